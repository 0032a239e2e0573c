"""`python -m harness.tools.bench_isolation [--rounds N] [--score-rounds M]`: what the sandbox
costs, as the staff's command lines run it: `xfmr grade examples/correct_submission.py` sandboxed
and with `--unsafe-no-sandbox` (workers forked from a fork server), N rounds interleaved; then
`xfmr mutation-score examples/student_tests_strong` both ways, M rounds. Each run's own figures
(the grade's time and its workers' start-ups; the score's wall and start-up median and maximum)
and the command's wall time, with the machine's load before and after; for each run also the
CPU the whole machine spent meanwhile, busy and idle (/proc/stat: every process, the sandboxed
workers included, whose time no rusage of the command's own reaches), which says whether a
command waited or was short of cores. A benchmark, not a test: it prints figures and asserts
nothing."""

from __future__ import annotations

import argparse
import os
import re
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
GRADE = ["grade", "examples/correct_submission.py"]
SCORE = ["mutation-score", "examples/student_tests_strong"]
UNSAFE = "--unsafe-no-sandbox"


def cpu_seconds() -> tuple[float, float]:
    """(busy, idle): the CPU seconds of every core since boot (/proc/stat's first line; idle
    counts iowait too)."""
    fields = [int(v) for v in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:]]
    tick = os.sysconf("SC_CLK_TCK")
    idle = fields[3] + fields[4]
    return (sum(fields) - idle) / tick, idle / tick


def run(args: list[str]) -> tuple[float, str, tuple[float, float]]:
    """The command's wall time, its output (stdout and stderr) and the machine's busy and idle
    CPU seconds meanwhile; exits on a failed run."""
    before = cpu_seconds()
    start = time.monotonic()
    done = subprocess.run(
        [sys.executable, "-m", "harness.cli", *args],
        cwd=ROOT, capture_output=True, text=True, check=False,
    )  # fmt: skip
    wall = time.monotonic() - start
    after = cpu_seconds()
    said = done.stdout + done.stderr
    if done.returncode != 0:
        raise SystemExit(f"xfmr {' '.join(args)} failed ({done.returncode}):\n{said}")
    return wall, said, (after[0] - before[0], after[1] - before[1])


def cpu_figures(spent: tuple[float, float]) -> str:
    return f"CPU {spent[0]:.1f} s busy, {spent[1]:.1f} s idle"


def grade_figures(said: str) -> str:
    score = re.search(r"^Score: .* in ([\d.]+) s$", said, re.M)
    starts = re.search(r"^Worker start-up[^:]*: (.*)$", said, re.M)
    took, began = score.group(1) if score else "?", starts.group(1) if starts else "?"
    return f"grade {took} s (start-ups {began})"


def score_figures(said: str) -> str:
    line = re.search(
        r"^wall ([\d.]+) s; worker start-up .* median ([\d.]+) s, max ([\d.]+) s", said, re.M
    )
    if not line:
        return "?"
    return f"wall {line.group(1)} s (start-up median {line.group(2)} s, max {line.group(3)} s)"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m harness.tools.bench_isolation")
    parser.add_argument("--rounds", type=int, default=3, help="grades of each kind (3)")
    parser.add_argument(
        "--score-rounds", type=int, default=1, help="mutation scores of each kind (1)"
    )
    args = parser.parse_args(argv)
    print(f"load before: {os.getloadavg()}, {os.cpu_count()} cores")
    for i in range(args.rounds):
        boxed = run(GRADE)
        forked = run([*GRADE, UNSAFE])
        print(
            f"grade round {i + 1}: sandboxed {grade_figures(boxed[1])}, command {boxed[0]:.1f} s, "
            f"{cpu_figures(boxed[2])}; unsafe {grade_figures(forked[1])}, command "
            f"{forked[0]:.1f} s, {cpu_figures(forked[2])}"
        )
    for i in range(args.score_rounds):
        boxed = run(SCORE)
        forked = run([*SCORE, UNSAFE])
        print(
            f"mutation-score round {i + 1}: sandboxed {score_figures(boxed[1])}, "
            f"{cpu_figures(boxed[2])}; unsafe {score_figures(forked[1])}, {cpu_figures(forked[2])}"
        )
    print(f"load after: {os.getloadavg()}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
