"""The incremental cell cache: a cell is re-run only when something that decides it changed.

A cell's key is a content hash (harness.engine.fingerprint) of everything that determines its
outcome:

- the subject's source as its worker loads it (a mutant's: impl's source with its patch applied,
  so a one-line change of one mutant's patch changes that mutant's row only);
- the test: its record (name, time limit) and its check's code with every helper of its module it
  reaches by name (a change to one check changes that column only);
- what every check shares: the verdicts, the inputs and the derived data (harness/data, the
  expectation file aside), the oracle's source, the probes and the rest of the worker's code, the
  wire format, the engine and the outcome rules;
- the versions of Python, numpy and torch, and the machine kind.

Only verdicts are kept: passed, killed and not applicable. Timeouts and errors say as much about
the machine as about the subject (load, a killed process), so those cells always run again.

The store is a plain directory: one small JSON file per entry, `ROOT/ab/abcdef....json`, written
to a private temporary file in the same folder, flushed to disk, then renamed over the entry's
name. A rename within one filesystem is atomic, so a reader sees the old entry, the new one, or
none, never half of one; concurrent writers of one key write the same content and the last rename
wins; a run killed mid-write leaves only a temporary file no reader opens. Each entry also holds
its key and a hash of its content, so a file damaged any other way (a full disk, a copy cut
short) is read as a miss and written again. A directory was chosen over SQLite because it needs
no lock at all (SQLite serialises writers with file locks, which network filesystems, the usual
home of a cache shared by a cluster's machines, often break) and a damaged entry costs one cell,
never the whole store.
"""

from __future__ import annotations

import json
import os
import statistics
import tempfile
import time
from collections.abc import Sequence
from dataclasses import dataclass, replace
from functools import cache
from pathlib import Path
from typing import Any

from harness.engine import fingerprint
from harness.engine.coverage import run_inferring
from harness.engine.run import Progress
from harness.engine.work import Executor
from harness.outcomes import Outcome
from harness.records import Cell, SuiteRun
from harness.shared_tests.inputs import run_dtype
from harness.shared_tests.record import Test
from harness.subjects import Subject

FORMAT = 1
# Outcomes worth keeping: the subject's verdict, not the machine's weather.
KEPT = (Outcome.PASSED, Outcome.KILLED, Outcome.NOT_APPLICABLE)
# What every check shares (the test's own check is hashed apart, by code_closure).
SHARED = (
    "oracle",
    "harness/shared_tests/inputs.py",
    "harness/shared_tests/verdicts.py",
    "harness/shared_tests/searches.py",
    "harness/shared_tests/record.py",
    "harness/data",  # the learning bar (the expectation file is left out below)
    "harness/isolation/child",
    "harness/isolation/worker.py",
    "harness/isolation/forkserver.py",
    "harness/wire.py",
    "harness/engine/run.py",
    "harness/records.py",
    "harness/outcomes.py",
    "harness/subjects.py",
)


def default_root() -> Path:
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / "xfmr-oracle" / "cells"


class Store:
    """A directory of entries, each a JSON value under a hex key (see the module's docstring)."""

    def __init__(self, root: Path) -> None:
        self.root = Path(root)
        self.damaged = 0  # entries found unreadable in this process, each read as a miss

    def _path(self, key: str) -> Path:
        if len(key) < 8 or not all(c in "0123456789abcdef" for c in key):
            raise ValueError(f"a cache key is lowercase hex, got {key!r}")
        return self.root / key[:2] / f"{key}.json"

    def get(self, key: str) -> Any | None:
        """The value stored under `key`, or None if absent or damaged."""
        path = self._path(key)
        try:
            entry = json.loads(path.read_bytes())
            ok = (
                isinstance(entry, dict)
                and entry.get("format") == FORMAT
                and entry.get("key") == key
                and entry.get("check") == fingerprint.digest(entry.get("value"))
            )
        except FileNotFoundError:
            return None
        except (OSError, ValueError):
            ok = False
        if not ok:
            self.damaged += 1
            return None
        return entry["value"]

    def put(self, key: str, value: Any) -> None:
        """Store `value` (JSON-able) under `key`, atomically (see the module's docstring)."""
        path = self._path(key)
        path.parent.mkdir(parents=True, exist_ok=True)
        entry = {"format": FORMAT, "key": key, "value": value, "check": fingerprint.digest(value)}
        fd, temporary = tempfile.mkstemp(prefix=".tmp-", dir=path.parent)
        try:
            with os.fdopen(fd, "wb") as f:
                f.write(json.dumps(entry).encode())
                f.flush()
                os.fsync(f.fileno())
            os.replace(temporary, path)
        except BaseException:
            Path(temporary).unlink(missing_ok=True)
            raise


