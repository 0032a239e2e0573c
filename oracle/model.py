"""The encoder-decoder Transformer (section 3): encode, decode, forward, with an optional trace.

Inputs are anything np.asarray accepts (numpy arrays, CPU torch tensors): ids [B, S] / [B, T],
padding masks bool [B, S] / [B, T] with True = a real token. Bad inputs raise the contract's errors
(CONTRACT.md, "Bad input"). With trace=True the result comes with a dict of every contract
module's output, keyed by module name in the order of computation.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from oracle.layers import (
    Cache,
    Grads,
    decoder_layer,
    decoder_layer_bwd,
    encoder_layer,
    encoder_layer_bwd,
    into,
)
from oracle.ops import embedding, embedding_bwd_rows, layer_norm, layer_norm_bwd, linear, linear_bwd
from oracle.params import Params


def embed(params: Params, table: str, ids: np.ndarray, start: int = 0) -> np.ndarray:
    """x0 = E[ids] * sqrt(d_model) + PE (sections 3.4, 3.5); positions start at `start`."""
    T = ids.shape[1]
    return embedding(params.arrays[table], ids, params.spec.scale) + params.pe(start + T)[start:]


def _add(g: Grads, name: str, value: np.ndarray) -> None:
    """g[name] += value: a tied table's gradient is the sum over all its uses (in place: every
    array in g is the backward's own, and a table is [V, d], the largest of a large vocabulary)."""
    if name in g:
        g[name] += value
    else:
        g[name] = value


def embed_bwd(params: Params, table: str, ids: np.ndarray, dx0: np.ndarray, g: Grads) -> None:
    """The table's gradient from dL/dx0 (PE has no parameters), added into g[table].

    Only the rows of the ids that occur are added (embedding_bwd_rows): the other rows of
    embedding_bwd's dE are 0, so g[table] + dE equals g[table] there; this skips two passes over
    a [V, d] table per use (227 MiB at Marian's 58k vocabulary)."""
    rows, dE_rows = embedding_bwd_rows(dx0, ids, params.spec.scale)
    if table in g:  # a tied table's earlier use: g[table] += dE on the rows dE has
        g[table][rows] += dE_rows
    else:  # the first use: dE itself
        g[table] = np.zeros(params.arrays[table].shape, dtype=dE_rows.dtype)
        g[table][rows] = dE_rows


def source_attention_mask(src_mask: np.ndarray) -> np.ndarray:
    """[B, 1, 1, S]: every query may read exactly the real source positions."""
    return src_mask[:, None, None, :]


def target_attention_mask(tgt_mask: np.ndarray) -> np.ndarray:
    """[B, 1, T, T]: query t may read key j when j <= t (causal) and j is a real token."""
    T = tgt_mask.shape[1]
    causal = np.tril(np.ones((T, T), dtype=bool))
    return causal[None, None] & tgt_mask[:, None, None, :]


def encoder_stack(
    params: Params, src: np.ndarray, src_mask: np.ndarray, trace: dict | None, keep: bool = False
) -> tuple[np.ndarray, Cache]:
    """x0 = embed(src), N_e encoder layers, then enc_norm for pre-LN: the memory [B, S, d].

    keep: hold every layer's cache for a backward (a forward alone drops each after its layer)."""
    spec, mask = params.spec, source_attention_mask(src_mask)
    x = embed(params, params.src_table, src)
    cache: Cache = {"src": src, "mask": mask, "layers": []}
    for i in range(spec.n_enc):
        name = f"encoder.{i}"
        x, c = encoder_layer(x, params.layer(name), mask, spec, trace, name)
        if keep:
            cache["layers"].append(c)
        del c  # else its arrays would live on through the next layer's forward
    cache["top"] = x
    if spec.norm == "pre":
        a = params.arrays
        x = layer_norm(x, a["enc_norm.weight"], a["enc_norm.bias"], spec.ln_eps)
        if trace is not None:
            trace["enc_norm"] = x
    return x, cache


