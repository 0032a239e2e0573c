"""The autograders' files, for both platforms, from one set of scripts (`xfmr autograder`).

Gradescope (`xfmr autograder gradescope --out autograder.zip`; the specification:
https://gradescope-autograders.readthedocs.io/en/latest/specs/, after Otter-Grader's `otter
generate`, which also ships its own source and a setup.sh of its own). The zip holds, at its root:

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

PrairieLearn (`xfmr autograder prairielearn --out DIR`; external grading:
https://prairielearn.readthedocs.io/en/latest/externalGrading/): DIR/image is the grader image's
build context (a Dockerfile whose one RUN is the same setup.sh, over /xfmr-grader: run.sh, the
source, assignment.json), DIR/questions/QID the question (info.json, question.html with a file
upload of transformer.py and, as on Gradescope, any modules of the student's own beside it).
run.sh is run_autograder's script for /grade: it proves the tier when each job starts (the
container a job runs in is not the one `docker build` ran in), grades /grade/student, and writes
/grade/results/results.json in PrairieLearn's format on every path. The image's name is the
course's (--image, or a Docker Hub namespace made from --course), and the question's UUID is made
from the course and the QID, so no two courses' questions share one.
"""

from __future__ import annotations

import argparse
import io
import json
import os
import re
import shlex
import uuid
import zipfile
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from importlib.metadata import version
from pathlib import Path
from typing import Any

from harness.isolation.sandbox import PROJECT_ROOT
from harness.isolation.tiers import CONTAINER, SANDBOX
from harness.reports.gradescope import staff_tests
from harness.reports.prairielearn import JOB_LOG
from harness.shared_tests.record import Test

PROJECT_DIR = "xfmr-oracle"  # the project's source, beside the platform's scripts
PACKAGES = ("oracle", "impl", "mutants", "harness", "tasks", "demos")
TOP_FILES = ("pyproject.toml", "README.md", "CONTRACT.md")
VENV = "/opt/xfmr-oracle/venv"  # setup.sh's default; XFMR_VENV changes it
TORCH = "torch==2.13.0"
BASE_IMAGE = "ubuntu:24.04"  # PrairieLearn's image (its python3 is 3.12)
IMAGE_REPOSITORY = "xfmr-grader"  # the image's repository under the course's namespace

# a Docker image reference as `docker build -t` takes it, with a namespace (registry host and
# port optional; path components of lowercase letters and digits joined by ., _, __ or dashes;
# an optional tag): distribution/reference's grammar, less digests
_COMPONENT = r"[a-z0-9]+(?:(?:\.|_|__|-+)[a-z0-9]+)*"
IMAGE_NAME = re.compile(
    rf"(?:[a-zA-Z0-9.-]+(?::[0-9]+)?/)?{_COMPONENT}(?:/{_COMPONENT})+(?::[\w][\w.-]{{0,127}})?"
)


@dataclass(frozen=True)
class Platform:
    """Where a platform puts things, in the container its jobs run in."""

    name: str
    command: str  # the `xfmr autograder` action that builds its files
    source: str  # the grader's own files (the project's source under it)
    home: str  # closed to the student's user at every job: the job's files and reports
    submission: str
    results: str  # the folder of results.json
    entry: str  # what the platform runs per submission, as root
    workdir: str  # the folder it runs it in
    log: str  # where staff read the job's output

    @property
    def record(self) -> str:
        """The isolation tier proved, then each tier's verdict (`xfmr autograder probe`)."""
        return f"{self.source}/isolation"


GRADESCOPE = Platform(
    "Gradescope",
    "gradescope",
    "/autograder/source",
    "/autograder",
    "/autograder/submission",
    "/autograder/results",
    "/autograder/run_autograder",
    "/autograder",
    "the autograder's output (stdout)",
)
PRAIRIELEARN = Platform(
    "PrairieLearn",
    "prairielearn",
    "/xfmr-grader",
    "/grade",
    "/grade/student",
    "/grade/results",
    "/xfmr-grader/run.sh",
    "/",
    JOB_LOG,
)

