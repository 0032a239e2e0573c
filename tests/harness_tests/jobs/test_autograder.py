"""The Gradescope autograder, built by `xfmr autograder gradescope` and run as Gradescope runs it,
in the simulated container of harness.jobs.simulated_container (the one `xfmr autograder try`
runs; its docstring says what is real and what is simulated).

What is real: the zip is the command's own output, unpacked to /autograder/source (its files'
modes kept, run_autograder copied to /autograder); its setup.sh runs once, into an image
(XFMR_SKIP_INSTALL=1: everything but its apt-get and pip steps: the student user is created,
/autograder closed to it, the isolation tier proved by `xfmr autograder probe` and recorded); its
run_autograder runs once per submission, as root, in /autograder, on /autograder/submission, in
a fresh copy of that image (a fresh container, as Gradescope starts one per submission), and
grades with the shipped source (/autograder/source/xfmr-oracle); the sandbox tier's nested
bubblewrap and the container tier's user switch, rlimits and kills are the real ones.

What is simulated: the container is bubblewrap run as root (a tmpfs root, its own pid, ipc and
uts namespaces, a writable copy of /etc, a 1777 /tmp), not Docker; the installed part reuses this
machine's interpreter (/root/.pyenv) and venv, bound read-only at /opt/xfmr-oracle/venv, in
place of setup.sh's apt-get (bubblewrap, python3.11) and pip (torch, the project), which need the
network. Two containers:

- "docker": Docker's defaults imitated: /proc mounted by bwrap with /proc/sys, /proc/irq,
  /proc/bus and /proc/sysrq-trigger covered (a masked /proc: a nested proc mount is refused),
  Docker's default capabilities only (no CAP_SYS_ADMIN), and a seccomp filter that, as Docker's
  profile does, refuses clone/unshare with CLONE_NEWUSER (EPERM) and clone3 (ENOSYS): bubblewrap
  cannot start, setup.sh proves the container tier;
- "userns": the same but with a fresh, unmasked /proc, all capabilities and no filter: nested
  user namespaces work, setup.sh proves the sandbox tier.

Each container grades a correct, a faulty, a forging (a setsid daemon that rewrites
results.json), a syntax-error and a two-file submission (transformer.py importing its own
schedule.py, absolutely, and positions.py, relatively): every results.json exists, is valid per
Gradescope's specification (autograder/gradescope_results.schema.json), and has the deserved
score; no process of the student's user (nor any Python) is left after run_autograder. The
correct and faulty submissions get the full grade in the docker container; the other runs grade
three tests (the mechanism, not the score, is their point). `xfmr autograder try` itself runs
the faulty example (three tests) and a syntax error (in the image the first try built) and, slow,
the correct one (the whole grade: 122/122).
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
import zipfile
from pathlib import Path

import pytest

from harness.cli import main
from harness.jobs import simulated_container
from harness.jobs.autograder_files import GRADESCOPE
from harness.jobs.autograder_try import Job, image, job
from harness.shared_tests.laws import BY_NAME, SHARED_TESTS

ROOT = Path(__file__).resolve().parents[3]
DATA = Path(__file__).parent / "autograder"
SUBSET = "test_hand_example_noam,test_golden_torch,test_source_padding_is_never_read"
SUBSET_POINTS = sum(BY_NAME[n].points for n in SUBSET.split(","))
TOTAL = sum(t.points for t in SHARED_TESTS)
FAULTY_LOST = (
    BY_NAME["test_golden_torch"].points + BY_NAME["test_source_padding_is_never_read"].points
)

needs_the_simulation = pytest.mark.skipif(
    bool(simulated_container.unavailable()), reason=simulated_container.unavailable()
)


def schema() -> dict:
    return json.loads((DATA / "gradescope_results.schema.json").read_text())


def valid(results: dict) -> None:
    """Valid per Gradescope's specification, with a top-level score (ours always has one)."""
    import jsonschema

    jsonschema.validate(results, schema())
    assert isinstance(results.get("score"), int | float), results


# --- the submissions ------------------------------------------------------------------------


