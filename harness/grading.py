"""How one submission is graded, whichever front end asks: `xfmr grade` and `grade-batch`
(harness.jobs.grade, sandboxed workers), `xfmr check` and `pytest --xfmr`
(harness.students.selfcheck, plain subprocesses). `Grading` is the one procedure: what is loaded
of a path and what is rejected before anything of it runs, where its workers run (a `Workers`
placement), the tests run as harness.engine.run.SubjectWorker runs them, the forward pass's
diagnosis run once and said once, each test's line of the grade, and a grader error as every
test's failure.
"""

from __future__ import annotations

import os
import re
import stat
import sys
import time
import traceback
from collections.abc import Callable, Collection, Iterator, Sequence
from contextlib import AbstractContextManager, ExitStack, contextmanager
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from harness import canary
from harness.engine.run import Launch, SubjectWorker, run_subject_apart, unjudgeable
from harness.isolation import container, tiers
from harness.isolation.limits import Limits
from harness.isolation.staging import (
    MAX_BYTES,
    MAX_ENTRIES,
    UnsafeInput,
    kind_problem,
    size_problem,
    staged,
)
from harness.isolation.static_check import check_submission
from harness.isolation.tiers import Tier
from harness.isolation.worker import (
    LOAD_TIMEOUT,
    NOT_IMPLEMENTED,
    SubjectRaised,
    WorkerDied,
    WorkerTimeout,
)
from harness.outcomes import Outcome
from harness.records import Cell, Grade, TestResult
from harness.shared_tests.diagnosis import diagnose
from harness.shared_tests.record import Test
from harness.subjects import Kind, Subject

# The longest test, run beside the others in a worker of its own when a grade has a second core:
# a correct submission's learning test trains for 5-6 s, about as long as the other 18 tests'
# worker time together (examples/correct_submission.py, idle machine), so the grade's tests take
# the longer of the two instead of their sum. The second worker's start-up (~2.5 s, and its own
# first optimizer's import of torch._dynamo) runs on the other core.
APART = ("test_learns_reversed_addition",)


# The cores one grade may take, where graders share a machine (several grading processes, or
# pytest-xdist's workers: tests/conftest.py sets it to each worker's share); default: the
# machine's. With one, a grade runs its tests in one worker: a second worker's start-up is
# ~1.7 s of CPU per grade (examples/correct_submission.py, 4 runs each way) that a busy machine
# pays for nothing. The cells are the same either way.
GRADER_CPUS = "XFMR_GRADER_CPUS"


def grader_cpus() -> int:
    """The cores one grade may take: $XFMR_GRADER_CPUS (a positive integer), else the CPU count."""
    given = os.environ.get(GRADER_CPUS, "").strip()
    if not given:
        return os.cpu_count() or 1
    if not given.isdigit() or int(given) < 1:
        raise ValueError(f"{GRADER_CPUS} must be a positive integer of cores, got {given!r}")
    return int(given)


def tests_apart(one_user: bool = False, cpus: int | None = None) -> tuple[str, ...]:
    """The tests a grade runs in a worker of their own: APART where a second core is free
    (`cpus`, default grader_cpus()), none where every worker runs as one user (the container
    tier: ending a worker ends every process of that user, harness.isolation.container, so a
    second worker would be killed when the first is closed)."""
    if one_user:
        return ()
    return APART if (cpus if cpus is not None else grader_cpus()) > 1 else ()


# What each outcome means to a student, before the engine's own message.
_REASON = {
    Outcome.KILLED: "failed",
    Outcome.ERROR: "crashed",
    Outcome.TIMEOUT: "timed out",
    Outcome.NOT_APPLICABLE: "not applicable",
}


