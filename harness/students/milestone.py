"""`xfmr milestone --submission transformer.py [--smoke]`: MS-L5 on a student's own model.

The thin entry of `xfmr milestone`, which the CLI points at: its options are the milestone's
(demos.milestone) and the student's three below; with --submission the run is demos.own_model's
(the student's fit, translate, noam_rate and optimizer, on their machine, as `xfmr check` runs
them), without it the course's MS-L5 on impl over seeds x norms (demos.milestone, a demo).
"""

from __future__ import annotations

import argparse
import sys

from demos import milestone
from demos.args import positive_int
from demos.runtime import THREADS
from harness import sealed


def configure_milestone(parser: argparse.ArgumentParser) -> None:
    milestone.configure_milestone(parser)
    own = parser.add_argument_group("your own model")
    own.add_argument(
        "--submission",
        metavar="FILE",
        help="your transformer.py: the milestone on your own model (its fit, noam_rate, "
        "make_optimizer, translate), on this machine without a sandbox, as xfmr check",
    )
    own.add_argument(
        "--smoke",
        action="store_true",
        help="with --submission: a quick run (two-digit sums, a shorter LayerNorm demo; under 3 "
        "minutes on 2 CPU cores) against the smoke bar",
    )
    own.add_argument("--threads", type=positive_int, default=THREADS, help="torch CPU threads")


def run_milestone(args: argparse.Namespace) -> int:
    if args.submission:
        from demos.own_model import run_own_milestone

        return run_own_milestone(args)
    if args.smoke:
        print("xfmr milestone: error: --smoke needs --submission", file=sys.stderr)
        return 2
    if sealed.in_kit():  # the course's MS-L5 trains impl, which the student kit does not hold
        print(
            "xfmr milestone: error: the student kit runs the milestone on your own model: give "
            "--submission transformer.py",
            file=sys.stderr,
        )
        return 2
    return milestone.run_milestone(args)
