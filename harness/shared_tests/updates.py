"""The parent's check of a learning run's updates: the weights the learning test judges must have
come from Adam steps on the parent's training rows, from the parent's initial weights.

The learning probe records every update of fit from outside it (torch's global optimizer step
hooks and a forward hook on the model) and shows the parent, at each checkpoint, what each update
was made of: the rows of its training-mode forward passes with dL/dlogits, the gradients the step
read and the weights after it. The parent (`Updates.judge`)

- maps every row back to a training row of its own instance (src and tgt_in both): no update may
  read a row the parent did not give fit for training;
- replays every update with the oracle's Adam (`oracle.adam_step`, the recipe's rate, Adam's
  moments from its own replay since the first update) from the weights before it (the parent's
  own initial weights for the first; the subject's weights after the previous update for each
  later one, so float32 rounding cannot accumulate), and the weights after it must lie within
  `oracle.adam_step_bound` of the replay;
- at secretly drawn updates (SPOT_CHECKS of every segment between two checkpoints, drawn only
  once the segment's records are in), checks the gradient itself against the oracle on the
  weights before the update and its rows (`check_gradient`).
"""

from __future__ import annotations

import ctypes
import glob
import os
import queue
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import numpy as np

import oracle
import oracle.optim
from harness.shared_tests.inputs import PAD
from harness.shared_tests.record import Failure
from harness.shared_tests.verdicts import untied_params, unwrapped
from oracle.grads import backward, forward_for_grads

BETAS, ADAM_EPS = (0.9, 0.98), 1e-9
# Updates whose gradient is checked against the oracle's, of every LEARN_CHECK_EVERY: drawn by
# the parent after the segment's records arrived, so the subject cannot know which. A fit whose
# gradient is not the loss's at f of a segment's 10 updates passes that segment's check with
# probability C(10 - f, k) / C(10, k) (k = SPOT_CHECKS): 0.6 for f = 1, 1/3 for f = 2, 0 for
# f >= 7; F such updates one per segment pass with 0.6^F (0.006 for F = 10). A check costs an
# oracle forward and backward on the update's rows (17 ms on one thread): 4 of 10 keep the
# learning test's cost within a fifth of what it was.
SPOT_CHECKS = 4
# The weights after each update lie within oracle.adam_step_bound of the replay's (the derived
# bound of torch's Adam computing in float32 from the same weights and gradients, its moments'
# rounding accumulated since the first update; a float64 subject is held to the same, looser,
# bound), re-anchored on the subject's weights after every update (prior 0).
BOUND_DTYPE = "float32"
# How far a checked gradient may lie from the oracle's backward pass of the subject's own
# dL/dlogits on the same weights and rows, per entry: GRAD_REL of the entry plus GRAD_FLOOR of
# its tensor's largest. Honest float32 gradients of this model lie within ~1e-6 of the tensor's
# largest entry (impl's first update: at most 1.2e-7 off, against entries up to 0.5; every
# checked update of impl, the torch copy, the real-world bases and the mutants whose forward is
# the oracle's holds); a gradient that steers Adam must flip or scale entries by their own size.
# GRAD_GLOBAL of the largest entry of all is the floor of every tensor: a gradient that is 0 by
# the algebra (the key biases: softmax ignores a shift) is a rounding residue of ~1e-9 there.
GRAD_REL, GRAD_FLOOR, GRAD_GLOBAL = 1e-2, 1e-3, 1e-5
# A relu whose input lies within rounding of 0 may go either way in float32, and its side decides
# whether the gradient flows through that unit at that position: the subject's honest gradient
# then differs from the oracle's float64 one by the whole flow (measured at draw 4, update 23 of
# the learning run: encoder.0.linear1's input at one position was 8.7e-9 of its accumulation
# sum |W||x| + |b| in float64, impl's own float32 forward put it on the other side, and linear1's
# gradient moved by 0.4% of its largest entry, three times GRAD_FLOOR). Each such kink, an input
# within KINK_BAND of its accumulation (the float32 forward lies within 3.4e-7 of it there, over
# both layers' 82k inputs: 300 times that), is a free choice of the check (`_within`): taken or
# not, or between. More than MAX_KINKS in one update leaves the exact check to the fallback.
KINK_BAND, MAX_KINKS = 1e-4, 64
# dL/dlogits of a label-smoothed cross-entropy is w (softmax(z) - (1 - e) onehot(t) - e / V) at
# every position it counts: DLOGITS_TOL of w per entry (float32 logits move softmax by ~1e-6).
DLOGITS_TOL = 1e-3
MAX_SMOOTHING = 0.5


