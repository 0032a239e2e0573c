"""`xfmr generated-draws`: students' suites on the generated samples of several secret draws.

`xfmr mutation-score` draws a secret sample of the generated mutants each run; one run says how a
suite did on that sample only. This measures several draws at once: every mutant of the draws'
samples (their union: a mutant drawn twice runs once) goes through each suite in one mutation
score, and each draw's count is read off the union's outcomes, as if that draw's run had scored
it (a generated mutant's outcome depends on the suite and the mutant, not on what else was
drawn). So five draws cost one mutation score per suite on up to five samples' mutants instead
of five whole scores.

    xfmr generated-draws examples/student_tests_strong examples/student_tests_weak \\
        --draws 0-4 --write results/mutants/generated_draws.md

A draw d here is the sample `XFMR_DRAW_SEED=d xfmr mutation-score SUITE` draws.

A measurement of the mutation-score job (its results are results/mutants/generated_draws.md), so it
lives among the measurements and is the one tool that runs a job (pyproject's contracts say so).
"""

from __future__ import annotations

import argparse
import datetime
import time
from pathlib import Path

from harness.jobs import mutation_score as ms
from harness.shared_tests.inputs import draw_secret, set_draw_secret
from harness.subjects import Kind, Subject
from harness.tools.false_alarms import draw_range


def samples(draws: list[int], n: int) -> dict[int, list[str]]:
    """draw -> the mutant ids of the generated sample `XFMR_DRAW_SEED=draw` gives a run."""
    before = draw_secret()
    try:
        out = {}
        for d in draws:
            set_draw_secret(d)
            out[d] = [s.mutant for s in ms.generated_subjects(n) if s.mutant is not None]
        return out
    finally:
        set_draw_secret(before)


def measure(
    suites: list[Path], draws: list[int], n: int, jobs: int | None = None
) -> tuple[dict[int, list[str]], dict[str, dict[str, bool]], dict[str, float]]:
    """(each draw's sample, suite -> mutant id -> killed, suite -> seconds)."""
    by_draw = samples(draws, n)
    union = list(dict.fromkeys(m for ids in by_draw.values() for m in ids))
    subjects = [
        Subject(f"u{i:03d}", Kind.MUTANT, module="impl.transformer", mutant=m)
        for i, m in enumerate(union, 1)
    ]
    killed: dict[str, dict[str, bool]] = {}
    seconds: dict[str, float] = {}
    for suite in suites:
        start = time.monotonic()
        score = ms.mutation_score(suite, jobs=jobs, sample=subjects)
        seconds[str(suite)] = time.monotonic() - start
        if score.invalid:
            raise ValueError(f"{suite} scores nothing: {score.invalid}")
        status = score.summary.status
        killed[str(suite)] = {s.mutant: status[s.name].detected for s in subjects if s.mutant}
    return by_draw, killed, seconds


def markdown(
    by_draw: dict[int, list[str]],
    killed: dict[str, dict[str, bool]],
    seconds: dict[str, float],
    command: str,
) -> str:
    suites = list(killed)
    names = [Path(s).name for s in suites]
    union = {m for ids in by_draw.values() for m in ids}
    lines = [
        "# Students' suites on the generated samples of several draws",
        "",
        f"Measured {datetime.date.today().isoformat()} with:",
        "",
        "```",
        command,
        "```",
        "",
        f"Each draw's sample is the one `XFMR_DRAW_SEED=draw xfmr mutation-score` draws "
        f"({len(next(iter(by_draw.values()), []))} mutants); the {len(union)} distinct mutants of "
        "the draws' samples ran once per suite (harness/tools/generated_draws.py).",
        "",
        "| draw | " + " | ".join(f"{n} killed" for n in names) + " |",
        "| ---: | " + " | ".join("---:" for _ in names) + " |",
    ]
    for d, ids in by_draw.items():
        counts = [f"{sum(killed[s][m] for m in ids)} of {len(ids)}" for s in suites]
        lines.append(f"| {d} | " + " | ".join(counts) + " |")
    lines += [
        "",
        "| suite | killed of the union | minutes |",
        "| --- | ---: | ---: |",
    ]
    for s, n in zip(suites, names, strict=True):
        lines.append(f"| {n} | {sum(killed[s].values())} of {len(union)} | {seconds[s] / 60:.1f} |")
    return "\n".join(lines) + "\n"


def configure_generated_draws(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("suites", nargs="+", type=Path, help="folders of pytest files")
    parser.add_argument("--draws", type=draw_range, default=draw_range("0-4"), help="0-4, or 3,5")
    parser.add_argument(
        "--generated", type=int, default=ms.GENERATED, help="the sample's size per draw"
    )
    parser.add_argument("--jobs", type=int, default=None, help="subjects at once (CPU count)")
    parser.add_argument("--write", type=Path, default=None, help="write the Markdown table here")


def run_generated_draws(args: argparse.Namespace) -> int:
    for suite in args.suites:
        if not suite.is_dir():
            print(f"xfmr generated-draws: {suite} is not a folder of pytest files")
            return 2
    if args.generated <= 0:
        print("xfmr generated-draws: --generated must be 1 or more")
        return 2
    try:
        by_draw, killed, seconds = measure(args.suites, args.draws, args.generated, args.jobs)
    except ValueError as e:
        print(f"xfmr generated-draws: {e}")
        return 1
    command = "xfmr generated-draws " + " ".join(str(s) for s in args.suites)
    command += f" --draws {','.join(map(str, args.draws))} --generated {args.generated}"
    report = markdown(by_draw, killed, seconds, command)
    print(report)
    if args.write is not None:
        args.write.write_text(report)
    return 0
