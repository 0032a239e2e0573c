"""Runs in a chosen dtype (`--dtype`): the weights are numbers of it, every model is built in it,
and each value is judged against its bound derived for it. Correct subjects pass in bfloat16;
a padding fault is still caught there, as the detection table says a missing mask is."""

from __future__ import annotations

import numpy as np
import pytest

from harness.cli import main
from harness.engine.run import run_suite, trusted_call
from harness.outcomes import Outcome
from harness.shared_tests.inputs import in_run_dtype, run_dtype, set_run_dtype
from harness.shared_tests.laws import BY_NAME
from harness.shared_tests.laws.values import golden_comparisons
from harness.subjects import Kind, Subject
from oracle.precision import representable

TESTS = [
    BY_NAME[name]
    for name in (
        "test_golden_torch",
        "test_source_padding_is_never_read",
        "test_decode_step_equals_forward",
        "test_decode_step_reads_a_kv_cache",
    )
]


@pytest.fixture
def bfloat16_run():
    set_run_dtype("bfloat16")
    yield
    set_run_dtype(None)


def test_weights_are_numbers_of_the_runs_dtype(bfloat16_run):
    drawn = in_run_dtype(np.random.default_rng(0).normal(size=4096))
    assert np.all(representable(drawn, "bfloat16"))
    set_run_dtype(None)
    assert run_dtype() is None
    default = in_run_dtype(np.random.default_rng(0).normal(size=4096))
    assert np.all(representable(default, "float32")) and not np.all(
        representable(default, "bfloat16")
    )


@pytest.mark.slow
def test_correct_subjects_pass_in_bfloat16_and_a_padding_fault_is_caught(bfloat16_run):
    subjects = [
        Subject("impl", Kind.CORRECT, module="impl.transformer"),
        Subject("torch_copy", Kind.CORRECT, module="impl.torch_copy"),
        Subject("s06", Kind.MUTANT, module="impl.transformer", mutant="s06"),
    ]
    run = run_suite(TESTS, subjects, jobs=1)
    for name in ("impl", "torch_copy"):
        for test in TESTS:
            cell = run.cell(test.name, name)
            assert cell.outcome is Outcome.PASSED, (name, test.name, cell.message)
    padding = run.cell("test_source_padding_is_never_read", "s06")
    assert padding.outcome is Outcome.KILLED, padding.message
    golden = run.cell("test_golden_torch", "s06")
    assert golden.outcome is Outcome.KILLED and "derived for bfloat16" in golden.message
    with trusted_call(subjects[0]) as call:
        call("use_dtype", dtype="bfloat16")
        assert {dtype for dtype, *_ in golden_comparisons(call)} == {"bfloat16"}


def test_the_expectation_is_not_rewritten_from_another_dtype(capsys):
    assert main(["matrix", "--update-expected", "--dtype", "float32"]) == 2
    assert "--update-expected takes no --dtype" in capsys.readouterr().err


def test_the_dtype_a_subject_reports_cannot_widen_its_bounds():
    # the run chooses the dtype: a subject that says "bfloat16" in a default run is not judged
    # with bfloat16's bounds; float32 stays the fallback of a model that cannot run in float64
    from harness.shared_tests.record import Failure
    from harness.shared_tests.verdicts import check_dtype

    check_dtype("float64")
    check_dtype("float32")
    for claimed in ("bfloat16", "float16", "int8", None):
        with pytest.raises(Failure, match="this run judges float64 or float32 only"):
            check_dtype(claimed)
    set_run_dtype("bfloat16")
    try:
        check_dtype("bfloat16")
        check_dtype("float32")  # a 16-bit run's training-mode probes
        with pytest.raises(Failure):
            check_dtype("float64")
    finally:
        set_run_dtype(None)


@pytest.mark.parametrize("dtype", ["float32", "bfloat16", "float16"])
def test_the_hand_examples_judge_in_the_dtype_of_their_given_inputs(dtype):
    # the parent gives the hand example float64 numbers in every run: its float64 bound is the
    # run's own choice for that test, not a dtype the subject claims (issue 35: 0/5 in float32)
    import oracle
    from harness.shared_tests.record import Failure
    from harness.shared_tests.verdicts import derived

    logits, targets = np.array([[1.0, 0.0, 0.0]]), np.array([0])
    set_run_dtype(dtype)
    try:
        (loss, _), (bound, _) = derived(
            oracle.label_smoothed_loss, logits, targets, 0.1, 2, dtype="float64", chosen=True
        )
        assert 0 < bound < 1e-13 and abs(loss - 0.618111) < 5e-7
        with pytest.raises(Failure, match="this run judges"):  # reported, it is still refused
            derived(oracle.label_smoothed_loss, logits, targets, 0.1, 2, dtype="float64")
        with pytest.raises(ValueError):
            derived(oracle.label_smoothed_loss, logits, targets, 0.1, 2, dtype="int8", chosen=True)
        subjects = [Subject("impl", Kind.CORRECT, module="impl.transformer")]
        law = BY_NAME["test_hand_example_label_smoothing"]
        cell = run_suite([law], subjects, jobs=1).cell(law.name, "impl")
        assert cell.outcome is Outcome.PASSED, cell.message
    finally:
        set_run_dtype(None)