def encoder_stack_bwd(params: Params, dmemory: np.ndarray, cache: Cache, g: Grads) -> None:
    """Backward through encoder_stack from dL/dmemory: every encoder gradient, added into g.

    Each layer's cache is taken out of `cache` as its backward runs, so its arrays are freed
    then (as autograd frees saved tensors): a cache serves one backward."""
    spec = params.spec
    dx = dmemory
    if spec.norm == "pre":
        dx, g["enc_norm.weight"], g["enc_norm.bias"] = layer_norm_bwd(
            dx, cache["top"], params.arrays["enc_norm.weight"], spec.ln_eps
        )
    for i in reversed(range(spec.n_enc)):
        name = f"encoder.{i}"
        dx, layer_grads = encoder_layer_bwd(dx, cache["layers"].pop(), params.layer(name), spec)
        into(g, name, layer_grads)
    embed_bwd(params, params.src_table, cache["src"], dx, g)


def output_logits(params: Params, y: np.ndarray) -> np.ndarray:
    """logits = y W_out^T (section 3.4: the output layer shares the embedding table when tied)."""
    logits = linear(y, params.arrays[params.out_table], None)
    if params.spec.logits_bias is not None:
        logits = logits + params.spec.logits_bias
    return logits


def decoder_stack(
    params: Params,
    tgt_in: np.ndarray,
    memory: np.ndarray,
    src_mask: np.ndarray,
    tgt_mask: np.ndarray,
    trace: dict | None,
    keep: bool = False,
) -> tuple[np.ndarray, Cache]:
    """y0 = embed(tgt_in), N_d decoder layers over `memory`, dec_norm for pre-LN, the logits.

    keep: hold every layer's cache for a backward (a forward alone drops each after its layer)."""
    spec = params.spec
    self_mask, cross_mask = target_attention_mask(tgt_mask), source_attention_mask(src_mask)
    y = embed(params, params.tgt_table, tgt_in)
    cache: Cache = {"tgt": tgt_in, "memory": memory, "layers": []}
    cache["self_mask"], cache["cross_mask"] = self_mask, cross_mask
    for i in range(spec.n_dec):
        name = f"decoder.{i}"
        y, c = decoder_layer(
            y, memory, params.layer(name), self_mask, cross_mask, spec, trace, name
        )
        if keep:
            cache["layers"].append(c)
        del c  # else its arrays would live on through the next layer's forward
    cache["top"] = y
    if spec.norm == "pre":
        a = params.arrays
        y = layer_norm(y, a["dec_norm.weight"], a["dec_norm.bias"], spec.ln_eps)
        if trace is not None:
            trace["dec_norm"] = y
    cache["y"] = y
    return output_logits(params, y), cache


def decoder_stack_bwd(params: Params, dlogits: np.ndarray, cache: Cache, g: Grads) -> np.ndarray:
    """Backward through decoder_stack from dL/dlogits: the decoder's gradients (output layer
    included) added into g; returns dL/dmemory. Like encoder_stack_bwd, it takes each layer's
    cache out of `cache` as it goes."""
    spec = params.spec
    dy, dW_out, _ = linear_bwd(dlogits, cache["y"], params.arrays[params.out_table])
    _add(g, params.out_table, dW_out)
    if spec.norm == "pre":
        dy, g["dec_norm.weight"], g["dec_norm.bias"] = layer_norm_bwd(
            dy, cache["top"], params.arrays["dec_norm.weight"], spec.ln_eps
        )
    dmemory = np.zeros_like(cache["memory"])
    for i in reversed(range(spec.n_dec)):
        name = f"decoder.{i}"
        dy, dm, layer_grads = decoder_layer_bwd(dy, cache["layers"].pop(), params.layer(name), spec)
        dmemory += dm
        into(g, name, layer_grads)
    embed_bwd(params, params.tgt_table, cache["tgt"], dy, g)
    return dmemory


# --- Inputs: the contract's errors for bad ones (CONTRACT.md, "Bad input") -------------------