def _openblas() -> tuple[Any, Any] | None:
    """numpy's scipy-openblas (set, get) thread-count functions, through its own C API (what
    threadpoolctl does; harness/tools/bench.py's blas_threads); None for another BLAS."""
    libs = os.path.join(os.path.dirname(np.__file__), os.pardir, "numpy.libs")
    for path in glob.glob(os.path.join(libs, "libscipy_openblas*")):
        lib = ctypes.CDLL(path, mode=os.RTLD_NOLOAD)
        for suffix in ("64_", ""):
            set_n = getattr(lib, f"scipy_openblas_set_num_threads{suffix}", None)
            get_n = getattr(lib, f"scipy_openblas_get_num_threads{suffix}", None)
            if set_n is not None and get_n is not None:
                return set_n, get_n
    return None


_BLAS = _openblas()
# OpenBLAS's thread count is the process's: the threads inside one_blas_thread at once (learning
# runs judged side by side, one replay thread each) share one setting, saved by the first to enter
# and given back by the last to leave ([threads inside, the count before])
_BLAS_HELD: list[int] = [0, 0]
_BLAS_LOCK = threading.Lock()


@contextmanager
def one_blas_thread() -> Iterator[None]:
    """numpy's BLAS on one thread while the oracle checks a gradient: its matrices here are 32 to
    128 wide, where OpenBLAS's threads only wait on each other (measured on a loaded 2-core
    machine: 270 ms per check with its default threads, 17 ms on one). Safe across threads: the
    count before the first of them entered is restored when the last leaves."""
    if _BLAS is None:
        yield
        return
    set_n, get_n = _BLAS
    with _BLAS_LOCK:
        if _BLAS_HELD[0] == 0:
            _BLAS_HELD[1] = int(get_n())
            set_n(1)
        _BLAS_HELD[0] += 1
    try:
        yield
    finally:
        with _BLAS_LOCK:
            _BLAS_HELD[0] -= 1
            if _BLAS_HELD[0] == 0:
                set_n(_BLAS_HELD[1])


class NotTheLossGradient(Failure):
    """A checked update's gradient is not its loss's (a forward fault makes one: the learning
    test then says whose charge it is, `trained_forward_first`)."""


