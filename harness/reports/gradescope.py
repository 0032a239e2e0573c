"""Gradescope's results.json where nothing was graded: the refusal (no isolation here), shared by
`xfmr grade` and the autograder's run_autograder (harness.jobs.autograder).

Gradescope's format: https://gradescope-autograders.readthedocs.io/en/latest/specs/ (a top-level
`score` is required unless every test has one; `visibility` is one of hidden, after_due_date,
after_published, visible). A refusal is a valid results.json with a score of 0, never a missing
file: a missing one shows every student "The autograder failed to execute correctly".
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Protocol

NOT_GRADED = (
    "NOT GRADED: the autograder could not isolate your code here, so it did not run it; this is "
    "not a verdict on your code, and its score of 0 stands only until course staff regrade it."
)


class _Test(Protocol):  # a shared test's record (harness.shared_tests.record.Test)
    name: str
    points: float
    visibility: str


def refusal(
    tests: Sequence[_Test],
    why: str,
    visibility: str = "visible",
    stdout_visibility: str = "hidden",
) -> dict[str, Any]:
    """results.json when nothing could run: score 0, each test not run, and what staff must do."""
    return {
        "score": 0.0,
        "execution_time": 0,
        "output": f"{NOT_GRADED}\nCourse staff: {why}",
        "output_format": "text",
        "visibility": visibility,
        "stdout_visibility": stdout_visibility,
        "tests": [
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
        ],
    }
