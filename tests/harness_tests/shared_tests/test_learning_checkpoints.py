"""The learning run's checkpoints: a probe asks, the parent answers, and the parent's answer
decides when training ends (harness.isolation.child.channel, Worker.request's on_ask)."""

from __future__ import annotations

import numpy as np
import pytest

from harness.engine.run import run_subject, trusted_call
from harness.isolation.worker import WorkerDied
from harness.outcomes import Outcome
from harness.shared_tests.inputs import PAD, batch, config
from harness.shared_tests.record import Test
from harness.subjects import Kind, Subject

# impl with a fit that only calls its callback: a checkpoint costs no training here
COUNTING_FIT = """
from impl.transformer import *  # noqa: F403


def fit(model, src, tgt, steps, batch, pad_id, warmup=4000, factor=1.0, smoothing=0.1,
        lr=None, seed=0, callback=None):
    for step in range(steps):
        if callback is not None:
            callback(step, 0.01, 1.0)
    return [1.0] * steps
"""


@pytest.fixture
def counting(tmp_path) -> Subject:
    path = tmp_path / "counting.py"
    path.write_text(COUNTING_FIT)
    return Subject("counting", Kind.SUBMISSION, path=str(path))


def learn_inputs(steps: int = 50, every: int = 10) -> dict:
    cfg = config(n_enc=1, n_dec=1)
    b = batch(np.random.default_rng(0), cfg, src_lens=[4, 3], tgt_lens=[3, 2])
    tgt = np.concatenate([b["tgt_in"], b["tgt_out"][:, -1:]], axis=1)
    data = {"src": b["src"], "tgt": tgt, "pad_id": PAD}
    checkpoints = {"src": b["src"], "tgt": tgt, "pad_id": PAD, "every": every}
    return {
        "cfg": cfg,
        "data": data,
        "steps": steps,
        "batch": 2,
        "warmup": 4,
        "factor": 1.0,
        "lr": 0.01,
        "checkpoints": checkpoints,
    }


def test_the_parents_answer_ends_training_at_a_checkpoint(counting):
    seen = []

    def on_ask(question):
        seen.append(question["update"])
        assert isinstance(question["own_loss"], float)
        assert "encoder.0.self_attn.q_proj.weight" in question["state_dict"]
        return {"stop": len(seen) == 3}

    with trusted_call(counting) as call:
        r = call("learn", on_ask=on_ask, **learn_inputs())
    assert seen == [10, 20, 30]
    assert r["updates"] == 30 and r["losses"] is None  # ended by the parent, not by fit
    with trusted_call(counting) as call:
        r = call("learn", on_ask=lambda q: {"stop": False}, **learn_inputs(steps=25))
    assert r["updates"] == 25 and r["losses"] == [1.0] * 25  # fit ran to its end


def test_a_question_nobody_may_answer_is_a_protocol_error(counting):
    with trusted_call(counting) as call, pytest.raises(WorkerDied, match="reply is not"):
        call("learn", **learn_inputs())


def test_a_check_that_cannot_answer_kills_the_worker_and_the_next_test_gets_a_fresh_one(
    counting,
):
    def raising(call):
        call("learn", on_ask=lambda q: 1 / 0, **learn_inputs())

    def plain(call):
        assert call("noam_rates", cases=[[0, 16, 4, 1.0]]) == [0.03125]

    tests = [Test("raising", "asks and fails", raising, 30.0), Test("plain", "", plain, 30.0)]
    cells, starts = run_subject(counting, tests, lambda test, cell: None)
    assert cells["raising"].outcome is Outcome.KILLED
    assert "ZeroDivisionError" in cells["raising"].message
    assert cells["plain"].outcome is Outcome.PASSED  # not a worker left waiting for an answer
    assert len(starts) == 2
