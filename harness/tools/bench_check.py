"""`python -m harness.tools.bench_check [FILE] [--runs N]`: wall times of `xfmr check FILE`
(default the correct example), as a student's command line runs it, in three ways, each in fresh
private runtime and cache folders:

- cold: XFMR_CHECK_WARM=0, every worker a fresh interpreter (and nothing prepared ahead);
- warm: the first check starts the warm fork server, the later ones fork from it; no draws
  prepared ahead (XFMR_CHECK_AHEAD=0);
- warm + ahead: as a student gets it by default: after each check the next one's draws are
  prepared in the background (harness.students.draws_ahead), and the bench waits for them to be
  ready before the next check, as a student who edits for a few seconds does (the wait is shown).

With the machine's load before and after, and each check's learning test time (its critical
path: how many updates the run takes to reach the bar depends on the secret draw). A benchmark,
not a test: it prints figures (medians of the checks after the first) and asserts nothing."""

from __future__ import annotations

import argparse
import os
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from harness.isolation import warm
from harness.isolation.forkserver import worker_environment

ROOT = Path(__file__).resolve().parents[2]
READY_WAIT = 120.0  # seconds the bench waits for the next check's draws
READY = "ready-"  # a prepared draw's folder (harness.students.draws_ahead.READY)
LEARNING = "test_learns_reversed_addition"


def timed(file: str, env: dict[str, str]) -> tuple[float, float | None]:
    """The check's wall time, and its learning test's own time as the report prints it."""
    start = time.monotonic()
    done = subprocess.run(
        [sys.executable, "-m", "harness.cli", "check", file],
        cwd=ROOT, env=env, capture_output=True, text=True, check=False,
    )  # fmt: skip
    if done.returncode != 0:
        raise SystemExit(f"xfmr check failed ({done.returncode}):\n{done.stdout}{done.stderr}")
    wall = time.monotonic() - start
    learned = re.search(rf"^\s*PASS\s+{LEARNING}\s.*\s([\d.]+) s$", done.stdout, re.M)
    return wall, float(learned.group(1)) if learned else None


def ready_after(draws: Path) -> float:
    """Seconds until a draw is ready under `draws` (the preparation the last check started)."""
    start = time.monotonic()
    while not any(draws.glob(f"{READY}*")):
        if time.monotonic() - start > READY_WAIT:
            raise SystemExit(f"no draw was ready within {READY_WAIT:g} s")
        time.sleep(0.1)
    return time.monotonic() - start


def series(file: str, runs: int, kind: str) -> tuple[list[float], list[float], list[float | None]]:
    """`runs` checks of one kind, each kind in its own runtime and cache folders; the times,
    (warm + ahead) the waits for the next draw, and the learning test's times."""
    folder = Path(tempfile.mkdtemp(prefix="xb-", dir="/tmp"))
    env = {
        **os.environ,
        "XFMR_RUNTIME_DIR": str(folder / "run"),
        "XFMR_CHECK_CACHE": str(folder / "cache"),
        "XFMR_CHECK_WARM": "0" if kind == "cold" else "1",
        "XFMR_CHECK_AHEAD": "1" if kind == "warm + ahead" else "0",
    }
    env.pop("XFMR_DRAW_SEED", None)  # a fixed secret takes no prepared draw
    times, waits, learning = [], [], []
    try:
        for _ in range(runs):
            wall, learned = timed(file, env)
            times.append(wall)
            learning.append(learned)
            if kind == "warm + ahead":
                waits.append(ready_after(folder / "cache" / "draws"))
    finally:
        warm.stop(worker_environment(), folder / "run")
        shutil.rmtree(folder, ignore_errors=True)
    return times, waits, learning


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m harness.tools.bench_check")
    parser.add_argument("file", nargs="?", default="examples/correct_submission.py")
    parser.add_argument("--runs", type=int, default=5, help="checks of each kind (5)")
    args = parser.parse_args(argv)
    print(f"load before: {os.getloadavg()}")
    results = {k: series(args.file, args.runs, k) for k in ("cold", "warm", "warm + ahead")}
    print(f"load after: {os.getloadavg()}")
    for kind, (times, waits, learning) in results.items():
        line = f"{kind}: " + ", ".join(f"{t:.2f}" for t in times) + " s"
        if len(times) > 1:
            line += f"; median of checks 2-{len(times)}: {statistics.median(times[1:]):.2f} s"
        if waits:
            line += "; next draw ready after " + ", ".join(f"{w:.1f}" for w in waits) + " s"
        line += "; its learning test " + ", ".join(
            "?" if t is None else f"{t:.2f}" for t in learning
        )
        print(line + " s")
    if args.runs > 1:
        later = {k: statistics.median(t[1:]) for k, (t, _, _) in results.items()}
        print(
            f"later checks, warm/cold: {later['warm'] / later['cold']:.2f}; "
            f"warm + ahead/cold: {later['warm + ahead'] / later['cold']:.2f}"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
