"""What every job's command line shares: checked options, the isolation flag, usage errors.

Exit statuses of the jobs: 0 every test passed (or the suite passed), 1 some failed, 2 nothing
was judged (bad options, an unwritable report path, no sandbox).
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from harness.isolation import tiers
from harness.isolation.container import ContainerUnavailable
from harness.isolation.limits import Limits
from harness.isolation.sandbox import SandboxUnavailable
from harness.shared_tests.inputs import RUN_DTYPES, set_run_dtype

# How a run's workers ran, as every report says it (an unsafe run says so in every report).
SANDBOX = tiers.SANDBOX.described
CONTAINER = tiers.CONTAINER.described
UNSAFE = tiers.UNSAFE.described


def add_dtype(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--dtype",
        choices=RUN_DTYPES,
        default=None,
        help="build every model of the run in this dtype (default: float64 where the subject "
        "runs in it, else float32); each value is judged against its bound derived for it",
    )


def apply_dtype(args: argparse.Namespace) -> None:
    """The run's dtype, for the weights the parent draws and the workers' models."""
    set_run_dtype(getattr(args, "dtype", None))


def usage_error(command: str, message: str) -> int:
    print(f"xfmr {command}: {message}", file=sys.stderr)
    return 2


def chosen_tier(args: argparse.Namespace) -> tiers.Tier:
    """The tier the options chose: UNSAFE under --unsafe-no-sandbox, else --isolation's (the
    sandbox where a command offers no --isolation)."""
    if args.unsafe_no_sandbox:
        return tiers.UNSAFE
    return tiers.tier(getattr(args, "isolation", tiers.SANDBOX.name))


def isolation_problem(args: argparse.Namespace, hidden: Sequence[Path] = ()) -> str:
    """Why untrusted code cannot run here ("" if it can): the chosen tier's own trial
    (args.isolation: the bubblewrap sandbox unless the container tier was chosen; `hidden`: the
    reports' folders, which the container tier must show out of its user's reach), unless the
    user explicitly chose to run trusted code without either."""
    tier = chosen_tier(args)
    if not tier.isolated:
        print(f"WARNING: {tier.described}", file=sys.stderr)
        return ""
    try:
        tier.trial(hidden)
    except (SandboxUnavailable, ContainerUnavailable) as e:
        return (
            f"refusing to run untrusted code: the {tier.name} tier cannot be set up ({e}). "
            f"{tier.fix}"
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
        "--memory-mb",
        type=positive(int),
        default=Limits.memory_mb,
        help="address space a worker may map beyond what it maps once torch is imported (MiB; "
        "torch's own mappings differ by build: 0.6 GiB CPU, 3.1 GiB CUDA)",
    )
    parser.add_argument(
        "--unsafe-no-sandbox",
        action="store_true",
        help="run the code without the bubblewrap sandbox (trusted code only; reports say so)",
    )