def two_files(folder: Path) -> None:
    """examples/correct_submission.py split in three: noam_rate in schedule.py (imported as
    `from schedule import noam_rate`), sinusoids in positions.py (`from .positions import`)."""
    source = (ROOT / "examples" / "correct_submission.py").read_text()
    noam = source[source.index("def noam_rate") : source.index("def make_optimizer")]
    sinus = source[source.index("def sinusoids") : source.index("def check_bool")]
    main_text = source.replace(noam, "from schedule import noam_rate  # the student's own\n\n\n")
    main_text = main_text.replace(sinus, "from .positions import sinusoids  # relative\n\n\n")
    (folder / "transformer.py").write_text(main_text)
    (folder / "schedule.py").write_text("import math\n\n\n" + noam)
    (folder / "positions.py").write_text("import math\n\nimport torch\n\n\n" + sinus)


def submissions(inputs: Path, full: bool) -> dict[str, tuple[Path, str, float, str]]:
    """The five submissions, each a folder inputs/NAME; the autograder each gets (the full grade
    or the subset), its deserved score and what its output must say."""
    correct = (ROOT / "examples" / "correct_submission.py").read_text()
    faulty = (ROOT / "examples" / "faulty_submission.py").read_text()
    made = {
        "correct": correct,
        "faulty": faulty,
        "forging": correct + (DATA / "forger.py").read_text(),
        "syntax_error": correct.replace("def make_optimizer(", "def make_optimizer(:", 1),
        "two_files": None,
    }
    for name, text in made.items():
        files = inputs / name
        files.mkdir(parents=True)
        if text is None:
            two_files(files)
        else:
            (files / "transformer.py").write_text(text)
    faulty_full = (
        TOTAL
        - FAULTY_LOST
        - sum(
            BY_NAME[n].points
            for n in (
                "test_translate_is_greedy_with_beam_one_and_drops_eos",
                "test_beam_search_matches_oracle",
            )
        )
    )
    grade = "full" if full else "subset"
    return {
        "correct": (inputs / "correct", grade, TOTAL if full else SUBSET_POINTS, "tests passed"),
        "faulty": (
            inputs / "faulty",
            grade,
            faulty_full if full else SUBSET_POINTS - FAULTY_LOST,
            "tests passed",
        ),
        "forging": (inputs / "forging", "subset", SUBSET_POINTS, "3/3 tests passed"),
        "syntax_error": (inputs / "syntax_error", "subset", 0.0, "does not parse"),
        "two_files": (inputs / "two_files", "subset", SUBSET_POINTS, "3/3 tests passed"),
    }


# --- the simulated container -----------------------------------------------------------------


