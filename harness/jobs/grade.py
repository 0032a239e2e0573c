"""`xfmr grade` and `xfmr grade-batch`: the shared tests on untrusted submissions, with points.

A submission runs only in workers that are each a bubblewrap sandbox of their own
(harness.isolation.sandbox): a crash, a hang, an exit with status 0 or a memory bomb is that
test's failure with its reason, and grading goes on in a fresh sandbox. If no sandbox can be set
up, grading refuses (exit 2) unless told --unsafe-no-sandbox. Every verdict is
reached here, in the parent, against the oracle; reports are written here too, after every
worker and whatever it started is gone, so nothing the submission wrote can stand in for them.
"""

from __future__ import annotations

import argparse
import os
import re
import sys
import tempfile
import threading
import time
import traceback
import xml.etree.ElementTree as ET
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any

import pandas as pd

from harness import work
from harness.engine import Cell, Launch, run_subject, unjudgeable
from harness.isolation import container
from harness.isolation.sandbox import (
    CONTAINER_TIER,
    DEFAULT_LIMITS,
    INPUT,
    SANDBOX_TIER,
    TIERS,
    Limits,
    UnsafeInput,
    staged,
    starter,
)
from harness.isolation.static_check import check_submission
from harness.isolation.worker import (
    LOAD_TIMEOUT,
    SubjectRaised,
    WorkerDied,
    WorkerTimeout,
    printable,
)
from harness.options import (
    CONTAINER,
    SANDBOX,
    UNSAFE,
    add_isolation,
    isolation_problem,
    positive,
    usage_error,
)
from harness.outcomes import Outcome
from harness.reports import grades as tables
from harness.reports.gradescope import refusal
from harness.reports.safe import to_csv
from harness.reports.writer import report_path_problem, write_all
from harness.shared_tests.diagnosis import diagnose
from harness.shared_tests.inputs import draw_secret, set_draw_secret
from harness.shared_tests.laws import BY_NAME, SHARED_TESTS
from harness.shared_tests.record import VISIBILITIES, Test
from harness.subjects import Kind, Subject

# What each outcome means to a student, before the engine's own message.
_REASON = {
    Outcome.KILLED: "failed",
    Outcome.ERROR: "crashed",
    Outcome.TIMEOUT: "timed out",
    Outcome.NOT_APPLICABLE: "not applicable",
}


@dataclass
class TestResult:
    """One shared test's verdict on a submission."""

    name: str
    law: str
    outcome: str  # an Outcome value
    score: float
    max_score: float
    message: str  # what a student can act on; empty when passed
    seconds: float
    visibility: str = "visible"  # Gradescope's, from the test's record

    @property
    def passed(self) -> bool:
        return self.outcome == Outcome.PASSED.value


@dataclass
class Grade:
    """A submission's grade: per-test results, the rejection if any, and the diagnosis."""

    submission: str
    tests: list[TestResult]
    rejected: str = ""  # why the submission was refused without running, if it was
    diagnosis: dict[str, str] = field(default_factory=dict)  # config -> first divergence
    seconds: float = 0.0
    isolation: str = SANDBOX  # how its workers ran: SANDBOX or UNSAFE
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


def submitted(path: Path) -> Path:
    """What to load of `path`: the file or package itself, or, in a folder without __init__.py
    (Gradescope's /autograder/submission), its transformer.py or its one module."""
    if not path.is_dir() or path.is_symlink() or (path / "__init__.py").is_file():
        return path
    if (path / "transformer.py").is_file():
        return path / "transformer.py"
    modules = sorted(p for p in path.glob("*.py") if p.is_file())
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


def rejection(path: Path, folder: Path | None = None) -> str:
    """Why `path` cannot be graded at all, in the student's terms; "" if it can be run. With
    `folder` (the student's folder `path` was found in), every .py file in it is checked."""
    if not path.exists() and not path.is_symlink():
        return f"{path} does not exist"
    if path.is_symlink():
        return f"{path} is a symbolic link, not a submission"
    if path.is_dir():
        if not (path / "__init__.py").is_file():
            found = sorted(p.name for p in path.iterdir())[:8]
            return (
                f"{path} is a folder without __init__.py and holds neither transformer.py nor "
                f"exactly one .py file (it holds {found}): submit transformer.py, or a package "
                "with __init__.py"
            )
    elif path.suffix != ".py":
        return f"{path} is not a .py file"
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


