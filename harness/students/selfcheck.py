"""`xfmr check`: a student's self-check, on their own code and their own machine.

`xfmr check transformer.py` runs the shared tests as `xfmr grade` does: the same engine
(harness.engine.run.run_subject_apart), the same workers, probes and checks, the same messages,
the same forward-pass diagnosis and the same text. `xfmr check --suite tests/` scores the
student's own pytest suite by the pitfall mutants it kills, as `xfmr mutation-score` does, with
its report.

What differs is the trust: the code is the student's own, run by the student on their own
laptop, so no sandbox walls it in and nothing of bubblewrap, os.fork or AF_UNIX SOCK_SEQPACKET
is used (Linux, macOS and Windows alike): each worker is a plain subprocess
(harness.isolation.local). A self-check is therefore not a grade, and every report says so: the
course's grade runs the same tests on the submitted file in the sandbox.

This is a front end over two jobs (like harness.cli), not a job: it uses grade's and
mutation-score's verdicts and reports, and the jobs never import it.
"""

from __future__ import annotations

import argparse
import importlib.util
import os
import random
import secrets
import socket
import sys
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import ExitStack, contextmanager
from pathlib import Path
from typing import Any

from harness import grading
from harness.analysis import Score
from harness.engine import work
from harness.engine.run import Launch
from harness.isolation import forkserver
from harness.isolation.local import confinement, local, workspace
from harness.isolation.sandbox import UnsafeInput, staged
from harness.isolation.worker import (
    LOAD_TIMEOUT,
    SubjectRaised,
    WorkerDied,
    WorkerTimeout,
    printable,
)
from harness.jobs import mutation_score as scoring
from harness.options import positive, usage_error
from harness.records import Grade
from harness.reports import check_page
from harness.reports import grade as grade_report
from harness.reports import score as score_report
from harness.reports.writer import report_path_problem, write_all
from harness.shared_tests import bounds_store
from harness.shared_tests.laws import SHARED_TESTS
from harness.shared_tests.pictures import measure
from harness.shared_tests.record import Test
from harness.students import draws_ahead
from harness.subjects import Kind, Subject

# How a self-check's workers ran: every report of one says so (the grade's `isolation` field).
SELF_CHECK = "SELF-CHECK, not a grade: your own code, run on this machine without a sandbox"
# The environment the canary proves a self-check's workers in (harness.canary), where they fork
# from the warm server: a proof of its own, apart from plain subprocesses'.
WARM_PROOF = f"{SELF_CHECK}; workers forked from the warm fork server"
WARM_SWITCH = "XFMR_CHECK_WARM"  # 0: plain subprocesses (xfmr check --cold)
WARM_IDLE = 300.0  # seconds the warm server outlives the last check
CHECK_CACHE = "XFMR_CHECK_CACHE"  # where self-checks keep bounds and the next check's draws


def load_path(path: Path) -> Path:
    """What a worker loads: the student's own file (or package), where it is, so messages name
    it."""
    return path.resolve()


def warm_available() -> bool:
    """Whether this self-check's workers fork from the warm server (harness.isolation.warm):
    where os.fork and AF_UNIX SOCK_SEQPACKET exist (Linux), unless XFMR_CHECK_WARM=0 (or
    `xfmr check --cold`) asks for plain subprocesses."""
    if os.environ.get(WARM_SWITCH, "1").strip() in ("0", "no", "false", "off"):
        return False
    return (
        sys.platform.startswith("linux")
        and hasattr(os, "fork")
        and hasattr(socket, "SOCK_SEQPACKET")
    )


@contextmanager
def launching(
    path: Path, load_timeout: float = LOAD_TIMEOUT, folder: Path | None = None
) -> Iterator[Launch]:
    """How the self-check's workers on `path` start, in a private folder with the submission's
    folder on their import path (its own helper modules import): each a fresh fork of the warm
    server, which imported torch and the probes once and never a submission
    (warm_available(); it is started by the first check and exits WARM_IDLE seconds after the
    last), else a plain subprocess (harness.isolation.local)."""
    target = load_path(path)
    paths = (str(folder.resolve() if folder else target.parent),)
    with workspace() as work_folder, ExitStack() as stack:
        if warm_available():
            stack.enter_context(forkserver.warm_server(WARM_IDLE))
            start = forkserver.forked_as_local(paths)
        else:
            start = local(work_folder, paths)
        spec = {"path": str(target)}
        if folder is not None:  # loaded as the grader loads a student's folder
            spec["folder"] = str(folder.resolve())
        yield Launch(start, spec, ("probes",), confinement(work_folder), load_timeout)


