"""`xfmr false-alarms`: whole grades of correct subjects under many secret draws and dtypes.

A correct submission must pass every shared test whatever the run's secret draws (weights,
inputs, the learning task's instance, the rows a search is judged on) and whatever `--dtype`
staff choose. bound-check measures the oracle comparisons over configurations; this sweep runs
every law of a full grade, as `xfmr grade` runs them, on subjects known to be correct: impl, the
torch copy, examples/correct_submission.py and the real-world bases
(tests/harness_tests/realworld/, where present). Every cell that is not passed (or not
applicable) is a false alarm, reported with the draw and dtype that reproduce it:

    XFMR_DRAW_SEED=DRAW xfmr grade --dtype DTYPE --unsafe-no-sandbox SUBJECT

    xfmr false-alarms --draws 0-19 --dtypes float64 --write results/grading/false_alarms.md

The subjects are the project's own code, so they run from the trusted fork server (no sandbox):
the laws, the draws and the verdicts are those of a grade. One unit is a grade-draw: one subject
graded under one (dtype, draw). Every subject of a draw shares its oracle computations, as the
subjects of a matrix do.
"""

from __future__ import annotations

import argparse
import datetime
import importlib.util
import json
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from harness.engine.run import run_suite
from harness.shared_tests.inputs import RUN_DTYPES, set_draw_secret, set_run_dtype
from harness.shared_tests.laws import BY_NAME, SHARED_TESTS
from harness.subjects import Kind, Subject

ROOT = Path(__file__).resolve().parents[2]
REALWORLD = ROOT / "tests" / "harness_tests" / "realworld"
CORRECT_EXAMPLE = ROOT / "examples" / "correct_submission.py"
DTYPES = RUN_DTYPES


@dataclass(frozen=True)
class Candidate:
    """A subject known to be correct, and the tests the contract lets it fail (a clause its
    style cannot meet, as the real-world set records it)."""

    subject: Subject
    may_fail: frozenset[str] = frozenset()


@dataclass
class Alarm:
    """One test that failed on a correct subject: what to rerun to see it again."""

    dtype: str
    draw: int
    subject: str
    test: str
    outcome: str
    message: str


@dataclass
class Sweep:
    """What a sweep ran and found."""

    dtypes: list[str]
    draws: list[int]
    subjects: list[str]
    grade_draws: dict[str, int] = field(default_factory=dict)  # per dtype
    seconds: dict[str, float] = field(default_factory=dict)  # per dtype
    alarms: list[Alarm] = field(default_factory=list)

    def to_json(self) -> dict[str, Any]:
        return {
            "dtypes": self.dtypes,
            "draws": self.draws,
            "subjects": self.subjects,
            "grade_draws": self.grade_draws,
            "seconds": {k: round(v, 1) for k, v in self.seconds.items()},
            "alarms": [vars(a) for a in self.alarms],
        }


