"""The engine: run a suite of tests over a set of subjects, one worker process per subject.

Running and judging are apart. Each subject is loaded in its own worker process, started as
its `Launch` says (harness.isolation: a sandbox for untrusted code, the fork server for trusted
code); the tests' checks run here, in the parent, on plain data the worker sends back. A hang
is a timeout cell, a crash an error cell, and either way a fresh worker runs the subject's
remaining tests. A subject's row is one unit of work (harness.engine.work): by default subjects run
in parallel threads, each thread driving one worker; given a Dask executor, each row runs on a Dask
worker (`run_row`: plain data in, plain data out, the subject forked there, judged there by
this same trusted code).
"""

from __future__ import annotations

import sys
import threading
import time
import traceback
from collections.abc import Callable, Collection, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from harness.engine.work import Executor, LocalExecutor, Unit
from harness.isolation.forkserver import forked
from harness.isolation.worker import (
    LOAD_TIMEOUT,
    Start,
    SubjectRaised,
    Worker,
    WorkerDied,
    WorkerTimeout,
)
from harness.outcomes import Outcome
from harness.records import Cell, SuiteRun
from harness.shared_tests.inputs import draw_secret, run_dtype, set_draw_secret, set_run_dtype
from harness.shared_tests.record import Call, Failure, Test
from harness.subjects import Subject


@dataclass(frozen=True)
class Launch:
    """How one subject's workers start and what they load: the engine's only knowledge of the
    process boundary (harness.isolation)."""

    start: Start  # sandboxed for untrusted code, forked from the fork server for trusted code
    subject: dict[str, Any]  # what the worker loads: {"path"} or {"source", "filename"}
    probes: tuple[str, ...] = ("probes",)  # probe modules of harness.isolation.child
    confine: dict[str, Any] = field(default_factory=dict)  # the worker's own limits
    load_timeout: float = LOAD_TIMEOUT

    def worker(self, trace: bool = False) -> Worker:
        """A started and loaded worker (WorkerDied / WorkerTimeout / SubjectRaised if not);
        traced: it records the subject's functions each request runs (Worker.calls), from load."""
        worker = Worker(self.start)
        if trace:
            worker.calls = set()
        try:
            worker.load(
                self.subject, time.monotonic() + self.load_timeout, self.probes, self.confine
            )
        except BaseException:
            worker.close()
            raise
        return worker


def trusted(subject: Subject) -> Launch:
    """A trusted subject (impl, the torch copy, a mutant): forked from the fork server."""
    return Launch(forked, subject.payload())


# on_cell(subject, test, cell, cells_done, cells_total)
Progress = Callable[[Subject, Test, Cell, int, int], None]


def run_test(test: Test, worker: Worker) -> Cell:
    """Run one test's check against a live worker; the worker may be dead afterwards. A traced
    worker's cell says what the test covered: what loading ran (worker.calls on entry) and what
    the test's calls ran."""
    start = time.monotonic()
    deadline = start + test.timeout

    def call(probe: str, on_ask: Callable[[Any], Any] | None = None, **inputs: Any) -> Any:
        return worker.call(probe, deadline, on_ask, **inputs)

    try:
        test.check(call)
        outcome, message = Outcome.PASSED, ""
    except Failure as e:
        outcome, message = Outcome.KILLED, str(e)
    except SubjectRaised as e:
        outcome, message = Outcome.KILLED, str(e)
    except WorkerTimeout:
        worker.kill()
        outcome, message = Outcome.TIMEOUT, f"no answer within {test.timeout:g} s; killed"
    except WorkerDied as e:
        outcome, message = Outcome.ERROR, str(e)
    except Exception as e:  # the check could not read the answer: malformed data is the subject's
        outcome, message = Outcome.KILLED, unjudgeable(e)
    covered = frozenset(worker.calls) if worker.calls is not None else None
    return Cell(outcome, message, time.monotonic() - start, covered)