def check_ids_and_mask(
    params: Params, ids: Any, mask: Any, what: str
) -> tuple[np.ndarray, np.ndarray]:
    """ids and mask as arrays, or the contract's error: TypeError for a non-bool mask, ValueError
    for shapes that differ, a sequence longer than max_len or an id outside the vocabulary."""
    ids, mask = np.asarray(ids), np.asarray(mask)
    if mask.dtype != bool:
        raise TypeError(f"{what}_mask must be bool (True = a real token), got {mask.dtype}")
    if not np.issubdtype(ids.dtype, np.integer):
        raise TypeError(f"{what} ids must be integers, got {ids.dtype}")
    if ids.ndim != 2 or mask.shape != ids.shape:
        raise ValueError(
            f"{what} ids {ids.shape} and {what}_mask {mask.shape} must be equal [B, L]"
        )
    if ids.shape[1] > params.spec.max_len:
        raise ValueError(f"{what} length {ids.shape[1]} exceeds max_len={params.spec.max_len}")
    vocab = params.spec.src_vocab if what == "src" else params.spec.tgt_vocab
    if ids.size and (ids.min() < 0 or ids.max() >= vocab):
        raise ValueError(f"{what} ids must lie in [0, {vocab}), got {ids.min()}..{ids.max()}")
    return ids, mask


def check_src(params: Params, src: Any, src_mask: Any) -> tuple[np.ndarray, np.ndarray]:
    src, src_mask = check_ids_and_mask(params, src, src_mask, "src")
    empty = np.flatnonzero(~src_mask.any(axis=1))
    if empty.size:
        raise ValueError(f"source rows {empty.tolist()} have no real token")
    return src, src_mask


def check_tgt(params: Params, tgt: Any, tgt_mask: Any, batch: int) -> tuple[np.ndarray, np.ndarray]:
    tgt, tgt_mask = check_ids_and_mask(params, tgt, tgt_mask, "tgt")
    if tgt.shape[0] != batch:
        raise ValueError(f"target batch {tgt.shape[0]} differs from source batch {batch}")
    if tgt.shape[1] == 0 or not tgt_mask[:, 0].all():
        raise ValueError("every target row must start with a real token (bos)")
    return tgt, tgt_mask


# --- The public entry points ----------------------------------------------------------------


def encode(params: Params, src: Any, src_mask: Any, trace: bool = False):
    """The encoder's output (the memory) [B, S, d]; with trace=True, (memory, trace)."""
    src, src_mask = check_src(params, src, src_mask)
    record: dict[str, np.ndarray] | None = {} if trace else None
    memory, _ = encoder_stack(params, src, src_mask, record)
    return (memory, record) if trace else memory


def decode(
    params: Params, tgt_in: Any, memory: Any, src_mask: Any, tgt_mask: Any, trace: bool = False
):
    """The logits [B, T, V_tgt] of the decoder reading `memory`; with trace, (logits, trace)."""
    memory = np.asanyarray(memory, dtype=params.dtype)
    src_mask = np.asarray(src_mask)
    if src_mask.dtype != bool:
        raise TypeError(f"src_mask must be bool (True = a real token), got {src_mask.dtype}")
    B, S = src_mask.shape
    if memory.shape != (B, S, params.spec.d_model):
        raise ValueError(f"memory has shape {memory.shape}, expected {(B, S, params.spec.d_model)}")
    tgt_in, tgt_mask = check_tgt(params, tgt_in, tgt_mask, B)
    record: dict[str, np.ndarray] | None = {} if trace else None
    logits, _ = decoder_stack(params, tgt_in, memory, src_mask, tgt_mask, record)
    return (logits, record) if trace else logits


def forward(
    params: Params, src: Any, tgt_in: Any, src_mask: Any, tgt_mask: Any, trace: bool = False
):
    """decode(tgt_in, encode(src)): logits [B, T, V_tgt]; with trace=True, (logits, trace)."""
    src, src_mask = check_src(params, src, src_mask)
    tgt_in, tgt_mask = check_tgt(params, tgt_in, tgt_mask, src.shape[0])
    record: dict[str, np.ndarray] | None = {} if trace else None
    memory, _ = encoder_stack(params, src, src_mask, record)
    logits, _ = decoder_stack(params, tgt_in, memory, src_mask, tgt_mask, record)
    return (logits, record) if trace else logits
