"""`python -m harness.tools.bench_check [FILE]`: wall times of `xfmr check FILE` (default the
correct example), cold (XFMR_CHECK_WARM=0: every worker a fresh interpreter) and warm (the first
check starts a warm server in a private runtime folder, the later ones fork from it), with the
machine's load. A benchmark, not a test: it prints figures and asserts nothing."""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from harness.isolation import warm
from harness.isolation.forkserver import worker_environment

ROOT = Path(__file__).resolve().parents[2]


def timed(file: str, env: dict[str, str]) -> float:
    start = time.monotonic()
    done = subprocess.run(
        [sys.executable, "-m", "harness.cli", "check", file],
        cwd=ROOT, env=env, capture_output=True, text=True, check=False,
    )  # fmt: skip
    if done.returncode != 0:
        raise SystemExit(f"xfmr check failed ({done.returncode}):\n{done.stdout}{done.stderr}")
    return time.monotonic() - start


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m harness.tools.bench_check")
    parser.add_argument("file", nargs="?", default="examples/correct_submission.py")
    parser.add_argument("--runs", type=int, default=2, help="checks of each kind (2)")
    args = parser.parse_args(argv)
    print(f"load before: {os.getloadavg()}")
    folder = Path(tempfile.mkdtemp(prefix="xb-", dir="/tmp"))
    base = {**os.environ, "XFMR_RUNTIME_DIR": str(folder)}
    try:
        cold = [timed(args.file, base | {"XFMR_CHECK_WARM": "0"}) for _ in range(args.runs)]
        hot = [timed(args.file, base | {"XFMR_CHECK_WARM": "1"}) for _ in range(args.runs)]
    finally:
        warm.stop(worker_environment(), folder)
        shutil.rmtree(folder, ignore_errors=True)
    print(f"load after: {os.getloadavg()}")
    print("cold: " + ", ".join(f"{t:.2f} s" for t in cold))
    print("warm: " + ", ".join(f"{t:.2f} s" for t in hot) + " (the first starts the server)")
    if len(hot) > 1 and len(cold) > 1:
        print(f"second check warm/cold: {hot[1] / cold[1]:.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