def grade(
    path: str | Path,
    tests: Sequence[Test] = SHARED_TESTS,
    limits: Limits = DEFAULT_LIMITS,
    time_limit: float | None = None,
    unsafe: bool = False,
    isolation: str = SANDBOX_TIER,
) -> Grade:
    """Run `tests` on the submission at `path` (a .py file, a package directory, or a student's
    folder holding transformer.py and its helper modules), each of its workers isolated as
    `isolation` says: a sandbox of its own, or the container tier's dedicated user (unsafe=True:
    forked without either, for trusted code only).

    Whatever the submission does, the answer is a Grade: an error of the grader's own while
    grading it becomes that submission's failing grade with the reason, never an exception."""
    start = time.monotonic()
    path = Path(path)
    if time_limit is not None:  # a cap on every test's own limit
        tests = [replace(t, timeout=min(t.timeout, time_limit)) for t in tests]
    load_timeout = time_limit if time_limit is not None else LOAD_TIMEOUT
    mode = UNSAFE if unsafe else CONTAINER if isolation == CONTAINER_TIER else SANDBOX
    shown, path = path, submitted(path)
    folder = folder_of(shown, path)
    rejected = rejection(path, folder)

    def failing(reason: str) -> list[TestResult]:  # nothing judged: an error of every test
        error = Outcome.ERROR.value
        return [
            TestResult(t.name, t.law, error, 0.0, t.points, reason, 0.0, t.visibility)
            for t in tests
        ]

    if rejected:  # nothing of it ran: an error of every test, not a failed law
        results = failing(rejected)
        return Grade(str(shown), results, rejected, {}, time.monotonic() - start, mode)
    inside = Path(INPUT)
    try:
        with staged(staging(path, folder)) as stage:
            start_worker, inside = starter(stage, limits, unsafe, isolation)

            def launch(s: Subject) -> Launch:
                # the student's folder first on the worker's import path: its modules import
                spec = {"path": str(inside / path.name), "folder": str(inside)}
                return Launch(start_worker, spec, ("probes",), limits.confine(), load_timeout)

            subject = Subject(path.stem, Kind.SUBMISSION, path=str(path))
            try:
                cells, starts = run_subject(subject, tests, lambda test, cell: None, launch)
                values = [t for t in tests if t.values]  # a failure there gets the diagnosis
                failed = any(cells[t.name].outcome is Outcome.KILLED for t in values)
                found = _diagnose(launch(subject)) if failed else {}
            finally:
                if isolation == CONTAINER_TIER and not unsafe:  # nothing of the user survives
                    container.sweep(container.account(), os.path.realpath(sys.executable))
    except UnsafeInput as e:
        reason = f"rejected: {e}"
        results = failing(reason)
        return Grade(str(shown), results, reason, {}, time.monotonic() - start, mode)
    except Exception as e:  # the grader's own failure on this submission: said, never raised
        reason = f"grader error while grading this submission: {type(e).__name__}: {e}"
        return Grade(
            str(shown),
            failing(reason),
            "",
            {},
            time.monotonic() - start,
            mode,
            error=traceback.format_exc(),
        )
    results, told = [], ""
    for t in tests:  # the diagnosis is said once, under the first failed value test
        results.append(_result(t, cells[t.name], found, told))
        if t.values and found and not results[-1].passed and not told:
            told = t.name
    # messages name the student's own files, not where the worker saw them
    where = f"{inside}/"
    results = [replace(r, message=r.message.replace(where, "")) for r in results]
    found = {k: v.replace(where, "") for k, v in found.items()}
    seconds = time.monotonic() - start
    return Grade(str(shown), results, "", found, seconds, mode, start_seconds=starts)


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


def _result(test: Test, cell: Cell, found: dict[str, str], told: str = "") -> TestResult:
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
        cell.outcome.value,
        score,
        max_score,
        message,
        round(cell.seconds, 3),
        test.visibility,
    )


# --- reports ----------------------------------------------------------------------------------