@contextmanager
def local_workers(path: Path, folder: Path | None) -> Iterator[grading.Placement]:
    """A self-check's workers (grading.Workers): plain subprocesses in a private folder, the
    submission's folder on their import path (its own helper modules import), loaded where the
    file is, so messages name it."""
    with launching(path, LOAD_TIMEOUT, folder) as launch:
        yield grading.Placement(lambda s: launch)


def check(
    path: str | Path, tests: Sequence[Test] = SHARED_TESTS, time_limit: float | None = None
) -> Grade:
    """`tests` on the student's code at `path` (a .py file, a package, or a folder holding
    transformer.py), graded by grade's own procedure (grading.Grading): the same rejections,
    cells, messages, diagnosis and text; only the workers are plain subprocesses (SELF_CHECK)."""
    cache = check_cache()
    with draws_ahead.claimed(cache / "draws", cache / "bounds"):
        return graded(path, tests, time_limit, cache / "bounds")


def graded(
    path: str | Path, tests: Sequence[Test], time_limit: float | None, bounds: Path
) -> Grade:
    """check() on this process's draws, the oracle's bounds kept in `bounds`."""
    apart = grading.tests_apart()  # plain subprocesses: as a grade's sandboxes
    with (
        bounds_store.kept(bounds),
        grading.Grading(path, tests, SELF_CHECK, local_workers, time_limit, proof()) as g,
    ):
        return g.grade(apart)


def check_cache() -> Path:
    """Where self-checks keep the oracle's bounds (harness.shared_tests.bounds_store) and the
    next check's draws (harness.students.draws_ahead): $XFMR_CHECK_CACHE, else the user's
    cache folder."""
    if given := os.environ.get(CHECK_CACHE):
        return Path(given)
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / "xfmr-oracle" / "check"


def proof() -> str:
    """The canary's environment for this self-check's workers ("": the mode alone)."""
    return WARM_PROOF if warm_available() else ""


def text(g: Grade) -> str:
    """A grade's text, headed as the self-check it is."""
    lines = grade_report.text(g).splitlines()
    lines[0] = f"Self-check of {printable(g.submission)} (not a grade)"
    return "\n".join(lines)


def runner(path: str | Path, tests: Sequence[Test] = SHARED_TESTS) -> grading.Grading:
    """The shared tests one at a time on the student's code, for `pytest --xfmr` (one pytest
    item each, Grading.result): graded as check() grades it. Close it when done."""
    g = grading.Grading(path, tests, SELF_CHECK, local_workers, proof=proof())
    g.hold(bounds_store.kept(check_cache() / "bounds"))
    return g


# --- the student's own suite ------------------------------------------------------------------


def run_suite_on(
    source: str,
    tests_dir: Path,
    module_name: str,
    time_limit: float,
    memory_mb: int = 2048,
    stop: frozenset[str] = frozenset(),
) -> scoring.SubjectRun:
    """The suite on one subject's source, as mutation_score.run_on runs it (a private copy of
    the suite and the subject, the same probe, restarting after a test that hangs or crashes),
    in plain subprocesses."""
    start = time.monotonic()
    out = scoring.SubjectRun()
    with staged({"tests": tests_dir}, {"subject.py": source}) as stage:
        launch = Launch(
            local(stage),
            {"path": str(stage / "subject.py")},
            ("probes", "student_suite"),
            confinement(stage, memory_mb),
            scoring.COLLECT_TIMEOUT,
        )
        scoring.suite_in(launch, stage, module_name, time_limit, out, stop)
    out.seconds = time.monotonic() - start
    return out