def build(out: Path, *options: str, action: str = "gradescope") -> None:
    """The platform's files, by the real command."""
    done = subprocess.run(
        [sys.executable, "-m", "harness", "autograder", action, "--out", str(out), *options],
        capture_output=True,
        text=True,
        cwd=ROOT,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr


def student_uid(built: Path) -> str:
    """The container tier's user's uid in an image (its /etc/passwd)."""
    passwd = (built / "etc" / "passwd").read_text().splitlines()
    return next(line.split(":")[2] for line in passwd if line.startswith("xfmr-student:"))


def forger_marks(ran: simulated_container.Ran) -> list[str]:
    return [name for name in ran.tmp if name.startswith("xfmr-forger-ran")]


def container(variant: str, tmp: Path) -> tuple[dict, dict, dict[str, Job], float]:
    """Build the autograders and their images (setup.sh, once each), then grade each submission
    in a fresh container of its image; the images, the submissions (submissions()), the jobs and
    the jobs' wall time."""
    build(tmp / "autograder.zip")
    build(tmp / "subset.zip", "--tests", SUBSET)
    images = {
        mode: image(tmp / f"{name}.zip", GRADESCOPE, variant, tmp / "cache", rebuild=False)
        for mode, name in (("full", "autograder"), ("subset", "subset"))
    }
    expected = submissions(tmp / "in", full=variant == "docker")
    begun = time.monotonic()
    jobs = {
        name: job(images[mode].folder, GRADESCOPE, variant, folder)
        for name, (folder, mode, _, _) in expected.items()
    }
    return images, expected, jobs, time.monotonic() - begun


@needs_the_simulation
@pytest.mark.slow
@pytest.mark.parametrize(
    "variant, tier",
    [("docker", "container"), ("userns", "sandbox")],
)
def test_run_autograder_in_a_simulated_gradescope_container(tmp_path, variant, tier):
    images, expected, jobs, wall = container(variant, tmp_path)
    for built in images.values():
        assert built.build.status == 0, built.build.output
        record = (built.folder / "root" / "autograder" / "source" / "isolation").read_text()
        assert record.splitlines()[0] == tier, record  # what setup.sh proved works here
    setups = ", ".join(f"{m} {b.build.seconds:.1f} s" for m, b in images.items())
    print(f"\n{variant}: setup.sh {setups}; the jobs {wall:.1f} s")
    print(f"  isolation record: {record.strip()!r}")
    for name, (_, _, score, says) in expected.items():
        done = jobs[name]
        assert done.results, f"{name}: no results.json\n{done.ran.output}"
        results = json.loads(done.results)
        valid(results)
        first = results["output"].splitlines()[0]
        print(
            f"  {name}: {results['score']:g} in {done.ran.seconds:.1f} s "
            f"(run_autograder status {done.ran.status}): {first}"
        )
        assert results["score"] == score, (name, results["output"], done.ran.output)
        assert says in results["output"], (name, results["output"])
        assert done.ran.left == (), f"{name}: left running after run_autograder: {done.ran.left}"
    # the forging daemon did run (as the student's user, where /tmp is shared) and forged nothing
    if tier == "container":
        marks = forger_marks(jobs["forging"].ran)
        assert marks == [f"xfmr-forger-ran-as-{student_uid(images['subset'].folder)}"], marks
    two = json.loads(jobs["two_files"].results)
    assert all(t["status"] == "passed" for t in two["tests"]), two
    bad = json.loads(jobs["syntax_error"].results)
    assert "transformer.py line" in bad["output"] and "/sandbox" not in bad["output"], bad


# --- xfmr autograder try -----------------------------------------------------------------------


def tried(tmp_path: Path, capsys, zipped: Path, submission: Path) -> tuple[dict, str]:
    """`xfmr autograder try` (exit 0): the results.json it wrote (valid), and what it printed."""
    results = tmp_path / "results.json"
    argv = ["autograder", "try", str(zipped), str(submission)]
    assert main([*argv, "--cache-dir", str(tmp_path / "cache"), "--results", str(results)]) == 0
    out = capsys.readouterr().out
    data = json.loads(results.read_text())
    valid(data)
    assert "XFMR_SKIP_INSTALL=1" in out and "isolation tier container" in out, out
    most = sum(t["max_score"] for t in data["tests"])
    assert f"Score: {data['score']:g}/{most:g}" in out, out
    student, staff = out.split("\nStaff only (hidden from the student):\n") + [""] * (
        "Staff only" not in out
    )
    for t in data["tests"]:
        shown = f"{t['score']:g}/{t['max_score']:g}  {t['name']}" in student
        assert shown is (t["visibility"] != "hidden"), (t["name"], out)
        if t["visibility"] == "hidden":  # staff's notes: after the student's view, apart
            assert t["name"] in staff and t["output"].splitlines()[0][:120] in staff, out
    return data, out


@needs_the_simulation
@pytest.mark.slow
def test_try_shows_the_students_results_json(tmp_path, capsys):
    """`xfmr autograder try` on the faulty example (three tests): the build once, the job in a
    fresh container, the results.json the upload would write, as the student sees it; a second
    try (a syntax error) reuses the built image."""
    zipped = tmp_path / "autograder.zip"
    build(zipped, "--tests", SUBSET)
    begun = time.monotonic()
    data, out = tried(tmp_path, capsys, zipped, ROOT / "examples" / "faulty_submission.py")
    assert data["score"] == SUBSET_POINTS - FAULTY_LOST and "setup.sh: " in out, out
    assert "(cached at " in out and "first divergence" in out, out  # a failure, shortened
    print(f"\nfaulty, three tests: {data['score']:g}, try {time.monotonic() - begun:.1f} s")
    broken = tmp_path / "broken" / "transformer.py"
    broken.parent.mkdir()
    correct = (ROOT / "examples" / "correct_submission.py").read_text()
    broken.write_text(correct.replace("def make_optimizer(", "def make_optimizer(:", 1))
    data, out = tried(tmp_path, capsys, zipped, broken.parent)
    assert data["score"] == 0 and "does not parse" in data["output"], data
    assert "(the cached image " in out, out


@needs_the_simulation
@pytest.mark.slow
def test_try_gives_the_correct_example_its_whole_grade(tmp_path, capsys):
    zipped = tmp_path / "autograder.zip"
    build(zipped)
    begun = time.monotonic()
    data, out = tried(tmp_path, capsys, zipped, ROOT / "examples" / "correct_submission.py")
    assert data["score"] == TOTAL and f"Score: {TOTAL:g}/{TOTAL:g}" in out, out
    print(f"\ncorrect: {data['score']:g}/{TOTAL:g}, try {time.monotonic() - begun:.1f} s")


def test_try_refuses_what_is_not_an_autograder(tmp_path, capsys):
    (tmp_path / "notes.txt").write_text("not a zip")
    assert main(["autograder", "try", str(tmp_path / "notes.txt"), "transformer.py"]) == 2
    assert "neither an autograder zip nor a PrairieLearn folder" in capsys.readouterr().err


# --- without a container ----------------------------------------------------------------------


def test_the_zip_is_gradescopes_layout_with_the_law_records_points(tmp_path):
    zipped = tmp_path / "autograder.zip"
    assert main(["autograder", "gradescope", "--out", str(zipped)]) == 0
    with zipfile.ZipFile(zipped) as z:
        names = set(z.namelist())
        modes = {i.filename: (i.external_attr >> 16) & 0o777 for i in z.infolist()}
        about = json.loads(z.read("assignment.json"))
        scripts = {n: z.read(n).decode() for n in ("setup.sh", "run_autograder")}
    assert modes["setup.sh"] == modes["run_autograder"] == 0o755
    for package in ("oracle", "impl", "harness", "mutants", "tasks"):
        assert f"xfmr-oracle/{package}/__init__.py" in names
    assert "xfmr-oracle/pyproject.toml" in names and not any("__pycache__" in n for n in names)
    assert not any(n.startswith(("xfmr-oracle/tests", "xfmr-oracle/.git")) for n in names)
    assert about["total_points"] == TOTAL
    assert [(t["name"], t["points"], t["visibility"]) for t in about["tests"]] == [
        (t.name, float(t.points), t.visibility) for t in SHARED_TESTS
    ]
    setup = scripts["setup.sh"]
    assert "torch==2.13.0 --index-url https://download.pytorch.org/whl/cpu" in setup
    assert "python3.11" in setup and "bubblewrap" in setup and "useradd" in setup
    assert "--unsafe-no-sandbox" not in setup + scripts["run_autograder"]
    for name, text in scripts.items():
        (tmp_path / name).write_text(text)
        done = subprocess.run(["bash", "-n", str(tmp_path / name)], capture_output=True, text=True)
        assert done.returncode == 0, (name, done.stderr)


def test_no_isolation_is_a_valid_results_json_that_tells_staff(tmp_path, capsys):
    """A container tier that cannot be set up (here: its user does not exist, or this is not
    root) refuses: exit 2, and a results.json with score 0 saying why, never a missing file;
    --unsafe-no-sandbox is not offered."""
    report = tmp_path / "results.json"
    argv = ["grade", str(ROOT / "examples" / "correct_submission.py"), "--gradescope", str(report)]
    assert main([*argv, "--isolation", "container"]) == 2
    err = capsys.readouterr().err
    assert "refusing to run untrusted code" in err and "--unsafe-no-sandbox" not in err
    results = json.loads(report.read_text())
    valid(results)
    assert results["score"] == 0 and results["output"].startswith("NOT GRADED")
    assert "Course staff" not in results["output"]  # staff's words are in a hidden test only
    *tests, staff = results["tests"]
    assert staff["visibility"] == "hidden" and staff["max_score"] == 0, staff
    assert "Course staff: refusing to run untrusted code: the container tier" in staff["output"]
    assert [t["max_score"] for t in tests] == [float(t.points) for t in SHARED_TESTS]


def test_the_refusal_of_run_autograder_reads_setups_reasons(tmp_path):
    record = tmp_path / "isolation"
    record.write_text("none\nsandbox: cannot be set up: X\ncontainer: cannot be set up: Y\n")
    report = tmp_path / "results.json"
    argv = ["autograder", "refuse", "--why", str(record), "--out", str(report)]
    assert main([*argv, "--tests", "test_hand_example_noam"]) == 2
    results = json.loads(report.read_text())
    valid(results)
    assert results["score"] == 0 and results["output"].startswith("NOT GRADED"), results
    staff = results["tests"][-1]
    assert (
        staff["visibility"] == "hidden" and "X; container: cannot be set up: Y" in staff["output"]
    )
    assert "cannot be set up" not in results["output"]