def submitted(path: Path) -> Path:
    """What to load of `path`: the file or package itself, or, in a folder without __init__.py
    (Gradescope's /autograder/submission), its transformer.py or its one module."""
    if not path.is_dir() or path.is_symlink() or (path / "__init__.py").is_file():
        return path
    if (path / "transformer.py").is_file():
        return path / "transformer.py"
    names = _listing(path) or []  # past the cap: the folder itself, which rejection() refuses
    modules = [path / n for n in names if n.endswith(".py") and (path / n).is_file()]
    return modules[0] if len(modules) == 1 else path


def folder_of(shown: Path, main: Path) -> Path | None:
    """The student's folder when `shown` is one (a folder without __init__.py whose main module
    submitted() found): every file in it is part of the submission; None for a file or a
    package, which is the whole submission itself."""
    if shown.is_dir() and not shown.is_symlink() and main != shown:
        return shown
    return None


def staging(main: Path, folder: Path | None) -> dict[str, Path]:
    """What is staged for the worker, each under its own name: every file and folder of the
    student's folder (caches aside), or the file or package alone."""
    if folder is None:
        return {main.name: main}
    entries = sorted(folder.iterdir(), key=lambda p: p.name)
    return {p.name: p for p in entries if p.name != "__pycache__"}


def _listing(folder: Path) -> list[str] | None:
    """The names in `folder`, sorted; None past staging's MAX_ENTRIES (listed no further)."""
    names: list[str] = []
    with os.scandir(folder) as found:
        for entry in found:
            names.append(entry.name)
            if len(names) > MAX_ENTRIES:
                return None
    return sorted(names)


def _tree_problem(top: Path) -> str:
    """Why staging would refuse `top`, found with lstat and counting alone, before a byte of it is
    read: a link or special file, more entries than MAX_ENTRIES, more bytes (apparent sizes: a
    sparse file is not read) than MAX_BYTES; "" if none."""
    entries, left = 0, MAX_BYTES
    todo = [(top, "")]  # each entry named as staging names it: relative to a folder
    while todo:
        here, where = todo.pop()
        info = os.lstat(here)
        if problem := kind_problem(info.st_mode, where or top.name):
            return problem
        if not stat.S_ISDIR(info.st_mode):
            if problem := size_problem(info.st_size, where or top.name, left):
                return problem
            left -= info.st_size
            continue
        names = _listing(here)
        names = None if names is None else [n for n in names if n != "__pycache__"]
        entries += len(names) if names is not None else MAX_ENTRIES + 1
        if names is None or entries > MAX_ENTRIES:
            return f"the submission holds more than {MAX_ENTRIES} files and folders: submit source"
        todo += [(here / n, f"{where}/{n}" if where else n) for n in reversed(names)]
    return ""


def rejection(path: Path, folder: Path | None = None) -> str:
    """Why `path` cannot be graded at all, in the student's terms; "" if it can be run. With
    `folder` (the student's folder `path` was found in), every .py file in it is checked. Every
    entry is looked at with lstat and counted (staging's checks and caps) before any is read."""
    try:
        info = os.lstat(path)
    except FileNotFoundError:
        return f"{path} does not exist"
    except OSError as e:
        return f"{path} could not be read: {e.strerror or e}"
    if stat.S_ISLNK(info.st_mode):
        return f"{path} is a symbolic link, not a submission"
    if stat.S_ISDIR(info.st_mode):
        if not (path / "__init__.py").is_file():
            names = _listing(path)
            found = names[:8] if names is not None else f"more than {MAX_ENTRIES} entries"
            return (
                f"{path} is a folder without __init__.py and holds neither transformer.py nor "
                f"exactly one .py file (it holds {found}): submit transformer.py, or a package "
                "with __init__.py"
            )
    elif path.suffix != ".py":
        return f"{path} is not a .py file"
    try:
        if problem := _tree_problem(folder if folder is not None else path):
            return f"rejected: {problem}"
    except OSError as e:
        return f"{path} could not be read: {e.strerror or e}"
    try:
        problems = check_submission(folder if folder is not None else path)
    except OSError as e:
        return f"{path} could not be read: {e.strerror or e}"
    parse = [p for p in problems if "does not parse" in p]
    if parse:
        return "rejected: the submission does not parse: " + "; ".join(parse)
    if problems:
        return "rejected: the submission imports the grader's own packages: " + "; ".join(problems)
    return ""


