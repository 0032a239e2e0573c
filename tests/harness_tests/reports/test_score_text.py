"""A suite's mutation score in the student's words (issue 48): their test *failed* on a correct
subject (not "killed"), a mutant is *caught* or *MISSED*; the JSON report and Stryker's keep the
machine-read "killed"/"survived"."""

from __future__ import annotations

from harness.jobs import mutation_score as ms
from harness.outcomes import Outcome
from harness.records import Cell
from harness.reports import score as report
from mutants import catalog

P, K = Outcome.PASSED, Outcome.KILLED


def run(outcomes: dict[str, Outcome]) -> ms.SubjectRun:
    return ms.SubjectRun({t: Cell(o, "tests/t.py:2: AssertionError") for t, o in outcomes.items()},
                         list(outcomes))  # fmt: skip


def a_score():
    # t_noam catches s08 alone; t_wrong fails on impl and the torch copy (a false alarm)
    subs = ms.subjects() + ms.generated_subjects(2, seed=3)
    runs = {s.name: run({"t_noam": P, "t_wrong": K}) for s in subs}
    runs["s08"] = run({"t_noam": K, "t_wrong": K})
    return ms.scored(subs, runs, ms.MODULE, 1.0, 0.0)


def test_the_students_tests_fail_and_mutants_are_caught_or_missed():
    s = a_score()
    text = report.text(s, "tests")
    assert "  impl        correct  1 passed, 1 failed" in text
    assert "  s08*        caught   Noam at n = s" in text
    assert "      caught by 1: t_noam" in text
    assert "  s01*        MISSED   post-LN written as pre-LN" in text
    assert "False alarms (fail on a correct subject, so they catch nothing):" in text
    assert "    impl: failed: tests/t.py:2: AssertionError" in text
    assert "generated: 0 of 2 caught" in text and "(missed of drawn)" in text
    assert "(* = must be caught: s01-s08;" in text
    assert "killed" not in text.lower() and "SURVIVED" not in text
    results = report.gradescope(s)["tests"]
    said = {t["name"][:3]: t["output"] for t in results}
    assert said["s08"] == "caught: a test of yours failed on it"
    assert said["s01"] == "missed: no test of yours failed on it"


def test_machine_read_reports_keep_their_words():
    s = a_score()
    data = report.to_json(s)
    assert data["killed"] == ["s08"] and data["mutants"]["s01"]["status"] == "passed"
    assert {m["status"] for m in data["generated"]["mutants"].values()} == {"survived"}
    assert {c["outcome"] for c in data["cells"]} == {"passed", "killed"}
    assert len(catalog.PITFALLS) == 11
