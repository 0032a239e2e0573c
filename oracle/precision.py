"""The arithmetic of each dtype a subject may compute in, as the rounding model reads it.

A subject stores every tensor in its dtype (unit roundoff u: 2^-53, 2^-24, 2^-8, 2^-11 for
float64, float32, bfloat16, float16, and for float16 also eta, half its smallest subnormal) and
accumulates reductions in u_acc: the dtype's own for float64 and float32, float32 for bfloat16 and
float16 (every BLAS, oneDNN and torch's CPU and GPU kernels do). Its inputs are what it can hold
(`representable`), and its positional table is the sinusoid computed in u_acc (`pe_error`).
oracle/roundoff.py is the model that runs on these facts; the oracle's own float64 arithmetic is
counted there too (U64), the bound being on |subject - oracle|.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

U64 = 2.0**-53  # the oracle's own unit roundoff


@dataclass(frozen=True)
class Precision:
    """A subject's arithmetic: storage unit roundoff u, accumulation's u_acc, subnormal eta."""

    name: str
    u: float
    u_acc: float
    eta: float
    largest: float  # the largest finite number: past it the bound is inf


PRECISIONS = {
    "float64": Precision("float64", 2.0**-53, 2.0**-53, 2.0**-1075, 1.8e308),
    "float32": Precision("float32", 2.0**-24, 2.0**-24, 2.0**-150, 3.4e38),
    "bfloat16": Precision("bfloat16", 2.0**-8, 2.0**-24, 2.0**-134, 3.38e38),
    "float16": Precision("float16", 2.0**-11, 2.0**-24, 2.0**-25, 65504.0),
}


def representable(w: np.ndarray, dtype: str) -> np.ndarray:
    """Where w is a number of `dtype` (held exactly by a subject computing in it)."""
    if dtype == "float64":
        return np.ones(w.shape, dtype=bool)
    f32 = w.astype(np.float32)
    same32 = f32.astype(np.float64) == w
    if dtype == "float32":
        return same32
    if dtype == "float16":
        with np.errstate(over="ignore"):
            return w.astype(np.float16).astype(np.float64) == w
    if dtype == "bfloat16":  # a bfloat16 number is a float32 whose low 16 bits are 0
        return same32 & ((f32.view(np.uint32) & np.uint32(0xFFFF)) == 0)
    raise ValueError(f"dtype must be one of {tuple(PRECISIONS)}, got {dtype!r}")


def pe_error(length: int, d: int, u_acc: float) -> np.ndarray:
    """[length, d]: how far an honest positional table computed in u_acc's precision may be
    from the oracle's, per entry. Any of the contract's honest forms (p / 10000^(2i/d),
    p exp(-2i ln(10000) / d), ...) gets the angle a = p f, f = 10000^(-2i/d), within
    (3 |ln f| + 2) u_acc a of itself (the exponent's three roundings scaled by |ln f| through the
    power), which moves sin a by |cos a| times that; sin and cos are within 2 u_acc of their
    values (cos likewise, with |sin a|). A float64 table in the exp-log form differs from the
    oracle's by up to 1.8e-15 over 32 positions at d = 16 (measured,
    tests/oracle_tests/test_cancellation_bounds.py); one computed in float32 arithmetic inside a
    float64 model carries ~a u32 (1e-5 at position 200): a fault, one of the course's pitfalls."""
    p = np.arange(length, dtype=np.float64)[:, None]
    two_i = np.arange(0, d, 2, dtype=np.float64)
    f = 10000.0 ** (-two_i / d)
    a = p * f
    da = (3.0 * np.abs(np.log(f)) + 2.0) * u_acc * a
    out = np.empty((length, d))
    out[:, 0::2] = np.abs(np.cos(a)) * da + 2 * u_acc * np.abs(np.sin(a))
    out[:, 1::2] = (np.abs(np.sin(a)) * da + 2 * u_acc * np.abs(np.cos(a)))[:, : d // 2]
    return out
