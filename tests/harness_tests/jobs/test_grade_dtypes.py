"""`xfmr grade --dtype float32` (issue 35): the correct example gets every point, the faulty one
keeps exactly the failures of its float64 grade (test_grade.py's FAULTY_FAILS)."""

from pathlib import Path

import pytest

from harness.isolation import tiers
from harness.jobs import grade
from harness.shared_tests.inputs import set_run_dtype
from harness.shared_tests.laws import SHARED_TESTS

ROOT = Path(__file__).resolve().parents[3]
FAULTY_FAILS = [  # the faulty example's float64 failures (test_grade.py)
    "test_golden_torch",
    "test_source_padding_is_never_read",
    "test_translate_is_greedy_with_beam_one_and_drops_eos",
    "test_beam_search_matches_oracle",
]


@pytest.fixture
def float32_run():
    set_run_dtype("float32")
    yield
    set_run_dtype(None)


@pytest.mark.slow
def test_correct_example_gets_every_point_in_float32_and_the_faulty_keeps_its_failures(
    float32_run,
):
    g = grade.grade(ROOT / "examples" / "correct_submission.py", SHARED_TESTS)
    failed = {t.name: t.message for t in g.tests if not t.passed}
    assert failed == {}
    assert g.score == g.max_score
    # the learning test (no padding law) is left out of the faulty grade to keep it shorter
    tests = [t for t in SHARED_TESTS if t.name != "test_learns_reversed_addition"]
    g = grade.grade(ROOT / "examples" / "faulty_submission.py", tests)
    assert [t.name for t in g.tests if not t.passed] == FAULTY_FAILS


def test_the_faulty_example_keeps_its_search_failures_in_bfloat16():
    # a 16-bit run searches in float32 (probes.base.search_dtype): in bfloat16 nearly every
    # argmax lay within the bound of its runner-up, and the padding fault passed both search tests
    set_run_dtype("bfloat16")
    try:
        tests = [t for t in SHARED_TESTS if t.name in FAULTY_FAILS[2:]]
        g = grade.grade(ROOT / "examples" / "faulty_submission.py", tests, tier=tiers.UNSAFE)
    finally:
        set_run_dtype(None)
    assert [t.name for t in g.tests if not t.passed] == FAULTY_FAILS[2:], g.tests