def suite_check(
    tests_dir: str | Path,
    module_name: str = scoring.MODULE,
    time_limit: float = scoring.TEST_TIMEOUT,
    jobs: int | None = None,
    progress: Callable[[str, scoring.SubjectRun], None] | None = None,
    generated: int = scoring.GENERATED,
    seed: int | None = None,
) -> Score:
    """The suite's mutation score, as mutation_score.mutation_score gives it: the same subjects
    (impl, the torch copy, s01-s11 and the generated sample), rewritten afresh and run in a
    secret order, the correct ones first, scored by the same rules; each subject in plain
    subprocesses."""
    tests_dir = Path(tests_dir).resolve()
    if not tests_dir.is_dir():
        raise FileNotFoundError(f"--suite must be a folder of pytest files, got {tests_dir}")
    started = time.monotonic()
    subs = scoring.subjects() + scoring.generated_subjects(generated, seed)
    secret = random.Random(secrets.randbits(64))
    sources = {s.name: scoring.subject_source(s, secret) for s in subs}
    correct = [s for s in subs if s.is_correct]
    mutants = [s for s in subs if not s.is_correct]
    lock = threading.Lock()
    executor = work.LocalExecutor(jobs)
    runs: dict[str, scoring.SubjectRun] = {}
    stops: dict[str, frozenset[str]] = {}  # a generated mutant's first-kill tests
    for wave in (secret.sample(correct, len(correct)), secret.sample(mutants, len(mutants))):

        def one(s: Subject) -> work.Unit[scoring.SubjectRun]:
            stop = stops.get(s.name, frozenset())

            def run() -> scoring.SubjectRun:
                return run_suite_on(sources[s.name], tests_dir, module_name, time_limit, stop=stop)

            def local_only(payload: Any) -> Any:
                raise RuntimeError("a self-check runs on this machine only")

            lost = lambda why: scoring.SubjectRun(error=why)  # noqa: E731
            return work.Unit(s.name, run, local_only, dict, lambda d: d, lost)

        def done(i: int, r: scoring.SubjectRun, wave: list[Subject] = wave) -> None:
            if progress is not None:
                with lock:
                    progress(wave[i].name, r)

        results = executor.run([one(s) for s in wave], done)
        runs.update(zip([s.name for s in wave], results, strict=True))
        impl = runs["impl"]
        if not impl.collected or (impl.error and not impl.cells):
            raise scoring.SuiteBroken(impl.error or "pytest collected no test on impl")
        if not stops:
            honest = scoring.first_kill_tests(runs, correct)
            stops.update({s.name: honest for s in mutants if scoring.is_generated(s)})
    s = scoring.scored(subs, runs, module_name, time_limit, time.monotonic() - started)
    s.isolation = SELF_CHECK  # every report of it says so (text, JSON)
    return s


def suite_text(s: Score, tests_dir: str) -> str:
    """mutation-score's text (which says SELF_CHECK under its heading), headed as a self-check."""
    lines = score_report.text(s, tests_dir).splitlines()
    lines[0] = f"Self-check: {lines[0]}"
    return "\n".join(lines)


# --- xfmr check -------------------------------------------------------------------------------


def configure_check(parser: argparse.ArgumentParser) -> None:
    parser.description = (
        "A self-check of your own code on your own machine: the shared tests on your "
        "transformer.py, and with --suite the mutation score of your own tests, judged exactly "
        "as `xfmr grade` and `xfmr mutation-score` judge them, but run without a sandbox "
        "(bubblewrap is not needed: Linux, macOS, Windows). Not a grade."
    )
    parser.epilog = (
        "exit status: 0 every test passed (and the suite passed); 1 some test failed (or the "
        "suite did not pass); 2 nothing was checked (bad options, a broken suite); 3 the "
        "checker itself failed"
    )
    parser.add_argument(
        "submission", nargs="?", help="your transformer.py (a file, a package, or its folder)"
    )
    parser.add_argument("--suite", metavar="DIR", help="your own pytest suite: its mutation score")
    parser.add_argument(
        "--module",
        default=scoring.MODULE,
        help=f"the module path your suite imports ({scoring.MODULE})",
    )
    parser.add_argument("--tests", metavar="NAMES", help="comma-separated shared tests to run")
    parser.add_argument(
        "--time-limit", type=positive(float), metavar="S", help="cap every test's limit (seconds)"
    )
    parser.add_argument(
        "--cold",
        action="store_true",
        help="start every worker as a fresh interpreter instead of forking it from the warm "
        f"server that checks keep for {WARM_IDLE / 60:.0f} idle minutes (as {WARM_SWITCH}=0)",
    )
    parser.add_argument("--json", metavar="FILE", help="the self-check's grade as JSON")
    parser.add_argument(
        "--html",
        metavar="FILE",
        help="the self-check as one page to open in a browser: each test's verdict, the "
        "diagnosis, and pictures of a mask or value fault (no script, no network)",
    )
    parser.add_argument("--suite-json", metavar="FILE", help="the suite's score as JSON")
    # the detached preparation of the next check's draws (harness.students.draws_ahead)
    parser.add_argument(draws_ahead.PREPARE_FLAG, metavar="DIR", help=argparse.SUPPRESS)
    parser.add_argument(
        "--jobs", type=positive(int), default=None, help="subjects at once for --suite (CPUs)"
    )
    parser.add_argument(
        "--generated",
        type=int,
        default=scoring.GENERATED,
        metavar="N",
        help=f"--suite: generated mutants drawn ({scoring.GENERATED}; 0: none)",
    )