def text(g: Grade) -> str:
    """The readable summary: one line per test, then why each failure failed."""
    lines = [f"Grading {printable(g.submission)}", ""]
    if g.isolation != SANDBOX:
        lines += [g.isolation, ""]
    if g.rejected:
        lines += [g.rejected, ""]
    width = max(len(t.name) for t in g.tests)
    for t in g.tests:
        mark = "PASS" if t.passed else t.outcome.upper()
        lines.append(
            f"  {mark:<8} {t.name:<{width}}  {t.score:g}/{t.max_score:g}  {t.seconds:6.2f} s"
        )
    failures = [t for t in g.tests if not t.passed and not g.rejected]
    if failures:
        lines += ["", "Why:"]
        for t in failures:
            lines.append(f"  {t.name} ({t.law})")
            lines += [f"    {line}" for line in t.message.splitlines()[:8]]
    lines += [
        "",
        f"Score: {g.score:g}/{g.max_score:g} ({sum(t.passed for t in g.tests)}/{len(g.tests)} "
        f"tests passed) in {g.seconds:.1f} s",
    ]
    if g.start_seconds:
        each = ", ".join(f"{x:.1f}" for x in g.start_seconds)
        lines.append(f"Worker start-up (process, interpreter, torch, the submission): {each} s")
    return "\n".join(lines)


def to_json(g: Grade) -> dict[str, Any]:
    return {
        "submission": g.submission,
        "score": g.score,
        "max_score": g.max_score,
        "passed": g.passed,
        "rejected": g.rejected,
        "diagnosis": g.diagnosis,
        "seconds": round(g.seconds, 2),
        "isolation": g.isolation,
        "start_seconds": [round(x, 3) for x in g.start_seconds],
        "grader_error": g.error,
        "tests": [asdict(t) for t in g.tests],
    }


STAFF_FAULT = (
    "GRADER ERROR: the grader failed while grading this submission; this is not a verdict on "
    "your code, and its score of 0 stands only until course staff regrade it."
)


def _summary(g: Grade) -> str:
    if g.error:
        return (
            f"{STAFF_FAULT}\nCourse staff: the autograder's output (stdout) has the traceback; "
            "fix the cause or report it, then regrade this submission (xfmr grade exit status 3)."
        )
    return g.rejected or f"{sum(t.passed for t in g.tests)}/{len(g.tests)} tests passed"


def gradescope(
    g: Grade, visibility: str = "visible", stdout_visibility: str = "hidden"
) -> dict[str, Any]:
    """Gradescope's results.json (score, execution_time, output, visibility,
    stdout_visibility, tests[] each with its own visibility from the test's record): always a
    top-level score, 0 for a rejection or a grader fault (whose output tells staff what to do)."""
    return {
        "score": g.score,
        "execution_time": round(g.seconds, 2),
        "output": _summary(g) + ("" if g.isolation != UNSAFE else f"\n{g.isolation}"),
        "output_format": "text",
        "visibility": visibility,
        "stdout_visibility": stdout_visibility,
        "tests": [
            {
                "name": t.name,
                "score": t.score,
                "max_score": t.max_score,
                "status": "passed" if t.passed else "failed",
                "output": t.message or t.law,
                "output_format": "text",
                "visibility": t.visibility,
            }
            for t in g.tests
        ],
    }


def junit(g: Grade) -> str:
    """JUnit XML: one testcase per shared test; crashes and timeouts as <error>."""
    suite = ET.Element(
        "testsuite",
        name=printable(f"xfmr grade {Path(g.submission).name}"),
        tests=str(len(g.tests)),
        failures=str(sum(t.outcome == Outcome.KILLED.value for t in g.tests)),
        errors=str(sum(t.outcome in ("error", "timeout") for t in g.tests)),
        skipped=str(sum(t.outcome == Outcome.NOT_APPLICABLE.value for t in g.tests)),
        time=f"{g.seconds:.3f}",
    )
    for t in g.tests:
        case = ET.SubElement(
            suite, "testcase", classname="xfmr.shared_tests", name=t.name, time=f"{t.seconds:.3f}"
        )
        message = printable(t.message)  # XML 1.0 forbids most control characters
        first = (message.splitlines() or [""])[0]
        if t.outcome == Outcome.KILLED.value:
            ET.SubElement(case, "failure", message=first).text = message
        elif t.outcome in ("error", "timeout"):
            ET.SubElement(case, "error", message=first).text = message
        elif t.outcome == Outcome.NOT_APPLICABLE.value:
            ET.SubElement(case, "skipped")
    root = ET.Element("testsuites")
    root.append(suite)
    ET.indent(root)
    return ET.tostring(root, encoding="unicode", xml_declaration=True) + "\n"


