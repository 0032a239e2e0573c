"""`xfmr autograder try autograder.zip SUBMISSION`: the autograder, run as its platform runs it,
before it is uploaded (a PrairieLearn folder from `xfmr autograder prairielearn` too).

The platform's build (Gradescope's setup.sh; the PrairieLearn Dockerfile's COPY and RUN) runs
once into an image folder, cached under the cache folder by the files' hash and the container
variant; each try runs one job (run_autograder; run.sh) in a fresh throwaway copy of that image,
in the simulated container (harness.jobs.simulated_container: bubblewrap as root, Docker's
restrictions by default), as root, the submission where the platform puts it; then prints the
results.json as the student sees it, with the wall times of the build and the job, then what only
staff see (Gradescope's hidden tests; PrairieLearn's job output).
"""

from __future__ import annotations

import argparse
import datetime
import hashlib
import json
import os
import shutil
import sys
import tempfile
import zipfile
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from harness.jobs import simulated_container as sim
from harness.jobs.autograder_files import GRADESCOPE, PRAIRIELEARN, Platform
from harness.options import positive, usage_error
from harness.reports.writer import write_all

SHOWN_LINES = 6  # of each test's output
SHOWN_WIDTH = 160  # characters of each line


def default_cache() -> Path:
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / "xfmr-oracle" / "autograder"


def platform_of(path: Path) -> Platform | None:
    """Gradescope for a zip, PrairieLearn for `xfmr autograder prairielearn`'s folder."""
    if path.is_file() and zipfile.is_zipfile(path):
        return GRADESCOPE
    if (path / "image" / "Dockerfile").is_file():
        return PRAIRIELEARN
    return None


def digest(path: Path) -> str:
    """The hash the image is cached by: the zip's bytes, or every file of the folder's image/
    (its path, mode and bytes)."""
    h = hashlib.sha256()
    if path.is_file():
        with path.open("rb") as f:
            h.update(hashlib.file_digest(f, "sha256").digest())
        return h.hexdigest()
    for found in sorted(p for p in (path / "image").rglob("*") if p.is_file()):
        h.update(f"{found.relative_to(path).as_posix()}\0{found.stat().st_mode:o}\0".encode())
        h.update(hashlib.sha256(found.read_bytes()).digest())
    return h.hexdigest()


# --- the images ---------------------------------------------------------------------------------


def _gradescope_files(zipped: Path, root: Path) -> list[str]:
    """The zip in /autograder/source (its files' modes kept), run_autograder copied to
    /autograder, as Gradescope does; setup.sh is the build."""
    source = root / "autograder" / "source"
    source.mkdir(parents=True)
    with zipfile.ZipFile(zipped) as z:
        for info in z.infolist():
            path = Path(z.extract(info, source))
            mode = (info.external_attr >> 16) & 0o777
            if mode and not info.is_dir():
                path.chmod(mode)
    shutil.copy2(source / "run_autograder", root / "autograder" / "run_autograder")
    return ["bash", f"{GRADESCOPE.source}/setup.sh"]


def _prairielearn_files(folder: Path, root: Path) -> list[str]:
    """The Dockerfile's COPY (of a folder to a top-level folder) and RUN lines; the RUNs, joined,
    are the build."""
    runs = []
    for line in (folder / "image" / "Dockerfile").read_text().splitlines():
        word, _, rest = line.strip().partition(" ")
        if word == "COPY":
            src, dst = rest.split()
            shutil.copytree(folder / "image" / src, root / dst.strip("/"), symlinks=True)
        elif word == "RUN":
            runs.append(rest)
    return ["bash", "-c", " && ".join(runs)]


@dataclass(frozen=True)
class Image:
    """A built image: its folder, its build's run, whether it was cached already."""

    folder: Path
    build: sim.Ran
    cached: bool


def image(files: Path, platform: Platform, variant: str, cache: Path, rebuild: bool) -> Image:
    """The platform's image of `files` in `variant`, built once (its build in the container)
    and kept under `cache`; a failed build is not kept."""
    folder = cache / f"{platform.command}-{variant}-{digest(files)[:20]}"
    about = folder / "build.json"
    if rebuild and folder.exists():
        shutil.rmtree(folder)
    if about.is_file():
        said = json.loads(about.read_text())
        return Image(folder, sim.Ran(said["status"], said["seconds"], said["output"]), True)
    cache.mkdir(parents=True, exist_ok=True)
    fresh = Path(tempfile.mkdtemp(prefix=f".{folder.name}.", dir=cache))
    try:
        root, _ = sim.new_image(fresh / "image")
        fill = _gradescope_files if platform is GRADESCOPE else _prairielearn_files
        build = sim.setup(fresh / "image", variant, fill(files, root))
        if build.status != 0:
            return Image(fresh, build, False)
        data = {"status": build.status, "seconds": build.seconds, "output": build.output}
        data["built"] = datetime.datetime.now().isoformat(timespec="seconds")
        (fresh / "image" / "build.json").write_text(json.dumps(data, indent=2) + "\n")
        try:
            os.rename(fresh / "image", folder)
        except OSError:  # built meanwhile by another try: that one stands
            pass
        return Image(folder, build, False)
    finally:
        shutil.rmtree(fresh, ignore_errors=True)