def page_pictures(submission: str, g: Grade) -> check_page.Pictures:
    """The pictures `g` calls for (check_page.wanted), measured on the submission in one more of
    the self-check's workers (harness.shared_tests.pictures); one that could not be is a note."""
    grids, bars = check_page.wanted(g)
    found = check_page.Pictures()
    if not (grids or bars):
        return found
    shown = Path(submission)
    path = grading.submitted(shown)
    with local_workers(path, grading.folder_of(shown, path)) as placement:
        try:
            worker = placement.launch(Subject(path.stem, Kind.SUBMISSION, path=str(path))).worker()
        except (SubjectRaised, WorkerDied, WorkerTimeout) as e:
            found.notes.append(f"The pictures could not be measured: {type(e).__name__}: {e}")
            return found
        try:
            deadline = time.monotonic() + LOAD_TIMEOUT + 60.0
            call = lambda probe, **inputs: worker.call(probe, deadline, **inputs)  # noqa: E731
            found.grids, found.bars, found.notes = measure(call, grids, bars)
        except (SubjectRaised, WorkerDied, WorkerTimeout) as e:
            found.notes.append(f"The pictures could not be measured: {type(e).__name__}: {e}")
        finally:
            worker.close()
    return found


def _selected(names: str | None) -> list[Test] | str:
    if not names:
        return list(SHARED_TESTS)
    wanted = names.split(",")
    unknown = sorted(set(wanted) - {t.name for t in SHARED_TESTS})
    if unknown:
        return f"--tests: unknown {unknown}; known: {[t.name for t in SHARED_TESTS]}"
    return [t for t in SHARED_TESTS if t.name in wanted]


def run_check(args: argparse.Namespace) -> int:
    if args.prepare_next_draw:
        return draws_ahead.run_prepared(
            Path(args.prepare_next_draw),
            lambda model, bounds: graded(model, SHARED_TESTS, None, bounds),
        )
    if not args.submission and not args.suite:
        return usage_error("check", "name your transformer.py, or --suite DIR, or both")
    if args.html and not args.submission:
        return usage_error("check", "--html is the shared tests' page: name your transformer.py")
    for report in (args.json, args.suite_json, args.html):
        if report and (problem := report_path_problem(report)):
            return usage_error("check", f"cannot write a report: {problem}")
    try:
        grading.grader_cpus()
    except ValueError as e:
        return usage_error("check", str(e))
    tests = _selected(args.tests)
    if isinstance(tests, str):
        return usage_error("check", tests)
    statuses = []
    if args.submission:
        with _cold(args.cold):
            g = check(args.submission, tests, args.time_limit)
        print(text(g), flush=True)
        if g.error:
            print(f"xfmr check: checker error (exit 3):\n{g.error}", file=sys.stderr)
        with _cold(args.cold):
            pictures = page_pictures(args.submission, g) if args.html else None
        reports = [(args.json, lambda: grade_report.to_json(g))]
        written = write_all("check", [*reports, (args.html, lambda: check_page.page(g, pictures))])
        statuses.append(3 if g.error else 2 if not written else 0 if g.passed else 1)
        with _cold(args.cold):
            if warm_available() and draws_ahead.wanted():  # the next check's draws, derived
                draws_ahead.prepare_next(check_cache() / "draws")  # while the student edits
    if args.suite:
        if args.submission:
            print()
        statuses.append(_run_suite(args))
    return max(statuses)


@contextmanager
def _cold(cold: bool) -> Iterator[None]:
    """Within: no warm server, where `cold` (XFMR_CHECK_WARM=0, restored after)."""
    before = os.environ.get(WARM_SWITCH)
    if cold:
        os.environ[WARM_SWITCH] = "0"
    try:
        yield
    finally:
        if cold and before is None:
            del os.environ[WARM_SWITCH]
        elif cold and before is not None:
            os.environ[WARM_SWITCH] = before


def _run_suite(args: argparse.Namespace) -> int:
    def progress(name: str, r: scoring.SubjectRun) -> None:
        print(f"  {name:<11} {len(r.cells)} tests, {r.seconds:5.1f} s", file=sys.stderr)

    missing = [m for m in ("pytest", "hypothesis") if importlib.util.find_spec(m) is None]
    if missing:  # the checker's own dependency, never the suite's fault
        return usage_error(
            "check",
            f"--suite needs {' and '.join(missing)}, which this install lacks: "
            "pip install -e '.[test]' (or pip install pytest hypothesis)",
        )
    time_limit = args.time_limit or scoring.TEST_TIMEOUT
    try:
        s = suite_check(args.suite, args.module, time_limit, args.jobs, progress, args.generated)
    except (FileNotFoundError, UnsafeInput) as e:
        return usage_error("check", str(e))
    except scoring.SuiteBroken as e:
        return usage_error("check", f"the suite is broken, no mutant was run: {e}")
    print(suite_text(s, args.suite))
    written = write_all("check", [(args.suite_json, lambda: score_report.to_json(s))])
    return 2 if not written else 0 if s.passed else 1


if __name__ == "__main__":  # python -m harness.students.selfcheck: as `xfmr check`
    parser = argparse.ArgumentParser(prog="xfmr check")
    configure_check(parser)
    sys.exit(run_check(parser.parse_args()))