# --- xfmr grade -------------------------------------------------------------------------------


def _add_gradescope(parser: argparse.ArgumentParser) -> None:
    for option, default, what in (
        ("--visibility", "visible", "the whole result"),
        ("--stdout-visibility", "hidden", "the grader's standard output"),
    ):
        parser.add_argument(
            option, choices=VISIBILITIES, default=default, help=f"Gradescope's, for {what}"
        )


def _add_limits(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--time-limit", type=positive(float), metavar="S", help="cap every test's limit (seconds)"
    )
    add_isolation(parser)
    parser.add_argument("--tests", metavar="NAMES", help="comma-separated shared tests to run")


def _selected(args: argparse.Namespace) -> list[Test]:
    if not args.tests:
        return list(SHARED_TESTS)
    names = args.tests.split(",")
    unknown = sorted(set(names) - {t.name for t in SHARED_TESTS})
    if unknown:
        known = [t.name for t in SHARED_TESTS]
        raise SystemExit(usage_error("grade", f"--tests: unknown {unknown}; known: {known}"))
    return [t for t in SHARED_TESTS if t.name in names]


def configure_grade(parser: argparse.ArgumentParser) -> None:
    parser.epilog = (
        "exit status: 0 every test passed; 1 some test failed (or the submission was rejected); "
        "2 nothing was graded (bad options, an unwritable report path, no isolation: the "
        "Gradescope report then says so); 3 the grader itself failed on the submission (the "
        "reports say so)"
    )
    parser.add_argument(
        "submission", help="a .py file, a package directory, or a folder holding transformer.py"
    )
    parser.add_argument("--json", metavar="FILE", help="the grade as JSON")
    parser.add_argument("--junit", metavar="FILE", help="JUnit XML for CI")
    parser.add_argument("--gradescope", metavar="FILE", help="Gradescope's results.json")
    _add_gradescope(parser)
    _add_limits(parser)
    parser.add_argument(
        "--isolation",
        choices=TIERS,
        default=SANDBOX_TIER,
        help="how untrusted workers are isolated: a bubblewrap sandbox each (default), or the "
        "container tier (root, as the dedicated user the autograder's setup.sh creates: where "
        "bubblewrap cannot start); never chosen for you",
    )


def run_grade(args: argparse.Namespace) -> int:
    reports = [p for p in (args.json, args.junit, args.gradescope) if p]
    for path in reports:
        if problem := report_path_problem(path):
            return usage_error("grade", f"cannot write a report: {problem}")
    hidden = sorted({Path(p).resolve().parent for p in reports})
    if problem := isolation_problem(args, hidden):
        if args.gradescope:  # the student's page says it was not graded, and staff read why
            tests = _selected(args)
            write_all(
                "grade",
                [
                    (
                        args.gradescope,
                        lambda: refusal(tests, problem, args.visibility, args.stdout_visibility),
                    )
                ],
            )
        return usage_error("grade", problem)
    limits = Limits(memory_mb=args.memory_mb)
    g = grade(
        args.submission,
        _selected(args),
        limits,
        args.time_limit,
        args.unsafe_no_sandbox,
        args.isolation,
    )
    print(text(g))
    if g.error:
        print(f"xfmr grade: grader error (exit 3):\n{g.error}", file=sys.stderr)
    written = write_all(
        "grade",
        [
            (args.json, lambda: to_json(g)),
            (args.junit, lambda: junit(g)),
            (args.gradescope, lambda: gradescope(g, args.visibility, args.stdout_visibility)),
        ],
    )
    if g.error:
        return 3
    return 2 if not written else 0 if g.passed else 1


# --- xfmr grade-batch -------------------------------------------------------------------------