class Updates:
    """The replay of one learning run's updates, fed segment by segment (`judge`)."""

    def __init__(
        self,
        initial: dict[str, np.ndarray],
        data: dict[str, Any],
        cfg: dict[str, Any],
        rate: Any,
        rng: np.random.Generator,
    ) -> None:
        self.initial = {k: np.asarray(v, dtype=np.float64) for k, v in initial.items()}
        self.cfg, self.rate, self.rng = cfg, rate, rng
        self.src, self.tgt = np.asarray(data["src"]), np.asarray(data["tgt"])
        self.rows = {row.tobytes(): i for i, row in enumerate(self.src.astype(np.int64))}
        self.weights: dict[str, np.ndarray] | None = None  # the subject's after the last update
        # flat over the names in sorted order: the weights, Adam's moments, and the average of
        # |g| the rounding bound reads
        self.keys: list[str] = []
        self.ends = np.zeros(0, dtype=np.int64)
        self.flat = self.m = self.v = self.m_abs = np.zeros(0)
        self.step = 0
        self.shown: Any = None
        self.checked: list[str] = []  # how each spot-checked gradient held ("oracle" / "close")
        self.largest = 0.0  # the largest norm of the oracle's gradient the fallback has met

    # --- rows --------------------------------------------------------------------------------
    def training_rows(self, batch: dict[str, Any]) -> np.ndarray:
        """The training-row index of every row of one forward pass; a row that is not one of the
        parent's training rows fails."""
        src = np.asarray(batch["src"])
        tgt_in = np.asarray(batch["tgt_in"])
        if src.ndim != 2 or tgt_in.ndim != 2 or len(src) != len(tgt_in) or not len(src):
            raise Failure(
                f"update {self.step}: a forward pass of shapes {src.shape}, {tgt_in.shape}"
            )
        found = []
        for s, t in zip(src.astype(np.int64), tgt_in.astype(np.int64), strict=True):
            i = self.rows.get(s.tobytes())
            want = None if i is None else self.tgt[i, :-1]
            if want is None or want.shape != t.shape or not np.array_equal(want, t):
                raise Failure(
                    f"update {self.step} trained on a row that is not one of the training rows "
                    f"fit was given (src {s.tolist()}, tgt_in {t.tolist()}): fit must learn from "
                    "its data"
                )
            found.append(i)
        return np.asarray(found)

    # --- the replay --------------------------------------------------------------------------
    def judge(self, shown: Any) -> None:
        """Check one segment's updates (the probe's `_Updates.take()`); Failure on the first that
        is not an Adam step from the weights before it, on training rows, whose gradient (where
        drawn) is the loss's."""
        if not isinstance(shown, dict) or not isinstance(shown.get("records"), list):
            raise Failure("the learning run's updates could not be read back")
        records = shown["records"]
        if records and isinstance(records[-1], dict):
            self.shown = records[-1].get("after")  # the weights the model holds now
        if self.weights is None:
            before = shown.get("before")
            if not isinstance(before, dict) or set(before) != set(self.initial):
                raise Failure(
                    "the first update's weights are not under the names the parent's weights were "
                    "loaded by: fit's updates cannot be followed"
                )
            for k, w in self.initial.items():
                if np.shape(before[k]) != w.shape or not np.array_equal(before[k], w):
                    raise Failure(f"fit's first update did not start from the weights loaded ({k})")
            self.weights = dict(self.initial)
            self.keys = sorted(self.weights)
            self.ends = np.cumsum([self.weights[k].size for k in self.keys])
            self.flat = np.concatenate([self.weights[k].ravel() for k in self.keys])
            self.m, self.v, self.m_abs = (np.zeros_like(self.flat) for _ in range(3))
        draws = set(self.rng.permutation(len(records))[:SPOT_CHECKS].tolist())
        for i, record in enumerate(records):
            before = self.weights
            self.step += 1
            rows = [self.training_rows(b) for b in record.get("batches") or []]
            if not rows:
                raise Failure(
                    f"update {self.step} read no training-mode forward pass of fit's data"
                )
            grads = self._replay(record)
            if i in draws:
                with one_blas_thread():
                    self.checked.append(check_gradient(before, grads, record, rows, self))

    def _replay(self, record: dict[str, Any]) -> dict[str, np.ndarray]:
        """Replay one update from the weights before it (flat over every name: one Adam step on
        one vector); the weights after it must lie within the rounding bound. Its gradients."""
        assert self.weights is not None
        grads, after = record.get("grads"), record.get("after")
        if not (isinstance(grads, dict) and isinstance(after, dict)) or not (
            set(grads) == set(self.weights) == set(after)
        ):
            raise Failure(f"update {self.step}: its gradients or weights are not under the names")
        g = {k: np.asarray(grads[k], dtype=np.float64) for k in self.keys}
        for k in self.keys:
            if g[k].shape != self.weights[k].shape or np.shape(after[k]) != self.weights[k].shape:
                raise Failure(f"update {self.step}: {k} changed shape")
        flat_g = np.concatenate([g[k].ravel() for k in self.keys])
        new = np.concatenate([np.asarray(after[k], dtype=np.float64).ravel() for k in self.keys])
        rate = self.rate(self.step - 1) if callable(self.rate) else float(self.rate)
        stepped, m, v = oracle.adam_step(
            {"w": self.flat}, {"w": flat_g}, {"w": self.m}, {"w": self.v}, self.step, rate,
            betas=BETAS, eps=ADAM_EPS,
        )  # fmt: skip
        want, self.m, self.v = stepped["w"], m["w"], v["w"]
        self.m_abs = oracle.optim.first_moment(self.m_abs, np.abs(flat_g), BETAS[0])
        bound = oracle.adam_step_bound(
            self.m_abs, self.v, want, self.step, rate, BOUND_DTYPE, betas=BETAS, eps=ADAM_EPS
        )
        off = np.abs(new - want)
        if not np.all(off <= bound):  # NaN fails too
            j = int(np.argmax(np.where(off <= bound, -1.0, np.nan_to_num(off, nan=np.inf))))
            at = int(np.searchsorted(self.ends, j, side="right"))
            k = self.keys[at]
            i = np.unravel_index(
                j - int(self.ends[at]) + self.weights[k].size, self.weights[k].shape
            )
            raise Failure(
                f"update {self.step} is not Adam's step on the gradients it read: {k}"
                f"{[int(x) for x in i]} moved to {new[j]:.7g}, Adam's step from the weights "
                f"before it gives {want[j]:.7g} (within {bound[j]:.2g}): the weights fit ends "
                "with must come from its updates"
            )
        self.flat = new
        self.weights = {
            k: new[e - self.weights[k].size : e].reshape(self.weights[k].shape)
            for k, e in zip(self.keys, self.ends, strict=True)
        }
        return g


