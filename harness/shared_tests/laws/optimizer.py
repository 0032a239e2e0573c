"""The optimizer law: make_optimizer's optimizer judged by what it does to the parameters.

The parent pushes weights it drew and chooses the gradients and the rate of every update; the
subject's optimizer takes the updates in its worker; the oracle's Adam (oracle.adam_step, float64)
replays them from the parent's copy of the weights, and each parameter after each update must lie
within the derived per-entry bound of the replay (oracle.adam_step_bound, summed over the
updates). Nothing the optimizer object says about itself (its class, its param groups' betas or
eps) enters the verdict: an SGD behind Adam's name, maximize=True, other betas or eps, no bias
correction, weight decay, amsgrad, a parameter left out or held twice all move the parameters
elsewhere.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np

import oracle
from harness.shared_tests.inputs import config, draw_seed, pushed_weights
from harness.shared_tests.record import Call, Failure, law
from oracle.optim import BETAS, EPS, bias_corrected, first_moment, second_moment
from oracle.precision import PRECISIONS

CFG = config(n_enc=1, n_dec=1)
SEED = 18  # the model's own initialization, replaced by the pushed weights
# Five updates at the Noam rates of a warmup of 4 (0.031 to 0.125 for d_model 16): the rate
# changes at every update, so an optimizer that does not read its param groups' rate misses;
# betas matter from the second update on (the first's bias corrections cancel them), and the
# moments' history (a gradient 0 after a large one, a sign that flips) from the third.
UPDATES = 5
WARMUP = 4
# The gradients' kinds, per entry: Adam treats each apart. Large (1e-3 to 1: sqrt(v^) >> eps,
# the update near the rate), near eps (sqrt(v^) ~ 1e-9: eps decides half the quotient, so eps
# 1e-8 or 1e-9 differ by a factor), far below it (1e-13 to 1e-11: the update is g / eps, a
# fraction of the rate), middling (1e-6 to 1e-2). Each entry keeps its kind over the updates,
# with a fresh normal factor (so signs flip) and a 0 at about one update in five.
KINDS = ((-3.0, 0.0), (-9.5, -8.5), (-13.0, -11.0), (-6.0, -2.0))
ZERO_SHARE = 0.2


def gradients(shapes: dict[str, list[int]], seed: int) -> list[dict[str, np.ndarray]]:
    """UPDATES gradients for the named parameters, numbers of float32 (held exactly by a subject
    in float32 or float64). Each parameter's first entry is large and not 0 at the first update,
    so that every parameter must move."""
    rng = np.random.default_rng(seed)
    scales = {}
    for name, shape in sorted(shapes.items()):
        kind = rng.integers(0, len(KINDS), shape)
        exponent = np.choose(kind, [rng.uniform(lo, hi, shape) for lo, hi in KINDS])
        scales[name] = 10.0**exponent
    out = []
    for i in range(UPDATES):
        step = {}
        for name, shape in sorted(shapes.items()):
            g = scales[name] * rng.normal(size=shape) * (rng.random(shape) >= ZERO_SHARE)
            if i == 0 and g.size:
                g.flat[0] = 0.5 if g.flat[0] >= 0 else -0.5
            step[name] = g.astype(np.float32).astype(np.float64)
        out.append(step)
    return out


def _adam_like(
    betas: tuple[float, float] = BETAS,
    eps: float = EPS,
    sign: float = 1.0,
    corrected: bool = True,
    repeats: int = 1,
    amsgrad: bool = False,
) -> Callable[..., list[dict[str, np.ndarray]]]:
    """A replay of an Adam variant (for naming what a failing optimizer looks like)."""

    def run(start: dict, grads: list[dict], rates: list[float]) -> list[dict[str, np.ndarray]]:
        p, t, out = dict(start), 0, []
        m: dict[str, np.ndarray] = {}
        v: dict[str, np.ndarray] = {}
        vmax: dict[str, np.ndarray] = {}
        for rate, g in zip(rates, grads, strict=True):
            for _ in range(repeats):
                t += 1
                for k in p:
                    m[k] = first_moment(m.get(k, 0.0), sign * g[k], betas[0])
                    v[k] = second_moment(v.get(k, 0.0), g[k], betas[1])
                    vmax[k] = np.maximum(vmax.get(k, 0.0), v[k]) if amsgrad else v[k]
                    m_hat = bias_corrected(m[k], betas[0], t) if corrected else m[k]
                    v_hat = bias_corrected(vmax[k], betas[1], t) if corrected else vmax[k]
                    p[k] = p[k] - rate * m_hat / (np.sqrt(v_hat) + eps)
            out.append(dict(p))
        return out

    return run


def _sgd(start: dict, grads: list[dict], rates: list[float]) -> list[dict[str, np.ndarray]]:
    p, out = dict(start), []
    for rate, g in zip(rates, grads, strict=True):
        p = {k: p[k] - rate * g[k] for k in p}
        out.append(p)
    return out


VARIANTS: dict[str, Callable[..., list[dict[str, np.ndarray]]]] = {
    "plain SGD (p - lr g)": _sgd,
    "Adam with maximize=True (it climbs the gradient)": _adam_like(sign=-1.0),
    "Adam with torch's default betas (0.9, 0.999)": _adam_like(betas=(0.9, 0.999)),
    "Adam with torch's default eps 1e-8": _adam_like(eps=1e-8),
    "Adam without the bias corrections": _adam_like(corrected=False),
    "Adam stepping twice per update (a parameter held twice?)": _adam_like(repeats=2),
    "Adam with amsgrad=True": _adam_like(amsgrad=True),
}


def replay(
    start: dict[str, np.ndarray], grads: list[dict], rates: list[float], dtype: str
) -> tuple[list[dict[str, np.ndarray]], list[dict[str, np.ndarray]]]:
    """The oracle's parameters after each update, and each entry's bound after it."""
    p = dict(start)
    m: dict[str, np.ndarray] = {}
    v: dict[str, np.ndarray] = {}
    a: dict[str, np.ndarray] = {}
    bound = {k: np.zeros(np.shape(x)) for k, x in start.items()}
    params, bounds = [], []
    for step, (rate, g) in enumerate(zip(rates, grads, strict=True), start=1):
        p, m, v = oracle.adam_step(p, g, m, v, step, rate)
        a = {k: first_moment(a.get(k, 0.0), np.abs(g[k]), BETAS[0]) for k in p}
        bound = {
            k: oracle.adam_step_bound(a[k], v[k], p[k], step, rate, dtype, prior=bound[k])
            for k in p
        }
        params.append(p)
        bounds.append(bound)
    return params, bounds


def want_move(start: dict, grads: list[dict], rates: list[float], step: int, name: str) -> Any:
    """The oracle's Adam's move of `name` at update `step` (from 1)."""
    params, _ = replay(start, grads, rates, "float64")
    before = params[step - 2][name] if step > 1 else start[name]
    return params[step - 1][name] - before


def looks_like(
    start: dict, grads: list[dict], rates: list[float], got: list[dict], step: int, name: str
) -> str:
    """What the subject's move of `name` by update `step` (from 1) looks like, where cheap to
    tell: a known variant whose replay it follows, no move at all, or weight decay."""
    moved = got[step][name] - got[step - 1][name]
    if not np.any(moved):
        return "it did not move at all: the optimizer does not hold this parameter, or ignores it"
    for what, run in VARIANTS.items():
        theirs = run(start, grads, rates)
        want = theirs[step - 1][name]
        before = theirs[step - 2][name] if step > 1 else start[name]
        tol = 1e-3 * np.abs(want - before) + 1e-6 * np.abs(want)
        if np.all(np.abs(got[step][name] - want) <= tol):
            return f"it moves as {what} would"
    # weight decay, of any kind and size: entries whose gradient has been 0 at every update
    # move (Adam leaves them), each toward 0
    still = np.all([g[name] == 0 for g in grads[:step]], axis=0)
    drift = got[step][name][still] - start[name][still]
    if np.any(drift) and np.all(drift * start[name][still] <= 0):
        return "entries whose gradient was always 0 moved toward 0: it looks like weight decay"
    # the rate: Adam's moves all scaled by one factor
    theirs = got[step][name] - got[step - 1][name]
    ours = want_move(start, grads, rates, step, name)
    big = np.abs(ours) > 1e-3 * np.abs(ours).max(initial=0.0)
    if np.any(big):
        ratio = theirs[big] / ours[big]
        scale = float(np.median(ratio))
        if scale > 0 and np.ptp(ratio) <= 1e-2 * scale:
            rate, theirs_rate = scale * rates[step - 1], rates[step - 1]
            return f"it moves as Adam at rate {rate:.4g}, not its groups' {theirs_rate:.4g}"
    return (
        "it is none of the known variants (SGD, maximize, other betas or eps, no bias "
        "correction, held twice, amsgrad, weight decay)"
    )


def _floats(r: Any, names: set[str], shapes: dict[str, list[int]]) -> list[dict[str, np.ndarray]]:
    """The probe's reply checked: UPDATES + 1 dicts of every parameter by name, in its shape."""
    after = r.get("after") if isinstance(r, dict) else None
    if not isinstance(after, list) or len(after) != UPDATES + 1:
        raise Failure(f"the optimizer's run gave no parameters after each of {UPDATES} updates")
    out = []
    for i, state in enumerate(after):
        if not isinstance(state, dict) or set(state) != names:
            raise Failure(
                f"the model's parameters changed names during the optimizer's run (update {i})"
            )
        arrays = {k: np.asarray(state[k], dtype=np.float64) for k in names}
        for k, x in arrays.items():
            if list(x.shape) != list(shapes[k]):
                raise Failure(f"parameter {k} has shape {list(x.shape)}, expected {shapes[k]}")
        out.append(arrays)
    return out


