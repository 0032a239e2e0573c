"""The `xfmr` command: one subcommand per job, each living in the module that does the work.

A subcommand's module is imported only when that subcommand runs, so `xfmr matrix` never pays
for matplotlib and `xfmr bench` never imports the harness's workers.
"""

from __future__ import annotations

import argparse
import importlib
import os
import select
import sys
from importlib.metadata import version

# name -> (module, one-line help). The module defines configure_<name>(parser) and
# run_<name>(args) -> int, with '-' in the name written as '_'.
COMMANDS: dict[str, tuple[str, str]] = {
    "smoke": (
        "harness.tools.smoke",
        "oracle vs impl agreement for both norms (a quick health check)",
    ),
    "bench": ("harness.tools.bench", "oracle vs torch float64 speed, forward and backward"),
    "bound-check": (
        "harness.tools.bound_check",
        "honest subjects in float32/bfloat16/float16 against the oracle's derived error bound",
    ),
    "false-alarms": (
        "harness.tools.false_alarms",
        "whole grades of correct subjects under many secret draws and dtypes: every failure",
    ),
    "compare": (
        "harness.tools.compare",
        "your model's outputs (any dtype) against the oracle within the derived error bound",
    ),
    "detection": (
        "harness.tools.detection",
        "the smallest fault of each classic kind the derived bound detects, per dtype",
    ),
    "bench-engine": (
        "harness.tools.bench_engine",
        "local vs Dask executors, and the incremental cache (needs the [dist] extra)",
    ),
    "matrix": (
        "harness.jobs.matrix",
        "the kill-rate matrix: shared tests x impl, torch copy, mutants",
    ),
    "grade": ("harness.jobs.grade", "grade one untrusted submission against the shared tests"),
    "grade-batch": ("harness.jobs.grade", "grade every submission in a folder"),
    "autograder": (
        "harness.jobs.autograder",
        "the Gradescope autograder zip and the PrairieLearn grader: build, try "
        "(xfmr autograder gradescope --out autograder.zip; try autograder.zip transformer.py)",
    ),
    "summarize": (
        "harness.reports.grades",
        "grade-batch's tables from a folder of collected Gradescope results.json files",
    ),
    "mutation-score": (
        "harness.jobs.mutation_score",
        "score a student's test suite by mutants killed",
    ),
    "generated-draws": (
        "harness.jobs.generated_draws",
        "students' suites on the generated samples of several secret draws (a measurement)",
    ),
    "check": (
        "harness.selfcheck",
        "a student's self-check (no sandbox, not a grade): the shared tests, --suite: mutants",
    ),
    "start": (
        "harness.tools.start",
        "a student's starting folder: transformer.py stubbed from the contract, tests/, README",
    ),
    "diff": (
        "harness.diff",
        "after every shared test passes: your code beside the reference, definition by definition",
    ),
    "warm-server": (
        "harness.tools.warm_server",
        "start, inspect or stop the warm fork server that --incremental keeps between runs",
    ),
    "train": ("demos.train", "train impl on reversed addition (the milestone MS-L5)"),
    "evaluate": ("demos.train", "exact match of a trained model on held-out sums"),
    "translate": ("demos.train", "a trained model's answer to one sum"),
    "ln-demo": ("demos.ln_demo", "post-LN vs pre-LN without warmup, then post-LN with warmup"),
    "depth-demo": ("demos.depth_demo", "shared-weight post-norm vs pre-norm stacks over depth"),
    "milestone": ("demos.milestone", "MS-L5 over seeds x norms, float32 and float64 (results/)"),
}


def _usage() -> str:
    width = max(map(len, COMMANDS))
    lines = ["usage: xfmr COMMAND [options]", "", "commands:"]
    lines += [f"  {name:<{width}}  {about}" for name, (_, about) in COMMANDS.items()]
    lines += ["", "xfmr COMMAND --help shows a command's options."]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv and argv[0] == "--version":
        print(f"xfmr {version('xfmr-oracle')}")
        return 0
    if not argv or argv[0] in {"-h", "--help"}:
        print(_usage(), file=sys.stdout if argv else sys.stderr)
        return 0 if argv else 2
    name, rest = argv[0], argv[1:]
    if name not in COMMANDS:
        print(f"xfmr: unknown command {name!r}\n\n{_usage()}", file=sys.stderr)
        return 2
    module_name, about = COMMANDS[name]
    module = importlib.import_module(module_name)
    attr = name.replace("-", "_")
    parser = argparse.ArgumentParser(prog=f"xfmr {name}", description=about)
    getattr(module, f"configure_{attr}")(parser)
    args = parser.parse_args(rest)
    try:
        return int(getattr(module, f"run_{attr}")(args) or 0)
    except BrokenPipeError:
        if not _stdout_is_broken():
            raise  # a pipe of the job's own: an error like any other
        # `xfmr ... | head`: the reader left, which is not an error
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 0


def _stdout_is_broken() -> bool:
    """Is standard output a pipe whose reader has gone?"""
    try:
        poller = select.poll()
        poller.register(sys.stdout.fileno(), select.POLLOUT)
        return any(events & select.POLLERR for _, events in poller.poll(0))
    except (OSError, ValueError):
        return False


if __name__ == "__main__":
    sys.exit(main())