# --- a job --------------------------------------------------------------------------------------


def place(platform: Platform, submission: Path) -> Callable[[Path], None]:
    """What the platform does before a job: the submission's files in its folder (a file under
    its own name, a folder's contents); PrairieLearn's /grade also gets its other folders."""

    def put(root: Path) -> None:
        target = root / platform.submission.strip("/")
        if target.exists():
            shutil.rmtree(target)
        if submission.is_dir():
            shutil.copytree(submission, target, symlinks=True)
        else:
            target.mkdir(parents=True)
            shutil.copy2(submission, target / submission.name)
        if platform is PRAIRIELEARN:
            grade = root / platform.home.strip("/")
            for name in ("tests", "serverFilesCourse", "data"):
                (grade / name).mkdir(exist_ok=True)
            data = {"params": {}, "submitted_answers": {}, "gradable": True}
            (grade / "data" / "data.json").write_text(json.dumps(data))

    return put


@dataclass(frozen=True)
class Job:
    """One job's run, its results.json as text ("" if none) and the isolation record."""

    ran: sim.Ran
    results: str
    record: str


def job(
    built: Path, platform: Platform, variant: str, submission: Path, timeout: float = 1800
) -> Job:
    """One grading job of `submission` in a fresh copy of the image, as the platform runs it."""
    left: dict[str, str] = {}

    def collect(root: Path) -> None:
        for key, where in (
            ("results", f"{platform.results}/results.json"),
            ("record", platform.record),
        ):
            path = root / where.strip("/")
            left[key] = path.read_text(errors="replace") if path.is_file() else ""

    ran = sim.run(
        built,
        variant,
        [platform.entry],
        place(platform, submission),
        collect,
        platform.workdir,
        timeout=timeout,
    )
    return Job(ran, left.get("results", ""), left.get("record", ""))


# --- what the student sees ----------------------------------------------------------------------


def _number(value: Any) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool)


def problem(platform: Platform, results: str) -> str:
    """Why `results` is not a results.json the platform takes ("" if it is)."""
    if not results.strip():
        return "no results.json"
    try:
        data = json.loads(results)
    except json.JSONDecodeError as e:
        return f"results.json is not JSON ({e})"
    if not isinstance(data, dict) or not _number(data.get("score")):
        return "results.json has no numeric top-level score"
    tests = data.get("tests", [])
    keys = ("score", "max_score") if platform is GRADESCOPE else ("points", "max_points")
    if not isinstance(tests, list) or not all(
        isinstance(t, dict)
        and isinstance(t.get("name"), str)
        and all(_number(t.get(k, 0)) for k in keys)
        for t in tests
    ):
        return f"results.json's tests are not a list of named tests with {keys[0]}/{keys[1]}"
    if platform is PRAIRIELEARN and not 0 <= data["score"] <= 1:
        return f"PrairieLearn's score is a fraction in [0, 1], not {data['score']}"
    return ""


def _cut(text: str, lines: int = SHOWN_LINES) -> list[str]:
    kept = [
        line if len(line) <= SHOWN_WIDTH else line[: SHOWN_WIDTH - 1] + "…"
        for line in text.splitlines()
    ]
    return kept[:lines] + ([f"… ({len(kept) - lines} more lines)"] if len(kept) > lines else [])


def student_view(platform: Platform, data: dict[str, Any]) -> str:
    """results.json as the student's page shows it: the score, the summary, each test's points
    and output (shortened: SHOWN_LINES lines of SHOWN_WIDTH characters); a test Gradescope never
    shows a student (visibility hidden) is left out (staff_view shows it)."""
    tests = [t for t in data.get("tests", []) if t.get("visibility", "visible") != "hidden"]
    if platform is GRADESCOPE:
        most = sum(float(t.get("max_score", 0)) for t in tests)
        lines = [f"Score: {data['score']:g}/{most:g}"]
        text = data.get("output", "")
    else:
        most = sum(float(t.get("max_points", 0)) for t in tests)
        share = f"{100 * data['score']:.1f}%"
        if data.get("gradable", True) is False:
            lines = [
                f"Score: not gradable ({share}; no points awarded or lost, no attempt charged)"
            ]
        else:
            lines = [f"Score: {share} ({data['score'] * most:g}/{most:g} points)"]
        text = "\n".join(p for p in (data.get("message", ""), data.get("output", "")) if p)
        errors = data.get("format_errors") or []
        text += "".join(
            f"\nformat error: {e}" for e in ([errors] if isinstance(errors, str) else errors)
        )
    lines += [f"  {line}" for line in _cut(text, 12)]
    lines.append(f"Tests ({len(tests)}):")
    for t in tests:
        if platform is GRADESCOPE:
            got, of, words = t.get("score", 0), t.get("max_score", 0), t.get("output", "")
        else:
            got, of, words = t.get("points", 0), t.get("max_points", 0), t.get("message", "")
        status = t.get("status") or ("passed" if got == of else "failed")
        hidden = "" if t.get("visibility", "visible") == "visible" else f"  ({t['visibility']})"
        lines.append(f"  {status:<6} {f'{got:g}/{of:g}':>7}  {t['name']}{hidden}")
        if status != "passed" and words:
            lines += [f"{'':17}{line}" for line in _cut(words)]
    return "\n".join(lines)