def submissions(folder: Path) -> list[Path]:
    """The .py files and folders directly in `folder`, by name (a folder is a package, or a
    student's folder holding transformer.py: grade() tells, and rejects one that is neither)."""
    found = [
        p
        for p in folder.iterdir()
        if not p.name.startswith((".", "__"))
        and ((p.suffix == ".py" and p.is_file()) or p.is_dir())
    ]
    return sorted(found, key=lambda p: p.name)


class Bar:
    """A one-line progress bar on stderr (a line per submission when not on a terminal)."""

    def __init__(self, total: int) -> None:
        self.total, self.done, self.start = total, 0, time.monotonic()
        self.lock = threading.Lock()

    def step(self, label: str) -> None:
        with self.lock:
            self.done += 1
            filled = round(30 * self.done / self.total)
            line = (
                f"[{'#' * filled}{'.' * (30 - filled)}] {self.done}/{self.total} "
                f"{time.monotonic() - self.start:5.1f} s  {label}"
            )
            end = "\r" if sys.stderr.isatty() and self.done < self.total else "\n"
            print(line, end=end, file=sys.stderr, flush=True)


def grade_batch(
    folder: Path,
    tests: Sequence[Test],
    limits: Limits,
    time_limit: float | None,
    jobs: int,
    bar: Bar | None = None,
    unsafe: bool = False,
    executor: work.Executor | None = None,
) -> list[Grade]:
    """Every submission in `folder`, each a unit of `executor` (default: `jobs` at a time here);
    one that breaks the grader's own code (it should not) becomes a grade with that reason, never
    the end of the batch."""
    paths = submissions(folder)

    def done(i: int, g: Grade) -> None:
        if bar is not None:
            bar.step(f"{paths[i].name}: {g.score:g}/{g.max_score:g}")

    units = [_grade_unit(p, tests, limits, time_limit, unsafe) for p in paths]
    return (executor or work.LocalExecutor(jobs)).run(units, done)


def _grade_unit(
    path: Path, tests: Sequence[Test], limits: Limits, time_limit: float | None, unsafe: bool
) -> work.Unit[Grade]:
    def payload() -> dict[str, Any]:
        strays = [t.name for t in tests if BY_NAME.get(t.name) is not t]
        if strays:
            raise ValueError(f"only the registered shared tests run on a cluster, not {strays}")
        try:
            files = work.pack(path)
        except (OSError, work.TooLarge) as e:
            files = {"unreadable": f"{type(e).__name__}: {e}"}
        return {
            "draw": draw_secret(),  # every grade of a batch judges on the same draws
            "shown": str(path),
            "files": files,
            "tests": [t.name for t in tests],
            "limits": asdict(limits),
            "time_limit": time_limit,
            "unsafe": unsafe,
        }

    def lost(why: str) -> Grade:
        failing = [
            TestResult(t.name, t.law, Outcome.ERROR.value, 0.0, t.points, why, 0.0, t.visibility)
            for t in tests
        ]
        isolation = UNSAFE if unsafe else SANDBOX
        return Grade(str(path), failing, "", {}, 0.0, isolation, error=why)

    return work.Unit(
        path.name,
        lambda: grade(path, tests, limits, time_limit, unsafe),  # each worker sandboxed
        grade_shipped,
        payload,
        grade_from_json,
        lost,
        sandboxed=not unsafe,
    )


def grade_shipped(payload: dict[str, Any]) -> dict[str, Any]:
    """A grade as a remote unit (on a Dask worker): the shipped submission recreated in a private
    folder, graded by grade() exactly as here (its workers sandboxed on this machine), the grade
    returned as plain data under the client's own path."""
    shown = Path(payload["shown"])
    tests = [BY_NAME[name] for name in payload["tests"]]
    limits = Limits(**payload["limits"])
    if "draw" in payload:
        set_draw_secret(payload["draw"])
    with tempfile.TemporaryDirectory(prefix="xfmr-shipped-") as folder:
        path = Path(folder) / shown.name
        if "unreadable" in payload["files"]:
            g = Grade(str(shown), [], payload["files"]["unreadable"])
            g.tests = [_result(t, Cell(Outcome.ERROR, g.rejected), {}) for t in tests]
        else:
            work.unpack(payload["files"], path)
            g = grade(path, tests, limits, payload["time_limit"], payload["unsafe"])
    data = grade_json(g)
    # the folder it was graded in is this worker's: messages name the client's path instead
    here, there = f"{folder}/", "" if str(shown.parent) == "." else f"{shown.parent}/"
    return _relocated(data, here, there) | {"submission": str(shown)}


