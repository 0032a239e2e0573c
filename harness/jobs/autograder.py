"""`xfmr autograder gradescope --out autograder.zip`: the whole Gradescope autograder, built.

The zip holds, at its root (Gradescope's specification:
https://gradescope-autograders.readthedocs.io/en/latest/specs/, after Otter-Grader's
`otter generate`, which also ships its own source and a setup.sh of its own):

- setup.sh: run once, as root, when Gradescope builds the image (Ubuntu 22.04's python3 is
  3.10): bubblewrap; a Python >= 3.11 (the image's, else Ubuntu's python3.11, else deadsnakes');
  a venv with the CPU build of torch and this project (editable, from the shipped source); the
  container tier's user; /autograder closed to it; then `xfmr autograder probe` proves which
  isolation tier works in this very container and records it for run_autograder.
- run_autograder: per submission, as root: `xfmr grade /autograder/submission --gradescope
  /autograder/results/results.json --isolation TIER` (the tier setup.sh proved; none proved: a
  refusal), and a results.json of its own if the grade left none (Python itself broken).
- xfmr-oracle/: this project's source at this version (the packages, pyproject.toml, the README
  and the contract), installed by setup.sh.
- assignment.json: the tests, their points and visibility (from the law records), the total to
  enter in Gradescope, the options run_autograder grades with.

`xfmr autograder probe` and `xfmr autograder refuse` are setup.sh's and run_autograder's.
"""

from __future__ import annotations

import argparse
import io
import json
import os
import shlex
import sys
import zipfile
from collections.abc import Sequence
from importlib.metadata import version
from pathlib import Path
from typing import Any

from harness.isolation.container import ContainerUnavailable
from harness.isolation.sandbox import (
    CONTAINER_TIER,
    PROJECT_ROOT,
    SANDBOX_TIER,
    SandboxUnavailable,
    tier_check,
)
from harness.options import positive, usage_error
from harness.reports.gradescope import refusal
from harness.reports.writer import report_path_problem, write_all, write_report
from harness.shared_tests.laws import BY_NAME, SHARED_TESTS
from harness.shared_tests.record import VISIBILITIES, Test

PROJECT_DIR = "xfmr-oracle"  # the project's source, inside the zip and /autograder/source
PACKAGES = ("oracle", "impl", "mutants", "harness", "tasks", "demos")
TOP_FILES = ("pyproject.toml", "README.md", "CONTRACT.md")
VENV = "/opt/xfmr-oracle/venv"  # setup.sh's default; XFMR_VENV changes it
TORCH = "torch==2.13.0"

SETUP_SH = r"""#!/usr/bin/env bash
# setup.sh of the xfmr-oracle {version} Gradescope autograder (built by `xfmr autograder
# gradescope`). Gradescope runs it once, as root, when it builds the autograder's image.
# XFMR_SKIP_INSTALL=1 skips the apt and pip steps (an image that has them: the CI's simulation).
set -euo pipefail
SOURCE=/autograder/source
PROJECT="$SOURCE/{project}"
VENV="${{XFMR_VENV:-{venv}}}"
STUDENT={user}
export DEBIAN_FRONTEND=noninteractive

python_ok() {{  # a Python >= 3.11 that can make a venv
    "$1" -c 'import sys, ensurepip, venv; sys.exit(sys.version_info < (3, 11))' 2>/dev/null
}}

if [ "${{XFMR_SKIP_INSTALL:-0}}" != 1 ]; then
    apt-get update
    apt-get install -y --no-install-recommends bubblewrap libseccomp2 ca-certificates passwd
    PYTHON=""
    for candidate in python3.13 python3.12 python3.11 python3; do
        if command -v "$candidate" >/dev/null && python_ok "$(command -v "$candidate")"; then
            PYTHON="$(command -v "$candidate")"
            break
        fi
    done
    if [ -z "$PYTHON" ]; then  # Ubuntu 22.04: python3 is 3.10; its universe has python3.11
        apt-get install -y --no-install-recommends python3.11 python3.11-venv || {{
            apt-get install -y --no-install-recommends software-properties-common gpg-agent
            add-apt-repository -y ppa:deadsnakes/ppa
            apt-get update
            apt-get install -y --no-install-recommends python3.11 python3.11-venv
        }}
        PYTHON="$(command -v python3.11)"
    fi
    python_ok "$PYTHON" || {{ echo "setup.sh: no Python >= 3.11 with venv" >&2; exit 1; }}
    mkdir -p "$(dirname "$VENV")"
    "$PYTHON" -m venv "$VENV"
    "$VENV/bin/pip" install --upgrade pip
    # the CPU build, asked for explicitly: the default index would pull CUDA's gigabytes
    "$VENV/bin/pip" install {torch} --index-url https://download.pytorch.org/whl/cpu
    "$VENV/bin/pip" install -e "$PROJECT"
fi
echo "$VENV" > "$SOURCE/venv"

# the container tier's user: no password, no login shell, no groups but its own
id -u "$STUDENT" >/dev/null 2>&1 || useradd --system --user-group --no-create-home \
    --home-dir /nonexistent --shell /usr/sbin/nologin "$STUDENT"
# nothing of the grader within its reach: the reference, the oracle, the reports are under
# /autograder; it reads only the interpreter and the venv's packages
chmod 700 /autograder
chmod -R go-rwx "$PROJECT"

# which isolation tier works in this container, proved by a trial of each (run_autograder
# passes it to xfmr grade); none: every submission gets a results.json saying why
PYTHONPATH="$PROJECT" "$VENV/bin/python" -m harness.cli autograder probe \
    --record "$SOURCE/isolation" --hidden /autograder
"""

