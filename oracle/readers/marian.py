"""Reading a Hugging Face MarianMTModel state_dict (with its MarianConfig) into the oracle's Params.

Marian is the paper's post-LN encoder-decoder with these differences, all carried by ModelSpec:
the activation of `config.activation_function` (relu, gelu in its exact erf form, silu/swish);
the embeddings scaled by sqrt(d_model) only when `config.scale_embedding`; a sinusoidal table
with every sin feature first and every cos feature second (not interleaved), positions from 0;
`final_logits_bias` added to the logits; LayerNorm epsilon 1e-5 (torch's default). Masks are the
contract's: source padding in encoder self-attention and cross-attention, causal and target
padding in decoder self-attention.

Names, contract <- Marian (`model.` prefix of MarianMTModel; MarianModel's keys have none):
    src_emb.weight <- model.encoder.embed_tokens.weight (or model.shared.weight)
    tgt_emb.weight <- model.decoder.embed_tokens.weight (or model.shared.weight)
    out.weight     <- lm_head.weight (or the target table when config.tie_word_embeddings)
    {encoder,decoder}.{i}.self_attn.*  <- model.{encoder,decoder}.layers.{i}.self_attn.*
    decoder.{i}.cross_attn.*           <- model.decoder.layers.{i}.encoder_attn.*
    *.linear1, *.linear2               <- *.fc1, *.fc2
    encoder.{i}.norm1, norm2           <- self_attn_layer_norm, final_layer_norm
    decoder.{i}.norm1, norm2, norm3    <- self_attn_layer_norm, encoder_attn_layer_norm,
                                          final_layer_norm
The positional table is model.encoder.embed_positions.weight where the checkpoint stores it.
"""

from __future__ import annotations

import dataclasses
import re
from typing import Any

import numpy as np

from oracle.params import Params
from oracle.readers.state_dict import (
    StateDictError,
    config_value,
    contract_keys,
    params_from_contract,
    register_scheme,
)

# transformers' ACT2FN names -> oracle.ops.ACTIVATIONS ('gelu' there is torch's exact erf form)
MARIAN_ACTIVATIONS = {"relu": "relu", "gelu": "gelu", "silu": "silu", "swish": "silu"}
MARIAN_LN_EPS = 1e-5  # MarianEncoderLayer/DecoderLayer build nn.LayerNorm(d_model) with defaults
MARIAN_NORMS = {
    "encoder": {"norm1": "self_attn_layer_norm", "norm2": "final_layer_norm"},
    "decoder": {
        "norm1": "self_attn_layer_norm",
        "norm2": "encoder_attn_layer_norm",
        "norm3": "final_layer_norm",
    },
}
TABLES = ("src_emb.weight", "tgt_emb.weight", "out.weight")


