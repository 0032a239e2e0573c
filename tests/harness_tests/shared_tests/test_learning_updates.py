"""The learning test's replay of a run's updates (harness/shared_tests/updates.py), in-process on
impl's own fit: its updates hold (every one replayed, every gradient checked), and each kind of
departure fails with its reason: a weight moved other than by Adam's step, a gradient that is
not the loss's, a row that is not a training row."""

from __future__ import annotations

import copy

import numpy as np
import pytest
import torch

import harness.shared_tests.updates as updates
import oracle
from harness.isolation.child.probes.base import tensor_of
from harness.isolation.child.probes.training import _Updates
from harness.shared_tests.inputs import learning_instance, learning_setup, set_draw_secret
from harness.shared_tests.record import Failure
from harness.shared_tests.verdicts import untied_params
from impl import transformer as impl
from oracle.grads import backward, forward_for_grads

STEPS = 20


@pytest.fixture(scope="module")
def run():
    """20 updates of impl's fit from weights it holds, recorded as the learning probe records
    them; the task instance, config and initial weights."""
    set_draw_secret(5)
    setup = learning_setup()
    task = learning_instance(setup, 0)
    torch.manual_seed(0)
    model = impl.Transformer(impl.TransformerConfig(**setup["config"]))
    initial = {k: v.detach().numpy().astype(np.float64) for k, v in model.state_dict().items()}
    r = setup["recipe"]
    with _Updates(model) as recorder:
        impl.fit(
            model, tensor_of(task["data"]["src"]), tensor_of(task["data"]["tgt"]), STEPS,
            r["batch"], 0, lr=r["lr"],
        )  # fmt: skip
    return recorder.take(), task, setup, initial


def judge(shown, task, setup, initial, checks=10):
    replay = updates.Updates(
        initial, task["data"], setup["config"], setup["recipe"]["lr"], np.random.default_rng(0)
    )
    old = updates.SPOT_CHECKS
    updates.SPOT_CHECKS = checks
    try:
        for i in range(0, len(shown["records"]), 10):
            replay.judge({"before": shown["before"], "records": shown["records"][i : i + 10]})
    finally:
        updates.SPOT_CHECKS = old
    return replay


def test_an_honest_fit_holds_at_every_update(run):
    shown, task, setup, initial = run
    replay = judge(shown, task, setup, initial)
    assert replay.step == STEPS
    assert replay.checked == ["oracle"] * STEPS  # the exact check, never the fallback


def test_a_weight_moved_other_than_by_adam_fails(run):
    shown, task, setup, initial = run
    tampered = copy.deepcopy(shown)
    name = sorted(tampered["records"][3]["after"])[0]
    tampered["records"][3]["after"][name].flat[0] += 1e-4  # ~ a fortieth of one update
    with pytest.raises(Failure, match="update 4 is not Adam's step"):
        judge(tampered, task, setup, initial, checks=0)


def test_a_gradient_that_is_not_the_losss_fails_where_checked(run):
    shown, task, setup, initial = run
    tampered = copy.deepcopy(shown)
    record = tampered["records"][0]
    record["grads"] = {k: -g for k, g in record["grads"].items()}  # uphill, consistently
    # the replay alone cannot tell (Adam stepped on what it read); the weights it then reached
    # are checked with the gradient they were made with
    adam = updates.Updates(
        initial, task["data"], setup["config"], setup["recipe"]["lr"], np.random.default_rng(0)
    )
    adam.judge({"before": tampered["before"], "records": []})
    want, _, _ = oracle.adam_step(
        adam.weights, {k: np.asarray(g, np.float64) for k, g in record["grads"].items()},
        {}, {}, 1, setup["recipe"]["lr"],
    )  # fmt: skip
    record["after"] = {k: want[k].astype(np.float32) for k in want}
    with pytest.raises(updates.NotTheLossGradient, match="update 1 .checked at random."):
        adam.judge({"records": tampered["records"][:1]})


def test_a_row_that_is_not_a_training_row_fails(run):
    shown, task, setup, initial = run
    tampered = copy.deepcopy(shown)
    batch = tampered["records"][0]["batches"][0]
    batch["src"][0] = task["test_src"][0]
    with pytest.raises(Failure, match="update 1 trained on a row that is not one of the training"):
        judge(tampered, task, setup, initial, checks=0)


