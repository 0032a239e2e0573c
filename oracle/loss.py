"""The training objective and schedule: label smoothing (section 5.4) and the Noam rate (5.3)."""

from __future__ import annotations

from typing import Any

import numpy as np

from oracle.ops import FLOATS, log_softmax


def label_smoothed_loss(
    logits: Any, targets: Any, eps: float, pad_id: int
) -> tuple[float, np.ndarray]:
    """loss = mean over non-pad targets t of -sum_j q_j log p_j, q = (1 - eps) onehot(t) + eps / V.

    Returns (loss, dloss/dlogits); the gradient is (p - q) / N on the N non-pad rows, 0 on pad rows.
    A target equal to pad_id contributes nothing, not even to N (section 5.4 plus the pad rule).
    """
    z = np.asanyarray(logits)  # an array subclass stays one (oracle.roundoff's)
    if z.dtype not in FLOATS:
        z = z.astype(np.float64)
    t = np.asarray(targets)
    if z.shape[:-1] != t.shape:
        raise ValueError(f"logits {z.shape} must be targets {t.shape} plus a vocabulary axis")
    V = z.shape[-1]
    keep = t != pad_id
    n = int(keep.sum())
    if n == 0:
        raise ValueError(
            f"every target equals pad_id={pad_id}: the mean over no targets is undefined"
        )
    if t[keep].min() < 0 or t[keep].max() >= V:
        raise ValueError(f"targets must lie in [0, {V}), got {t[keep].min()}..{t[keep].max()}")
    logp = log_softmax(z)  # [.., V]
    safe_t = np.where(keep, t, 0)  # pad rows read any id; they are dropped below
    nll = -np.take_along_axis(logp, safe_t[..., None], axis=-1)[..., 0]
    row = (1 - eps) * nll - eps * logp.mean(axis=-1)
    loss = row[keep].sum() / n
    # dlogits = (p - q) / N with q = eps / V off the target and 1 - eps + eps / V on it, written
    # without a second [.., V] array for q: p - eps / V everywhere, then the targets' entries
    dlogits = np.exp(logp)
    p_t = np.take_along_axis(dlogits, safe_t[..., None], axis=-1)
    dlogits -= eps / V
    np.put_along_axis(dlogits, safe_t[..., None], p_t - (1 - eps + eps / V), axis=-1)
    dlogits *= keep[..., None] / z.dtype.type(n)
    return loss, dlogits


def noam_rate(step: int, d_model: int, warmup: int, factor: float = 1.0) -> float:
    """lr = factor * d^-1/2 * min(n^-1/2, n * warmup^-3/2) with n = step + 1 (section 5.3):
    update `step` counts from 0, the paper's step number n from 1."""
    if step < 0 or warmup < 1:
        raise ValueError(f"need step >= 0 and warmup >= 1, got step={step}, warmup={warmup}")
    n = step + 1
    return factor * d_model**-0.5 * min(n**-0.5, n * warmup**-1.5)
