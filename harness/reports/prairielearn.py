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
same NOT GRADED and GRADER ERROR wording, harness.reports.gradescope).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from harness.options import CONTAINER, SANDBOX
from harness.records import Grade, TestResult
from harness.reports.gradescope import NOT_GRADED, STAFF_FAULT, Recorded, summary

# where a PrairieLearn grading job's own output is: the grader's stdout, on the job's page
JOB_LOG = "the grading job's output (the submission's grading job page)"


def _test(t: TestResult) -> dict[str, Any]:
    shown = t.visibility == "visible"  # PrairieLearn has no hidden tests: their words are withheld
    return {
        "name": t.name,
        "description": t.law if shown else "",
        "points": t.score,
        "max_points": t.max_score,
        "message": (t.message if shown else "") or ("passed" if t.passed else "failed"),
        "output": "",
    }


def not_graded(tests: Sequence[Recorded], message: str, why: str = "") -> dict[str, Any]:
    """results.json for a submission that was not graded: not gradable (no attempt charged),
    score 0, each test at 0 of its points, and what staff must do; `why`, a rejection's reason,
    is also its format error."""
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


def refusal(tests: Sequence[Recorded], why: str) -> dict[str, Any]:
    """results.json when nothing could run: not gradable, and what staff must do."""
    return not_graded(tests, f"{NOT_GRADED}\nCourse staff: {why}")


def fault(tests: Sequence[Recorded], what: str) -> dict[str, Any]:
    """results.json when the grader broke before it could report (`what`: how, for staff)."""
    return not_graded(tests, f"{STAFF_FAULT}\nCourse staff: {what}; fix it, then regrade.")


def prairielearn(g: Grade) -> dict[str, Any]:
    """A grade's results.json: its score as a fraction of the points; a rejection (the code does
    not load: PrairieLearn's invalid submission) or a grader fault is not gradable."""
    if g.error or g.rejected:
        data = not_graded([], summary(g, JOB_LOG), g.rejected)
        return data | {"tests": [_test(t) for t in g.tests]}
    isolated = g.isolation in (SANDBOX, CONTAINER)
    return {
        "gradable": True,
        "score": g.score / g.max_score if g.max_score > 0 else 0.0,
        "message": summary(g, JOB_LOG),
        "output": f"{g.score:g}/{g.max_score:g} points" + ("" if isolated else f"\n{g.isolation}"),
        "tests": [_test(t) for t in g.tests],
    }