def test_fit_must_start_from_the_weights_loaded(run):
    shown, task, setup, initial = run
    moved = {k: v + (k == sorted(initial)[0]) for k, v in initial.items()}
    with pytest.raises(Failure, match="did not start from the weights loaded"):
        judge(shown, task, setup, moved, checks=0)


@pytest.fixture(scope="module")
def kinked(run):
    """One training batch and weights with a relu kink planted in it: encoder.0.linear1's bias
    moved so that one unit's input at one real position is 1e-9 of its accumulation above 0 in
    float64 (a float32 forward may put it either side); the oracle's gradient of that batch with
    the unit on the other side (what an honest float32 fit computes when it lands there), and
    that kink's flow alone. The loss is summed, not averaged: the contract's times the count of
    real targets."""
    shown, task, setup, initial = run
    cfg = setup["config"]
    replay = updates.Updates(
        initial, task["data"], cfg, setup["recipe"]["lr"], np.random.default_rng(0)
    )
    batch = {k: np.asarray(v) for k, v in shown["records"][0]["batches"][0].items()}
    rows = [replay.training_rows(batch)]
    src, tgt_in = batch["src"].astype(np.int64), batch["tgt_in"].astype(np.int64)
    tgt_out = replay.tgt[rows[0], 1:]
    weights = {k: v.copy() for k, v in initial.items()}
    params, _ = untied_params(weights, cfg, "the planted weights")
    _, _, _, enc, _ = forward_for_grads(params, src, tgt_in, tgt_out, src != 0, tgt_in != 0, 0.1, 0)
    ff = enc["layers"][0]["ff"]["sublayer"]
    unit, (row, t) = 5, np.argwhere(src != 0)[3]
    w, b = weights["encoder.0.linear1.weight"], weights["encoder.0.linear1.bias"]
    scale = np.abs(ff["x"][row, t]) @ np.abs(w[unit]) + abs(b[unit])
    b[unit] += 1e-9 * scale - ff["h1"][row, t, unit]
    params, stands = untied_params(weights, cfg, "the planted weights")
    _, _, dz, enc, dec = forward_for_grads(
        params, src, tgt_in, tgt_out, src != 0, tgt_in != 0, 0.1, 0
    )
    dz = dz * int((tgt_out != 0).sum())  # a summed loss: the same gradient, scaled
    kink = ("encoder", 0, int(row), int(t), unit)
    assert kink in updates._kinks(params, enc, dec, src, tgt_in)
    # under the subject's names: a tied table's gradient is the sum over its uses
    zeros = {k: np.zeros_like(v) for k, v in weights.items()}
    shared = updates._groups(weights, zeros)
    plain = updates._by_key(backward(params, dz, enc, dec)[0], stands, shared, zeros)
    flow = updates._by_key(
        updates._kink_flow(params, kink, src, tgt_in, tgt_out, dz), stands, shared, zeros
    )
    record = {"batches": [{**batch, "dlogits": dz}]}
    return weights, plain, flow, record, rows, replay


def test_a_relu_on_the_other_side_of_its_kink_is_the_loss_gradient(kinked):
    """An honest gradient whose relu input sat within rounding of 0 and went the other way holds
    the exact check, under any positive scale (here a summed loss, which the fallback's norm
    limit would refuse): the charge of a fault cannot depend on where a draw puts a kink."""
    weights, plain, flow, record, rows, replay = kinked
    grads = {k: plain[k] + flow[k] for k in plain}
    # the kink moves linear1's gradient by several times the tolerance's floor
    largest = np.abs(plain["encoder.0.linear1.weight"]).max()
    assert np.abs(flow["encoder.0.linear1.weight"]).max() > 3 * updates.GRAD_FLOOR * largest
    assert updates.check_gradient(weights, grads, record, rows, replay).startswith("oracle (")
    assert updates.check_gradient(weights, plain, record, rows, replay) == "oracle"
    old = updates.MAX_KINKS
    updates.MAX_KINKS = 0  # without the kink's freedom, the same gradient is refused
    try:
        with pytest.raises(updates.NotTheLossGradient, match="norm 2"):
            updates.check_gradient(weights, grads, record, rows, replay)
    finally:
        updates.MAX_KINKS = old


