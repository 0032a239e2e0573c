"""The outcome of one (test, subject) cell, and how each outcome counts.

One vocabulary for every view of the engine: the kill-rate matrix, grading a submission and
mutation-scoring a student's suite all speak it.
"""

from __future__ import annotations

import enum


class Outcome(enum.Enum):
    """What running one test on one subject gave."""

    PASSED = "passed"  # the verdict held
    KILLED = "killed"  # the verdict failed, or the subject raised inside a contract call
    ERROR = "error"  # no answer: the worker died (exit status, signal) or broke the protocol
    TIMEOUT = "timeout"  # the test ran past its time limit; the worker's process group was killed
    NOT_APPLICABLE = "not applicable"  # the test does not apply to this subject

    @property
    def detected(self) -> bool:
        """Does this cell detect a mutant? Killed and timeout do, as Stryker counts them.

        An error cell (a crash, a broken protocol) is not a test's verdict, so it detects
        nothing: a mutant whose only non-passing cells are errors counts as not killed.
        """
        return self in (Outcome.KILLED, Outcome.TIMEOUT)

    @property
    def false_alarm(self) -> bool:
        """On a correct subject, anything but passed or not applicable is a false alarm."""
        return self not in (Outcome.PASSED, Outcome.NOT_APPLICABLE)

    @property
    def symbol(self) -> str:
        """One character for the printed grid."""
        return _SYMBOLS[self]


_SYMBOLS = {
    Outcome.PASSED: ".",
    Outcome.KILLED: "K",
    Outcome.ERROR: "E",
    Outcome.TIMEOUT: "T",
    Outcome.NOT_APPLICABLE: "-",
}

# Stryker's MutantStatus (mutation-testing-report-schema) for a mutant, from its row of cells.
STRYKER_STATUS = {
    Outcome.KILLED: "Killed",
    Outcome.TIMEOUT: "Timeout",
    Outcome.ERROR: "RuntimeError",
    Outcome.PASSED: "Survived",
    Outcome.NOT_APPLICABLE: "NoCoverage",
}


def mutant_outcome(cells: list[Outcome]) -> Outcome:
    """A mutant's overall outcome: killed if any test kills it, then timeout, error, passed."""
    for outcome in (Outcome.KILLED, Outcome.TIMEOUT, Outcome.ERROR, Outcome.PASSED):
        if outcome in cells:
            return outcome
    return Outcome.NOT_APPLICABLE
