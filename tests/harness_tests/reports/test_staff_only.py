"""Nothing meant for staff reaches a field a student can see, on every path that writes
Gradescope's or PrairieLearn's results.json.

What a student can see is read from each platform's specification, not from our code:

- Gradescope (https://gradescope-autograders.readthedocs.io/en/latest/specs/): every field of
  results.json but the tests whose visibility is "hidden" ("will never be shown to students";
  after_due_date and after_published are shown in time, so they count as seen). The autograder's
  stdout is staff's (`stdout_visibility` hidden, our default).
- PrairieLearn (https://prairielearn.readthedocs.io/en/latest/externalGrading/): all of
  results.json (its results element renders it; the format has no hidden field). The grading
  job's output is staff's: its page, and output.log, are instructors' only.

Staff's text here: the isolation line when it is not plainly a tier's (LIMITS MISSING in the
words the tiers use, UNSAFE, SWEEP FAILED), why nothing was graded (a refusal's reasons), a grader
fault's traceback and what to do; each carries a marker no student text has. Each path is checked
both ways: the marker is nowhere a student looks, and it is where staff look (Gradescope's hidden
test; PrairieLearn's job output), so that dropping the notes fails as surely as showing them.

The paths: a mutation score's results.json (`xfmr mutation-score --gradescope`); a grade (`xfmr
grade --gradescope`'s and grade-batch's renderer; `prairielearn-results`
over `xfmr grade --json`'s report), a rejection, a grader error, each under a weaker isolation; a
full score with the reference shown (`--reveal-reference-after-pass`); `xfmr grade`'s refusal
when its tier cannot be set up; `xfmr autograder refuse` (no tier works) in both formats;
`prairielearn-results` without a report (a refusal, a fault); and the per-submission scripts'
own last resort (run_autograder's, run.sh's), run by bash from the built files.
"""

from __future__ import annotations

import json
import subprocess
import zipfile
from pathlib import Path
from typing import Any

import pytest

from harness.cli import main
from harness.isolation import tiers
from harness.jobs import mutation_score as ms
from harness.options import CONTAINER, SANDBOX, UNSAFE
from harness.outcomes import Outcome
from harness.records import Cell, Grade, TestResult
from harness.reports import score
from harness.reports.grade import to_json
from harness.reports.gradescope import gradescope, with_reference
from harness.shared_tests.laws import SHARED_TESTS

ROOT = Path(__file__).resolve().parents[3]
SECRET = "STAFF-ONLY-7f3a"  # in every staff note of these grades; in no student text
# what only staff's notes say (case matters: NOT GRADED tells students "course staff regrade it")
STAFF_WORDS = ("Course staff", "LIMITS MISSING", "UNSAFE", "SWEEP FAILED", "Traceback", SECRET)
SUBSET = [t.name for t in SHARED_TESTS[:3]]

# weaker isolations, as the tiers and the sweep word them
LIMITS = (
    f"{CONTAINER}; LIMITS MISSING: no cgroup per worker (no cgroup v1 memory controller is "
    f"mounted {SECRET}): {tiers.CONTAINER.lacks}"
)
ISOLATIONS = {
    "limits missing": LIMITS,
    "unsafe": f"{UNSAFE} {SECRET}",
    "sweep failed": f"{SANDBOX}; SWEEP FAILED: 2 processes of xfmr-student survived {SECRET}",
}


def strings(value: Any) -> list[str]:
    """Every string in a JSON value, keys included."""
    if isinstance(value, str):
        return [value]
    if isinstance(value, dict):
        return [s for k, v in value.items() for s in [k, *strings(v)]]
    if isinstance(value, list):
        return [s for v in value for s in strings(v)]
    return []


def gradescope_seen(results: dict) -> list[str]:
    """What a student can see of a Gradescope results.json: all but the hidden tests."""
    shown = {k: v for k, v in results.items() if k != "tests"}
    tests = [t for t in results.get("tests", []) if t.get("visibility", "visible") != "hidden"]
    return strings(shown) + strings(tests)


def gradescope_staff(results: dict) -> str:
    return "\n".join(
        strings([t for t in results.get("tests", []) if t.get("visibility") == "hidden"])
    )


def clean(seen: list[str], where: str) -> None:
    for text in seen:
        for word in STAFF_WORDS:
            assert word not in text, f"{where}: a student sees {word!r} in {text!r}"


