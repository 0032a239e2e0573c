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
from dataclasses import dataclass
from importlib.metadata import version

from harness import sealed


@dataclass(frozen=True)
class Command:
    """One line of `xfmr --help`: a command, the module that does its work (it defines
    configure_<name>(parser) and run_<name>(args) -> int, '-' in the name written as '_'), and
    its one-line help. `shown` is how the line writes it where the options make it this
    section's (the students' `milestone --submission FILE`)."""

    name: str
    module: str
    about: str
    shown: str = ""


# `xfmr --help`'s sections by audience, the students' first. Each command's module lives in its
# section's folder (tests/harness_tests/test_architecture.py holds it). A command listed in two
# sections (milestone) runs the module of its first line, which hands the other's runs on to it.
SECTIONS: tuple[tuple[str, tuple[Command, ...]], ...] = (
    (
        "your own code",
        (
            Command(
                "start",
                "harness.students.start",
                "a student's starting folder: transformer.py stubbed from the contract, tests/, "
                "README",
            ),
            Command(
                "check",
                "harness.students.selfcheck",
                "a student's self-check (no sandbox, not a grade): the shared tests, --suite: "
                "mutants",
            ),
            Command(
                "diff",
                "harness.students.diff",
                "after every shared test passes: your code beside the reference, definition by "
                "definition",
            ),
            Command(
                "milestone",
                "harness.students.milestone",
                "MS-L5 on a student's own model: its fit, noam_rate, make_optimizer, translate "
                "(--smoke: a quick run)",
                shown="milestone --submission FILE",
            ),
        ),
    ),
    (
        "grading",
        (
            Command(
                "grade",
                "harness.jobs.grade",
                "grade one untrusted submission against the shared tests",
            ),
            Command("grade-batch", "harness.jobs.grade", "grade every submission in a folder"),
            Command(
                "autograder",
                "harness.jobs.autograder",
                "the Gradescope autograder zip and the PrairieLearn grader: build, try "
                "(xfmr autograder gradescope --out autograder.zip; try autograder.zip "
                "transformer.py)",
            ),
            Command(
                "summarize",
                "harness.reports.grades",
                "grade-batch's tables from a folder of collected Gradescope results.json files",
            ),
            Command(
                "kit",
                "harness.jobs.kit",
                "the student kit: a wheel of the students' commands without the reference "
                "(xfmr kit --out DIR; hand out the wheel and its INSTALL.txt)",
            ),
            Command(
                "mutation-score",
                "harness.jobs.mutation_score",
                "score a student's test suite by mutants killed",
            ),
            Command(
                "matrix",
                "harness.jobs.matrix",
                "the kill-rate matrix: shared tests x impl, torch copy, mutants",
            ),
        ),
    ),
    (
        "the course's measurements (results/)",
        (
            Command(
                "bound-check",
                "harness.tools.bound_check",
                "honest subjects in float32/bfloat16/float16 against the oracle's derived error "
                "bound",
            ),
            Command(
                "detection",
                "harness.tools.detection",
                "the smallest fault of each classic kind the derived bound detects, per dtype",
            ),
            Command(
                "false-alarms",
                "harness.tools.false_alarms",
                "whole grades of correct subjects under many secret draws and dtypes: every "
                "failure",
            ),
            Command(
                "generated-draws",
                "harness.tools.generated_draws",
                "students' suites on the generated samples of several secret draws (a measurement)",
            ),
            Command(
                "bench",
                "harness.tools.bench",
                "oracle vs torch float64 speed, forward and backward",
            ),
            Command(
                "bench-engine",
                "harness.tools.bench_engine",
                "local vs Dask executors, and the incremental cache (needs the [dist] extra)",
            ),
        ),
    ),
    (
        "the oracle",
        (
            Command(
                "compare",
                "harness.oracle_checks.compare",
                "your model's outputs (any dtype) against the oracle within the derived error "
                "bound",
            ),
            Command(
                "smoke",
                "harness.oracle_checks.smoke",
                "oracle vs impl agreement for both norms (a quick health check)",
            ),
        ),
    ),
    (
        "demos",
        (
            Command(
                "train", "demos.train", "train impl on reversed addition (the milestone MS-L5)"
            ),
            Command("evaluate", "demos.train", "exact match of a trained model on held-out sums"),
            Command("translate", "demos.train", "a trained model's answer to one sum"),
            Command(
                "ln-demo",
                "demos.ln_demo",
                "post-LN vs pre-LN without warmup, then post-LN with warmup",
            ),
            Command(
                "depth-demo",
                "demos.depth_demo",
                "shared-weight post-norm vs pre-norm stacks over depth",
            ),
            Command(
                "milestone",
                "demos.milestone",
                "MS-L5 over seeds x norms, float32 and float64 (results/)",
            ),
        ),
    ),
    (
        "operations",
        (
            Command(
                "warm-server",
                "harness.isolation.warm_server",
                "start, inspect or stop the warm fork server that --incremental keeps between runs",
            ),
        ),
    ),
)


def _commands() -> dict[str, tuple[str, str]]:
    """name -> (the module it runs: its first line's, its description: its lines' help)."""
    found: dict[str, tuple[str, str]] = {}
    for _, commands in SECTIONS:
        for c in commands:
            module, about = found.get(c.name, (c.module, ""))
            found[c.name] = (module, f"{about}; {c.about}" if about else c.about)
    return found


COMMANDS = _commands()


def _usage() -> str:
    width = max(len(c.shown or c.name) for _, commands in SECTIONS for c in commands)
    lines = ["usage: xfmr COMMAND [options]"]
    for title, commands in SECTIONS:
        offered = [c for c in commands if sealed.offers(c.name, c.module)]  # the kit: its own
        lines += ["", f"{title}:"] if offered else []
        lines += [f"  {c.shown or c.name:<{width}}  {c.about}" for c in offered]
    if sealed.in_kit():
        lines += ["", "(the student kit: the staff commands are in the project's own install)"]
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
    if refused := sealed.refusal(name):  # the student kit: a staff command, another Python
        print(f"xfmr {name}: {refused}", file=sys.stderr)
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