def _relocated(value: Any, here: str, there: str) -> Any:
    if isinstance(value, str):
        return value.replace(here, there)
    if isinstance(value, dict):
        return {k: _relocated(v, here, there) for k, v in value.items()}
    if isinstance(value, list):
        return [_relocated(v, here, there) for v in value]
    return value


def grade_json(g: Grade) -> dict[str, Any]:
    """A Grade as plain data, every field (grade_from_json reads it back)."""
    return asdict(g)


def grade_from_json(data: dict[str, Any]) -> Grade:
    return Grade(**{**data, "tests": [TestResult(**t) for t in data["tests"]]})


def graded(g: Grade) -> tables.Graded:
    """A Grade as the batch tables read it (harness.reports.grades, shared with summarize)."""
    lines = [tables.TestLine(t.name, t.passed, t.outcome) for t in g.tests]
    name = Path(g.submission).name
    return tables.Graded(name, g.score, g.max_score, g.passed, lines, g.rejected, g.error)


def batch_table(grades: Sequence[Grade]) -> pd.DataFrame:
    """One row per submission: score, max, passed, each test's outcome."""
    return tables.batch_table([graded(g) for g in grades])


def hardest(grades: Sequence[Grade]) -> pd.DataFrame:
    """Which tests students fail most: failures, share of submissions, most common outcome.
    Rejected submissions (nothing ran) and grader errors are left out: they failed no test.
    (Collected Gradescope results.json files: `xfmr summarize`, harness.reports.grades.)"""
    return tables.hardest([graded(g) for g in grades])


def configure_grade_batch(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("folder", help="a folder of submissions (.py files or packages)")
    parser.add_argument("--out", metavar="DIR", default="grades", help="where reports go")
    parser.add_argument("--jobs", type=positive(int), default=os.cpu_count() or 1, help="at once")
    _add_gradescope(parser)
    _add_limits(parser)
    work.add_scheduler(parser)


def run_grade_batch(args: argparse.Namespace) -> int:
    folder = Path(args.folder)
    paths = submissions(folder) if folder.is_dir() else []
    if not paths:
        return usage_error("grade-batch", f"no submissions in {folder}")
    out = Path(args.out)
    try:
        out.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        return usage_error("grade-batch", f"cannot create {out}: {e.strerror or e}")
    names = ["grades.csv", "hardest_tests.csv"] + [f"{p.stem}.gradescope.json" for p in paths]
    for name in names:
        if problem := report_path_problem(out / name):
            return usage_error("grade-batch", f"cannot write a report: {problem}")
    if problem := isolation_problem(args):
        return usage_error("grade-batch", problem)
    limits = Limits(memory_mb=args.memory_mb)
    try:
        executor = work.executor(args.scheduler, args.jobs)
        try:
            grades = grade_batch(
                folder,
                _selected(args),
                limits,
                args.time_limit,
                args.jobs,
                Bar(len(paths)),
                args.unsafe_no_sandbox,
                executor,
            )
        finally:
            executor.close()
    except work.ClusterProblem as e:
        return usage_error("grade-batch", str(e))
    # every worker is gone: only now does anything get written
    table, worst = batch_table(grades), hardest(grades)  # CSVs through reports.safe.to_csv

    def scope(g: Grade) -> Callable[[], dict[str, Any]]:
        return lambda: gradescope(g, args.visibility, args.stdout_visibility)

    written = write_all(
        "grade-batch",
        [
            (out / "grades.csv", lambda: to_csv(table)),
            (out / "hardest_tests.csv", lambda: to_csv(worst)),
            *[(out / f"{Path(g.submission).stem}.gradescope.json", scope(g)) for g in grades],
        ],
    )
    print(tables.summary_text([graded(g) for g in grades]))
    print(f"\nwrote {out}/grades.csv, {out}/hardest_tests.csv and one Gradescope JSON each")
    if any(g.error for g in grades):
        return 3
    if not written:
        return 2
    return 0 if all(g.passed for g in grades) else 1