# --- a student's suite on one subject (xfmr mutation-score --incremental) ----------------------

# The code that runs a student's suite on a subject, beyond what every check shares.
SUITE_CODE = ("harness/jobs/mutation_score.py", "harness/jobs/disguise.py")


def suite_run_key(subject: dict[str, Any], suite: dict[str, Any], settings: dict[str, Any]) -> str:
    """The key of one subject's run of a suite: the subject as loaded (before this run's
    disguise, which is drawn afresh each run and, by design, changes no verdict), the suite's
    files (work.pack: names, bytes, links as links), the run's settings (module name, limits)
    and the code and versions that run it."""
    code = fingerprint.files_digest(fingerprint.tree(*SUITE_CODE))
    return fingerprint.digest("suite-run", shared_code(), code, subject, repr(suite), settings)


# --- the matrix's cells -----------------------------------------------------------------------


EXPECTATION = "expected_matrix.json"  # what --check compares with, not an input of a cell


@cache
def shared_code() -> str:
    files = [p for p in fingerprint.tree(*SHARED) if p.name != EXPECTATION]
    return fingerprint.digest(fingerprint.files_digest(files), fingerprint.versions())


@cache
def _test_code(test: Test) -> str:
    return fingerprint.digest(test.name, test.timeout, fingerprint.code_closure(test.check))


def cell_keys(tests: Sequence[Test], subjects: Sequence[Subject]) -> dict[tuple[str, str], str]:
    """(test, subject) -> the cell's key."""
    shared = shared_code()
    # each subject's source hashed once, not once per test
    loads = {s.name: fingerprint.digest(s.payload()) for s in subjects}
    return {
        (t.name, s.name): fingerprint.digest(
            "matrix-cell", shared, _test_code(t), loads[s.name], run_dtype() or "float64 or float32"
        )
        for t in tests
        for s in subjects
    }


@dataclass(frozen=True)
class Reuse:
    """What an incremental run took from the cache and what it ran."""

    reused: int
    ran: int
    damaged: int
    inferred: int = 0  # not run, newly: impl's coverage shows the test cannot reach the change

    def line(self) -> str:
        total = self.reused + self.ran + self.inferred
        damaged = f"; {self.damaged} damaged entries ignored" if self.damaged else ""
        inferred = f", {self.inferred} inferred from impl's coverage" if self.inferred else ""
        return (
            f"incremental: {self.reused} of {total} cells reused{inferred}, {self.ran} run{damaged}"
        )


def incremental_suite(
    tests: Sequence[Test],
    subjects: Sequence[Subject],
    store: Store,
    jobs: int | None = None,
    progress: Progress | None = None,
    executor: Executor | None = None,
    infer: bool = True,
) -> tuple[SuiteRun, Reuse]:
    """The suite's run, taking from `store` every cell whose key it holds, running only the rest
    (harness.engine.coverage.run_inferring: with `infer`, a mutant's cell that impl's coverage
    shows the test cannot reach is impl's, not run), and storing what ran. The run holds every
    cell either way (a --check sees them all).

    When fewer rows have cells to run than the executor runs units at once, each such row is
    split into that many units (each its own worker), balanced by the tests' last measured
    seconds: one changed mutant's row then takes its slowest test's time, not the sum."""
    started = time.monotonic()
    keys = cell_keys(tests, subjects)
    kept: dict[tuple[str, str], Cell] = {}
    measured: dict[str, list[float]] = {}
    for (test, subject), key in keys.items():
        value = store.get(key)
        if value is not None:
            cell = Cell.from_json(value)
            kept[(test, subject)] = replace(cell, seconds=0.0)  # reused: no time spent now
            if cell.ran:
                measured.setdefault(test, []).append(cell.seconds)
    weight = {
        t.name: statistics.median(measured[t.name]) if t.name in measured else t.timeout
        for t in tests
    }
    run = run_inferring(tests, subjects, kept, jobs, progress, executor, weight=weight, infer=infer)
    ran = inferred = 0
    for cell_id, cell in run.cells.items():
        if cell_id in kept:
            continue
        ran, inferred = ran + cell.ran, inferred + (not cell.ran)
        if cell.outcome in KEPT:
            store.put(keys[cell_id], cell.to_json())
    run.wall_seconds = time.monotonic() - started
    return run, Reuse(len(kept), ran, store.damaged, inferred)
