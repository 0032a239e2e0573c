"""Gradescope's results.json: a grade's, and the refusal where nothing was graded (no isolation
here), shared by `xfmr grade`, `grade-batch` and the autograder's run_autograder
(harness.jobs.autograder).

Gradescope's format: https://gradescope-autograders.readthedocs.io/en/latest/specs/ (a top-level
`score` is required unless every test has one; `visibility` is one of hidden, after_due_date,
after_published, visible). A refusal is a valid results.json with a score of 0, never a missing
file: a missing one shows every student "The autograder failed to execute correctly".

What is meant for staff (the isolation line when it is not plainly a tier's: UNSAFE, LIMITS
MISSING, SWEEP FAILED; why nothing was graded; where a grader fault's traceback is) never reaches
a field a student can see: it is one extra test of 0 points whose visibility is "hidden" (the
specification's "test case will never be shown to students"; staff see it on the submission's
results), and the autograder's stdout (staff's; `stdout_visibility` hidden by default). A student
reads only the summary: the tests passed, the rejection, NOT GRADED or GRADER ERROR.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Protocol

from harness.isolation.worker import printable
from harness.options import CONTAINER, SANDBOX
from harness.records import Grade

NOT_GRADED = (
    "NOT GRADED: the autograder could not isolate your code here, so it did not run it; this is "
    "not a verdict on your code, and its score of 0 stands only until course staff regrade it."
)


STAFF_FAULT = (
    "GRADER ERROR: the grader failed while grading this submission; this is not a verdict on "
    "your code, and its score of 0 stands only until course staff regrade it."
)

# where Gradescope's staff read the autograder's own output
LOG = "the autograder's output (stdout)"

# the one test a student never sees: the grader's notes for staff (0 points)
STAFF_ONLY = "Course staff only: the grader's notes (hidden from students)"


class Recorded(Protocol):  # a shared test's record (harness.shared_tests.record.Test, frozen)
    @property
    def name(self) -> str: ...
    @property
    def points(self) -> float: ...
    @property
    def visibility(self) -> str: ...


def refusal(
    tests: Sequence[Recorded],
    why: str,
    visibility: str = "visible",
    stdout_visibility: str = "hidden",
) -> dict[str, Any]:
    """results.json when nothing could run: score 0, each test not run; what staff must do (`why`)
    only in the hidden staff test."""
    return {
        "score": 0.0,
        "execution_time": 0,
        "output": NOT_GRADED,
        "output_format": "text",
        "visibility": visibility,
        "stdout_visibility": stdout_visibility,
        "tests": [
            *(
                {
                    "name": t.name,
                    "score": 0.0,
                    "max_score": float(t.points),
                    "status": "failed",
                    "output": "not run: the autograder could not isolate the submission",
                    "output_format": "text",
                    "visibility": t.visibility,
                }
                for t in tests
            ),
            *staff_tests([f"Course staff: {why}"]),
        ],
    }


def staff_tests(notes: Sequence[str]) -> list[dict[str, Any]]:
    """The hidden test of 0 points holding staff's notes ([] when there are none)."""
    if not notes:
        return []
    return [
        {
            "name": STAFF_ONLY,
            "score": 0.0,
            "max_score": 0.0,
            "status": "passed",  # 0 of 0: it takes nothing and reveals nothing
            "output": "\n".join(notes),
            "output_format": "text",
            "visibility": "hidden",
        }
    ]


def staff_notes(g: Grade, log: str = LOG) -> list[str]:
    """What staff must know of a grade and a student must not read: the isolation line when it
    is not plainly a tier's (UNSAFE, LIMITS MISSING, SWEEP FAILED), and where a grader fault's
    traceback is (`log`) and what to do."""
    notes = []
    if g.isolation not in (SANDBOX, CONTAINER):
        notes.append(f"Course staff: isolation: {g.isolation}")
    if g.error:
        notes.append(
            f"Course staff: {log} has the grader's traceback; fix the cause or report it, then "
            "regrade this submission (xfmr grade exit status 3)."
        )
    return notes


def summary(g: Grade) -> str:
    """What a student reads first: the tests passed, the rejection, or a grader fault (its
    traceback and what to do are staff's: staff_notes)."""
    if g.error:
        return STAFF_FAULT
    return printable(g.rejected) or f"{sum(t.passed for t in g.tests)}/{len(g.tests)} tests passed"


def gradescope(
    g: Grade, visibility: str = "visible", stdout_visibility: str = "hidden"
) -> dict[str, Any]:
    """A grade's results.json (score, execution_time, output, visibility, stdout_visibility,
    tests[] each with its own visibility from the test's record): always a top-level score, 0 for
    a rejection or a grader fault; staff's notes (staff_notes) in one more test, hidden."""
    return {
        "score": g.score,
        "execution_time": round(g.seconds, 2),
        "output": summary(g),
        "output_format": "text",
        "visibility": visibility,
        "stdout_visibility": stdout_visibility,
        "tests": [
            {
                "name": printable(t.name),
                "score": t.score,
                "max_score": t.max_score,
                "status": "passed" if t.passed else "failed",
                "output": printable(t.message) or t.law,
                "output_format": "text",
                "visibility": t.visibility,
            }
            for t in g.tests
        ]
        + staff_tests(staff_notes(g)),
    }


# The extra test a full-score results.json carries where the course reveals the reference after
# a pass (`xfmr autograder gradescope --reveal-reference-after-pass`; off by default).
REFERENCE_DIFF = "Your code beside the reference (shown after a full score; 0 points)"


def full_score(results: dict[str, Any]) -> bool:
    """Every test of a results.json passed with its whole points, and the score is their sum."""
    tests = results.get("tests")
    if not isinstance(tests, list) or not tests:
        return False
    most = sum(float(t.get("max_score", 0)) for t in tests)
    every = all(t.get("status") == "passed" and t.get("score") == t.get("max_score") for t in tests)
    return every and most > 0 and float(results.get("score", -1)) == most


def with_reference(results: dict[str, Any], diff: str) -> dict[str, Any]:
    """results.json with the reference diff as one more test of 0 points, if it has the full
    score; otherwise `results` itself, unchanged (the reference never reaches a student then)."""
    if not full_score(results):
        return results
    extra = {
        "name": REFERENCE_DIFF,
        "score": 0.0,
        "max_score": 0.0,
        "status": "passed",
        "output": diff,
        "output_format": "text",
        "visibility": results.get("visibility", "visible"),
    }
    return {**results, "tests": [*results["tests"], extra]}