def staff_view(platform: Platform, data: dict[str, Any], output: str) -> str:
    """What staff read and the student does not ("" if nothing): Gradescope's hidden tests; on
    PrairieLearn, the job output's "Course staff:" lines (its job page is instructors' only)."""
    if platform is GRADESCOPE:
        said = [
            f"{t.get('name', '')}:\n" + "\n".join(f"  {line}" for line in _cut(t["output"], 12))
            for t in data.get("tests", [])
            if t.get("visibility") == "hidden" and t.get("output")
        ]
        where = "hidden from the student"
    else:
        said = [line for line in output.splitlines() if line.startswith("Course staff:")]
        where = f"in {PRAIRIELEARN.log}, not in results.json"
    return f"Staff only ({where}):\n" + "\n".join(said) if said else ""


# --- the command --------------------------------------------------------------------------------


def configure_try(parser: argparse.ArgumentParser) -> None:
    parser.description = (
        "Run the autograder on a submission as its platform does, before uploading it: its "
        "build once (cached), then the job in a fresh copy, as root, in a simulated container; "
        "print the results.json as the student sees it. " + sim.SKIPPED + "."
    )
    parser.add_argument(
        "autograder", help="the zip of `xfmr autograder gradescope` (or a PrairieLearn folder)"
    )
    parser.add_argument("submission", help="transformer.py, or a folder of the student's files")
    parser.add_argument(
        "--variant",
        choices=sim.VARIANTS,
        default="docker",
        help="docker (default): Docker's restrictions, bubblewrap cannot start, the container "
        "tier is used; userns: nested user namespaces work, the sandbox tier is used",
    )
    parser.add_argument(
        "--cache-dir",
        metavar="DIR",
        help=f"where built images are kept (default: {default_cache()})",
    )
    parser.add_argument("--rebuild", action="store_true", help="build the image again")
    parser.add_argument("--results", metavar="FILE", help="also write the results.json here")
    parser.add_argument(
        "--show-output", action="store_true", help="print the job's own output (staff's view)"
    )
    parser.add_argument(
        "--timeout",
        type=positive(float),
        default=1800.0,
        metavar="S",
        help="stop the job after S seconds (default 1800: past any platform's limit, so a "
        "slow job is measured, not cut)",
    )


def run_try(args: argparse.Namespace) -> int:
    files, submission = Path(args.autograder), Path(args.submission)
    platform = platform_of(files)
    if platform is None:
        return usage_error(
            "autograder try", f"{files}: neither an autograder zip nor a PrairieLearn folder"
        )
    if not submission.exists():
        return usage_error("autograder try", f"no submission at {submission}")
    if why := sim.unavailable():
        return usage_error("autograder try", why)
    cache = Path(args.cache_dir) if args.cache_dir else default_cache()
    print(f"xfmr autograder try: {files} ({platform.name}), {submission}")
    print(f"  in the simulated {args.variant!r} container. {sim.SKIPPED}.", flush=True)
    built = image(files, platform, args.variant, cache, args.rebuild)
    what = "setup.sh" if platform is GRADESCOPE else "the image's build (Dockerfile RUN)"
    if built.build.status != 0:
        print(built.build.output[-4000:], file=sys.stderr)
        print(
            f"xfmr autograder try: {what} failed (status {built.build.status}): its output is "
            "above; no job was run",
            file=sys.stderr,
        )
        return 1
    done = job(built.folder, platform, args.variant, submission, args.timeout)
    tier = (done.record.splitlines() or ["(no record)"])[0]
    print(
        f"{what}: {built.build.seconds:.1f} s"
        + (
            f" (the cached image {built.folder})"
            if built.cached
            else f" (cached at {built.folder})"
        )
    )
    print(
        f"{platform.entry}: {done.ran.seconds:.1f} s, exit status {done.ran.status}, "
        f"isolation tier {tier}"
    )
    if done.ran.left:
        print("left running after the job:\n  " + "\n  ".join(done.ran.left))
    if args.show_output:
        print(f"--- {platform.entry}'s output ---\n{done.ran.output.rstrip()}\n---")
    if why := problem(platform, done.results):
        if not args.show_output:
            print("\n".join(done.ran.output.splitlines()[-30:]), file=sys.stderr)
        print(f"xfmr autograder try: {why}: the student would see an error", file=sys.stderr)
        return 1
    data = json.loads(done.results)
    print()
    print(student_view(platform, data))
    if staff := staff_view(platform, data, done.ran.output):
        print()
        print(staff)
    if args.results:
        write_all("autograder try", [(args.results, lambda: data)])
    return 0