RUN_AUTOGRADER = r"""#!/usr/bin/env bash
# run_autograder of the xfmr-oracle {version} Gradescope autograder: Gradescope runs it as root,
# in /autograder, once per submission. It always leaves a valid results.json.
SOURCE=/autograder/source
PROJECT="$SOURCE/{project}"
RESULTS=/autograder/results
VENV="$(cat "$SOURCE/venv" 2>/dev/null || echo {venv})"
TIER="$(head -n 1 "$SOURCE/isolation" 2>/dev/null)"
mkdir -p "$RESULTS"
chmod 700 /autograder "$RESULTS"
rm -f "$RESULTS/results.json"
cd /autograder
run() {{
    env -i PATH=/usr/local/bin:/usr/bin:/bin HOME=/root LANG=C.UTF-8 PYTHONPATH="$PROJECT" \
        "$VENV/bin/python" -m harness.cli "$@"
}}
case "$TIER" in
    {sandbox}|{container})
        run grade /autograder/submission --gradescope "$RESULTS/results.json" \
            --isolation "$TIER" {options}{grade_json}
        ;;
    *)  # setup.sh proved no tier (its reasons are in $SOURCE/isolation)
        run autograder refuse --why "$SOURCE/isolation" --out "$RESULTS/results.json" \
            {refuse}
        ;;
esac
status=$?
{reveal}if [ ! -s "$RESULTS/results.json" ]; then  # the grader could not even report: say so
    MSG="NOT GRADED: the autograder failed before it could report (status $status); this is "
    MSG+="not a verdict on your code, and its score of 0 stands only until course staff "
    MSG+="regrade it.\\nCourse staff: the autograder's output (stdout) says why; fix it, then "
    MSG+="regrade."
    printf '{{"score": 0.0, "output": "%s", "output_format": "text", "tests": [],\n' "$MSG" \
        > "$RESULTS/results.json"
    printf ' "visibility": "{visibility}", "stdout_visibility": "{stdout_visibility}"}}\n' \
        >> "$RESULTS/results.json"
fi
echo "xfmr grade exit status: $status (0 all passed, 1 some failed or rejected, 2 not graded," \
    "3 grader error)"
exit 0
"""


def _source_files(root: Path = PROJECT_ROOT) -> list[tuple[str, Path]]:
    """The project's source as shipped: its packages (data included; caches and compiled files
    left out) and the top-level files its install reads."""
    found = [(name, root / name) for name in TOP_FILES if (root / name).is_file()]
    for package in PACKAGES:
        for folder, dirs, files in os.walk(root / package):
            dirs[:] = sorted(d for d in dirs if d != "__pycache__" and not d.startswith("."))
            for name in sorted(files):
                if name.endswith((".pyc", ".pyo")) or name.startswith("."):
                    continue
                path = Path(folder) / name
                if not path.is_symlink():
                    found.append((path.relative_to(root).as_posix(), path))
    return found


def assignment(tests: Sequence[Test]) -> dict[str, Any]:
    """The assignment as Gradescope's settings need it: the total and each test's share."""
    return {
        "total_points": float(sum(t.points for t in tests)),
        "tests": [
            {"name": t.name, "law": t.law, "points": float(t.points), "visibility": t.visibility}
            for t in tests
        ],
    }


def _grade_options(args: argparse.Namespace) -> list[str]:
    options = ["--visibility", args.visibility, "--stdout-visibility", args.stdout_visibility]
    if args.tests:
        options += ["--tests", args.tests]
    if args.time_limit:
        options += ["--time-limit", str(args.time_limit)]
    return options


# --reveal-reference-after-pass (a course policy, off by default): the grade also writes its JSON,
# and `xfmr diff` adds the student's code beside the reference to a full-score results.json
# (harness.diff; it reads the submission's source, never runs it). Without it nothing of impl
# reaches a results.json.
GRADE_JSON = ' --json "$RESULTS/grade.json"'
REVEAL = """if [ -s "$RESULTS/grade.json" ]; then  # the reference, after a full score
    run diff /autograder/submission --grade "$RESULTS/grade.json" \\
        --gradescope "$RESULTS/results.json" > /dev/null
fi
rm -f "$RESULTS/grade.json"
"""


