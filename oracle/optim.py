"""The paper's optimizer: Adam with beta1 = 0.9, beta2 = 0.98, eps = 1e-9 (section 5.3), in the
form torch.optim.Adam computes it (Kingma and Ba, Algorithm 1, eps added to the bias-corrected
root), and the bound of an honest subject's rounding of each of its steps.

Every function is pure: it returns new arrays and never changes the ones it is given. Arrays are
keyed by any names the caller chooses (the subject's own parameter names): Adam is elementwise,
so it needs no model structure.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np

from oracle.precision import PRECISIONS, U64

BETAS = (0.9, 0.98)  # section 5.3
EPS = 1e-9  # section 5.3


def _f64(a: Any) -> np.ndarray:
    return np.asarray(a, dtype=np.float64)


def first_moment(m: Any, g: Any, beta1: float) -> np.ndarray:
    """The running mean of the gradient.

    m_t = beta1 m_{t-1} + (1 - beta1) g_t (section 5.3; Kingma and Ba, Algorithm 1).
    """
    return beta1 * _f64(m) + (1.0 - beta1) * _f64(g)


def second_moment(v: Any, g: Any, beta2: float) -> np.ndarray:
    """The running mean of the squared gradient.

    v_t = beta2 v_{t-1} + (1 - beta2) g_t^2 (section 5.3; Kingma and Ba, Algorithm 1).
    """
    g = _f64(g)
    return beta2 * _f64(v) + (1.0 - beta2) * g * g


def bias_corrected(moment: Any, beta: float, step: int) -> np.ndarray:
    """A moment divided by its bias from starting at zero.

    m^_t = m_t / (1 - beta^t), t counting updates from 1 (section 5.3; Kingma and Ba, Alg. 1).
    """
    if step < 1:
        raise ValueError(f"Adam's step counts from 1, got {step}")
    return _f64(moment) / (1.0 - beta**step)


def adam_update(m_hat: Any, v_hat: Any, lr: float, eps: float) -> np.ndarray:
    """The change Adam makes to a parameter.

    delta = -lr m^_t / (sqrt(v^_t) + eps) (section 5.3; eps outside the root, as torch's Adam).
    """
    return -lr * _f64(m_hat) / (np.sqrt(_f64(v_hat)) + eps)


def adam_step(
    params: Mapping[str, Any],
    grads: Mapping[str, Any],
    m: Mapping[str, Any],
    v: Mapping[str, Any],
    step: int,
    lr: float,
    betas: tuple[float, float] = BETAS,
    eps: float = EPS,
) -> tuple[dict[str, np.ndarray], dict[str, np.ndarray], dict[str, np.ndarray]]:
    """One Adam update of every named parameter: (params, m, v) after update `step`.

    p_t = p_{t-1} - lr m^_t / (sqrt(v^_t) + eps), with m^_t, v^_t the bias-corrected moments of
    the gradients so far (section 5.3: beta1 0.9, beta2 0.98, eps 1e-9). `step` counts from 1;
    m and v of a parameter not updated before may be missing or 0 (Adam's moments start at 0).
    Every parameter must have a gradient.
    """
    b1, b2 = betas
    missing = sorted(set(params) - set(grads))
    if missing:
        raise ValueError(f"no gradient for {missing}")
    new_p, new_m, new_v = {}, {}, {}
    for name, p in params.items():
        g = _f64(grads[name])
        new_m[name] = first_moment(m.get(name, 0.0), g, b1)
        new_v[name] = second_moment(v.get(name, 0.0), g, b2)
        m_hat = bias_corrected(new_m[name], b1, step)
        v_hat = bias_corrected(new_v[name], b2, step)
        new_p[name] = _f64(p) + adam_update(m_hat, v_hat, lr, eps)
    return new_p, new_m, new_v


def _gamma(n: float, u: float) -> float:
    """Higham's gamma_n = n u / (1 - n u): the relative error of n roundings of unit u."""
    return n * u / (1.0 - n * u)


def adam_step_bound(
    abs_m: Any,
    v: Any,
    params: Any,
    step: int,
    lr: float,
    dtype: str,
    prior: Any = 0.0,
    betas: tuple[float, float] = BETAS,
    eps: float = EPS,
) -> np.ndarray:
    """How far an honest subject's parameter after update `step` may be from the oracle's: the
    bound after the update before (`prior`, 0 before the first) plus this update's own share
    (Adam's update does not read the parameter, so earlier errors pass on unchanged and later
    ones add).

    abs_m: first_moment run on |g| (a_t, the same recursion on the gradients' magnitudes); v:
    the oracle's second moment after the update; params: the oracle's parameter after it.

    The subject holds the same gradients exactly (the caller draws numbers of `dtype`), and
    computes in `dtype` (unit roundoff u) what torch's Adam computes, in any of its orders
    (single tensor, foreach, fused, capturable); the oracle in float64 (U64). Per entry:
    - m: a lerp or a multiply-add per update, each a few roundings of terms at most a_t (the
      lerp's weight 1 - beta1 itself rounded): |m~ - m| <= gamma(6t) a_t (errors from earlier
      updates are scaled by beta1 and b1^(t-j) a_j <= a_t).
    - v: positive terms only: |v~ - v| <= gamma(6t) v, so sqrt(v^) moves by half that plus the
      root's, the division's and eps's roundings: the denominator d = sqrt(v^) + eps by
      gamma(3t + 4) of itself.
    - the bias corrections 1 - beta^t, when computed in `dtype` (capturable: beta^t from a
      rounded beta, (t + 1) roundings), cancel: relative error (t + 1) u beta^t / (1 - beta^t)
      (98 u for beta2 at t = 1); 1 - beta1^t enters whole, 1 - beta2^t under the root (half).
    - the quotient, the rate's product and the cast of lr: three more roundings; then the
      store of p + delta: u times the subject's sum, at most |p| + prior + its own error.
    So |delta~ - delta| <= gamma(n) lr (a_t / (1 - beta1^t)) / d with n = 9t + 7 plus the
    corrections' terms, doubled for the second-order terms and the oracle's own float64
    rounding (the same n with U64), plus (u + U64)(|p| + prior + that). The store's share is
    exact, not an estimate (|fl(x) - x| <= u |x|): an update below half an ulp of p leaves the
    subject's p where it was, and six of those in a row come within a few percent of the sum
    (measured: 0.92 of it in float32). An entry whose v is near eps^2 has d near eps, where
    Adam's quotient turns on eps: its bound is gamma(n) lr a_t / eps, the same share of its
    own update as any entry's, per entry. Subnormal roundings (eta) move m and v by at most
    n eta (below 1e-40 in float32): lr 2 n eta / eps covers them.
    """
    p = PRECISIONS[dtype]
    b1, b2 = betas
    t = int(step)
    cancel = (t + 1) * (b1**t / (1 - b1**t) + 0.5 * b2**t / (1 - b2**t))
    n = 2.0 * (9 * t + 7 + cancel)
    a_hat = _f64(abs_m) / (1.0 - b1**t)
    d = np.sqrt(_f64(v) / (1.0 - b2**t)) + eps
    rel = _gamma(n, p.u) + _gamma(n, U64)
    own = rel * lr * a_hat / d + lr * 2 * n * p.eta / eps
    prior = _f64(prior)
    return prior + own + (p.u + U64) * (np.abs(_f64(params)) + prior + own)


__all__ = [
    "BETAS",
    "EPS",
    "adam_step",
    "adam_step_bound",
    "adam_update",
    "bias_corrected",
    "first_moment",
    "second_moment",
]