def test_a_kinks_flow_is_free_only_once(kinked):
    """The freedom is the kink's side, nothing more: its flow taken five times is refused."""
    weights, plain, flow, record, rows, replay = kinked
    grads = {k: plain[k] + 5 * flow[k] for k in plain}
    with pytest.raises(updates.NotTheLossGradient):
        updates.check_gradient(weights, grads, record, rows, replay)


def test_the_fallbacks_norm_limit_is_the_largest_true_gradient_met(kinked):
    """Late in a run the true gradient is small and a dropout model's is not (c01 met 5.88 times
    its update's own): the fallback's norm limit is FALLBACK_NORM times the largest true gradient
    among the run's checks, which at a run's first check is its own."""
    weights, plain, flow, record, rows, replay = kinked
    grads = {k: plain[k] + flow[k] for k in plain}  # a summed loss: ~270 times the contract's
    old, before = updates.MAX_KINKS, replay.largest
    updates.MAX_KINKS = 0  # the kink's side not free: the fallback decides
    try:
        replay.largest = 0.0  # the run's first check
        with pytest.raises(updates.NotTheLossGradient, match="norm 2.. times the largest"):
            updates.check_gradient(weights, grads, record, rows, replay)
        own = replay.largest  # the oracle's gradient's norm at this update
        ratio = np.sqrt(sum(float((g**2).sum()) for g in grads.values())) / own
        replay.largest = ratio / updates.FALLBACK_NORM * own * 1.01  # an earlier, larger one
        assert updates.check_gradient(weights, grads, record, rows, replay).startswith("close")
        replay.largest = ratio / updates.FALLBACK_NORM * own * 0.99
        with pytest.raises(updates.NotTheLossGradient, match="at most 4.0 needed"):
            updates.check_gradient(weights, grads, record, rows, replay)
    finally:
        updates.MAX_KINKS, replay.largest = old, before


def test_groups_are_the_pairs_whose_weights_and_gradients_are_equal():
    # _groups buckets by a value key before comparing; its groups must be exactly those of
    # comparing every pair: a tied table under two names, equal values in float32 and float64,
    # -0.0 beside 0.0 (equal), equal weights with different gradients (apart), a NaN (equal to
    # nothing, itself included), and a shape apart
    rng = np.random.default_rng(0)
    table = rng.normal(size=(4, 3))
    w = {
        "a": table,
        "b": table.copy(),
        "c": table.astype(np.float32).astype(np.float64),
        "d": table.astype(np.float32),
        "z0": np.zeros(3),
        "z1": -np.zeros(3),
        "n": np.array([np.nan, 1.0, 2.0]),
        "row": table[:1].copy(),
    }
    g = {k: np.ones(np.shape(v)) for k, v in w.items()}
    g["b"] = g["b"] * 2

    def pairwise(k: str) -> list[str]:
        return [
            j
            for j in sorted(w)
            if w[j].shape == w[k].shape
            and np.array_equal(w[j], w[k])
            and np.array_equal(g[j], g[k])
        ]

    got = updates._groups(w, g)
    assert got == {k: pairwise(k) for k in sorted(w)}
    assert got["a"] == ["a"] and got["c"] == ["c", "d"] and got["z0"] == ["z0", "z1"]
    assert got["n"] == []


def test_one_blas_thread_gives_the_count_back_when_threads_overlap(monkeypatch):
    """Two replays check gradients at once (learning runs judged side by side): the first to
    enter saves the count, the last to leave restores it, so BLAS never stays on one thread (it
    did when each restored what it had read: the second read the first's 1)."""
    import threading

    count = [8]
    set_n = lambda n: count.__setitem__(0, n)  # noqa: E731
    monkeypatch.setattr(updates, "_BLAS", (set_n, lambda: count[0]))
    first_in, second_in, first_out = threading.Event(), threading.Event(), threading.Event()
    seen: list[int] = []

    def first() -> None:
        with updates.one_blas_thread():
            first_in.set()
            second_in.wait(5)
            seen.append(count[0])
        first_out.set()

    def second() -> None:
        first_in.wait(5)
        with updates.one_blas_thread():
            second_in.set()
            first_out.wait(5)
            seen.append(count[0])  # the first has left: still one thread while this one is in

    threads = [threading.Thread(target=f) for f in (first, second)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(10)
    assert seen == [1, 1] and count[0] == 8
