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
import shlex
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Collection, Sequence
from dataclasses import asdict
from pathlib import Path
from typing import Any

from harness.engine import executors, work
from harness.grading import (
    Grading,
    grader_cpus,
    not_judged,
    result_line,
    sandboxed,
    tests_apart,
)
from harness.isolation import tiers
from harness.isolation.limits import DEFAULT_LIMITS, Limits
from harness.isolation.staging import UnsafeInput
from harness.isolation.tiers import Tier
from harness.isolation.worker import printable
from harness.jobs import class_folder
from harness.options import (
    add_dtype,
    add_isolation,
    apply_dtype,
    chosen_tier,
    isolation_problem,
    positive,
    usage_error,
)
from harness.outcomes import Outcome
from harness.records import Cell, Grade
from harness.reports import grades as tables
from harness.reports.class_report import About, html_report, student_page
from harness.reports.grade import junit, text, to_json
from harness.reports.gradescope import gradescope, refusal
from harness.reports.safe import to_csv
from harness.reports.writer import report_path_problem, write_all
from harness.shared_tests.inputs import draw_secret, run_dtype, set_draw_secret, set_run_dtype
from harness.shared_tests.laws import BY_NAME, SHARED_TESTS
from harness.shared_tests.record import VISIBILITIES, Test


def grade(
    path: str | Path,
    tests: Sequence[Test] = SHARED_TESTS,
    limits: Limits = DEFAULT_LIMITS,
    time_limit: float | None = None,
    tier: Tier = tiers.SANDBOX,
    apart: Collection[str] | None = None,
) -> Grade:
    """Run `tests` on the submission at `path` (a .py file, a package directory, or a student's
    folder holding transformer.py and its helper modules), each of its workers isolated as
    `tier` says: a sandbox of its own, or the container tier's dedicated user (tiers.UNSAFE:
    forked without either, for trusted code only). `apart`: tests run in a worker of their own
    beside the others' (default: `tests_apart`; grade-batch, which grades submissions side by
    side, gives none).

    Whatever the submission does, the answer is a Grade (Grading)."""
    mode = tier.described
    if missing := tier.limits_problem():  # said in every report
        mode = f"{mode}; {missing}"
    if apart is None:
        apart = tests_apart(one_user=tier.one_user)
    workers = sandboxed(limits, tier)
    proof = f"{mode}; {limits}"  # the environment the workers are proven in (harness.canary)
    with Grading(path, tests, mode, workers, time_limit, proof) as g:
        return g.grade(apart)


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
        "--time-limit",
        type=positive(float),
        metavar="S",
        help="cap every test's limit (seconds); loading keeps its own limit",
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
    add_dtype(parser)
    parser.add_argument(
        "--isolation",
        choices=tuple(tiers.TIERS),
        default=tiers.SANDBOX.name,
        help="how untrusted workers are isolated: a bubblewrap sandbox each (default), or the "
        "container tier (root, as the dedicated user the autograder's setup.sh creates: where "
        "bubblewrap cannot start); never chosen for you",
    )


def run_grade(args: argparse.Namespace) -> int:
    apply_dtype(args)
    try:
        grader_cpus()
    except ValueError as e:
        return usage_error("grade", str(e))
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
        chosen_tier(args),
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
    """The entries of `folder` that are submissions, by name: .py files and folders that are
    not empty, hidden or links (class_folder.entries; grade() tells a package from a student's
    folder holding transformer.py, and rejects one that is neither, with the reason)."""
    return [e.path for e in class_folder.entries(folder) if e.submission]


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
    tier: Tier = tiers.SANDBOX,
    executor: work.Executor | None = None,
    paths: Sequence[Path] | None = None,
) -> list[Grade]:
    """Every submission in `folder` (or `paths`, its submissions as listed once), each a unit
    of `executor` (default: `jobs` at a time here), their grades in that order; one that breaks
    the grader's own code (it should not) becomes a grade with that reason, never the end of
    the batch."""
    paths = list(submissions(folder) if paths is None else paths)

    def done(i: int, g: Grade) -> None:
        if bar is not None:
            bar.step(f"{printable(paths[i].name)}: {g.score:g}/{g.max_score:g}")

    units = [_grade_unit(p, tests, limits, time_limit, tier) for p in paths]
    return (executor or work.LocalExecutor(jobs)).run(units, done)


