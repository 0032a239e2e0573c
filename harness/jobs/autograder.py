"""`xfmr autograder`: the Gradescope autograder zip and the PrairieLearn grader, built; tried
before uploading; and the steps their scripts run.

- `gradescope --out autograder.zip`, `prairielearn --out DIR`: the platforms' files, from one set
  of scripts (harness.jobs.autograder_files says what each holds).
- `try AUTOGRADER SUBMISSION`: the build and one job, as the platform runs them, in a simulated
  container (harness.jobs.autograder_try).
- `probe`, `refuse`, `prairielearn-results`: the scripts' own steps (which isolation tier works
  here; a results.json when none does; a grade's report in PrairieLearn's format).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import tempfile
from collections.abc import Sequence
from importlib.metadata import version
from pathlib import Path
from typing import Any

from harness.isolation.container import USER, ContainerUnavailable
from harness.isolation.sandbox import SandboxUnavailable
from harness.isolation.tiers import TIERS
from harness.jobs import autograder_files as files
from harness.jobs.autograder_try import configure_try, run_try
from harness.options import positive, usage_error
from harness.records import Grade, TestResult
from harness.reports import gradescope, prairielearn
from harness.reports.writer import report_path_problem, write_all, write_report
from harness.shared_tests.laws import BY_NAME, SHARED_TESTS
from harness.shared_tests.record import VISIBILITIES, Test

FORMATS = ("gradescope", "prairielearn")


def _selected(names: str | None) -> list[Test]:
    if not names:
        return list(SHARED_TESTS)
    wanted = names.split(",")
    unknown = sorted(set(wanted) - set(BY_NAME))
    if unknown:
        raise SystemExit(usage_error("autograder", f"--tests: unknown {unknown}"))
    return [t for t in SHARED_TESTS if t.name in wanted]


# --- probe: which tier works here -----------------------------------------------------------


def probe(hidden: Sequence[Path]) -> tuple[str, list[str]]:
    """The first isolation tier whose trial passes here (the sandbox first: it also takes the
    network away), or "none"; and each tier's verdict."""
    said = []
    for tier in TIERS.values():
        try:
            tier.trial(hidden)
        except (SandboxUnavailable, ContainerUnavailable) as e:
            said.append(f"{tier.name}: cannot be set up: {e}")
            continue
        said.append(f"{tier.name}: works")
        return tier.name, said
    return "none", said


# --- the steps of the platforms' scripts --------------------------------------------------------


def refused(args: argparse.Namespace) -> tuple[dict[str, Any], str]:
    """The results.json of `refuse` (no isolation tier works here), and why, for staff (the
    probe's record): in the results.json only where the platform hides it from the student
    (Gradescope's hidden test), and on the job's output (staff's on both platforms)."""
    try:
        said = Path(args.why).read_text().strip().splitlines()[1:]
    except OSError as e:
        said = [f"the probe's record {args.why} could not be read: {e.strerror or e}"]
    why = (
        "no isolation tier works in this container, so no submission is run ("
        + "; ".join(said or ["the probe recorded no reason"])
        + "). Rebuild the grader where bubblewrap can start, or where the container tier's "
        "user exists and the grader's folders are closed to it (see the README's Gradescope "
        "and PrairieLearn sections), then regrade."
    )
    tests = _selected(args.tests)
    if args.format == "prairielearn":
        return prairielearn.refusal(tests), why
    return gradescope.refusal(tests, why, args.visibility, args.stdout_visibility), why


def grade_of(report: dict[str, Any]) -> Grade:
    """The Grade of `xfmr grade --json`'s report (harness.reports.grade.to_json)."""
    return Grade(
        report["submission"],
        [TestResult.from_json(t) for t in report["tests"]],
        report["rejected"],
        report["diagnosis"],
        report["seconds"],
        report["isolation"],
        report["grader_error"],
        report["start_seconds"],
    )


def converted(args: argparse.Namespace) -> tuple[dict[str, Any], list[str]]:
    """The results.json of `prairielearn-results`: the grade's report in PrairieLearn's format;
    no report (the grade refused, or broke before it could write one): not graded. And what
    staff must know, for the job's output only (PrairieLearn shows a student all of
    results.json)."""
    try:
        g = grade_of(json.loads(Path(args.grade).read_text()))
        return prairielearn.prairielearn(g), prairielearn.staff_notes(g)
    except (OSError, ValueError, KeyError, TypeError) as e:
        problem = f"{type(e).__name__}: {e}"
    tests = _selected(args.tests)
    if args.status == 2:  # nothing was graded: a refusal, said on the grade's stderr above
        why = "xfmr grade refused to grade (exit 2); its reason is above, in this output"
        return prairielearn.refusal(tests), [f"Course staff: {why}"]
    return prairielearn.fault(tests), [
        f"Course staff: xfmr grade left no report (exit status {args.status}; {problem}); this "
        "output says why; fix it, then regrade."
    ]


