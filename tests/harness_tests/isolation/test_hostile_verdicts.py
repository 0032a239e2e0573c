"""Verdicts no subject can steer (issues 21 and 34), against the real sandbox: every value a
verdict depends on is chosen by the parent (weights, inputs, the task instance, the moments of
measurement, the optimizer's gradients and rates) or computed by the oracle; the subject
supplies outputs only.

Each attack is an overlay on a correct submission (the torch copy, or the correct example) in
tests/harness_tests/isolation/hostile/ and is graded by `xfmr grade`'s own function on the tests it
targets: the attacked test fails with a reason that names what the attack did, and the tests it
does not touch still pass (no over-charge). The correct classmate passes all of them.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from harness.jobs.grade import grade
from harness.outcomes import Outcome
from harness.shared_tests.laws import BY_NAME

pytestmark = pytest.mark.slow  # seven sandboxed grades, two of them with the learning test

ROOT = Path(__file__).resolve().parents[3]
HOSTILE = Path(__file__).parent / "hostile"


def submission(folder: Path, name: str | None, base: str = "impl/torch_copy.py") -> Path:
    """`base` (the torch copy), with the named overlay appended (None: the correct classmate)."""
    text = (ROOT / base).read_text()
    if name is not None:
        text += "\n\n" + (HOSTILE / f"{name}.py").read_text()
    path = folder / f"{name or 'classmate'}_on_{Path(base).stem}.py"
    path.write_text(text)
    return path


def outcomes(path: Path, tests: list[str]) -> dict[str, tuple[Outcome, str]]:
    g = grade(path, [BY_NAME[t] for t in tests])
    assert not g.rejected and not g.error, (g.rejected, g.error)
    return {r.name: (r.outcome, r.message) for r in g.tests}


VALUES = ["test_golden_torch", "test_decoder_is_causal", "test_embeddings_scaled_and_tied"]
DECODING = ["test_decode_step_equals_forward", "test_decode_step_reads_a_kv_cache"]
LEARNING = ["test_learns_reversed_addition"]
OPTIMIZER = [
    "test_optimizer_is_the_papers_adam",
    "test_fit_follows_the_schedule_and_is_reproducible",
]
CORRECT_EXAMPLE = "examples/correct_submission.py"


@pytest.fixture(scope="module")
def folder(tmp_path_factory):
    return tmp_path_factory.mktemp("verdicts")


def test_the_correct_classmate_passes_every_attacked_test(folder):
    got = outcomes(submission(folder, None), VALUES + DECODING + LEARNING + OPTIMIZER[:1])
    assert all(o is Outcome.PASSED for o, _ in got.values()), got


def test_the_correct_example_passes_the_optimizer_laws(folder):
    got = outcomes(submission(folder, None, CORRECT_EXAMPLE), OPTIMIZER)
    assert all(o is Outcome.PASSED for o, _ in got.values()), got


# Issue 34: make_optimizer judged by where its optimizer moves the parameters, not by its class
# or its param groups' fields. Each overlay on the correct example names what it looks like; a
# maximizing Adam still takes steps of Adam's size, so fit's schedule law (the size of the first
# update) cannot tell it and must not be charged; SGD's first step is not the rate's size.
DISGUISED_OPTIMIZERS = {
    "verdict_sgd_behind_adam": ("plain SGD", Outcome.KILLED),
    "verdict_adam_maximize": ("maximize=True", Outcome.PASSED),
}


@pytest.mark.parametrize("name", sorted(DISGUISED_OPTIMIZERS))
def test_a_disguised_optimizer_fails_the_optimizer_law(folder, name):
    looks_like, fit_outcome = DISGUISED_OPTIMIZERS[name]
    got = outcomes(submission(folder, name, CORRECT_EXAMPLE), OPTIMIZER)
    outcome, message = got["test_optimizer_is_the_papers_adam"]
    assert outcome is Outcome.KILLED, message
    assert "not where the paper's Adam puts them" in message and looks_like in message, message
    assert got["test_fit_follows_the_schedule_and_is_reproducible"][0] is fit_outcome, got


def test_zero_weights_pass_no_value_test(folder):
    # every parameter 0 and a forward pass of zeros: trivial against its own weights, wrong
    # against the parent's
    got = outcomes(submission(folder, "verdict_zero_weights"), VALUES)
    assert got["test_golden_torch"][0] is Outcome.KILLED
    assert "logits" in got["test_golden_torch"][1]
    assert got["test_decoder_is_causal"][0] is Outcome.KILLED  # it reads no target at all


def test_a_model_that_keeps_its_own_weights_is_judged_on_the_parents(folder):
    got = outcomes(submission(folder, "verdict_own_weights"), VALUES)
    for test in VALUES:
        outcome, message = got[test]
        assert outcome is Outcome.KILLED, (test, message)
        assert "does not hold the weights the test loaded" in message, (test, message)


def test_a_recomputed_prefix_hidden_from_counters_fails_the_kv_cache_law_only(folder):
    got = outcomes(submission(folder, "verdict_flop_dodge"), DECODING)
    assert got["test_decode_step_equals_forward"][0] is Outcome.PASSED  # its values are right
    outcome, message = got["test_decode_step_reads_a_kv_cache"]
    assert outcome is Outcome.KILLED
    assert "recomputed" in message and "not read from a cache" in message


def test_weights_not_learned_from_the_given_data_fail_the_learning_test(folder):
    got = outcomes(submission(folder, "verdict_checkpoint"), LEARNING)
    outcome, message = got["test_learns_reversed_addition"]
    assert outcome is Outcome.KILLED
    # it trains on rows of the task as published, not on the secret instance's training rows:
    # the replay finds a row fit was not given (or, had it used them, a step that is not Adam's,
    # or weights that did not learn the secret instance)
    reasons = ("not one of the training rows fit was given", "not Adam's step", "held-out loss")
    assert any(r in message for r in reasons), message


# Issue 34: the learning test judges weights whose every update the parent replayed (Adam from
# its own initial weights on its own training rows, gradients checked at secret updates). A
# relabelled checkpoint loaded after one honest update, and training on the held-out sums a fit
# can list for itself, each fail with what they did; the correct example still learns.
LEARNING_ATTACKS = {
    "verdict_relabelled_checkpoint": "update 2 is not Adam's step",
    "verdict_lists_test_sums": "not one of the training rows fit was given",
}


def test_the_correct_example_passes_the_learning_test(folder):
    got = outcomes(submission(folder, None, CORRECT_EXAMPLE), LEARNING)
    assert all(o is Outcome.PASSED for o, _ in got.values()), got


@pytest.mark.parametrize("name", sorted(LEARNING_ATTACKS))
def test_a_fit_that_does_not_learn_from_its_updates_fails_the_learning_test(folder, name):
    got = outcomes(submission(folder, name), LEARNING)
    outcome, message = got["test_learns_reversed_addition"]
    assert outcome is Outcome.KILLED, message
    assert LEARNING_ATTACKS[name] in message, message