class Behind:
    """`Updates.judge` on a thread of its own, segment by segment in the order given, so that the
    worker's checkpoint is answered at once and the subject trains while the parent replays (the
    worker used to wait for every segment's replay and spot checks: a fifth of the learning
    test's time). The verdict is the one judging in line gives: every segment up to the run's
    end or the checkpoint where it stops is judged, in order, with the same secret draws; the
    first failure is kept and nothing after it is judged; a weight the parent reads (the loss at
    a checkpoint, the trained weights) is read only once the replay has caught up (`settle`)."""

    def __init__(self, run: Updates) -> None:
        self.run = run
        self.failure: Exception | None = None  # the first segment that did not hold
        self._queue: queue.Queue[tuple[int, Any] | None] = queue.Queue()
        self._thread = threading.Thread(target=self._judge, name="learning-replay", daemon=True)
        self._thread.start()

    def put(self, update: int, shown: Any) -> None:
        """Judge `shown`, the segment that ends at checkpoint `update`, after those put before."""
        self._queue.put((update, shown))

    def settle(self) -> Exception | None:
        """Wait until every segment put so far is judged; the first failure, if any."""
        self._queue.join()
        return self.failure

    def close(self) -> None:
        self._queue.put(None)
        self._thread.join()

    def _judge(self) -> None:
        while True:
            item = self._queue.get()
            try:
                if item is None:
                    return
                if self.failure is None:
                    self._segment(*item)
            except Exception as e:  # kept for the verdict; the thread goes on answering settle
                self.failure = e
            finally:
                self._queue.task_done()

    def _segment(self, update: int, shown: Any) -> None:
        self.run.judge(shown)
        if self.run.step != update:
            raise Failure(
                f"fit's callback counted {update} updates where the optimizer made {self.run.step}"
            )