@dataclass
class Placement:
    """Where one submission's workers run while it is graded: how each starts (`launch`), the
    folder prefix its messages show for the student's own files (`inside`, dropped from every
    message), and what the placement found to say when it ended (`note`: processes a container
    sweep could not end), said in the grade's isolation line."""

    launch: Callable[[Subject], Launch]
    inside: str = ""
    note: str = ""


# How a submission's workers are placed: (the module to load, the student's folder or None) ->
# a context holding the Placement for the length of the grading. UnsafeInput from it rejects
# the submission.
Workers = Callable[[Path, "Path | None"], AbstractContextManager[Placement]]


def sandboxed(limits: Limits, tier: Tier = tiers.SANDBOX) -> Workers:
    """A grade's workers: the submission staged, each worker started as `tier` starts it (a
    sandbox of its own, the container tier's user; tiers.UNSAFE: forked, for trusted code only),
    the user's processes swept when the grading ends (a one-user tier: the container's)."""

    @contextmanager
    def place(path: Path, folder: Path | None) -> Iterator[Placement]:
        with staged(staging(path, folder)) as stage:
            start_worker, inside = tier.start(stage, limits)

            def launch(s: Subject) -> Launch:
                # the student's folder first on the worker's import path: its modules import
                spec = {"path": str(inside / path.name), "folder": str(inside)}
                return Launch(start_worker, spec, ("probes",), limits.confine(), LOAD_TIMEOUT)

            placement = Placement(launch, f"{inside}/")
            try:
                yield placement
            finally:
                if tier.one_user:  # nothing of it survives
                    # never raises: what survives is said in every report of the grade
                    placement.note = container.sweep_user(os.path.realpath(sys.executable))

    return place