SETUP_SH = r"""#!/usr/bin/env bash
# setup.sh of the xfmr-oracle {version} {platform} grader (built by `xfmr autograder {command}`).
# {when}, as root, once.
# XFMR_SKIP_INSTALL=1 skips the apt and pip steps (an image that has them: the CI's simulation).
set -euo pipefail
SOURCE={source}
PROJECT="$SOURCE/{project}"
VENV="${{XFMR_VENV:-{venv}}}"
STUDENT={user}
export DEBIAN_FRONTEND=noninteractive

python_ok() {{  # a Python >= 3.11 that can make a venv
    "$1" -c 'import sys, ensurepip, venv; sys.exit(sys.version_info < (3, 11))' 2>/dev/null
}}

if [ "${{XFMR_SKIP_INSTALL:-0}}" != 1 ]; then
    apt-get update
    apt-get install -y --no-install-recommends bubblewrap libseccomp2 ca-certificates passwd \
        python3 python3-venv
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
# nothing of the grader within its reach: the reference and the oracle are under {closed}
# ({reports}); it reads only the interpreter and the venv's packages
chmod 700 {closed}
chmod -R go-rwx "$PROJECT"
{setup_probe}"""

# `xfmr autograder probe`: which isolation tier works in this container, proved by a trial of
# each, recorded for xfmr grade (none proved: every submission gets a results.json saying why)
PROBE = 'autograder probe --record "$SOURCE/isolation" --hidden {home}'

RUN_SH = r"""#!/usr/bin/env bash
# {name} of the xfmr-oracle {version} {platform} grader (built by `xfmr autograder {command}`):
# {platform} runs it as root, in {workdir}, once per submission. It always leaves a valid
# results.json, and exits 0.
SOURCE={source}
PROJECT="$SOURCE/{project}"
RESULTS={results}
VENV="$(cat "$SOURCE/venv" 2>/dev/null || echo {venv})"
mkdir -p "$RESULTS"
chmod 700 {home} "$RESULTS"
rm -f "$RESULTS/results.json"
cd {home}
run() {{
    env -i PATH=/usr/local/bin:/usr/bin:/bin HOME=/root LANG=C.UTF-8 PYTHONPATH="$PROJECT" \
        "$VENV/bin/python" -m harness.cli "$@"
}}
{probe}TIER="$(head -n 1 "$SOURCE/isolation" 2>/dev/null)"
case "$TIER" in
    {sandbox}|{container})
        run grade {submission} {report} \
            --isolation "$TIER" {options}
        ;;
    *)  # no tier was proved here (the reasons are in $SOURCE/isolation)
        run autograder refuse --why "$SOURCE/isolation" --out "$RESULTS/results.json" \
            {refuse}
        ;;
esac
status=$?
{after}if [ ! -s "$RESULTS/results.json" ]; then  # the grader could not even report: say so
    MSG="NOT GRADED: the autograder failed before it could report; this is not a verdict on "
    MSG+="your code, and its score of 0 stands only until course staff regrade it."
    STAFF="Course staff: the grade ended with status $status and left no results.json; {log} "
    STAFF+="says why; fix it, then regrade."
    echo "$STAFF"
    printf {fallback} {fallback_args} > "$RESULTS/results.json"
fi
echo "xfmr grade exit status: $status (0 all passed, 1 some failed or rejected, 2 not graded," \
    "3 grader error)"
exit 0
"""

# --reveal-reference-after-pass (Gradescope; a course policy, off by default): the grade also
# writes its JSON, and `xfmr diff` adds the student's code beside the reference to a full-score
# results.json (harness.students.diff; it reads the submission's source, never runs it). Without it
# nothing of impl reaches a results.json.
REVEAL = """if [ -s "$RESULTS/grade.json" ]; then  # the reference, after a full score
    run diff {submission} --grade "$RESULTS/grade.json" \\
        --gradescope "$RESULTS/results.json" > /dev/null
fi
rm -f "$RESULTS/grade.json"
"""

# PrairieLearn: the grade's JSON report, in PrairieLearn's format (a rejection and a grader
# fault too; no report at all: not graded, with the grade's exit status)
CONVERT = """if [ ! -s "$RESULTS/results.json" ]; then
    run autograder prairielearn-results --grade "$RESULTS/grade.json" --status "$status" \\
        --out "$RESULTS/results.json" {tests}
fi
rm -f "$RESULTS/grade.json"
"""

