"""`xfmr matrix`: every shared test on impl, the torch copy, the sanity mutant and the mutants
(the seed's pitfalls s01-s11 and the contract clauses c01-c04).

Prints the kill-rate matrix and its findings, writes it in the formats asked for, and with
--check compares it with the committed expectation (harness/data/expected_matrix.json).
Exit status: 0 when the matrix is healthy (no false alarm, every seed-named killer kills, the
sanity mutant dies everywhere) and, with --check, equal to the expectation; 1 otherwise; 2 when
nothing was judged (bad options, an unreachable or unfit cluster).
With --scheduler each subject's row runs on a Dask cluster (harness.engine.cluster); with
--incremental only the cells whose inputs changed run (harness.engine.cache). A mutant's cell that
impl's traced run shows the test cannot reach is impl's, not run (harness.engine.coverage);
--run-every-cell runs it.
An --incremental run on this machine forks its workers from the warm fork server
(harness.isolation.warm), started if none runs and left for the next run; --warm-idle 0 keeps
each run to its own.
"""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any

from harness.analysis import summarize
from harness.engine import executors, work
from harness.engine.cache import Store, default_root, incremental_suite
from harness.engine.coverage import inferred_line, run_inferring
from harness.engine.run import print_progress, run_suite
from harness.isolation import forkserver
from harness.options import add_dtype, apply_dtype
from harness.records import SuiteRun
from harness.reports import matrix as reports
from harness.reports.safe import to_csv
from harness.reports.writer import write_all
from harness.shared_tests.inputs import DATA
from harness.shared_tests.laws import SHARED_TESTS
from harness.subjects import Kind, Subject, module_source
from mutants import catalog

EXPECTED = DATA / "expected_matrix.json"


def matrix_subjects() -> list[Subject]:
    """impl, the torch copy, the sanity mutant, s01-s11 and c01-c04, in that order."""
    return [
        Subject("impl", Kind.CORRECT, module="impl.transformer"),
        Subject("torch_copy", Kind.CORRECT, module="impl.torch_copy"),
        Subject("sanity", Kind.SANITY, module="impl.transformer", mutant="sanity"),
        *(
            Subject(m, Kind.MUTANT, module="impl.transformer", mutant=m)
            for m in catalog.PITFALLS + catalog.CLAUSES
        ),
    ]


def outcomes(run: SuiteRun) -> dict[str, dict[str, str]]:
    """subject -> test -> outcome value: what the expectation file holds."""
    return {
        s.name: {t.name: run.cell(t.name, s.name).outcome.value for t in run.tests}
        for s in run.subjects
    }


def changed_cells(expected: dict[str, Any], run: SuiteRun) -> list[str]:
    """Every cell that differs from the expectation, plus tests and subjects that came or went."""
    got, want = outcomes(run), expected["outcomes"]
    changes = []
    for subject in sorted(set(got) | set(want)):
        if subject not in want or subject not in got:
            changes.append(f"subject {subject}: {'new' if subject in got else 'gone'}")
            continue
        for test in sorted(set(got[subject]) | set(want[subject])):
            was, now = want[subject].get(test, "absent"), got[subject].get(test, "absent")
            if was != now:
                message = run.cells.get((test, subject))
                why = f": {message.message.splitlines()[0]}" if message and message.message else ""
                changes.append(f"{test} on {subject}: expected {was}, got {now}{why}")
    return changes


