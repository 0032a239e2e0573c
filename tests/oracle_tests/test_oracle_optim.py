"""The oracle's Adam (section 5.3) against torch.optim.Adam, and the bound of one honest update."""

from __future__ import annotations

import numpy as np
import pytest
import torch

import oracle
from oracle.optim import first_moment

STEPS = 6
RATES = [oracle.noam_rate(s, 16, 4) for s in range(STEPS)]  # 0.03 to 0.125: the Noam warmup


def draws(seed: int, dtype=np.float32) -> tuple[dict, list[dict]]:
    """Weights near the contract's scale, and gradients of every kind Adam treats apart: large,
    near eps (sqrt(v) ~ 1e-9), far below it (eps decides), 0 at some updates, signs that flip;
    all numbers of `dtype`, so torch holds exactly what the oracle computes with."""
    rng = np.random.default_rng(seed)
    shapes = {"w": (7, 5), "b": (5,), "g": (64,)}
    params = {k: rng.normal(0, 0.3, s).astype(dtype).astype(np.float64) for k, s in shapes.items()}
    scale = {}
    for k, s in shapes.items():
        kind = rng.integers(0, 4, s)
        scale[k] = np.choose(
            kind,
            [
                10 ** rng.uniform(-3, 0, s),
                10 ** rng.uniform(-9.5, -8.5, s),
                10 ** rng.uniform(-13, -11, s),
                10 ** rng.uniform(-6, -2, s),
            ],
        )
    grads = []
    for _ in range(STEPS):
        g = {k: scale[k] * rng.normal(size=s) * (rng.random(s) > 0.2) for k, s in shapes.items()}
        grads.append({k: v.astype(dtype).astype(np.float64) for k, v in g.items()})
    return params, grads


def torch_run(params, grads, torch_dtype, **kw) -> list[dict[str, np.ndarray]]:
    """torch's Adam from `params` over `grads` at RATES: the parameters after each update."""
    ts = {k: torch.tensor(v, dtype=torch_dtype, requires_grad=True) for k, v in params.items()}
    kw = {"betas": (0.9, 0.98), "eps": 1e-9, **kw}
    opt = torch.optim.Adam(list(ts.values()), lr=1.0, **kw)
    out = []
    for rate, g in zip(RATES, grads, strict=True):
        for group in opt.param_groups:
            group["lr"] = rate
        for k, t in ts.items():
            t.grad = torch.tensor(g[k], dtype=torch_dtype)
        opt.step()
        out.append({k: t.detach().to(torch.float64).numpy().copy() for k, t in ts.items()})
    return out


def oracle_run(params, grads, **kw) -> tuple[list[dict], list[dict]]:
    """The oracle's parameters after each update, and the summed bound of each (float32 and
    float64 bounds, by dtype)."""
    p, m, v, a = dict(params), {}, {}, {}
    out, bounds = [], {"float32": [], "float64": []}
    total = {d: {k: np.zeros(np.shape(x)) for k, x in params.items()} for d in bounds}
    bound = oracle.adam_step_bound
    for step, (rate, g) in enumerate(zip(RATES, grads, strict=True), start=1):
        p, m, v = oracle.adam_step(p, g, m, v, step, rate, **kw)
        a = {k: first_moment(a.get(k, 0.0), np.abs(g[k]), 0.9) for k in g}
        out.append(p)
        for d in bounds:
            for k in p:
                total[d][k] = bound(a[k], v[k], p[k], step, rate, d, prior=total[d][k])
            bounds[d].append({k: x.copy() for k, x in total[d].items()})
    return out, bounds


TORCH_ADAMS = {
    "single": {"foreach": False},
    "foreach": {"foreach": True},
    "fused": {"fused": True},
}


def test_first_update_is_the_rate_against_the_gradients_sign():
    # at t = 1 the bias corrections make m^ = g and v^ = g^2: delta = -lr g / (|g| + eps)
    g = np.array([1.0, -2.0, 1e-9, 0.0, -1e-12])
    p, m, v = oracle.adam_step({"x": np.zeros(5)}, {"x": g}, {}, {}, 1, 0.5)
    np.testing.assert_allclose(p["x"], -0.5 * g / (np.abs(g) + 1e-9), rtol=1e-15, atol=0)
    assert p["x"][2] == pytest.approx(-0.25)  # a gradient of eps: half the rate
    assert p["x"][3] == 0.0  # no gradient, no move
    np.testing.assert_allclose(m["x"], 0.1 * g, rtol=1e-15)
    np.testing.assert_allclose(v["x"], 0.02 * g * g, rtol=1e-15)