def _grade_unit(
    path: Path, tests: Sequence[Test], limits: Limits, time_limit: float | None, tier: Tier
) -> work.Unit[Grade]:
    def payload() -> dict[str, Any]:
        strays = [t.name for t in tests if BY_NAME.get(t.name) is not t]
        if strays:
            raise ValueError(f"only the registered shared tests run on a cluster, not {strays}")
        try:
            files = work.pack(path)
        except (OSError, work.TooLarge, UnsafeInput) as e:  # UnsafeInput: swapped meanwhile
            files = {"unreadable": f"{type(e).__name__}: {e}"}
        return {
            "draw": draw_secret(),  # every grade of a batch judges on the same draws
            "dtype": run_dtype(),
            "shown": str(path),
            "files": files,
            "tests": [t.name for t in tests],
            "limits": asdict(limits),
            "time_limit": time_limit,
            "tier": tier.name,
        }

    def lost(why: str) -> Grade:
        return Grade(str(path), not_judged(tests, why), "", {}, 0.0, tier.described, error=why)

    return work.Unit(
        path.name,
        lambda: grade(path, tests, limits, time_limit, tier, apart=()),  # each worker isolated
        grade_shipped,
        payload,
        Grade.from_json,
        lost,
        sandboxed=tier.isolated,
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
    set_run_dtype(payload.get("dtype"))
    with tempfile.TemporaryDirectory(prefix="xfmr-shipped-") as folder:
        path = Path(folder) / shown.name
        if "unreadable" in payload["files"]:
            g = Grade(str(shown), [], payload["files"]["unreadable"])
            g.tests = [result_line(t, Cell(Outcome.ERROR, g.rejected), {}) for t in tests]
        else:
            work.unpack(payload["files"], path)
            tier = tiers.NAMED[payload["tier"]]
            g = grade(path, tests, limits, payload["time_limit"], tier, apart=())
    data = g.to_json()
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


def configure_grade_batch(parser: argparse.ArgumentParser) -> None:
    parser.epilog = (
        "every entry directly in the folder is graded, rejected with its reason, or listed as "
        "not a submission with its reason (a PDF, an archive, an empty folder, a link, a hidden "
        "file); exit status: 0 every submission passed every test; 1 some failed or was "
        "rejected; 2 nothing was graded (no submission, bad options, an unwritable report "
        "path, no isolation) or a report was not written; 3 the grader failed on a submission"
    )
    parser.add_argument("folder", help="a folder of submissions (.py files or folders)")
    parser.add_argument(
        "--out",
        metavar="DIR",
        default="grades",
        help="where reports go: grades.csv (a row per entry), hardest_tests.csv, report.html "
        "(a class report), and per submission NAME.gradescope.json and NAME.student.html (NAME: "
        "the entry's name percent-encoded, lower-case ASCII)",
    )
    parser.add_argument("--jobs", type=positive(int), default=os.cpu_count() or 1, help="at once")
    _add_gradescope(parser)
    _add_limits(parser)
    add_dtype(parser)
    work.add_scheduler(parser)


RESULTS, PAGE = ".gradescope.json", ".student.html"  # after each submission's output stem
CLASS_FILES = ("grades.csv", "hardest_tests.csv", "report.html")


def gradescope_names(paths: list[Path]) -> dict[str, str]:
    """The file grade-batch writes each submission's results.json to, in --out: its output
    stem (class_folder.output_stem: the name percent-encoded, unique by construction) and
    .gradescope.json; `paths` are a folder's entries, in order."""
    stems = class_folder.output_stems([p.name for p in paths])
    return {str(p): stem + RESULTS for p, stem in zip(paths, stems, strict=True)}


def _command(args: argparse.Namespace) -> str:
    """The command line that gives this batch again, every option said."""
    words = ["xfmr", "grade-batch", args.folder]
    for key, value in vars(args).items():
        if key == "folder" or value is None or value is False:
            continue
        words += [f"--{key.replace('_', '-')}"] + ([] if value is True else [str(value)])
    return printable(shlex.join(words))


def run_grade_batch(args: argparse.Namespace) -> int:
    apply_dtype(args)
    folder = Path(args.folder)
    found = class_folder.entries(folder) if folder.is_dir() else []
    paths = [e.path for e in found if e.submission]
    if not paths:
        for entry in found:
            print(f"not a submission: {printable(entry.name)}: {entry.reason}", file=sys.stderr)
        return usage_error("grade-batch", f"no submissions in {folder}")
    out = Path(args.out)
    try:
        out.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        return usage_error("grade-batch", f"cannot create {out}: {e.strerror or e}")
    names = [entry.name for entry in found]
    stems = dict(zip(found, class_folder.output_stems(names), strict=True))
    outputs = [stems[x] + end for x in found if x.submission for end in (RESULTS, PAGE)]
    for name in [*CLASS_FILES, *outputs]:
        if problem := report_path_problem(out / name):
            return usage_error("grade-batch", f"cannot write a report: {problem}")
    if problem := isolation_problem(args):
        return usage_error("grade-batch", problem)
    limits = Limits(memory_mb=args.memory_mb)
    others = len(found) - len(paths)
    none = "a submission" if others == 1 else "submissions"
    print(
        f"{len(found)} entries in {printable(str(folder))}: {len(paths)} to grade, {others} not "
        f"{none} (listed at the end)",
        file=sys.stderr,
    )
    try:
        executor = executors.executor(args.scheduler, args.jobs)
        try:
            grades = grade_batch(
                folder,
                _selected(args),
                limits,
                args.time_limit,
                args.jobs,
                Bar(len(paths)),
                chosen_tier(args),
                executor,
                paths,
            )
        finally:
            executor.close()
    except work.ClusterProblem as e:
        return usage_error("grade-batch", str(e))

    # every worker is gone: only now does anything get written. One row per entry, in the
    # folder's order; each grade is its submission's (the executor keeps the order).
    by_path = dict(zip(paths, grades, strict=True))
    rows: list[tables.Graded] = []
    for entry in found:
        if not entry.submission:
            rows.append(tables.Graded.not_graded(entry.name, entry.reason))
            continue
        report, page = out / (stems[entry] + RESULTS), out / (stems[entry] + PAGE)
        rows.append(tables.Graded.of(by_path[entry.path], str(report), str(page)))
    table, worst = tables.batch_table(rows), tables.hardest(rows)  # CSVs: reports.safe
    about = About.now(printable(str(folder)), _command(args))
    index = out / "report.html"

    def scope(g: Grade) -> Callable[[], dict[str, Any]]:
        return lambda: gradescope(g, args.visibility, args.stdout_visibility)

    def own_page(r: tables.Graded) -> Callable[[], str]:
        return lambda: student_page(r, out, index, about)

    written = write_all(
        "grade-batch",
        [
            (out / "grades.csv", lambda: to_csv(table)),
            (out / "hardest_tests.csv", lambda: to_csv(worst)),
            (index, lambda: html_report(rows, out, about)),
            *[
                (Path(r.report), scope(by_path[entry.path]))
                for entry, r in zip(found, rows, strict=True)
                if r.report
            ],
            *[(Path(r.page), own_page(r)) for r in rows if r.page],
        ],
    )
    print(tables.summary_text(rows))
    print(
        f"\nwrote {out}/grades.csv (a row per entry), {out}/hardest_tests.csv, {out}/report.html "
        f"and, per submission, its .gradescope.json and .student.html ({len(grades)} each)"
    )
    if any(g.error for g in grades):
        return 3
    if not written:
        return 2
    return 0 if all(g.passed for g in grades) else 1