class Grading:
    """One submission through the shared tests, as every front end grades it: `xfmr grade`,
    grade-batch, `xfmr check` and each `pytest --xfmr` item differ only in where the workers run
    (`workers`, said in `mode`). The one procedure: the submission rejected before anything of
    it runs (rejection()); the tests run as harness.engine.run.SubjectWorker runs them (start,
    a load failure every test's, a fresh worker after a failed answer); the forward pass
    diagnosed once, in a worker of its own, when a value test failed on a wrong value; the
    diagnosis said once, under the first failed value test; the student's own file names in
    every message; a grader error of its own becomes every test's failure with the reason,
    never an exception.

    Whole (`grade()`: the tests named in `apart` in a second worker beside the others) or one
    test at a time (`result(test)`, for pytest items); close() ends the workers."""

    def __init__(
        self,
        path: str | Path,
        tests: Sequence[Test],
        mode: str,
        workers: Workers,
        time_limit: float | None = None,
        proof: str | None = "",
    ) -> None:
        self.begun = time.monotonic()
        # the environment the workers are proven in before a verdict (harness.canary): its
        # tier and limits as the front end says them ("": the mode alone), None: not proven
        # (the proof's own grade)
        self.proof = None if proof is None else proof or mode
        self.shown = Path(path)
        self.path = submitted(self.shown)
        self.folder = folder_of(self.shown, self.path)
        if time_limit is not None:  # a cap on every test's own limit; loading keeps its own
            tests = [replace(t, timeout=min(t.timeout, time_limit)) for t in tests]
        self.tests = list(tests)
        self.mode, self.workers = mode, workers
        self.rejected = rejection(self.path, self.folder)
        self.subject = Subject(self.path.stem, Kind.SUBMISSION, path=str(self.path))
        self.results: dict[str, TestResult] = {}  # result(): each test's line so far
        self.found: dict[str, str] = {}
        self._told = ""  # the value test whose message carries the diagnosis
        self._stack = ExitStack()
        self._placement: Placement | None = None
        self._runner: SubjectWorker | None = None
        self._broken = ""  # a grader error met by result(): every later test's reason

    def __enter__(self) -> Grading:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def hold(self, context: AbstractContextManager[Any]) -> None:
        """Keep `context` entered until this grading is closed (a self-check's bounds store)."""
        self._stack.enter_context(context)

    def close(self) -> None:
        if self._runner is not None:
            self._runner.close()
            self._runner = None
        self._stack.close()

    def seconds(self) -> float:
        return time.monotonic() - self.begun

    def _mode(self) -> str:
        note = self._placement.note if self._placement is not None else ""
        return f"{self.mode}; {note}" if note else self.mode

    def _failing(self, reason: str, rejected: str = "", error: str = "") -> Grade:
        results = not_judged(self.tests, reason)
        return Grade(
            str(self.shown), results, rejected, {}, self.seconds(), self._mode(), error=error
        )

    def _said(self, text: str) -> str:
        inside = self._placement.inside if self._placement is not None else ""
        return text.replace(inside, "") if inside else text

    def grade(self, apart: Collection[str] = ()) -> Grade:
        """Every test; the whole grade."""
        if self.rejected:  # nothing of it ran: an error of every test, not a failed law
            return self._failing(self.rejected, self.rejected)
        if unproven := self._prove():  # the grader's environment, never the student's fault
            return self._failing(unproven, error=unproven)
        try:
            with self.workers(self.path, self.folder) as placement:
                self._placement = placement
                cells, starts = run_subject_apart(self.subject, self.tests, apart, placement.launch)
                values = [t for t in self.tests if t.values]
                if any(diagnosable(cells[t.name]) for t in values):
                    self.found = _diagnose(placement.launch(self.subject))
        except UnsafeInput as e:
            return self._failing(f"rejected: {e}", f"rejected: {e}")
        except Exception as e:  # the grader's own failure on this submission: said, never raised
            reason = f"grader error while grading this submission: {type(e).__name__}: {e}"
            return self._failing(reason, error=traceback.format_exc())
        results = [
            replace(r, message=self._said(r.message))
            for r in results_of(self.tests, cells, self.found)
        ]
        found = {k: self._said(v) for k, v in self.found.items()}
        return Grade(
            str(self.shown), results, "", found, self.seconds(), self._mode(), start_seconds=starts
        )

    def result(self, test: Test) -> TestResult:
        """One test's line, the tests taken one at a time in one worker (a fresh one after a
        failed answer); the diagnosis runs at the first value test that failed on a wrong
        value and is said under it, pointed to from the later ones."""
        reason = self.rejected or self._broken
        if not reason and not self.results:
            reason = self._broken = self._prove()
        if not reason:
            try:
                cell = self._cell(test)
            except UnsafeInput as e:
                reason = self.rejected = f"rejected: {e}"
            except Exception as e:  # the grader's own failure: this test's and every later one's
                reason = self._broken = (
                    f"grader error while checking this code: {type(e).__name__}: {e}"
                )
        if reason:
            result = replace(result_line(test, Cell(Outcome.ERROR, reason), {}), message=reason)
        else:
            if test.values and diagnosable(cell) and not self.found:
                assert self._placement is not None
                self.found = _diagnose(self._placement.launch(self.subject))
            result = result_line(test, cell, self.found, self._told)
            result = replace(result, message=self._said(result.message))
            if test.values and self.found and not result.passed and not self._told:
                self._told = test.name
        self.results[test.name] = result
        return result

    def _prove(self) -> str:
        """ "" once a correct model has passed through these workers in this environment
        (harness.canary); else the grader error every test of this grade is."""
        if self.proof is None:
            return ""
        from harness.shared_tests.laws import BY_NAME

        proof = [BY_NAME[name] for name in canary.CANARY_TESTS]

        def run(path: Path) -> Grade:
            with Grading(path, proof, self.mode, self.workers, proof=None) as g:
                return g.grade()

        return canary.prove(self.proof, run)

    def _cell(self, test: Test) -> Cell:
        if self._runner is None:
            self._placement = self._stack.enter_context(self.workers(self.path, self.folder))
            self._runner = SubjectWorker(self.subject, self._placement.launch)
        return self._runner.cell(test)