def check_gradient(
    weights: dict[str, np.ndarray],
    grads: dict[str, np.ndarray],
    record: dict[str, Any],
    rows: list[np.ndarray],
    run: Updates,
) -> str:
    """One drawn update's gradient against the oracle on the weights before it and its rows.

    Held exactly ("oracle") when the gradient is the oracle's backward pass of the update's own
    dL/dlogits, up to one positive factor (a clipped gradient), and that dL/dlogits is a
    label-smoothed cross-entropy's of the oracle's logits on the rows' own targets (one weight
    and one smoothing for every position it counts, every real target counted: the contract's
    loss, or one that also counts pad targets). A model whose training-mode forward pass is not
    the oracle's cannot hold it (dropout left on: c01; the golden and dropout tests charge it):
    its gradient must then be close ("close": a descent direction of the oracle's gradient of
    the contract's loss, its norm at most FALLBACK_NORM times the largest of that gradient's
    among the run's checks, `run.largest`)."""
    cfg = run.cfg
    # names under a wrapper module ('transformer.encoder.0...') read as the oracle's, as the
    # weights are read (a wrapper is the names test's charge, never the learning test's)
    weights, grads = unwrapped(dict(weights)), unwrapped(dict(grads))
    batches = record["batches"]
    src = np.concatenate([np.asarray(b["src"], dtype=np.int64) for b in batches])
    tgt_in = np.concatenate([np.asarray(b["tgt_in"], dtype=np.int64) for b in batches])
    dz = np.concatenate([np.asarray(b["dlogits"], dtype=np.float64) for b in batches])
    tgt_out = run.tgt[np.concatenate(rows), 1:]
    params, stands = untied_params(weights, cfg, f"the weights before update {run.step}")
    z, _, dz_star, enc, dec = forward_for_grads(
        params, src, tgt_in, tgt_out, src != PAD, tgt_in != PAD, 0.1, PAD
    )
    shared = _groups(weights, grads)
    if dz.shape == z.shape and np.all(np.isfinite(dz)) and _loss_gradient(z, dz, tgt_out):
        kinks = _kinks(params, enc, dec, src, tgt_in)
        own, _ = backward(params, dz, enc, dec)
        want = _by_key(own, stands, shared, grads)
        if _within(grads, want):
            return "oracle"
        if 0 < len(kinks) <= MAX_KINKS:
            batch = (src, tgt_in, tgt_out, dz)
            flows = [_by_key(_kink_flow(params, k, *batch), stands, shared, grads) for k in kinks]
            if _within(grads, want, flows):
                return f"oracle ({len(kinks)} relu kinks free)"
    enc, dec = forward_for_grads(params, src, tgt_in, tgt_out, src != PAD, tgt_in != PAD, 0.1, PAD)[
        3:
    ]
    star, _ = backward(params, dz_star, enc, dec)
    want = _by_key(star, stands, shared, grads)
    keys = sorted(grads)
    got_v = np.concatenate([grads[k].ravel() for k in keys])
    want_v = np.concatenate([want[k].ravel() for k in keys])
    norm_g, norm_w = float(np.linalg.norm(got_v)), float(np.linalg.norm(want_v))
    cos = float(got_v @ want_v) / (norm_g * norm_w) if norm_g and norm_w else 0.0
    run.largest = reference = max(run.largest, norm_w)  # this one's at the run's first check
    if cos > FALLBACK_COS and norm_g <= FALLBACK_NORM * reference:
        return f"close (cosine {cos:.3f}, norm {norm_g / reference:.3f} of the largest)"
    raise NotTheLossGradient(
        f"update {run.step} (checked at random) read gradients that are not the loss's on its "
        f"rows at its weights: neither the oracle's backward pass of its own dL/dlogits nor "
        f"near the oracle's gradient (cosine {cos:.3f}, norm {norm_g / max(reference, 1e-300):.3g} "
        f"times the largest of the run's checks so far; above {FALLBACK_COS} and at most "
        f"{FALLBACK_NORM} needed): fit's weights must come from the gradients of its data"
    )


