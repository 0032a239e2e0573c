"""The oracle's own gradients: label-smoothed loss, then every layer's hand-written backward.

No autograd: each forward in ops.py / layers.py / model.py has its backward beside it, and this
module chains them. A tied table's gradient is the sum over its uses (source embedding, target
embedding, output layer); a target equal to pad_id contributes nothing.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from oracle.layers import Cache, Grads
from oracle.loss import label_smoothed_loss
from oracle.model import (
    check_src,
    check_tgt,
    decoder_stack,
    decoder_stack_bwd,
    encoder_stack,
    encoder_stack_bwd,
)
from oracle.params import Params

WRT = ("logits", "memory")  # the intermediate gradients loss_and_grads returns on request


def forward_for_grads(
    params: Params,
    src: Any,
    tgt_in: Any,
    tgt_out: Any,
    src_mask: Any,
    tgt_mask: Any,
    eps: float,
    pad_id: int,
) -> tuple[np.ndarray, float, np.ndarray, Cache, Cache]:
    """The forward pass keeping every cache: (logits, loss, dL/dlogits, encoder cache, decoder
    cache)."""
    src, src_mask = check_src(params, src, src_mask)
    tgt_in, tgt_mask = check_tgt(params, tgt_in, tgt_mask, src.shape[0])
    tgt_out = np.asarray(tgt_out)
    if tgt_out.shape != tgt_in.shape:
        raise ValueError(f"tgt_out {tgt_out.shape} must have tgt_in's shape {tgt_in.shape}")
    memory, enc_cache = encoder_stack(params, src, src_mask, None, keep=True)
    logits, dec_cache = decoder_stack(params, tgt_in, memory, src_mask, tgt_mask, None, keep=True)
    loss, dlogits = label_smoothed_loss(logits, tgt_out, eps, pad_id)
    return logits, loss, dlogits, enc_cache, dec_cache


def backward(
    params: Params, dlogits: np.ndarray, enc_cache: Cache, dec_cache: Cache
) -> tuple[Grads, np.ndarray]:
    """Every parameter's gradient from dL/dlogits, under the contract's names; and dL/dmemory.

    The caches are consumed: each layer's is freed once its backward has run."""
    grads: Grads = {}
    dmemory = decoder_stack_bwd(params, dlogits, dec_cache, grads)
    encoder_stack_bwd(params, dmemory, enc_cache, grads)
    assert grads.keys() == params.arrays.keys(), set(grads) ^ set(params.arrays)
    return {name: grads[name] for name in params.arrays}, dmemory


def loss_and_grads(
    params: Params,
    src: Any,
    tgt_in: Any,
    tgt_out: Any,
    src_mask: Any,
    tgt_mask: Any,
    eps: float,
    pad_id: int,
    wrt: tuple[str, ...] = (),
):
    """(loss, grads): the label-smoothed loss of forward(...) against tgt_out, and its gradient
    for every parameter (a dict in params.arrays' order, each of its array's shape).

    wrt names intermediate gradients to return as well, from WRT: with wrt=('logits', 'memory')
    the result is (loss, grads, {'logits': dL/dlogits [B, T, V], 'memory': dL/dmemory [B, S, d]}).
    """
    unknown = set(wrt) - set(WRT)
    if unknown:
        raise ValueError(f"wrt may name {WRT}, got {sorted(unknown)}")
    _, loss, dlogits, enc_cache, dec_cache = forward_for_grads(
        params, src, tgt_in, tgt_out, src_mask, tgt_mask, eps, pad_id
    )
    grads, dmemory = backward(params, dlogits, enc_cache, dec_cache)
    if not wrt:
        return loss, grads
    extra = {"logits": dlogits, "memory": dmemory}
    return loss, grads, {name: extra[name] for name in wrt}


def logits_loss_and_grads(params: Params, *batch: Any) -> tuple[np.ndarray, float, Grads]:
    """(logits, loss, grads) for loss_and_grads' arguments after params (src, tgt_in, tgt_out,
    src_mask, tgt_mask, eps, pad_id): forward's logits with loss_and_grads' loss and gradients,
    from one forward pass (what the golden test compares, and bounds with oracle.roundoff)."""
    logits, loss, dlogits, enc_cache, dec_cache = forward_for_grads(params, *batch)
    grads, _ = backward(params, dlogits, enc_cache, dec_cache)
    return logits, loss, grads