GRADE_JSON = '--json "$RESULTS/grade.json"'

DOCKERFILE = """# xfmr-oracle {version}: PrairieLearn's grader image (xfmr autograder prairielearn)
#   docker build -t {image} . && docker push {image}
# PrairieLearn runs {entry} (the question's info.json says so) as root, in a fresh
# container per submission, the submission in /grade/student; no network, the memory and the
# time limit the grader host and info.json give.
FROM {base}
COPY xfmr-grader /xfmr-grader
# setup.sh downloads bubblewrap and Python (apt), the CPU build of torch (download.pytorch.org)
# and the project's dependencies (PyPI)
RUN bash /xfmr-grader/setup.sh && rm -rf /var/lib/apt/lists/* /root/.cache/pip
"""

README = """# xfmr-oracle {version}: a PrairieLearn external-grader question

Built by `xfmr autograder prairielearn`. `image/` is the grader image's build context;
`questions/{qid}/` is the question.

1. Build the image and push it where PrairieLearn pulls from (Docker Hub, under a namespace
   the course owns: `docker login` as it; then sync it on the course's sync page). The build
   downloads bubblewrap and Python (Ubuntu's archive), the CPU build of torch
   (download.pytorch.org) and the project's dependencies (PyPI):

       docker build -t {image} image && docker push {image}

2. Copy `questions/{qid}` into the course's `questions/` and add it to an assessment, with the
   points you choose: results.json's score is the fraction earned of the {count} tests'
   {total:g} points. Its UUID is made from the course's name ({course!r}) and the QID: build
   it again with the same two and it is the same question; another course gets its own.
   Students upload `transformer.py` and any modules of their own beside it (`*.py`).
3. `info.json`: image `{image}`, entrypoint `{entry}`, timeout {timeout} s (PrairieLearn's
   most is 600). The grader is all in the image: no serverFilesCourse, no tests/ folder.
4. Try it first, on this machine: `xfmr autograder try DIR transformer.py` (a simulated
   container, not Docker: the build's downloads are skipped, this machine's venv stands in).

run.sh proves the isolation tier at the start of every job (the sandbox where bubblewrap can
start in the container, else the container tier as the user `{user}`) and always writes
`/grade/results/results.json`: a grade; a rejection (the code does not parse or load: not
gradable, no attempt charged, the reason as a format error); a refusal when no tier works
("NOT GRADED"); a grader fault ("GRADER ERROR": not the student's; fix it, rebuild, then
regrade). A student sees all of results.json, so what is staff's (each tier's reason, what
broke, an isolation that lacks limits) is only in the grading job's output, on the job's page
(instructors only), in lines that begin "Course staff:".
"""

QUESTION_HTML = """<pl-question-panel>
  <p>
    Upload your <code>transformer.py</code>: the encoder-decoder Transformer of the assignment's
    contract, and any modules of your own beside it that it imports (<code>.py</code> files). It
    is graded by the {count} shared tests of xfmr-oracle {version} ({total:g} points), each
    against a float64 oracle, your code isolated from the grader.
  </p>
  <pl-file-upload file-names="transformer.py" optional-file-patterns="*.py"></pl-file-upload>
</pl-question-panel>

<pl-submission-panel>
  <pl-external-grader-results></pl-external-grader-results>
  <pl-file-preview></pl-file-preview>
</pl-submission-panel>
"""


def source_files(root: Path = PROJECT_ROOT) -> list[tuple[str, Path]]:
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
    """The assignment as a platform's settings need it: the total and each test's share."""
    return {
        "total_points": float(sum(t.points for t in tests)),
        "tests": [
            {"name": t.name, "law": t.law, "points": float(t.points), "visibility": t.visibility}
            for t in tests
        ],
    }


def grade_options(args: argparse.Namespace) -> list[str]:
    """What run_autograder or run.sh passes to `xfmr grade`: Gradescope's visibilities, the tests
    (--tests), the time limit."""
    options = []
    if hasattr(args, "visibility"):
        options += ["--visibility", args.visibility, "--stdout-visibility", args.stdout_visibility]
    if args.tests:
        options += ["--tests", args.tests]
    if args.time_limit:
        options += ["--time-limit", str(args.time_limit)]
    return options


