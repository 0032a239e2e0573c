"""The engine's results as records, each with the one codec that turns it into plain data.

A cell is one (test, subject) outcome; a suite run is the matrix of cells one run of the engine
gives; a test result and a grade are a submission's view of its cells, with points; a subject run
is a student suite's cells on one subject (mutation-score). Every view of the engine (the
kill-rate matrix, a grade, a mutation score) reads and writes these, and nothing else decides how
they look as JSON: `to_json` gives plain data (what crosses a process or a cluster, what the
incremental cache stores, what a report embeds) and `from_json` reads it back. Outcomes are
`Outcome` members everywhere in memory and their string values only in plain data.

At the bottom of the imports (pyproject.toml's contracts): this module imports the standard
library and plain-data modules only (outcomes, subjects, a test's record, the tiers' names).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any

from harness.isolation.tier_names import DESCRIBED, SANDBOX
from harness.outcomes import Outcome
from harness.shared_tests.record import Test
from harness.subjects import Subject


@dataclass(frozen=True)
class Cell:
    """One (test, subject) result."""

    outcome: Outcome
    message: str = ""
    seconds: float = 0.0
    # a traced row's cell: the subject's functions that loading it and this test ran
    covered: frozenset[str] | None = None
    ran: bool = True  # False: inferred, not run (harness.engine.coverage)

    def to_json(self) -> dict[str, Any]:
        """outcome, message and seconds; covered only when traced, ran only when False."""
        data: dict[str, Any] = {
            "outcome": self.outcome.value,
            "message": self.message,
            "seconds": round(self.seconds, 3),
        }
        if self.covered is not None:
            data["covered"] = sorted(self.covered)
        if not self.ran:
            data["ran"] = False
        return data

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> Cell:
        covered = data.get("covered")
        return cls(
            Outcome(data["outcome"]),
            str(data["message"]),
            float(data.get("seconds", 0.0)),
            None if covered is None else frozenset(map(str, covered)),
            data.get("ran", True) is not False,
        )


@dataclass
class SuiteRun:
    """The outcome matrix of one run: cells by (test name, subject name), plus timings."""

    tests: list[Test]
    subjects: list[Subject]
    cells: dict[tuple[str, str], Cell] = field(default_factory=dict)
    subject_seconds: dict[str, float] = field(default_factory=dict)
    worker_starts: dict[str, int] = field(default_factory=dict)
    start_seconds: dict[str, list[float]] = field(default_factory=dict)  # each worker's start-up
    wall_seconds: float = 0.0

    def cell(self, test: str, subject: str) -> Cell:
        return self.cells[(test, subject)]

    def row(self, subject: str) -> list[Outcome]:
        """The subject's outcomes in test order."""
        return [self.cells[(t.name, subject)].outcome for t in self.tests]


@dataclass
class SubjectRun:
    """A student suite on one subject: cells by test id, the collected order, a suite-level
    error (mutation-score)."""

    cells: dict[str, Cell] = field(default_factory=dict)
    collected: list[str] = field(default_factory=list)
    error: str = ""  # the suite did not load or collect on this subject
    seconds: float = 0.0
    workers: int = 0
    start_seconds: list[float] = field(default_factory=list)  # each sandbox's start-up, loading

    def to_json(self) -> dict[str, Any]:
        return asdict(self) | {"cells": {k: c.to_json() for k, c in self.cells.items()}}

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> SubjectRun:
        cells = {k: Cell.from_json(c) for k, c in data["cells"].items()}
        return cls(**{**data, "cells": cells})


@dataclass(frozen=True)
class TestResult:
    """One shared test's verdict on a submission, with its points."""

    __test__ = False  # not a pytest class, whatever its name

    name: str
    law: str
    outcome: Outcome
    score: float
    max_score: float
    message: str  # what a student can act on; empty when passed
    seconds: float
    visibility: str = "visible"  # Gradescope's, from the test's record

    @property
    def passed(self) -> bool:
        return self.outcome is Outcome.PASSED

    def to_json(self) -> dict[str, Any]:
        return asdict(self) | {"outcome": self.outcome.value}

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> TestResult:
        return cls(**{**data, "outcome": Outcome(data["outcome"])})


@dataclass
class Grade:
    """A submission's grade: per-test results, the rejection if any, and the diagnosis."""

    submission: str
    tests: list[TestResult]
    rejected: str = ""  # why the submission was refused without running, if it was
    diagnosis: dict[str, str] = field(default_factory=dict)  # config -> first divergence
    seconds: float = 0.0
    isolation: str = DESCRIBED[SANDBOX]  # how its workers ran: a tier's `described` (tier_names)
    error: str = ""  # the grader's own traceback, if grading this submission broke it
    start_seconds: list[float] = field(default_factory=list)  # each worker's start-up, loading

    @property
    def score(self) -> float:
        return sum(t.score for t in self.tests)

    @property
    def max_score(self) -> float:
        return sum(t.max_score for t in self.tests)

    @property
    def passed(self) -> bool:
        return not self.rejected and all(t.passed for t in self.tests)

    def to_json(self) -> dict[str, Any]:
        """Every field (from_json reads it back): what a grade is on the wire."""
        return asdict(self) | {"tests": [t.to_json() for t in self.tests]}

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> Grade:
        return cls(**{**data, "tests": [TestResult.from_json(t) for t in data["tests"]]})
