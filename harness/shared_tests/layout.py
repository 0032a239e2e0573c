"""A hooked value in the contract's batch-first layout, whatever layout the subject keeps inside.

The contract's boundaries are batch-first ([B, T, ...]: encode's output, decode's logits), but
what a module inside a stack receives and returns is the subject's own business: fairseq, for
one, keeps time-first tensors ([T, B, C]) between its layers. A value compared at a hooked
boundary is first put in the batch-first layout by `batch_first`, the one function here:

    batch_first(hooked, shape, expected=None, mask=None) -> Arranged(array, layout, reason)

- `hooked`: the value the hook recorded (an array, or None when nothing was recorded);
- `shape`: the batch-first shape the contract expects there ([B, T, ...]);
- `expected` (optional): the contract's values at that boundary, in `shape`; only read when
  the shapes cannot tell the layouts apart (T == B);
- `mask` (optional): bool [B, T], the positions whose values the contract defines (padded
  positions are ignored when comparing with `expected`).

It returns an `Arranged` (a NamedTuple, so `array, layout, reason = batch_first(...)` works):

- array: the value in batch-first layout (a view of `hooked`, never a copy of changed values),
  or None when it cannot be put in it;
- layout: "batch-first" (as recorded) or "time-first" (recorded as [T, B, ...], axes 0 and 1
  swapped), "" when array is None;
- reason: "" when array is given; else why not, in words a report can quote ("shape (6, 2, 5),
  expected (2, 6, 16) batch-first or (6, 2, 16) time-first").

Recognised: the batch-first layout itself and the time-first transposition of the first two
axes. When T == B both have the same shape; then the layout is the one whose values are closer
to `expected` (on the masked positions), and without `expected` it is not guessed: array is
None and the reason says so. Nothing here judges whether the values are right.
"""

from __future__ import annotations

from typing import Any, NamedTuple

import numpy as np

BATCH_FIRST = "batch-first"
TIME_FIRST = "time-first"


class Arranged(NamedTuple):
    """`batch_first`'s answer: the batch-first array (or None), its layout as recorded, and why
    it could not be arranged ('' when it could)."""

    array: np.ndarray | None
    layout: str
    reason: str


def _distance(got: np.ndarray, want: np.ndarray, mask: np.ndarray | None) -> float:
    """max |got - want| over the masked positions (inf where either is not finite)."""
    diff = np.abs(got - want)
    diff = np.where(np.isfinite(got) & np.isfinite(want), diff, np.inf)
    if mask is not None:
        trailing = (1,) * (diff.ndim - mask.ndim)
        keep = np.broadcast_to(mask.reshape(mask.shape + trailing), diff.shape)
        diff = np.where(keep, diff, 0.0)
    return float(diff.max(initial=0.0))


def batch_first(
    hooked: Any,
    shape: tuple[int, ...],
    expected: Any = None,
    mask: Any = None,
) -> Arranged:
    """`hooked` in the batch-first layout `shape` ([B, T, ...]), or why it cannot be (see the
    module's docstring)."""
    shape = tuple(int(n) for n in shape)
    if hooked is None:
        return Arranged(None, "", "nothing was recorded at this boundary")
    try:
        got = np.asarray(hooked)
    except Exception as e:  # a value the wire carried but numpy cannot read as one array
        return Arranged(None, "", f"the recorded value is not an array ({type(e).__name__})")
    if got.dtype == object or not (
        np.issubdtype(got.dtype, np.number) or np.issubdtype(got.dtype, np.bool_)
    ):
        return Arranged(None, "", f"the recorded value is not numeric (dtype {got.dtype})")
    if len(shape) < 2:
        if got.shape == shape:
            return Arranged(got, BATCH_FIRST, "")
        return Arranged(None, "", f"shape {got.shape}, expected {shape}")
    swapped = (shape[1], shape[0], *shape[2:])
    if got.shape != shape and got.shape != swapped:
        return Arranged(
            None,
            "",
            f"shape {got.shape}, expected {shape} batch-first or {swapped} time-first",
        )
    if shape != swapped:  # the shapes tell the layouts apart
        if got.shape == shape:
            return Arranged(got, BATCH_FIRST, "")
        return Arranged(np.swapaxes(got, 0, 1), TIME_FIRST, "")
    # T == B: the same shape either way; the values decide, or nothing does
    if expected is None:
        return Arranged(
            None,
            "",
            f"shape {got.shape} is batch-first or time-first alike (as many positions as rows) "
            "and no expected values were given to tell them apart",
        )
    want = np.asarray(expected, dtype=np.float64)
    if want.shape != shape:
        return Arranged(None, "", f"the expected values have shape {want.shape}, not {shape}")
    keep = None if mask is None else np.asarray(mask, dtype=bool)
    if keep is not None and keep.shape != shape[: keep.ndim]:
        return Arranged(None, "", f"the mask has shape {keep.shape}, not {shape[:2]}")
    as_is = got.astype(np.float64)
    turned = np.swapaxes(as_is, 0, 1)
    if _distance(turned, want, keep) < _distance(as_is, want, keep):
        return Arranged(np.swapaxes(got, 0, 1), TIME_FIRST, "")
    return Arranged(got, BATCH_FIRST, "")