def _realworld_data() -> Any:
    spec = importlib.util.spec_from_file_location("realworld_variants", REALWORLD / "variants.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def candidates(realworld: bool = True) -> list[Candidate]:
    """impl, the torch copy, the correct example and (where present) every real-world base."""
    found = [
        Candidate(Subject("impl", Kind.CORRECT, module="impl.transformer")),
        Candidate(Subject("torch_copy", Kind.CORRECT, module="impl.torch_copy")),
        Candidate(Subject("correct_submission", Kind.CORRECT, path=str(CORRECT_EXAMPLE))),
    ]
    if realworld and (REALWORLD / "variants.py").exists():
        data = _realworld_data()
        for base in data.BASES:
            failing = frozenset(data.BASE_FAILING.get(base, ()))
            subject = Subject(f"realworld/{base}", Kind.CORRECT, path=str(REALWORLD / base))
            found.append(Candidate(subject, failing))
    return found


def sweep(
    candidates: Sequence[Candidate],
    dtypes: Sequence[str],
    draws: Sequence[int],
    tests: Sequence[Any] = SHARED_TESTS,
    jobs: int | None = None,
    progress: bool = False,
) -> Sweep:
    """Every test on every candidate under each (dtype, draw); the run's dtype and secret are
    restored afterwards."""
    subjects = [c.subject for c in candidates]
    may_fail = {c.subject.name: c.may_fail for c in candidates}
    found = Sweep(list(dtypes), list(draws), [s.name for s in subjects])
    try:
        for dtype in dtypes:
            set_run_dtype(None if dtype == "float64" else dtype)
            begun = time.monotonic()
            for draw in draws:
                set_draw_secret(draw)
                run = run_suite(tests, subjects, jobs=jobs)
                for s in subjects:
                    for t in tests:
                        cell = run.cell(t.name, s.name)
                        if cell.outcome.false_alarm and t.name not in may_fail[s.name]:
                            alarm = Alarm(
                                dtype, draw, s.name, t.name, cell.outcome.value, cell.message
                            )
                            found.alarms.append(alarm)
                found.grade_draws[dtype] = found.grade_draws.get(dtype, 0) + len(subjects)
                if progress:
                    these = [a for a in found.alarms if a.dtype == dtype and a.draw == draw]
                    lines = [
                        f"{dtype} draw {draw}: {len(subjects)} grades, {len(these)} false alarms, "
                        f"{run.wall_seconds:.0f} s",
                        *(f"  {a.subject} {a.test}: {a.message[:300]}" for a in these),
                    ]
                    print("\n".join(lines), file=sys.stderr, flush=True)
            found.seconds[dtype] = time.monotonic() - begun
    finally:
        set_run_dtype(None)
        set_draw_secret(None)
    return found


def draw_range(text: str) -> list[int]:
    """'0-19' or '3,5,9' or '7' as a list of draws."""
    out: list[int] = []
    for part in text.split(","):
        lo, _, hi = part.partition("-")
        try:
            first, last = int(lo), int(hi or lo)
        except ValueError:
            raise argparse.ArgumentTypeError(f"draws: {part!r} is not N or N-M") from None
        if last < first or first < 0:
            raise argparse.ArgumentTypeError(f"draws: {part!r} is an empty or negative range")
        out += range(first, last + 1)
    return out


def markdown(found: Sweep, command: str) -> str:
    lines = [
        "# False alarms of whole grades on correct subjects",
        "",
        f"Made by `{command}` on {datetime.date.today().isoformat()} "
        "(each subject graded by every shared law under each draw, from the trusted fork server).",
        "",
        f"Subjects ({len(found.subjects)}): " + ", ".join(f"`{s}`" for s in found.subjects),
        f"Draws (`XFMR_DRAW_SEED`): {_span(found.draws)}",
        "",
        "| dtype | grade-draws | false alarms | minutes |",
        "| --- | ---: | ---: | ---: |",
    ]
    for dtype in found.dtypes:
        n = sum(1 for a in found.alarms if a.dtype == dtype)
        lines.append(
            f"| {dtype} | {found.grade_draws.get(dtype, 0)} | {n} | "
            f"{found.seconds.get(dtype, 0.0) / 60:.1f} |"
        )
    lines.append("")
    if not found.alarms:
        lines.append("No test failed on a correct subject.")
    else:
        lines += ["| dtype | draw | subject | test | outcome | message |", "| --- " * 6 + "|"]
        for a in found.alarms:
            message = a.message.replace("|", "\\|").replace("\n", " ")[:300]
            lines.append(
                f"| {a.dtype} | {a.draw} | {a.subject} | {a.test} | {a.outcome} | {message} |"
            )
    return "\n".join(lines) + "\n"


def _span(draws: Sequence[int]) -> str:
    if draws and list(draws) == list(range(draws[0], draws[-1] + 1)):
        return f"{draws[0]}-{draws[-1]} ({len(draws)})"
    return ", ".join(map(str, draws))


def configure_false_alarms(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--draws", type=draw_range, default=draw_range("0-4"), help="secrets: 0-19, or 3,5,9"
    )
    parser.add_argument(
        "--dtypes", nargs="+", choices=DTYPES, default=["float64"], help="the runs' --dtype"
    )
    parser.add_argument(
        "--tests", nargs="+", choices=sorted(BY_NAME), help="only these shared tests"
    )
    parser.add_argument(
        "--no-realworld", action="store_true", help="impl, the torch copy and the example only"
    )
    parser.add_argument("--jobs", type=int, default=None, help="subjects at once (CPU count)")
    parser.add_argument("--json", type=Path, help="write every alarm and the counts as JSON")
    parser.add_argument("--write", type=Path, help="write the Markdown report here")
    parser.add_argument("--quiet", action="store_true", help="no progress lines on stderr")


def run_false_alarms(args: argparse.Namespace) -> int:
    """Exit 0 when no correct subject failed a test, 1 otherwise."""
    tests = [BY_NAME[n] for n in args.tests] if args.tests else list(SHARED_TESTS)
    found = sweep(
        candidates(realworld=not args.no_realworld),
        args.dtypes,
        args.draws,
        tests,
        jobs=args.jobs,
        progress=not args.quiet,
    )
    command = "xfmr false-alarms " + " ".join(sys.argv[2:] if len(sys.argv) > 2 else [])
    text = markdown(found, command.strip())
    print(text)
    if args.json is not None:
        args.json.write_text(json.dumps(found.to_json(), indent=2) + "\n")
    if args.write is not None:
        args.write.write_text(text)
    return 1 if found.alarms else 0