# The weaker check, for a model whose training-mode forward pass is not the oracle's (the only
# one met: attention dropout at a fixed rate of 0.1 with the config's 0, c01): the gradient must
# be a descent direction of the oracle's loss on the rows (a positive cosine) and its norm at
# most FALLBACK_NORM times the largest norm of the oracle's gradient among the run's checks so
# far, this one's included (no spike that fills Adam's moments; a loss scaled by more than
# FALLBACK_NORM fails at the run's first check, where the two are one). Not this update's own
# norm: as the loss falls, the true gradient shrinks and dropout's noise does not. With every
# update checked, c01's norm reached 4.98 times its own update's (2 to 5 at 40 draws, over 4 at
# 3 of them; CI met 5.88 at update 218 of a random draw) and 0.93-1.14 times the largest so far
# (28 draws); its cosine fell as low as 0.056 (draw 29).
FALLBACK_COS, FALLBACK_NORM = 0.0, 4.0


def _groups(weights: dict[str, np.ndarray], grads: dict[str, np.ndarray]) -> dict[str, list[str]]:
    """Names whose weights and gradients are the same tensor's (a tied table listed under each of
    its names): the subject's gradient of each is the sum of the oracle's over the group."""
    keys = sorted(weights)
    # candidates first: equal values have equal float64 bytes once -0.0 is 0.0 (+ 0.0 makes it
    # so), whatever the dtype; array_equal then decides, as on every pair, in ~1/30 of the time
    # (every pair cost 0.4 s of the parent's 2 s per learning run)
    place = {
        k: (
            np.shape(weights[k]),
            hash((np.asarray(weights[k], dtype=np.float64) + 0.0).tobytes()),
            np.shape(grads[k]),
        )
        for k in keys
    }
    bucket: dict[tuple, list[str]] = {}
    for k in keys:
        bucket.setdefault(place[k], []).append(k)
    out: dict[str, list[str]] = {}
    for k in keys:
        out[k] = [
            j
            for j in bucket[place[k]]
            if np.array_equal(weights[j], weights[k]) and np.array_equal(grads[j], grads[k])
        ]
    return out


def _by_key(
    oracle_grads: dict[str, np.ndarray],
    stands: dict[str, str],
    shared: dict[str, list[str]],
    grads: dict[str, np.ndarray],
) -> dict[str, np.ndarray]:
    """The oracle's gradient for each of the subject's names: a name's own use plus those its
    table stands for, summed over the names that are one tensor."""
    uses: dict[str, list[str]] = {k: [k] for k in grads}
    for table, listed in stands.items():
        uses.setdefault(listed, [listed]).append(table)
    out = {}
    for k in grads:
        total = np.zeros(np.shape(grads[k]))
        for j in shared.get(k, [k]):
            for name in uses.get(j, [j]):
                if name in oracle_grads and np.shape(oracle_grads[name]) == total.shape:
                    total = total + oracle_grads[name]
        out[k] = total
    return out


def _within(
    grads: dict[str, np.ndarray],
    want: dict[str, np.ndarray],
    flows: list[dict[str, np.ndarray]] | None = None,
) -> bool:
    """grads is s (want + sum_i c_i flows_i) within GRAD_REL and the floors, for one s > 0 (a
    clipped gradient) and each c_i in [0, 1] (a relu kink taken, or not: `_kink_flow`)."""
    keys = sorted(grads)

    def flat(d: dict[str, np.ndarray]) -> np.ndarray:
        return np.concatenate([np.asarray(d[k], dtype=np.float64).ravel() for k in keys])

    got_v, want_v = flat(grads), flat(want)
    if not np.all(np.isfinite(got_v)):
        return False
    if flows:
        # the least-squares s and s c_i, each c_i then held to [0, 1] and s refitted
        basis = np.stack([want_v] + [flat(f) for f in flows], axis=1)
        coef = np.linalg.lstsq(basis, got_v, rcond=None)[0]
        if not coef[0] > 0:
            return False
        c = np.clip(coef[1:] / coef[0], 0.0, 1.0)
        want_v = want_v + basis[:, 1:] @ c
    denom = float(want_v @ want_v)
    if not denom:
        return False
    s = float(got_v @ want_v) / denom  # one positive factor: a clipped gradient
    if not s > 0:
        return False
    w_v = s * want_v
    floor = GRAD_GLOBAL * float(np.abs(w_v).max())
    at = 0
    for k in keys:
        w = w_v[at : at + grads[k].size].reshape(np.shape(grads[k]))
        at += grads[k].size
        tol = GRAD_REL * np.abs(w) + GRAD_FLOOR * np.abs(w).max(initial=0) + floor
        if not np.all(np.abs(grads[k] - w) <= tol):
            return False
    return True