def diagnosable(cell: Cell) -> bool:
    """A value test failed on a wrong value, not on a definition not yet written (a stub's
    NotImplementedError: the diagnosis would only meet it again)."""
    return cell.outcome is Outcome.KILLED and not cell.message.startswith(NOT_IMPLEMENTED)


def _diagnose(launch: Launch) -> dict[str, str]:
    """diagnosis.diagnose in one more worker; a failure to run it, or an answer it cannot read,
    is said, not raised."""
    try:
        worker = launch.worker()
    except (SubjectRaised, WorkerDied, WorkerTimeout) as e:
        return {"forward pass": f"no diagnosis: {type(e).__name__}: {e}"}
    try:
        deadline = time.monotonic() + launch.load_timeout
        return diagnose(lambda probe, **inputs: worker.call(probe, deadline, **inputs))
    except (SubjectRaised, WorkerDied, WorkerTimeout) as e:
        return {"forward pass": f"no diagnosis: {type(e).__name__}: {e}"}
    except Exception as e:  # a malformed answer
        return {"forward pass": f"no diagnosis: {unjudgeable(e)}"}
    finally:
        worker.close()


_NUMBER = re.compile(r"[-+]?\d+(?:\.\d+)?(?:e[-+]?\d+)?")


def said_once(found: dict[str, str]) -> str:
    """The diagnosis, one line per config, each cause said once: configs whose lines differ only
    in their numbers (the same module, the same cause, other error sizes) share the first one's
    line, and are named after it."""
    groups: dict[str, list[str]] = {}
    for name, line in found.items():
        groups.setdefault(_NUMBER.sub("#", line), []).append(name)
    lines = []
    for names in groups.values():
        line = f"{names[0]}: {found[names[0]]}"
        if len(names) > 1:
            line += f" (the same in: {'; '.join(names[1:])})"
        lines.append(line)
    return "\n".join(lines)


def not_judged(tests: Sequence[Test], reason: str) -> list[TestResult]:
    """Every test an error with `reason`: nothing was judged (a rejection, a grader fault)."""
    return [
        TestResult(t.name, t.law, Outcome.ERROR, 0.0, t.points, reason, 0.0, t.visibility)
        for t in tests
    ]


def results_of(
    tests: Sequence[Test], cells: dict[str, Cell], found: dict[str, str]
) -> list[TestResult]:
    """Each test's line of the grade, the diagnosis said once, under the first failed value
    test."""
    results: list[TestResult] = []
    told = ""
    for t in tests:
        results.append(result_line(t, cells[t.name], found, told))
        if t.values and found and not results[-1].passed and not told:
            told = t.name
    return results


def result_line(test: Test, cell: Cell, found: dict[str, str], told: str = "") -> TestResult:
    """A test's line of the grade; a failed value test carries the forward pass's diagnosis,
    or, when `told` already carries it, says where it is."""
    message = ""
    if cell.outcome is not Outcome.PASSED:
        message = f"{_REASON[cell.outcome]}: {cell.message}".strip()
        if test.values and found and told:
            message += f"\n(the forward pass's diagnosis is under {told})"
        elif test.values and found:
            message += "\n" + said_once(found)
    max_score = 0.0 if cell.outcome is Outcome.NOT_APPLICABLE else float(test.points)
    score = max_score if cell.outcome is Outcome.PASSED else 0.0
    return TestResult(
        test.name,
        test.law,
        cell.outcome,
        score,
        max_score,
        message,
        round(cell.seconds, 3),
        test.visibility,
    )