def grade(isolation: str, rejected: str = "", error: str = "", passed: bool = False) -> Grade:
    tests = [
        TestResult(
            t.name,
            t.law,
            Outcome.PASSED if passed or i else Outcome.KILLED,
            float(t.points) if passed or i else 0.0,
            float(t.points),
            "" if passed or i else "the logits differ from the oracle's",
            0.1,
            t.visibility,
        )
        for i, t in enumerate(SHARED_TESTS[:3])
    ]
    return Grade("transformer.py", tests, rejected, isolation=isolation, error=error)


TRACEBACK = f'Traceback (most recent call last):\n  File "/x/harness/grading.py"\nOSError: {SECRET}'
GRADES = {
    **{f"grade, {k}": grade(v) for k, v in ISOLATIONS.items()},
    "rejection, limits missing": grade(LIMITS, rejected="transformer.py does not parse: line 3"),
    "grader error": grade(SANDBOX, error=TRACEBACK),
    "grader error, limits missing": grade(LIMITS, error=TRACEBACK),
}


@pytest.mark.parametrize("name", GRADES)
def test_a_gradescope_grade_keeps_staffs_notes_in_a_hidden_test(name):
    g = GRADES[name]
    for visibility in ("visible", "after_due_date"):
        results = gradescope(g, visibility)
        clean(gradescope_seen(results), name)
        staff = gradescope_staff(results)
        if g.isolation != SANDBOX:
            assert g.isolation in staff, (name, staff)
        if g.error:
            assert "the autograder's output (stdout) has the grader's traceback" in staff, staff
            assert results["output"].startswith("GRADER ERROR"), results["output"]
        hidden = [t for t in results["tests"] if t["visibility"] == "hidden"]
        assert [(t["score"], t["max_score"]) for t in hidden] == [(0.0, 0.0)], hidden
        assert results["score"] == g.score  # the staff test takes nothing


def test_a_plain_grade_has_no_staff_test():
    results = gradescope(grade(CONTAINER))
    assert len(results["tests"]) == 3 and results["output"] == "2/3 tests passed", results


def test_the_reference_after_a_full_score_keeps_the_staff_test_hidden():
    results = with_reference(gradescope(grade(LIMITS, passed=True)), "== noam_rate: identical")
    assert results["tests"][-1]["output"] == "== noam_rate: identical", results  # shown
    clean(gradescope_seen(results), "with the reference")
    assert LIMITS in gradescope_staff(results)


def converted(tmp_path: Path, capsys, report: dict | None, status: int) -> tuple[dict, str]:
    """`xfmr autograder prairielearn-results`: its results.json, and the job's output."""
    path, out = tmp_path / "grade.json", tmp_path / "results.json"
    path.unlink(missing_ok=True)
    if report is not None:
        path.write_text(json.dumps(report))
    argv = ["autograder", "prairielearn-results", "--grade", str(path), "--status", str(status)]
    assert main([*argv, "--out", str(out), "--tests", ",".join(SUBSET)]) == 0
    return json.loads(out.read_text()), capsys.readouterr().out


@pytest.mark.parametrize("name", GRADES)
def test_a_prairielearn_grade_keeps_staffs_notes_in_the_jobs_output(tmp_path, capsys, name):
    g = GRADES[name]
    results, output = converted(tmp_path, capsys, to_json(g), 3 if g.error else 1)
    clean(strings(results), name)
    if g.isolation != SANDBOX:
        assert f"Course staff: isolation: {g.isolation}" in output, output
    if g.error:
        assert "grading job's output" in output and "traceback" in output, output
        assert results["message"].startswith("GRADER ERROR") and not results["gradable"]
    if g.rejected:
        assert results["format_errors"] == [g.rejected], results


@pytest.mark.parametrize(
    "status, says", [(2, "refused to grade (exit 2)"), (137, "left no report (exit status 137")]
)
def test_prairielearn_without_a_report(tmp_path, capsys, status, says):
    results, output = converted(tmp_path, capsys, None, status)
    clean(strings(results), f"no report, status {status}")
    assert results["gradable"] is False and results["message"].startswith(
        "NOT GRADED" if status == 2 else "GRADER ERROR"
    )
    assert f"Course staff: xfmr grade {says}" in output, output  # the job's output: staff's