def build(args: argparse.Namespace, tests: Sequence[Test]) -> bytes:
    """The autograder zip's bytes."""
    options = _grade_options(args)
    reveal = bool(getattr(args, "reveal_reference_after_pass", False))
    refuse = [*options[:4], *options[4:6]]  # visibility and the tests, not the time limit
    fill = {
        "version": version("xfmr-oracle"),
        "project": PROJECT_DIR,
        "venv": VENV,
        "user": args.user,
        "torch": TORCH,
        "sandbox": SANDBOX_TIER,
        "container": CONTAINER_TIER,
        "options": shlex.join(options),
        "refuse": shlex.join(refuse),
        "visibility": args.visibility,
        "stdout_visibility": args.stdout_visibility,
        "grade_json": GRADE_JSON if reveal else "",
        "reveal": REVEAL if reveal else "",
    }
    data = io.BytesIO()
    with zipfile.ZipFile(data, "w", zipfile.ZIP_DEFLATED) as z:

        def add(name: str, content: bytes, mode: int = 0o644) -> None:
            info = zipfile.ZipInfo(name, date_time=(2026, 1, 1, 0, 0, 0))
            info.external_attr = (0o100000 | mode) << 16
            info.compress_type = zipfile.ZIP_DEFLATED
            z.writestr(info, content)

        add("setup.sh", SETUP_SH.format(**fill).encode(), 0o755)
        add("run_autograder", RUN_AUTOGRADER.format(**fill).encode(), 0o755)
        about = assignment(tests) | {
            "version": fill["version"],
            "run_autograder_grades_with": options,
            "container_tier_user": args.user,
            "reveal_reference_after_pass": reveal,
        }
        add("assignment.json", (json.dumps(about, indent=2) + "\n").encode())
        for name, path in _source_files():
            add(f"{PROJECT_DIR}/{name}", path.read_bytes())
    return data.getvalue()


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
    for tier in (SANDBOX_TIER, CONTAINER_TIER):
        try:
            tier_check(tier, hidden if tier == CONTAINER_TIER else ())
        except (SandboxUnavailable, ContainerUnavailable) as e:
            said.append(f"{tier}: cannot be set up: {e}")
            continue
        said.append(f"{tier}: works")
        return tier, said
    return "none", said


# --- the command ------------------------------------------------------------------------------


def configure_autograder(parser: argparse.ArgumentParser) -> None:
    sub = parser.add_subparsers(dest="action", required=True, metavar="ACTION")
    build_it = sub.add_parser(
        "gradescope", help="build the Gradescope autograder zip (setup.sh, run_autograder, source)"
    )
    build_it.add_argument("--out", default="autograder.zip", help="the zip to write")
    build_it.add_argument("--tests", metavar="NAMES", help="comma-separated shared tests to run")
    build_it.add_argument(
        "--time-limit",
        type=positive(float),
        metavar="S",
        help="cap every test's limit (seconds); loading keeps its own limit",
    )
    build_it.add_argument("--user", default="xfmr-student", help="the container tier's user")
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
    refuse_it.add_argument("--tests", metavar="NAMES")
    for option in ("--visibility", "--stdout-visibility"):
        refuse_it.add_argument(option, choices=VISIBILITIES, default="visible")


def run_autograder(args: argparse.Namespace) -> int:
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
        try:
            said = Path(args.why).read_text().strip().splitlines()[1:]
        except OSError as e:
            said = [f"the probe's record {args.why} could not be read: {e.strerror or e}"]
        why = (
            "no isolation tier works in this container, so no submission is run ("
            + "; ".join(said or ["setup.sh recorded no reason"])
            + "). Rebuild the autograder where bubblewrap can start, or where the container "
            "tier's user exists and /autograder is closed to it (see the README's Gradescope "
            "section), then regrade."
        )
        tests = _selected(args.tests)
        data = refusal(tests, why, args.visibility, args.stdout_visibility)
        write_all("autograder", [(args.out, lambda: data)])
        return 2  # nothing was graded
    tests = _selected(args.tests)
    if problem := report_path_problem(args.out):
        return usage_error("autograder", f"cannot write {args.out}: {problem}")
    content = build(args, tests)
    out = Path(args.out)
    tmp = out.with_name(f".{out.name}.tmp")
    tmp.write_bytes(content)
    os.replace(tmp, out)
    total = sum(t.points for t in tests)
    each = ", ".join(
        f"{t.name} {t.points:g}" + ("" if t.visibility == "visible" else f" ({t.visibility})")
        for t in tests
    )
    print(
        f"wrote {out} ({len(content) / 1e6:.1f} MB): setup.sh, run_autograder, assignment.json "
        f"and {PROJECT_DIR}/ (version {version('xfmr-oracle')})\n"
        f"{len(tests)} tests, {total:g} points: in Gradescope, create a Programming Assignment "
        f"of {total:g} points and upload {out} as its autograder (Ubuntu 22.04 or later).\n"
        f"Each test's points and visibility come from its record (harness/shared_tests): {each}"
    )
    return 0