def scripts(platform: Platform, args: argparse.Namespace) -> dict[str, str]:
    """The platform's setup.sh and its per-submission script (run_autograder, run.sh)."""
    options = grade_options(args)
    tests = shlex.join(["--tests", args.tests]) if args.tests else ""
    reveal = bool(getattr(args, "reveal_reference_after_pass", False))
    fill = {
        "version": version("xfmr-oracle"),
        "platform": platform.name,
        "command": platform.command,
        "source": platform.source,
        "home": platform.home,
        "submission": platform.submission,
        "results": platform.results,
        "workdir": platform.workdir,
        "log": platform.log,
        "project": PROJECT_DIR,
        "venv": VENV,
        "user": args.user,
        "torch": TORCH,
        "sandbox": SANDBOX.name,
        "container": CONTAINER.name,
        "options": shlex.join(options),
        "tests": tests,
    }
    probe = PROBE.format(**fill)
    fill["name"] = scripts_name(platform)
    if platform is GRADESCOPE:
        visibilities = shlex.join(options[:4])
        fill |= {
            "when": "Gradescope runs it when it builds the autograder's image",
            "closed": platform.home,
            "reports": "and so are the reports",
            "setup_probe": "# which isolation tier works in this very container (run_autograder "
            "reads it)\n"
            f'PYTHONPATH="$PROJECT" "$VENV/bin/python" -m harness.cli \\\n    {probe}\n',
            "probe": "",
            "report": '--gradescope "$RESULTS/results.json"',
            "refuse": f"{visibilities} {tests}".strip(),
            # the student's message, and staff's in the hidden test (harness.reports.gradescope)
            "fallback": shlex.quote(
                json.dumps(
                    {
                        "score": 0.0,
                        "output": "%s",
                        "output_format": "text",
                        "tests": staff_tests(["%s"]),
                        "visibility": args.visibility,
                        "stdout_visibility": args.stdout_visibility,
                    }
                )
                + "\\n"
            ),
            "fallback_args": '"$MSG" "$STAFF"',
        }
        if reveal:
            fill["options"] += " " + GRADE_JSON
        fill["after"] = REVEAL.format(**fill) if reveal else ""
    else:
        fill |= {
            "when": f"The Dockerfile runs it when `docker build` builds the image ({BASE_IMAGE})",
            "closed": platform.source,
            "reports": "run.sh closes /grade, the reports', at every job",
            "setup_probe": "# the isolation tier is proved by run.sh at every job, in the "
            "container the job runs in\n",
            "probe": "# which isolation tier works in this very container (`docker build` "
            f"ran in another)\nrun {probe}\n",
            "report": GRADE_JSON,
            "refuse": f"--format prairielearn {tests}".strip(),
            # the student's message only: staff's is on the job's output, above
            "fallback": shlex.quote(
                json.dumps(
                    {"gradable": False, "score": 0.0, "message": "%s", "output": "", "tests": []}
                )
                + "\\n"
            ),
            "fallback_args": '"$MSG"',
        }
        fill["after"] = CONVERT.format(**fill)
    setup = SETUP_SH.format(**fill)
    return {"setup.sh": setup, fill["name"]: RUN_SH.format(**fill)}


def scripts_name(platform: Platform) -> str:
    """The per-submission script's name: run_autograder, run.sh."""
    return Path(platform.entry).name


def _about(platform: Platform, args: argparse.Namespace, tests: Sequence[Test]) -> bytes:
    about = assignment(tests) | {
        "version": version("xfmr-oracle"),
        "platform": platform.name,
        f"{scripts_name(platform).replace('.', '_')}_grades_with": grade_options(args),
        "container_tier_user": args.user,
    }
    if platform is GRADESCOPE:
        about["reveal_reference_after_pass"] = bool(args.reveal_reference_after_pass)
    return (json.dumps(about, indent=2) + "\n").encode()


def _files(
    platform: Platform, args: argparse.Namespace, tests: Sequence[Test]
) -> list[tuple[str, Callable[[], bytes], int]]:
    """The grader's own files (name, content, mode), relative to its source folder."""
    found: list[tuple[str, Callable[[], bytes], int]] = [
        (name, text.encode, 0o755) for name, text in scripts(platform, args).items()
    ]
    found.append(("assignment.json", lambda: _about(platform, args, tests), 0o644))
    for name, path in source_files():
        found.append((f"{PROJECT_DIR}/{name}", path.read_bytes, 0o644))
    return found