@pytest.mark.parametrize("form", ["gradescope", "prairielearn"])
def test_the_refusal_where_no_tier_works(tmp_path, capsys, form):
    record = tmp_path / "isolation"
    record.write_text(f"none\nsandbox: cannot be set up: {SECRET}\ncontainer: cannot be set up\n")
    out = tmp_path / "results.json"
    argv = ["autograder", "refuse", "--why", str(record), "--out", str(out), "--format", form]
    assert main(argv) == 2
    results, output = json.loads(out.read_text()), capsys.readouterr().out
    assert (
        f"Course staff: no isolation tier works in this container, so no submission is run "
        f"(sandbox: cannot be set up: {SECRET}" in output
    ), output
    if form == "gradescope":
        assert results["output"].startswith("NOT GRADED"), results
        clean(gradescope_seen(results), "refuse")
        assert f"sandbox: cannot be set up: {SECRET}" in gradescope_staff(results)
    else:
        assert results["message"].startswith("NOT GRADED") and not results["gradable"]
        clean(strings(results), "refuse --format prairielearn")


def test_xfmr_grades_own_refusal(tmp_path, capsys):
    """`xfmr grade --gradescope` where its tier cannot be set up (the container tier: no user
    xfmr-student here, or not root): why, on stderr and in the hidden test only."""
    report = tmp_path / "results.json"
    argv = ["grade", str(ROOT / "examples" / "correct_submission.py"), "--gradescope", str(report)]
    assert main([*argv, "--isolation", "container"]) == 2
    why = capsys.readouterr().err
    results = json.loads(report.read_text())
    assert "refusing to run untrusted code: the container tier" in why
    assert results["score"] == 0 and results["output"].startswith("NOT GRADED"), results
    clean(gradescope_seen(results), "xfmr grade's refusal")
    assert "Course staff: refusing to run untrusted code: the container tier" in gradescope_staff(
        results
    )


def last_resort(script: str, results: Path) -> str:
    """Run a per-submission script's own last resort (its block for a grade that left no
    results.json, as built), as bash; its output."""
    block = script[script.index('if [ ! -s "$RESULTS/results.json" ]; then  # the grader') :]
    block = block[: block.index("\nfi\n") + 4]
    done = subprocess.run(
        ["bash", "-c", f"RESULTS={results}\nstatus=137\n{block}"],
        capture_output=True,
        text=True,
        check=True,
    )
    return done.stdout


def test_the_scripts_last_resort(tmp_path):
    zipped, folder = tmp_path / "autograder.zip", tmp_path / "pl"
    assert main(["autograder", "gradescope", "--out", str(zipped)]) == 0
    assert main(["autograder", "prairielearn", "--out", str(folder), "--course", "CS 182"]) == 0
    with zipfile.ZipFile(zipped) as z:
        gradescopes = z.read("run_autograder").decode()
    output = last_resort(gradescopes, tmp_path)
    results = json.loads((tmp_path / "results.json").read_text())
    assert results["output"].startswith("NOT GRADED: the autograder failed before it could report")
    clean(gradescope_seen(results), "run_autograder's last resort")
    staff = "Course staff: the grade ended with status 137 and left no results.json"
    assert staff in gradescope_staff(results) and staff in output, (results, output)
    (tmp_path / "results.json").unlink()
    output = last_resort((folder / "image" / "xfmr-grader" / "run.sh").read_text(), tmp_path)
    results = json.loads((tmp_path / "results.json").read_text())
    assert results["message"].startswith("NOT GRADED") and results["gradable"] is False
    clean(strings(results), "run.sh's last resort")
    assert staff in output, output


@pytest.mark.parametrize("isolation", ISOLATIONS.values(), ids=list(ISOLATIONS))
def test_a_mutation_scores_results_json_keeps_the_isolation_hidden(isolation):
    runs = {s.name: ms.SubjectRun({"t": Cell(Outcome.PASSED, "")}, ["t"]) for s in ms.subjects()}
    s = ms.scored(ms.subjects(), runs, ms.MODULE, 1.0, 0.0)
    s.isolation = isolation
    results = score.gradescope(s)
    clean(gradescope_seen(results), "a mutation score")
    assert isolation in gradescope_staff(results), results
    s.isolation = SANDBOX  # plainly the sandbox: nothing for staff, no staff test
    assert not gradescope_staff(score.gradescope(s))
