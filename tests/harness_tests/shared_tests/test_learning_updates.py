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
from impl import transformer as impl

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