def gradescope_zip(args: argparse.Namespace, tests: Sequence[Test]) -> bytes:
    """The Gradescope autograder zip's bytes."""
    data = io.BytesIO()
    with zipfile.ZipFile(data, "w", zipfile.ZIP_DEFLATED) as z:
        for name, content, mode in _files(GRADESCOPE, args, tests):
            info = zipfile.ZipInfo(name, date_time=(2026, 1, 1, 0, 0, 0))
            info.external_attr = (0o100000 | mode) << 16
            info.compress_type = zipfile.ZIP_DEFLATED
            z.writestr(info, content())
    return data.getvalue()


def image_of(course: str, image: str | None) -> tuple[str, str]:
    """The grader image's name: `image` if given, else NAMESPACE/xfmr-grader:VERSION with the
    course's letters and digits, lowercased, as its Docker Hub namespace (4 to 30 of them, Docker
    Hub's rule); and the problem ("" if none)."""
    if image is not None:
        if not IMAGE_NAME.fullmatch(image):
            return image, (
                f"--image {image!r} is not a Docker image name with a namespace (e.g. "
                f"your-org/{IMAGE_REPOSITORY}:1, a repository your course pushes to)"
            )
        return image, ""
    namespace = re.sub(r"[^a-z0-9]", "", course.lower())
    if not 4 <= len(namespace) <= 30:
        return "", (
            f"--course {course!r} gives no Docker Hub namespace ({namespace!r}: 4 to 30 letters "
            "and digits): name the image with --image NAMESPACE/NAME:TAG, a repository your "
            "course pushes to"
        )
    return f"{namespace}/{IMAGE_REPOSITORY}:{version('xfmr-oracle')}", ""


def question_uuid(course: str, qid: str) -> str:
    """The question's UUID: the same for a course's question at every build (PrairieLearn keys
    its submissions by it), and another for another course or another QID."""
    return str(uuid.uuid5(uuid.NAMESPACE_URL, f"xfmr-oracle/course/{course}/question/{qid}"))


def info_json(args: argparse.Namespace) -> dict[str, Any]:
    """The question's info.json: external grading by the image, run.sh as its entry point."""
    return {
        "uuid": question_uuid(args.course, args.qid),
        "title": "Transformer (xfmr-oracle)",
        "topic": "Transformer",
        "tags": ["xfmr-oracle", "code"],
        "type": "v3",
        "singleVariant": True,
        "gradingMethod": "External",
        "externalGradingOptions": {
            "enabled": True,
            "image": args.image,
            "entrypoint": PRAIRIELEARN.entry,
            "timeout": args.timeout,
        },
    }


def prairielearn_files(
    args: argparse.Namespace, tests: Sequence[Test]
) -> list[tuple[str, Callable[[], bytes], int]]:
    """The PrairieLearn grader's files (name under the output folder, content, mode): the image's
    build context (image/), the question (questions/QID/)."""
    fill = {
        "version": version("xfmr-oracle"),
        "image": args.image,
        "entry": PRAIRIELEARN.entry,
        "base": BASE_IMAGE,
        "count": len(tests),
        "total": sum(t.points for t in tests),
        "qid": args.qid,
        "timeout": args.timeout,
        "user": args.user,
        "course": args.course,
    }
    grader = PRAIRIELEARN.source.lstrip("/")
    question = f"questions/{args.qid}"
    found: list[tuple[str, Callable[[], bytes], int]] = [
        ("README.md", README.format(**fill).encode, 0o644),
        ("image/Dockerfile", DOCKERFILE.format(**fill).encode, 0o644),
        (
            f"{question}/info.json",
            lambda: (json.dumps(info_json(args), indent=2) + "\n").encode(),
            0o644,
        ),
        (f"{question}/question.html", QUESTION_HTML.format(**fill).encode, 0o644),
    ]
    found += [
        (f"image/{grader}/{name}", content, mode)
        for name, content, mode in _files(PRAIRIELEARN, args, tests)
    ]
    return found