def unjudgeable(e: Exception) -> str:
    """The verdict on an answer a check could not read (a string where an array belongs, a
    1-D table): the subject's failure, said in one line, with the check's line for the staff."""
    frames = traceback.extract_tb(e.__traceback__)
    at = f" [{Path(frames[-1].filename).name}:{frames[-1].lineno}]" if frames else ""
    return f"the answer could not be judged: {type(e).__name__}: {str(e)[:300]}{at}"


def warm_up(tests: Sequence[Test]) -> None:
    """Start the tests' parent-side work (Test.warm) in the background, a daemon thread each (an
    exit never waits for one): the oracle's bounds for the run's draws, which a test's check
    then finds computed, or being computed (one computation per key: subjects that share the
    draws share it). What it raises is the check's to meet again, in its own run: dropped here."""

    def quietly(work: Callable[[], None]) -> None:
        try:
            work()
        except Exception:
            pass

    for test in tests:
        if test.warm is not None:
            threading.Thread(target=quietly, args=(test.warm,), daemon=True).start()


class SubjectWorker:
    """One subject's tests, one at a time, as every path that runs them runs them (a matrix row,
    a grade, `xfmr check`, each `pytest --xfmr` item): the worker starts when the first test
    needs it; a subject that cannot load fails every test with that load's cell; after a test
    that timed out, errored or left the worker dead (a question its check could not answer
    kills it) the next test gets a fresh worker; traced, every test gets one, so what it covers
    is what it runs from a fresh load, never less because an earlier test ran something first
    (a memoized function, a module-level table filled once)."""

    def __init__(
        self,
        subject: Subject,
        launch: Callable[[Subject], Launch] = trusted,
        trace: bool = False,
    ) -> None:
        self.subject, self.launch, self.trace = subject, launch, trace
        self.worker: Worker | None = None
        self.load_failure: Cell | None = None
        self.starts: list[float] = []  # each worker start's seconds

    def cell(self, test: Test) -> Cell:
        """The test's cell on this subject."""
        if self.load_failure is not None:
            return self.load_failure
        if self.worker is None:
            begun = time.monotonic()
            self.worker, self.load_failure = _start(self.launch(self.subject), self.trace)
            self.starts.append(time.monotonic() - begun)
            if self.load_failure is not None:
                return self.load_failure
        assert self.worker is not None  # _start gives a worker or a load failure
        cell = run_test(test, self.worker)  # traced: worker.calls holds what loading ran
        dead = self.worker.status is not None
        if self.trace or dead or cell.outcome in (Outcome.TIMEOUT, Outcome.ERROR):
            self.close()
        return cell

    def close(self) -> None:
        if self.worker is not None:
            self.worker.close()
            self.worker = None


def run_subject(
    subject: Subject,
    tests: Sequence[Test],
    on_cell: Callable[[Test, Cell], None],
    launch: Callable[[Subject], Launch] = trusted,
    trace: bool = False,
) -> tuple[dict[str, Cell], list[float]]:
    """Every test on one subject in order (SubjectWorker); the cells, and each worker start's
    seconds (the last one's failed to load if load failed). trace: each cell says which of the
    subject's functions loading and its test ran, each test in a fresh worker."""
    cells: dict[str, Cell] = {}
    runner = SubjectWorker(subject, launch, trace)
    warm_up(tests)
    try:
        for test in tests:
            cells[test.name] = cell = runner.cell(test)
            on_cell(test, cell)
    finally:
        runner.close()
    return cells, runner.starts


