"""What every job's command line shares: checked options, the isolation flag, usage errors.

Exit statuses of the jobs: 0 every test passed (or the suite passed), 1 some failed, 2 nothing
was judged (bad options, an unwritable report path, no sandbox).
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable
from typing import Any

from harness.isolation.sandbox import Limits, SandboxUnavailable, check

# How a run's workers ran; an unsafe run says so in every report.
SANDBOX = "bubblewrap sandbox, one per worker"
UNSAFE = "UNSAFE: no sandbox (--unsafe-no-sandbox); for trusted code only"


def usage_error(command: str, message: str) -> int:
    print(f"xfmr {command}: {message}", file=sys.stderr)
    return 2


def isolation_problem(args: argparse.Namespace) -> str:
    """Why untrusted code cannot run here ("" if it can): the sandbox's own trial, unless the
    user explicitly chose to run without one."""
    if args.unsafe_no_sandbox:
        print(f"WARNING: {UNSAFE}", file=sys.stderr)
        return ""
    try:
        check()
    except SandboxUnavailable as e:
        return (
            f"refusing to run untrusted code: the sandbox cannot be set up ({e}). Install "
            "bubblewrap (apt-get install -y bubblewrap) or, for trusted code only, pass "
            "--unsafe-no-sandbox."
        )
    return ""


def positive(kind: type) -> Callable[[str], Any]:
    """An argparse type: a number of `kind` above zero."""

    def parse(text: str) -> Any:
        try:
            value = kind(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{text!r} is not a number") from None
        if not value > 0:
            raise argparse.ArgumentTypeError(f"must be above 0, got {text}")
        return value

    return parse


def add_isolation(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--memory-mb", type=positive(int), default=Limits.memory_mb, help="address space per worker"
    )
    parser.add_argument(
        "--unsafe-no-sandbox",
        action="store_true",
        help="run the code without the bubblewrap sandbox (trusted code only; reports say so)",
    )
