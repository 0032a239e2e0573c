"""The false-alarm sweep (`xfmr false-alarms`): whole grades of correct subjects under secret
draws and dtypes. The committed sweep is results/grading/false_alarms.md; this is CI's smaller
one."""

import argparse
from pathlib import Path

import pytest

from harness.shared_tests.inputs import draw_secret, run_dtype
from harness.shared_tests.laws import BY_NAME
from harness.subjects import Kind, Subject
from harness.tools import false_alarms
from harness.tools.false_alarms import Candidate, candidates, draw_range, sweep

FAULTY = Path(__file__).resolve().parents[3] / "examples" / "faulty_submission.py"

# Draws outside the committed sweep's range (results/grading/false_alarms.md), so CI adds draws to
# it instead of repeating them; fixed, so a red run names a draw anyone can rerun.
CI_DRAWS = [1_000_003]


def test_draw_ranges_parse_and_refuse_nonsense():
    assert draw_range("0-3,7") == [0, 1, 2, 3, 7]
    assert draw_range("5") == [5]
    for bad in ("3-1", "a", "-2", "1-x"):
        with pytest.raises(argparse.ArgumentTypeError):
            draw_range(bad)


def test_every_correct_subject_is_swept():
    names = [c.subject.name for c in candidates()]
    assert names[:3] == ["impl", "torch_copy", "correct_submission"]
    bases = [n for n in names if n.startswith("realworld/")]
    assert len(bases) == 6, names
    # functional.py cannot meet the dropout-site clause by its style (the real-world set's record)
    may_fail = {c.subject.name: c.may_fail for c in candidates()}
    assert may_fail["realworld/functional.py"] == {"test_dropout_at_every_site"}
    assert may_fail["impl"] == frozenset()


@pytest.mark.slow
def test_a_failing_subject_is_reported_with_its_draw_and_the_run_is_restored():
    # the sweep must be able to fail: the faulty example, posing as correct, fails its golden test
    before = draw_secret()
    posing = Candidate(Subject("faulty", Kind.CORRECT, path=str(FAULTY)))
    found = sweep([posing], ["float64"], [11], [BY_NAME["test_golden_torch"]])
    assert [(a.draw, a.dtype, a.subject, a.test) for a in found.alarms] == [
        (11, "float64", "faulty", "test_golden_torch")
    ]
    assert found.grade_draws == {"float64": 1}
    assert "| float64 | 11 | faulty | test_golden_torch | killed |" in false_alarms.markdown(
        found, "xfmr false-alarms"
    )
    assert run_dtype() is None and draw_secret() != before  # a fresh secret, no dtype left set


@pytest.mark.slow
def test_no_correct_subject_fails_any_test_under_ci_draws():
    # every shared test on impl, the torch copy, the correct example and the real-world bases
    found = sweep(candidates(), ["float64"], CI_DRAWS)
    assert found.alarms == [], found.alarms
    assert found.grade_draws == {"float64": 9}


@pytest.mark.slow
def test_no_correct_subject_fails_any_test_in_float32():
    few = [c for c in candidates() if c.subject.name in ("impl", "correct_submission")]
    found = sweep(few, ["float32"], CI_DRAWS)
    assert found.alarms == [], found.alarms


def test_a_nearly_singular_out_proj_reads_as_no_evidence_not_as_dropped_heads():
    # the committed bfloat16 sweep's one alarm: under draw 1 the encoder's second out_proj has a
    # smallest singular value of 3.9e-5, its heads cannot be told apart, and annotated.py read as
    # dropping 105 of 128 attention weights at p = 0.5
    annotated = [c for c in candidates() if c.subject.name == "realworld/annotated.py"]
    found = sweep(annotated, ["bfloat16"], [1], [BY_NAME["test_dropout_at_every_site"]])
    assert found.alarms == [] and found.grade_draws == {"bfloat16": 1}, found.alarms