def run_subject_apart(
    subject: Subject,
    tests: Sequence[Test],
    apart: Collection[str],
    launch: Callable[[Subject], Launch] = trusted,
) -> tuple[dict[str, Cell], list[float]]:
    """run_subject with the tests named in `apart` in a worker of their own, beside the others'
    worker, each driven by a thread of its own: a subject's grade takes the longer of the two
    instead of their sum where a second core is free. The cells are the same as run_subject's
    (no test reads another's outcome), in the tests' order; the starts are both workers'."""
    groups = [[t for t in tests if t.name not in apart], [t for t in tests if t.name in apart]]
    groups = [g for g in groups if g]
    if len(groups) < 2:
        return run_subject(subject, tests, lambda test, cell: None, launch)
    answers: list[Any] = [None, None]  # (cells, starts) or what the thread raised

    def run(i: int) -> None:
        try:
            answers[i] = run_subject(subject, groups[i], lambda test, cell: None, launch)
        except BaseException as e:  # raised again below, in the caller's thread
            answers[i] = e

    beside = threading.Thread(target=run, args=(1,), name=f"{subject.name}-apart", daemon=True)
    beside.start()
    run(0)
    beside.join()
    cells: dict[str, Cell] = {}
    starts: list[float] = []
    for answer in answers:
        if isinstance(answer, BaseException):
            raise answer
        cells.update(answer[0])
        starts += answer[1]
    return {t.name: cells[t.name] for t in tests}, starts


DTYPE_TIMEOUT = 10.0  # seconds for the worker to take the run's dtype (a module global set)


def _start(launch: Launch, trace: bool = False) -> tuple[Worker | None, Cell | None]:
    """A loaded worker, or the cell that its failure to load gives every test."""
    start = time.monotonic()
    try:
        worker = launch.worker(trace)
        if run_dtype() is not None:  # the harness's own probe: every model in the run's dtype
            worker.call("use_dtype", time.monotonic() + DTYPE_TIMEOUT, dtype=run_dtype())
        return worker, None
    except SubjectRaised as e:  # the subject raised at import: every test fails on it
        cell = Cell(Outcome.KILLED, str(e), time.monotonic() - start)
    except WorkerTimeout:
        seconds = time.monotonic() - start  # the worker's own load limit, LOAD_TIMEOUT or less
        cell = Cell(Outcome.TIMEOUT, f"loading took over {seconds:.0f} s; killed", seconds)
    except WorkerDied as e:
        cell = Cell(Outcome.ERROR, f"load: {e}", time.monotonic() - start)
    return None, cell


def run_suite(
    tests: Sequence[Test],
    subjects: Sequence[Subject],
    jobs: int | None = None,
    progress: Progress | None = None,
    launch: Callable[[Subject], Launch] = trusted,
    executor: Executor | None = None,
    groups: Mapping[str, Sequence[Sequence[str]]] | None = None,
    traced: Collection[str] = (),
) -> SuiteRun:
    """Every test on every subject: each subject's row a unit of `executor` (default: up to
    `jobs` subjects at once in threads here, the CPU count by default), each subject's workers
    started as `launch` says. `groups`: subject -> groups of test names, each group a unit of its
    own (default: one group of every test); a test in no group is left out of the run's cells
    (the incremental cache and harness.engine.coverage fill those). `traced`: the subjects whose
    cells say what they covered (trusted subjects loaded from source)."""
    names = [t.name for t in tests]
    if len(set(names)) != len(names):
        raise ValueError(f"test names must be unique, got {names}")
    if len({s.name for s in subjects}) != len(subjects):
        raise ValueError(f"subject names must be unique, got {[s.name for s in subjects]}")
    run = SuiteRun(list(tests), list(subjects))
    pieces = [
        (s, [t for t in tests if t.name in group])
        for s in subjects
        for group in (groups.get(s.name, ()) if groups is not None else [names])
        if group
    ]
    total = sum(len(piece) for _, piece in pieces)
    lock = threading.Lock()
    started = time.monotonic()
    for s in subjects:
        run.subject_seconds[s.name], run.worker_starts[s.name], run.start_seconds[s.name] = 0, 0, []

    def record(subject: Subject, test: Test, cell: Cell) -> None:
        with lock:
            run.cells[(test.name, subject.name)] = cell
            if progress is not None:
                progress(subject, test, cell, len(run.cells), total)

    def one(subject: Subject, piece: Sequence[Test]) -> Row:
        t0 = time.monotonic()
        on_cell = lambda test, cell: record(subject, test, cell)  # noqa: E731
        cells, starts = run_subject(subject, piece, on_cell, launch, subject.name in traced)
        return Row(cells, starts, time.monotonic() - t0, live=True)

    def done(i: int, row: Row) -> None:
        subject, piece = pieces[i]
        if not row.live:  # a remote row: its cells arrive together
            for test in piece:
                record(subject, test, row.cells[test.name])
        with lock:  # a subject's time and starts: its pieces' together
            run.subject_seconds[subject.name] += row.seconds
            run.worker_starts[subject.name] += len(row.starts)
            run.start_seconds[subject.name] += row.starts

    units = [_row_unit(s, piece, launch, one, s.name in traced) for s, piece in pieces]
    (executor or LocalExecutor(jobs)).run(units, done)
    run.wall_seconds = time.monotonic() - started
    return run


