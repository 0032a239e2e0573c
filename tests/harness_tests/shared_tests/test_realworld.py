"""Real student code graded right: the real-world-style set (tests/harness_tests/realworld/).

Four complete submissions written in other styles than impl (the Annotated Transformer's
habits with the residual and the norm inside the attention module, fused q/k/v projections,
nn.TransformerEncoder/Decoder stacks, a functional style whose modules are never called) and
single-fault variants of them, each with the verdict the contract expects kept as data in
realworld/variants.py: the tests that must fail (one cause, one charge), the tests that may fail
only as a documented dependency, the words the diagnosis must say and the false localizations it
must not.

The set is our own code, so it is graded through the trusted fork server (no sandbox: the
sandbox is the hostile tests' subject), every shared test, as `xfmr grade` grades a student.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from realworld import run_set

from harness.isolation import tiers
from harness.isolation.limits import DEFAULT_LIMITS
from harness.jobs import grade
from harness.reports import grade as grade_report
from harness.shared_tests.laws import SHARED_TESTS

pytestmark = pytest.mark.slow

RECORDS = {r["id"]: r for r in run_set.load_variants()}


@pytest.fixture(scope="module")
def graded(tmp_path_factory) -> dict[str, dict]:
    """Every base and every variant graded once: summaries by id (a base by its file name)."""
    folder = tmp_path_factory.mktemp("realworld")
    names = {}
    for base in run_set.bases():
        names[Path(base).stem] = base
        (folder / base).write_text(run_set.base_source(base))
    for vid, record in RECORDS.items():
        stem = vid.replace("-", "_")
        names[stem] = vid
        (folder / f"{stem}.py").write_text(run_set.variant_source(record))
    jobs = os.cpu_count() or 1
    grades = grade.grade_batch(folder, SHARED_TESTS, DEFAULT_LIMITS, None, jobs, tier=tiers.UNSAFE)
    return {
        names[Path(g.submission).stem]: run_set.summarize(grade_report.to_json(g)) for g in grades
    }


@pytest.mark.parametrize("base", run_set.bases())
def test_a_correct_submission_in_another_style_gets_full_marks(graded, base):
    # full marks, but for a clause its style cannot meet (variants.BASE_FAILING says why)
    summary = graded[base]
    assert summary["failing"] == run_set.base_failing(base), summary["diagnosis"]
    if not summary["failing"]:
        assert summary["score"] == summary["max_score"]


@pytest.mark.parametrize("vid", sorted(RECORDS))
def test_a_real_world_fault_is_charged_once_and_named(graded, vid):
    record, summary = RECORDS[vid], graded[vid]
    verdict = run_set.judge(record, summary)
    assert not summary["grader_error"], summary["grader_error"]
    assert verdict["missing"] == [], f"a required failure is absent: {verdict}"
    assert verdict["over"] == [], f"over-charged: {verdict}\n{summary['diagnosis']}"
    assert verdict["diagnosis_missing"] == [], summary["diagnosis"]
    assert verdict["diagnosis_false"] == [], summary["diagnosis"]