@law(
    "test_optimizer_is_the_papers_adam",
    "make_optimizer's optimizer moves every parameter as the paper's Adam (betas 0.9, 0.98, eps "
    "1e-9, bias-corrected, no decay) over five updates on the test's gradients at fit's rates",
    timeout=20.0,
)
def check_optimizer_is_the_papers_adam(call: Call) -> None:
    # The paper's Adam (section 5.3) judged by behaviour: from weights and gradients the parent
    # draws, at the rate fit would set in each param group, every parameter after every update
    # is the oracle's Adam's within the per-entry bound of an honest subject's rounding.
    shapes = call("optimizer_parameters", cfg=CFG, seed=SEED)
    if not isinstance(shapes, dict) or not shapes:
        raise Failure("the model has no parameters for an optimizer to update")
    shapes = {str(k): [int(n) for n in v] for k, v in shapes.items()}
    weights = pushed_weights(call, [CFG], "optimizer")[0]
    grads = gradients(shapes, draw_seed("optimizer gradients"))
    rates = [oracle.noam_rate(s, CFG["d_model"], WARMUP) for s in range(UPDATES)]
    r = call("optimizer_steps", cfg=CFG, seed=SEED, weights=weights, grads=grads, rates=rates)
    dtype = r.get("dtype") if isinstance(r, dict) else None
    if dtype not in PRECISIONS:
        raise Failure(f"the optimizer's run did not say its model's dtype ({dtype!r})")
    got = _floats(r, set(shapes), shapes)
    # the parent's own copy of the weights where a parameter is a state_dict entry by name
    # (the model must hold them, make_optimizer having changed nothing); a parameter only a
    # hook's view names starts where the subject says (Adam's update does not read it)
    start = {}
    for name in shapes:
        mine = weights.get(name)
        if mine is not None and np.shape(mine) == tuple(shapes[name]):
            if not np.array_equal(got[0][name], mine):
                diff = float(np.max(np.abs(got[0][name] - mine)))
                raise Failure(
                    f"after make_optimizer the model's {name} is not the weights the test "
                    f"loaded (off by {diff:.3g}): make_optimizer must not change the parameters"
                )
            start[name] = np.asarray(mine, dtype=np.float64)
        else:
            start[name] = got[0][name]
    want, bounds = replay(start, grads, rates, dtype)
    for step in range(1, UPDATES + 1):
        for name in shapes:
            err = np.abs(got[step][name] - want[step - 1][name])
            bad = ~(err <= bounds[step - 1][name])  # NaN fails too
            if not np.any(bad):
                continue
            i = np.unravel_index(int(np.flatnonzero(bad)[0]), bad.shape)
            before = got[step - 1][name][i]
            oracle_before = want[step - 2][name][i] if step > 1 else start[name][i]
            raise Failure(
                f"update {step} of {UPDATES} (rate {rates[step - 1]:.4g}), parameter {name}: "
                f"{int(bad.sum())} of {bad.size} entries are not where the paper's Adam puts "
                f"them; e.g. {name}{list(map(int, i))} with gradient "
                f"{grads[step - 1][name][i]:.3g} moved from {before:.8g} to "
                f"{got[step][name][i]:.8g}, Adam (betas (0.9, 0.98), eps 1e-9) moves it from "
                f"{oracle_before:.8g} to {want[step - 1][name][i]:.8g} (bound "
                f"{bounds[step - 1][name][i]:.2g} in {dtype}); "
                f"{looks_like(start, grads, rates, got, step, name)}"
            )