def marian_positional_table(n_positions: int, d: int) -> np.ndarray:
    """PE[p, i] = sin(p / 10000^(2i/d)) for i < ceil(d/2), PE[p, ceil(d/2) + i] = cos(p / ...).

    The angles are those of the paper's table (section 3.5), with the sin columns first and the
    cos columns second. transformers (MarianSinusoidalPositionalEmbedding.create_weight) and
    Marian compute the table in float32, so the float64 values are rounded through float32 here
    too: that is the table a checkpoint without embed_positions runs with.
    """
    p = np.arange(n_positions, dtype=np.float64)[:, None]
    j = np.arange(d)
    angle = p / np.power(10000, 2 * (j // 2) / d)  # [n_positions, d]
    table = np.concatenate([np.sin(angle[:, 0::2]), np.cos(angle[:, 1::2])], axis=1)
    return table.astype(np.float32).astype(np.float64)


def marian_name(name: str, prefix: str) -> str:
    """A contract name's Marian name: decoder.0.cross_attn.q_proj.weight ->
    model.decoder.layers.0.encoder_attn.q_proj.weight (the module docstring's table)."""
    tables = {
        "src_emb.weight": f"{prefix}encoder.embed_tokens.weight",
        "tgt_emb.weight": f"{prefix}decoder.embed_tokens.weight",
        "out.weight": "lm_head.weight",
    }
    if name in tables:
        return tables[name]
    m = re.match(r"(encoder|decoder)\.(\d+)\.(\w+)\.(.*)$", name)
    if not m:
        raise ValueError(f"{name!r} is not a contract name of a post-LN model")
    stack, i, module, rest = m.groups()
    module = {"cross_attn": "encoder_attn", "linear1": "fc1", "linear2": "fc2"}.get(module, module)
    module = MARIAN_NORMS[stack].get(module, module)
    return f"{prefix}{stack}.layers.{i}.{module}.{rest}"


def _required(config: Any, name: str) -> Any:
    value = config_value(config, name)
    if value is None:
        raise ValueError(f"a Marian state_dict needs its MarianConfig: config.{name} is missing")
    return value


def _same(config: Any, a: str, b: str) -> int:
    """A value Marian keeps per stack and ModelSpec keeps once."""
    va, vb = int(_required(config, a)), int(_required(config, b))
    if va != vb:
        raise ValueError(
            f"config.{a}={va} differs from config.{b}={vb}; the oracle needs one value"
        )
    return va


def _tables(arrays: dict[str, np.ndarray], config: Any, prefix: str) -> dict[str, np.ndarray]:
    """The source, target and output tables the model's modules read."""
    shared = arrays.get(f"{prefix}shared.weight")
    found = {name: arrays.get(marian_name(name, prefix)) for name in TABLES}
    for name in ("src_emb.weight", "tgt_emb.weight"):  # checkpoints may store only model.shared
        found[name] = shared if found[name] is None else found[name]
    if found["out.weight"] is None and config_value(config, "tie_word_embeddings") is not False:
        found["out.weight"] = found["tgt_emb.weight"]
    tables = {name: table for name, table in found.items() if table is not None}
    missing = [name for name in found if name not in tables]
    if missing:
        raise ValueError(f"Marian state_dict lacks the tables for {missing}")
    return tables


def _tie(tables: dict[str, np.ndarray]) -> str:
    """params.TIES from equal arrays: a state_dict lists a tied tensor under each of its names."""
    src, tgt, out = (tables[name] for name in TABLES)
    if tgt.shape == out.shape and np.array_equal(tgt, out):
        return "all" if src.shape == tgt.shape and np.array_equal(src, tgt) else "tgt_out"
    return "none"


def _positional_table(arrays: dict[str, np.ndarray], prefix: str, n: int, d: int) -> np.ndarray:
    enc = arrays.get(f"{prefix}encoder.embed_positions.weight")
    dec = arrays.get(f"{prefix}decoder.embed_positions.weight")
    if enc is not None and dec is not None and not np.array_equal(enc, dec):
        raise ValueError(
            "the encoder's and the decoder's embed_positions differ; the oracle's ModelSpec has one"
        )
    table = enc if enc is not None else dec
    return marian_positional_table(n, d) if table is None else table


@register_scheme
def read_marian(arrays: dict[str, np.ndarray], config: Any) -> Params | None:
    """Hugging Face Marian names: model.encoder.layers.{i}.self_attn_layer_norm, fc1, ..."""
    marker = re.compile(r"(model\.)?(encoder|decoder)\.layers\.\d+\.(self_attn_layer_norm|fc1)\.")
    hit = next((m for k in arrays if (m := marker.match(k))), None)
    if hit is None:
        return None
    prefix = hit.group(1) or ""
    d = int(_required(config, "d_model"))
    activation = str(_required(config, "activation_function"))
    if activation not in MARIAN_ACTIVATIONS:
        raise ValueError(
            f"activation_function={activation!r}: the oracle has {sorted(MARIAN_ACTIVATIONS)}"
        )
    n_enc, n_dec = (
        int(_required(config, "encoder_layers")),
        int(_required(config, "decoder_layers")),
    )

    tables = _tables(arrays, config, prefix)
    tie = _tie(tables)
    names = contract_keys(n_enc, n_dec, "post", tie)
    layer_names = [n for n in names if n not in TABLES]
    known = {marian_name(n, prefix) for n in layer_names}
    optional = {f"{prefix}shared.weight", "lm_head.weight", "final_logits_bias"}
    optional |= {f"{prefix}{s}.{t}.weight" for s in ("encoder", "decoder")
                 for t in ("embed_tokens", "embed_positions")}  # fmt: skip
    missing, unexpected = known - set(arrays), set(arrays) - known - optional
    if missing or unexpected:
        raise StateDictError("marian", missing, unexpected)

    contract = {n: arrays[marian_name(n, prefix)] for n in layer_names}
    contract |= {n: tables[n] for n in names if n in TABLES}
    max_len = int(_required(config, "max_position_embeddings"))
    stated = {
        "d_model": d,
        "n_heads": _same(config, "encoder_attention_heads", "decoder_attention_heads"),
        "d_ff": _same(config, "encoder_ffn_dim", "decoder_ffn_dim"),
        "ln_eps": MARIAN_LN_EPS,
        "max_len": max_len,
    }
    params = params_from_contract(
        contract, stated, (n_enc, n_dec, "post", tie), "marian", lambda n: marian_name(n, prefix)
    )
    bias = arrays.get("final_logits_bias")
    spec = dataclasses.replace(
        params.spec,
        activation=MARIAN_ACTIVATIONS[activation],
        embed_scale=None if config_value(config, "scale_embedding") else 1.0,  # None: sqrt(d)
        pos_table=_positional_table(arrays, prefix, max_len, d),
        logits_bias=None if bias is None else bias.reshape(-1),
    )
    return Params(spec, params.arrays, "marian")
