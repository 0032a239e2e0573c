"""PrairieLearn's results.json for an external-grader question: a grade's, and the not-graded
ones (a rejection, a grader fault, a refusal where no isolation tier works), written by the
PrairieLearn grader (`xfmr autograder prairielearn`, harness.jobs.autograder).

PrairieLearn's format: https://prairielearn.readthedocs.io/en/latest/externalGrading/ ("Grading
results"): `score` in [0, 1]; `gradable: false` for a submission that was not graded (no points
awarded or lost, no attempt charged; `format_errors` says why a submission is invalid); `message`,
`output`, and `tests`, each with `name`, `description`, `points`, `max_points`, `message`,
`output`. The grader host reads the file only when the entry script exits 0, and its score must
be a number even when not gradable (PrairieLearn's makeGradingResult), so ours always has one.

What a student reads here is what Gradescope's results.json tells them (the same summary, the
same NOT GRADED and GRADER ERROR wording, harness.reports.gradescope). PrairieLearn has no field
of results.json that a student cannot see (the results element renders it, and the format has no
visibility), so what is staff's (staff_notes: the isolation line when it is not plainly a tier's,
why nothing was graded, where a fault's traceback is) goes to the grading job's output alone: the
job's page and its output.log are instructors' only (PrairieLearn's instructorGradingJob page).
The autograder's steps print it there (harness.jobs.autograder: `prairielearn-results`,
`refuse`).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from harness.isolation.worker import printable
from harness.records import Grade, TestResult
from harness.reports import gradescope
from harness.reports.gradescope import NOT_GRADED, STAFF_FAULT, Recorded, summary

# where a PrairieLearn grading job's own output is: the grader's stdout, on the job's page
JOB_LOG = "the grading job's output (the submission's grading job page)"


def _test(t: TestResult) -> dict[str, Any]:
    shown = t.visibility == "visible"  # PrairieLearn has no hidden tests: their words are withheld
    return {
        "name": printable(t.name),
        "description": t.law if shown else "",
        "points": t.score,
        "max_points": t.max_score,
        "message": (printable(t.message) if shown else "") or ("passed" if t.passed else "failed"),
        "output": "",
    }


def not_graded(tests: Sequence[Recorded], message: str, why: str = "") -> dict[str, Any]:
    """results.json for a submission that was not graded: not gradable (no attempt charged),
    score 0, each test at 0 of its points, and the student's `message`; `why`, a rejection's
    reason, is also its format error."""
    data: dict[str, Any] = {
        "gradable": False,
        "score": 0.0,
        "message": message,
        "output": "",
        "tests": [
            {
                "name": t.name,
                "description": "",
                "points": 0.0,
                "max_points": float(t.points),
                "message": "not graded",
                "output": "",
            }
            for t in tests
        ],
    }
    if why:
        data["format_errors"] = [why]
    return data


def refusal(tests: Sequence[Recorded]) -> dict[str, Any]:
    """results.json when nothing could run: not gradable, NOT GRADED (why, for staff, goes to the
    job's output)."""
    return not_graded(tests, NOT_GRADED)


def fault(tests: Sequence[Recorded]) -> dict[str, Any]:
    """results.json when the grader broke before it could report (how, for staff, goes to the
    job's output)."""
    return not_graded(tests, STAFF_FAULT)


def staff_notes(g: Grade) -> list[str]:
    """What staff must know of a grade, for the job's output (harness.reports.gradescope's)."""
    return gradescope.staff_notes(g, JOB_LOG)


def prairielearn(g: Grade) -> dict[str, Any]:
    """A grade's results.json: its score as a fraction of the points; a rejection (the code does
    not load: PrairieLearn's invalid submission) or a grader fault is not gradable. Nothing of
    staff_notes is in it."""
    if g.error or g.rejected:
        data = not_graded([], summary(g), printable(g.rejected))
        return data | {"tests": [_test(t) for t in g.tests]}
    return {
        "gradable": True,
        "score": g.score / g.max_score if g.max_score > 0 else 0.0,
        "message": summary(g),
        "output": f"{g.score:g}/{g.max_score:g} points",
        "tests": [_test(t) for t in g.tests],
    }