@dataclass
class Row:
    """One subject's row: its cells by test name, each worker start's seconds, its time."""

    cells: dict[str, Cell]
    starts: list[float]
    seconds: float
    live: bool = False  # its cells were reported one by one as they came (run here)


def _row_unit(
    subject: Subject,
    tests: Sequence[Test],
    launch: Callable[[Subject], Launch],
    one: Callable[[Subject, Sequence[Test]], Row],
    trace: bool = False,
) -> Unit[Row]:
    def payload() -> dict[str, Any]:
        from harness.shared_tests.laws import BY_NAME

        if launch is not trusted:
            raise ValueError("only trusted subjects' rows run on a cluster (the matrix's)")
        strays = [t.name for t in tests if BY_NAME.get(t.name) is not t]
        if strays:
            raise ValueError(f"only the registered shared tests run on a cluster, not {strays}")
        load = subject.payload()
        tests_ = [t.name for t in tests]
        # the run's secret travels with the unit: every row of a run judges on the same draws
        draw = draw_secret()
        return {
            "subject": subject.to_json(),
            "load": load,
            "tests": tests_,
            "trace": trace,
            "draw": draw,
            "dtype": run_dtype(),
        }

    def lost(why: str) -> Row:
        return Row({t.name: Cell(Outcome.ERROR, why) for t in tests}, [], 0.0)

    return Unit(subject.name, lambda: one(subject, tests), run_row, payload, decode_row, lost)


def run_row(payload: dict[str, Any]) -> dict[str, Any]:
    """A row as a remote unit (on a Dask worker): the named shared tests on one trusted subject,
    loaded from the source text in `payload` by a worker forked from this machine's fork server,
    and judged here by the same checks; plain data in, plain data out."""
    from harness.shared_tests.laws import BY_NAME

    subject = Subject.from_json(payload["subject"])
    tests = [BY_NAME[name] for name in payload["tests"]]
    if "draw" in payload:
        set_draw_secret(payload["draw"])
    set_run_dtype(payload.get("dtype"))
    t0 = time.monotonic()
    spec = payload["load"]
    launch = lambda s: Launch(forked, spec)  # noqa: E731
    trace = payload.get("trace") is True
    cells, starts = run_subject(subject, tests, lambda t, c: None, launch, trace)
    return {
        "cells": {n: c.to_json() for n, c in cells.items()},
        "starts": starts,
        "seconds": time.monotonic() - t0,
    }


def decode_row(data: dict[str, Any]) -> Row:
    cells = {n: Cell.from_json(c) for n, c in data["cells"].items()}
    return Row(cells, list(data["starts"]), data["seconds"])


def print_progress(subject: Subject, test: Test, cell: Cell, done: int, total: int) -> None:
    """A progress line per cell on stderr."""
    print(
        f"[{done:>3}/{total}] {subject.name:<10} {test.name:<52} {cell.outcome.value:<8} "
        f"{cell.seconds:6.2f} s",
        file=sys.stderr,
        flush=True,
    )


@contextmanager
def trusted_call(subject: Subject, timeout: float = 600.0) -> Iterator[Call]:
    """`call` on a trusted subject's worker, for the tools that derive bars from impl or check
    bounds on the torch copy: the same probes and wire as a test's."""
    worker = trusted(subject).worker()
    try:
        yield lambda probe, **inputs: worker.call(probe, time.monotonic() + timeout, **inputs)
    finally:
        worker.close()