def _kinks(params: Any, enc: Any, dec: Any, src: np.ndarray, tgt_in: np.ndarray) -> list[tuple]:
    """Every relu input at a real position within KINK_BAND of its accumulation |x| |W1|^T + |b1|
    (side, layer, row, position, unit), from the forward caches before the backward frees them."""
    if params.spec.activation != "relu":
        return []
    found = []
    for side, cache, ids in (("encoder", enc, src), ("decoder", dec, tgt_in)):
        for layer, c in enumerate(cache["layers"]):
            ff = c["ff"]["sublayer"]
            w = params.arrays[f"{side}.{layer}.linear1.weight"]
            b = params.arrays[f"{side}.{layer}.linear1.bias"]
            scale = np.abs(ff["x"]) @ np.abs(w).T + np.abs(b)
            near = (np.abs(ff["h1"]) <= KINK_BAND * scale) & (ids != PAD)[..., None]
            found += [(side, layer, *map(int, i)) for i in np.argwhere(near)]
    return found


def _kink_flow(
    params: Any,
    kink: tuple,
    src: np.ndarray,
    tgt_in: np.ndarray,
    tgt_out: np.ndarray,
    dz: np.ndarray,
) -> dict[str, np.ndarray]:
    """How the oracle's gradient of dz changes when one relu kink goes to its other side: the
    backward pass of the kink's row alone, with the unit's input negated, less without."""
    side, layer, row, t, unit = kink
    at = slice(row, row + 1)

    def grads(flip: bool) -> dict[str, np.ndarray]:
        _, _, _, enc, dec = forward_for_grads(
            params, src[at], tgt_in[at], tgt_out[at], src[at] != PAD, tgt_in[at] != PAD, 0.1, PAD
        )
        if flip:  # relu's backward reads the side of its input
            h1 = (enc if side == "encoder" else dec)["layers"][layer]["ff"]["sublayer"]["h1"]
            h1[0, t, unit] = -h1[0, t, unit] if h1[0, t, unit] else np.finfo(np.float64).tiny
        return backward(params, dz[at], enc, dec)[0]

    flipped, plain = grads(True), grads(False)
    return {k: flipped[k] - plain[k] for k in plain}


def _loss_gradient(z: np.ndarray, dz: np.ndarray, tgt_out: np.ndarray) -> bool:
    """dz = w (softmax(z) - (1 - e) onehot(t) - e / V) at every counted position, one w > 0 and
    one e in [0, MAX_SMOOTHING] for all, every real target counted, pad targets all or none."""
    V = z.shape[-1]
    p = np.exp(z - z.max(axis=-1, keepdims=True))
    p /= p.sum(axis=-1, keepdims=True)
    onehot = np.zeros_like(p)
    np.put_along_axis(onehot, tgt_out[..., None], 1.0, axis=-1)
    real = tgt_out != PAD
    # dz = a (p - onehot) + b (onehot - 1/V), a = w, b = w e: least squares on the real rows
    x1, x2 = (p - onehot)[real].ravel(), (onehot - 1.0 / V)[real].ravel()
    a, b = np.linalg.lstsq(np.stack([x1, x2], axis=1), dz[real].ravel(), rcond=None)[0]
    if not (a > 0 and -DLOGITS_TOL * a <= b <= MAX_SMOOTHING * a):
        return False
    fit = a * (p - onehot) + b * (onehot - 1.0 / V)
    tol = DLOGITS_TOL * a
    if not np.all(np.abs(dz[real] - fit[real]) <= tol):
        return False
    pads = dz[~real]
    return bool(np.all(np.abs(pads) <= tol) or np.all(np.abs(pads - fit[~real]) <= tol))