def configure_matrix(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--jobs", type=int, default=None, help="subjects at once (default: CPUs)")
    parser.add_argument("--csv", metavar="FILE", help="one row per cell")
    parser.add_argument("--json", metavar="FILE", help="cells, findings and timings")
    parser.add_argument("--markdown", metavar="FILE", help="a Markdown table")
    parser.add_argument("--html", metavar="FILE", help="a colored grid")
    parser.add_argument("--stryker", metavar="FILE", help="mutation-testing-report-schema JSON")
    parser.add_argument("--check", action="store_true", help=f"compare with {EXPECTED.name}")
    parser.add_argument("--update-expected", action="store_true", help=f"rewrite {EXPECTED.name}")
    parser.add_argument("--quiet", action="store_true", help="no per-cell progress on stderr")
    parser.add_argument("--only", metavar="NAMES", help="comma-separated subjects (a partial run)")
    parser.add_argument("--tests", metavar="NAMES", help="comma-separated tests (a partial run)")
    parser.add_argument(
        "--show-patches", action="store_true", help="print every mutant as a diff of impl; no run"
    )
    work.add_scheduler(parser)
    add_dtype(parser)
    parser.add_argument(
        "--incremental", action="store_true", help="run only the cells whose inputs changed"
    )
    parser.add_argument(
        "--cache-dir", metavar="DIR", help=f"the incremental cache (default {default_root()})"
    )
    parser.add_argument(
        "--warm-idle",
        type=float,
        default=10.0,
        metavar="MINUTES",
        help="with --incremental and no --scheduler: fork workers from a warm fork server that "
        "outlives the run and exits after MINUTES unused (default 10; 0: this run's own)",
    )
    parser.add_argument(
        "--run-every-cell",
        action="store_true",
        help="also run the mutants' cells that impl's coverage shows a test cannot reach",
    )


def show_patches() -> str:
    """Every mutant's pitfall, expected killers and patch, as unified diffs of its target."""
    blocks = []
    for mutant in catalog.MUTANTS:
        _, source = module_source(mutant.target)
        killers = ", ".join(mutant.killers) or "every test"
        head = f"# {mutant.id} ({mutant.mutator}): {mutant.pitfall}\n# must be killed by: {killers}"
        blocks.append(f"{head}\n{mutant.diff(source)}")
    return "\n".join(blocks)


def run_matrix(args: argparse.Namespace) -> int:
    if args.show_patches:
        print(show_patches())
        return 0
    if args.dtype is not None and args.update_expected:
        print(
            f"xfmr matrix: {EXPECTED.name} holds the default run's outcomes; --update-expected "
            "takes no --dtype (--check compares a run in another dtype with it)",
            file=sys.stderr,
        )
        return 2
    apply_dtype(args)
    subjects, tests = matrix_subjects(), list(SHARED_TESTS)
    for option, names, known in (
        ("--only", args.only, [s.name for s in subjects]),
        ("--tests", args.tests, [t.name for t in tests]),
    ):
        unknown = sorted(set(names.split(",")) - set(known)) if names else []
        if unknown:
            print(f"xfmr matrix: {option}: unknown {unknown}; known: {known}", file=sys.stderr)
            return 2
    if args.only:
        subjects = [s for s in subjects if s.name in args.only.split(",")]
    if args.tests:
        tests = [t for t in tests if t.name in args.tests.split(",")]
    partial = len(subjects) < len(matrix_subjects()) or len(tests) < len(SHARED_TESTS)
    if partial and (args.check or args.update_expected):
        print("xfmr matrix: --check and --update-expected need the whole matrix", file=sys.stderr)
        return 2
    progress = None if args.quiet else print_progress
    try:
        run, reuse = _run(args, tests, subjects, progress)
    except work.ClusterProblem as e:
        print(f"xfmr matrix: {e}", file=sys.stderr)
        return 2
    summary = summarize(run)
    print(reports.text(run, summary))
    print()
    print(reports.timing(run))
    if reuse:
        print(reuse)
    written = write_all(
        "matrix",
        [
            (args.csv, lambda: to_csv(reports.frame(run))),
            (args.json, lambda: reports.to_json(run, summary)),
            (args.markdown, lambda: reports.markdown(run, summary)),
            (args.html, lambda: reports.html_page(run, summary)),
            (args.stryker, lambda: reports.stryker(run, summary)),
        ],
    )
    status = 0 if summary.healthy else 1
    if args.update_expected:
        data = {"tests": [t.name for t in tests], "outcomes": outcomes(run)}
        EXPECTED.write_text(json.dumps(data, indent=2) + "\n")
        print(f"wrote {EXPECTED}")
    elif args.check:
        changes = changed_cells(json.loads(EXPECTED.read_text()), run)
        for change in changes:
            print(f"CHANGED: {change}")
        print(f"check against {EXPECTED.name}: {len(changes)} changed cells")
        status = status or int(bool(changes))
    return status if written else 2


def _run(
    args: argparse.Namespace, tests: list, subjects: list[Subject], progress: Any
) -> tuple[SuiteRun, str]:
    """The run, on the executor and with the cache asked for; and the cache's line, if any."""
    executor = executors.executor(getattr(args, "scheduler", None), args.jobs)
    infer = not getattr(args, "run_every_cell", False)
    try:
        if not getattr(args, "incremental", False):
            if not infer:
                return run_suite(tests, subjects, progress=progress, executor=executor), ""
            run = run_inferring(tests, subjects, progress=progress, executor=executor)
            return run, inferred_line(run)
        local = getattr(args, "scheduler", None) is None
        store = Store(args.cache_dir or default_root())
        with forkserver.warm_server(60.0 * args.warm_idle if local else 0.0):
            run, reuse = incremental_suite(
                tests, subjects, store, progress=progress, executor=executor, infer=infer
            )
        return run, reuse.line()
    finally:
        executor.close()