def write_folder(out: Path, found: Sequence[tuple[str, Any, int]]) -> str:
    """Write the files (name under `out`, content, mode) as `out`, whole: built beside it, then
    put in its place (an earlier build of ours is replaced; anything else is left). Returns the
    problem ("" if none)."""
    if out.exists() and not (out / "image" / "Dockerfile").is_file():
        if not out.is_dir() or any(out.iterdir()):
            return f"{out} exists and is not an earlier `xfmr autograder prairielearn` folder"
    out.parent.mkdir(parents=True, exist_ok=True)
    fresh = Path(tempfile.mkdtemp(prefix=f".{out.name}.", dir=out.parent))
    try:
        for name, content, mode in found:
            path = fresh / name
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_bytes(content())
            path.chmod(mode)
        fresh.chmod(0o755)
        if out.exists():
            shutil.rmtree(out)
        os.rename(fresh, out)
    finally:
        shutil.rmtree(fresh, ignore_errors=True)
    return ""


# --- the command ------------------------------------------------------------------------------


def _add_build_options(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--tests", metavar="NAMES", help="comma-separated shared tests to run")
    parser.add_argument(
        "--time-limit",
        type=positive(float),
        metavar="S",
        help="cap every test's limit (seconds); loading keeps its own limit",
    )
    parser.add_argument("--user", default=USER, help="the container tier's user")


def configure_autograder(parser: argparse.ArgumentParser) -> None:
    sub = parser.add_subparsers(dest="action", required=True, metavar="ACTION")
    build_it = sub.add_parser(
        "gradescope", help="build the Gradescope autograder zip (setup.sh, run_autograder, source)"
    )
    build_it.add_argument("--out", default="autograder.zip", help="the zip to write")
    _add_build_options(build_it)
    build_it.add_argument(
        "--reveal-reference-after-pass",
        action="store_true",
        help="a course policy, off by default: a full-score results.json also shows the "
        "student's code beside the reference (xfmr diff); otherwise no results.json holds any",
    )
    for option, default, what in (
        ("--visibility", "visible", "the whole result"),
        ("--stdout-visibility", "hidden", "the grader's standard output"),
    ):
        build_it.add_argument(
            option, choices=VISIBILITIES, default=default, help=f"Gradescope's, for {what}"
        )
    learn = sub.add_parser(
        "prairielearn",
        help="build a PrairieLearn external-grader question: the image (Dockerfile, run.sh, "
        "source) and the question (info.json, question.html)",
    )
    learn.add_argument("--out", default="prairielearn", metavar="DIR", help="the folder to write")
    _add_build_options(learn)
    learn.add_argument(
        "--course",
        required=True,
        metavar="NAME",
        help="the course's name (its infoCourse.json name, e.g. 'CS 182'): the question's UUID "
        "is made from it and the QID, unique per course and question; and the image's default "
        "Docker Hub namespace (its letters and digits, lowercased)",
    )
    learn.add_argument(
        "--image",
        metavar="NAME:TAG",
        help="the image's name in info.json: a Docker Hub repository the course pushes to "
        f"(default: NAMESPACE/{files.IMAGE_REPOSITORY}:{version('xfmr-oracle')}, the namespace "
        "from --course)",
    )
    learn.add_argument("--qid", default="xfmr-transformer", help="the question's folder (its QID)")
    learn.add_argument(
        "--timeout",
        type=positive(int),
        default=600,
        metavar="S",
        help="info.json's grading timeout (PrairieLearn's most, and the default: 600)",
    )
    configure_try(
        sub.add_parser(
            "try",
            help="run the autograder on a submission as Gradescope (or PrairieLearn) does, in a "
            "simulated container, and show the results.json",
        )
    )
    check_it = sub.add_parser("probe", help="(setup.sh) record which isolation tier works here")
    check_it.add_argument("--record", required=True, metavar="FILE", help="where to record it")
    check_it.add_argument(
        "--hidden",
        action="append",
        default=[],
        metavar="DIR",
        help="a folder the container tier's user must not reach (the reports' folder)",
    )
    refuse_it = sub.add_parser(
        "refuse", help="(run_autograder) a results.json saying no tier works here, and why"
    )
    refuse_it.add_argument("--why", required=True, metavar="FILE", help="the probe's record")
    refuse_it.add_argument("--out", required=True, metavar="FILE", help="the results.json")
    refuse_it.add_argument("--format", choices=FORMATS, default="gradescope")
    refuse_it.add_argument("--tests", metavar="NAMES")
    for option, default in (("--visibility", "visible"), ("--stdout-visibility", "hidden")):
        refuse_it.add_argument(option, choices=VISIBILITIES, default=default)
    convert = sub.add_parser(
        "prairielearn-results",
        help="(run.sh) xfmr grade's JSON report as PrairieLearn's results.json",
    )
    convert.add_argument("--grade", required=True, metavar="FILE", help="xfmr grade --json's")
    convert.add_argument("--status", required=True, type=int, help="xfmr grade's exit status")
    convert.add_argument("--out", required=True, metavar="FILE", help="the results.json")
    convert.add_argument("--tests", metavar="NAMES")


def _told(tests: Sequence[Test]) -> str:
    each = ", ".join(
        f"{t.name} {t.points:g}" + ("" if t.visibility == "visible" else f" ({t.visibility})")
        for t in tests
    )
    return f"Each test's points and visibility come from its record (harness/shared_tests): {each}"


def run_autograder(args: argparse.Namespace) -> int:
    if args.action == "try":
        return run_try(args)
    if args.action == "probe":
        tier, said = probe([Path(h) for h in args.hidden])
        for line in said:
            print(f"xfmr autograder probe: {line}")
        write_report(args.record, "\n".join([tier, *said]) + "\n")
        if tier == "none":
            print(
                "xfmr autograder probe: NO ISOLATION TIER WORKS IN THIS CONTAINER: every "
                "submission will be refused (a results.json with score 0 saying why)",
                file=sys.stderr,
            )
        return 0
    if args.action == "refuse":
        data, why = refused(args)
        print(f"Course staff: {why}")  # the job's output: staff's on both platforms
        write_all("autograder", [(args.out, lambda: data)])
        return 2  # nothing was graded
    if args.action == "prairielearn-results":
        data, notes = converted(args)
        for note in notes:  # the grading job's output: instructors' only
            print(note)
        return 0 if write_all("autograder", [(args.out, lambda: data)]) else 2
    tests = _selected(args.tests)
    total = sum(t.points for t in tests)
    out = Path(args.out)
    if args.action == "prairielearn":
        args.image, problem = files.image_of(args.course, args.image)
        if problem or (problem := write_folder(out, files.prairielearn_files(args, tests))):
            return usage_error("autograder prairielearn", problem)
        print(
            f"wrote {out}/: image/ (the grader image's Dockerfile, setup.sh, run.sh and "
            f"{files.PROJECT_DIR}/, version {version('xfmr-oracle')}) and questions/{args.qid}/ "
            f"(info.json, question.html)\n"
            f"{len(tests)} tests, {total:g} points; PrairieLearn's score is their fraction.\n"
            f"  docker build -t {args.image} {out}/image && docker push {args.image}\n"
            f"(the namespace {args.image.rsplit('/', 1)[0]!r} must be one your course owns: "
            "`docker login` as it first; --image names another)\n"
            f"then copy {out}/questions/{args.qid} into your course's questions/ "
            f"({out}/README.md says more).\n{_told(tests)}"
        )
        return 0
    if problem := report_path_problem(out):
        return usage_error("autograder", f"cannot write {out}: {problem}")
    content = files.gradescope_zip(args, tests)
    tmp = out.with_name(f".{out.name}.tmp")
    tmp.write_bytes(content)
    os.replace(tmp, out)
    print(
        f"wrote {out} ({len(content) / 1e6:.1f} MB): setup.sh, run_autograder, assignment.json "
        f"and {files.PROJECT_DIR}/ (version {version('xfmr-oracle')})\n"
        f"{len(tests)} tests, {total:g} points: in Gradescope, create a Programming Assignment "
        f"of {total:g} points and upload {out} as its autograder (Ubuntu 22.04 or later).\n"
        f"Try it first: xfmr autograder try {out} transformer.py\n{_told(tests)}"
    )
    return 0