def test_adam_step_is_pure_and_needs_every_gradient():
    params, grads = draws(1)
    before = {k: x.copy() for k, x in params.items()}
    oracle.adam_step(params, grads[0], {}, {}, 1, 1e-3)
    assert all(np.array_equal(params[k], before[k]) for k in params)
    with pytest.raises(ValueError, match="no gradient"):
        oracle.adam_step(params, {"w": grads[0]["w"]}, {}, {}, 1, 1e-3)
    with pytest.raises(ValueError, match="counts from 1"):
        oracle.adam_step(params, grads[0], {}, {}, 0, 1e-3)


# torch's Adam in float64 computes the same formula in another order (lerp for m, the root of v
# divided by the root of the correction, the rate folded into one step size): each parameter
# after an update differs from the oracle's by some roundings of the update (at most lr in size
# at these draws' t <= 6, up to a few lr where m^/sqrt(v^) grows) and one of the stored
# parameter per update, at random signs. FEW_ULPS of the larger of |p| and the rate: four times
# the worst measured (3.9 ulps over 3 draws, 6 updates, torch's three orders), inside the
# worst-case bound the next test holds every order to (float64 runs reach 0.09 of it), and
# orders of magnitude below what any variant of the optimizer moves (next tests but one).
FEW_ULPS = 16 * 2.0**-52


@pytest.mark.parametrize("name", ["single", "foreach", "fused"])
@pytest.mark.parametrize("seed", [0, 1, 2])
def test_agrees_with_torch_adam_in_float64_to_a_few_ulps(name, seed):
    params, grads = draws(seed)
    want, _ = oracle_run(params, grads)
    got = torch_run(params, grads, torch.float64, **TORCH_ADAMS[name])
    for step, (g, w) in enumerate(zip(got, want, strict=True), start=1):
        for k in w:
            scale = np.maximum(np.abs(w[k]), RATES[step - 1])
            err = np.abs(g[k] - w[k]) / scale
            assert err.max() <= FEW_ULPS, (step, k, err.max() / 2.0**-52)


@pytest.mark.parametrize("dtype", ["float64", "float32"])
@pytest.mark.parametrize("name", sorted(TORCH_ADAMS))
def test_every_honest_torch_adam_is_within_the_bound(name, dtype):
    # torch's three CPU implementations of the same Adam (capturable runs on accelerators only),
    # in either dtype: each parameter after each update within the summed per-entry bound of
    # the updates so far
    worst = 0.0
    for seed in range(3):
        params, grads = draws(seed)
        want, bounds = oracle_run(params, grads)
        got = torch_run(params, grads, getattr(torch, dtype), **TORCH_ADAMS[name])
        for g, w, b in zip(got, want, bounds[dtype], strict=True):
            for k in w:
                ratio = np.abs(g[k] - w[k]) / b[k]
                assert ratio.max() <= 1.0, (seed, k, ratio.max())
                worst = max(worst, float(ratio.max()))
    assert worst > 0.0  # the comparison saw rounding: the bound is not judging identical copies


VARIANTS = {
    "eps 1e-8": {"eps": 1e-8},
    "betas (0.9, 0.999)": {"betas": (0.9, 0.999)},
    "maximize": {"maximize": True},
    "weight decay 1e-4": {"weight_decay": 1e-4},
    "amsgrad": {"amsgrad": True},
}


@pytest.mark.parametrize("variant", sorted(VARIANTS))
def test_the_bound_tells_the_known_variants_apart_in_float32(variant):
    # the bound is tight enough that each near miss leaves it on many entries
    kw = VARIANTS[variant]
    params, grads = draws(0)
    want, bounds = oracle_run(params, grads)
    got = torch_run(params, grads, torch.float32, **kw)
    outside = sum(
        int((np.abs(g[k] - w[k]) > b[k]).sum())
        for g, w, b in zip(got, want, bounds["float32"], strict=True)
        for k in w
    )
    assert outside >= 10, (variant, outside)
