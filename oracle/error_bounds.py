"""The forward pass's values with their bounds: `forward_bounds` and `label_smoothed_loss_bound`.

Both are views of oracle.bounded (oracle/roundoff.py, the one rounding model): the oracle's
forward pass, traced, run under a dtype's roundings with its rows folded into the runs, and the
label-smoothed loss of that forward pass run the same way one run at a time (a loss averages over
rows). `xfmr compare`, `xfmr bound-check` and `xfmr detection` read them; the shared tests call
oracle.bounded through harness.shared_tests.verdicts.derived.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

import oracle.model as model
from oracle.loss import label_smoothed_loss
from oracle.params import Params
from oracle.roundoff import SAMPLES, bounded


@dataclass(frozen=True)
class ForwardBounds:
    """The oracle's logits and every traced boundary (oracle.forward's names), each with its
    bound on |subject - oracle| for a subject computing in `dtype`."""

    dtype: str
    logits: np.ndarray
    bound: np.ndarray
    trace: dict[str, np.ndarray]
    trace_bound: dict[str, np.ndarray]
    seed: int


def _traced(params: Params, src: Any, tgt_in: Any, src_mask: Any, tgt_mask: Any) -> tuple:
    return model.forward(params, src, tgt_in, src_mask, tgt_mask, trace=True)


def forward_bounds(
    params: Params,
    src: Any,
    tgt_in: Any,
    src_mask: Any,
    tgt_mask: Any,
    dtype: str,
    samples: int = SAMPLES,
    seed: int = 0,
) -> ForwardBounds:
    """oracle.forward's logits and trace, each with its bound on |subject - oracle| for a subject
    computing in `dtype` (one of oracle.precision.PRECISIONS); `samples` runs drawn from `seed`."""
    src, src_mask = model.check_src(params, src, src_mask)
    tgt_in, tgt_mask = model.check_tgt(params, tgt_in, tgt_mask, src.shape[0])
    (logits, trace), (bound, trace_bound) = bounded(
        _traced,
        params,
        src,
        tgt_in,
        src_mask,
        tgt_mask,
        dtype=dtype,
        samples=samples,
        seed=seed,
        rows=True,
    )
    if any(np.isinf(b).any() for b in trace_bound.values()):
        bound = np.full_like(bound, np.inf)  # a boundary may overflow: nothing after it is bounded
    return ForwardBounds(dtype, logits, bound, trace, trace_bound, seed)


def _forward_loss(
    params: Params,
    src: Any,
    tgt_in: Any,
    tgt_out: Any,
    src_mask: Any,
    tgt_mask: Any,
    eps: float,
    pad_id: int,
) -> float:
    logits = model.forward(params, src, tgt_in, src_mask, tgt_mask)
    return label_smoothed_loss(logits, tgt_out, eps, pad_id)[0]


def label_smoothed_loss_bound(
    params: Params,
    src: Any,
    tgt_in: Any,
    tgt_out: Any,
    src_mask: Any,
    tgt_mask: Any,
    eps: float,
    pad_id: int,
    dtype: str,
    samples: int = SAMPLES,
    seed: int = 0,
) -> tuple[float, float]:
    """(loss, bound): oracle.label_smoothed_loss of the oracle's logits, and its bound for a
    subject computing the forward pass and the loss in `dtype`."""
    loss, bound = bounded(
        _forward_loss,
        params,
        src,
        tgt_in,
        tgt_out,
        src_mask,
        tgt_mask,
        eps,
        pad_id,
        dtype=dtype,
        samples=samples,
        seed=seed,
    )
    return float(loss), float(bound)
