"""The PrairieLearn grader, built by `xfmr autograder prairielearn` and run as PrairieLearn runs
it, in the simulated container test_autograder.py's Gradescope runs use
(harness.jobs.simulated_container).

What is real: the folder is the command's own output; the image is its Dockerfile's COPY and RUN
(the same setup.sh as Gradescope's, XFMR_SKIP_INSTALL=1: the student user is created,
/xfmr-grader closed to it); each job runs in a fresh copy of that image, with /grade laid out as
PrairieLearn's grader host lays it out (student/, tests/, serverFilesCourse/, data/data.json),
the entry point of info.json run as root: run.sh proves the isolation tier at its start
(`xfmr autograder probe`), grades /grade/student, and writes /grade/results/results.json in
PrairieLearn's format. What is simulated is test_autograder.py's: bubblewrap as root, not Docker;
this machine's interpreter and venv in place of the image's downloads.

Every results.json is valid per PrairieLearn's documentation
(autograder/prairielearn_results.schema.json) and has the deserved score: a grade (the fraction
of the points), a rejection (a syntax error: not gradable, the reason as a format error), a
refusal (an image without the tier's user: no tier works; not gradable, NOT GRADED), a grader
fault (no report: not gradable, GRADER ERROR), and the shell's own last resort (Python itself
missing); every job exits 0 and leaves no process of the student's user. The docker container
grades three tests (the mechanism is the point); slow: the faulty and the forging examples (a
setsid daemon rewriting /grade/results/results.json), the correct example's whole grade (score
1.0), and the sandbox tier in the userns container.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import uuid
import zipfile
from importlib.metadata import version
from pathlib import Path

import pytest
from test_autograder import (
    FAULTY_LOST,
    SUBSET,
    SUBSET_POINTS,
    build,
    forger_marks,
    needs_the_simulation,
    student_uid,
    submissions,
)

from harness.cli import main
from harness.jobs.autograder_files import PRAIRIELEARN
from harness.jobs.autograder_try import image, job
from harness.outcomes import Outcome
from harness.records import Grade, TestResult
from harness.reports.grade import to_json
from harness.shared_tests.laws import BY_NAME, SHARED_TESTS

DATA = Path(__file__).parent / "autograder"
QID = "xfmr-transformer"


def valid(results: dict) -> None:
    """Valid per PrairieLearn's documentation, with a numeric score (ours always has one)."""
    import jsonschema

    schema = json.loads((DATA / "prairielearn_results.schema.json").read_text())
    jsonschema.validate(results, schema)
    assert isinstance(results.get("score"), int | float), results


# --- without a container ----------------------------------------------------------------------


COURSE = "CS 182 Fall 2026"


def test_the_folder_is_a_grader_image_and_a_question(tmp_path, capsys):
    out = tmp_path / "pl"
    argv = ["autograder", "prairielearn", "--out", str(out), "--course", COURSE]
    assert main([*argv, "--image", "org/grader:1"]) == 0
    assert "docker build -t org/grader:1" in capsys.readouterr().out
    question = out / "questions" / QID
    info = json.loads((question / "info.json").read_text())
    options = info["externalGradingOptions"]
    assert info["type"] == "v3" and info["gradingMethod"] == "External", info
    assert options == {
        "enabled": True,
        "image": "org/grader:1",
        "entrypoint": "/xfmr-grader/run.sh",
        "timeout": 600,
    }
    html = (question / "question.html").read_text()
    # transformer.py, and the student's own modules beside it, as on Gradescope
    assert '<pl-file-upload file-names="transformer.py" optional-file-patterns="*.py">' in html
    assert "<pl-external-grader-results>" in html and "122 points" in " ".join(html.split())
    docker = (out / "image" / "Dockerfile").read_text()
    steps = [line.split()[:3] for line in docker.splitlines() if line and line[0] != "#"]
    assert steps == [
        ["FROM", "ubuntu:24.04"],
        ["COPY", "xfmr-grader", "/xfmr-grader"],
        ["RUN", "bash", "/xfmr-grader/setup.sh"],
    ]
    grader = out / "image" / "xfmr-grader"
    assert (grader / "run.sh").stat().st_mode & 0o777 == 0o755
    assert (grader / "xfmr-oracle" / "harness" / "__init__.py").is_file()
    assert not list(grader.rglob("__pycache__"))
    about = json.loads((grader / "assignment.json").read_text())
    assert about["total_points"] == sum(t.points for t in SHARED_TESTS)
    run, setup = ((grader / n).read_text() for n in ("run.sh", "setup.sh"))
    assert 'run autograder probe --record "$SOURCE/isolation" --hidden /grade' in run
    assert "--format prairielearn" in run and "prairielearn-results" in run and "exit 0" in run
    for script in (grader / "run.sh", grader / "setup.sh"):
        done = subprocess.run(["bash", "-n", str(script)], capture_output=True, text=True)
        assert done.returncode == 0, (script, done.stderr)
    # the install is Gradescope's own setup.sh's, to the letter
    build(tmp_path / "autograder.zip")
    with zipfile.ZipFile(tmp_path / "autograder.zip") as z:
        theirs = z.read("setup.sh").decode()
    start, end = 'if [ "${XFMR_SKIP_INSTALL:-0}" != 1 ]', 'echo "$VENV" > "$SOURCE/venv"'
    assert (
        setup[setup.index(start) : setup.index(end)]
        == theirs[theirs.index(start) : theirs.index(end)]
    )
    # built again: replaced whole; a folder that is not ours: refused
    assert main([*argv, "--tests", SUBSET]) == 0
    assert "--tests " + SUBSET in (grader / "run.sh").read_text()
    (tmp_path / "mine").mkdir()
    (tmp_path / "mine" / "notes.txt").write_text("mine")
    mine = ["autograder", "prairielearn", "--out", str(tmp_path / "mine"), "--course", COURSE]
    assert main(mine) == 2
    assert (tmp_path / "mine" / "notes.txt").read_text() == "mine"


def test_the_image_is_the_courses_and_the_uuid_its_question(tmp_path, capsys):
    def built(*options: str) -> tuple[int, dict, str]:
        out = tmp_path / "pl"
        status = main(["autograder", "prairielearn", "--out", str(out), *options])
        said = capsys.readouterr()
        info = (
            json.loads((out / "questions" / options[-1] / "info.json").read_text())
            if (status == 0 and options[-2] == "--qid")
            else {}
        )
        if out.exists():
            shutil.rmtree(out)
        return status, info, said.out + said.err

    # no image name and no course: refused (no default pushes into a namespace nobody owns)
    with pytest.raises(SystemExit) as refused:
        main(["autograder", "prairielearn", "--out", str(tmp_path / "pl")])
    assert refused.value.code == 2 and not (tmp_path / "pl").exists()
    assert "the following arguments are required: --course" in capsys.readouterr().err
    status, mine, said = built("--course", COURSE, "--qid", QID)
    image = f"cs182fall2026/xfmr-grader:{version('xfmr-oracle')}"
    assert status == 0 and mine["externalGradingOptions"]["image"] == image, (mine, said)
    assert f"docker push {image}" in said and "'cs182fall2026' must be one your course" in said
    assert "xfmr-oracle/grader" not in said
    # the same course and question: the same UUID at every build; another: another
    assert built("--course", COURSE, "--qid", QID)[1]["uuid"] == mine["uuid"]
    theirs = built("--course", "ECE 408", "--qid", QID)[1]
    other = built("--course", COURSE, "--qid", "xfmr-transformer-2")[1]
    assert len({mine["uuid"], theirs["uuid"], other["uuid"]}) == 3
    assert str(uuid.UUID(mine["uuid"])) == mine["uuid"]
    assert theirs["externalGradingOptions"]["image"].startswith("ece408/")
    # an image named: taken as it is; a name without a namespace, or no name: refused
    named = built("--course", COURSE, "--image", "ghcr.io/cs182/grader:2", "--qid", QID)[1]
    assert named["externalGradingOptions"]["image"] == "ghcr.io/cs182/grader:2"
    assert named["uuid"] == mine["uuid"]
    for bad in ("grader:1", "Org/Grader:1", "org/grader:"):
        status, _, said = built("--course", COURSE, "--image", bad, "--qid", QID)
        assert status == 2 and "not a Docker image name with a namespace" in said, (bad, said)
    status, _, said = built("--course", "C1", "--qid", QID)  # too short a Docker Hub namespace
    assert status == 2 and "--image" in said, said


def _grade(**what: str) -> Grade:
    tests = [
        TestResult(t.name, t.law, Outcome.PASSED, float(t.points), float(t.points), "", 0.1)
        for t in SHARED_TESTS[:2]
    ]
    failed = SHARED_TESTS[2]
    tests.append(
        TestResult(failed.name, failed.law, Outcome.KILLED, 0.0, float(failed.points), "off", 0.1)
    )
    return Grade("/grade/student", tests, what.get("rejected", ""), error=what.get("error", ""))


def _converted(tmp_path: Path, report: dict | None, status: int) -> dict:
    path, out = tmp_path / "grade.json", tmp_path / "results.json"
    if report is not None:
        path.write_text(json.dumps(report))
    argv = ["autograder", "prairielearn-results", "--grade", str(path), "--status", str(status)]
    assert main([*argv, "--out", str(out), "--tests", SUBSET]) == 0
    results = json.loads(out.read_text())
    valid(results)
    return results


def test_results_json_on_every_path(tmp_path, capsys):
    """The grade's report in PrairieLearn's format, and each way a grade can fail to be one."""
    graded = _converted(tmp_path, to_json(_grade()), 1)
    points = [float(t.points) for t in SHARED_TESTS[:3]]
    assert graded["gradable"] is True and graded["score"] == sum(points[:2]) / sum(points)
    assert graded["message"] == "2/3 tests passed"
    assert [(t["points"], t["max_points"]) for t in graded["tests"]] == [
        (points[0], points[0]),
        (points[1], points[1]),
        (0.0, points[2]),
    ]
    assert graded["tests"][2]["message"] == "off"
    why = "transformer.py does not parse: line 3"
    rejected = _converted(tmp_path, to_json(_grade(rejected=why)), 1)
    assert rejected["gradable"] is False and rejected["score"] == 0
    assert rejected["format_errors"] == [why] and rejected["message"] == why
    broke = _converted(tmp_path, to_json(_grade(error="Traceback: ...")), 3)
    assert broke["gradable"] is False and broke["message"].startswith("GRADER ERROR")
    (tmp_path / "grade.json").unlink()
    refused = _converted(tmp_path, None, 2)
    assert refused["gradable"] is False and refused["message"].startswith("NOT GRADED")
    lost = _converted(tmp_path, None, 137)
    assert lost["message"].startswith("GRADER ERROR") and "137" not in lost["message"]
    assert "left no report (exit status 137" in capsys.readouterr().out  # the job's output
    assert [t["max_points"] for t in lost["tests"]] == [
        float(BY_NAME[n].points) for n in SUBSET.split(",")
    ]
    record = tmp_path / "isolation"
    record.write_text("none\nsandbox: cannot be set up: X\ncontainer: cannot be set up: Y\n")
    argv = ["autograder", "refuse", "--why", str(record), "--out", str(tmp_path / "r.json")]
    assert main([*argv, "--format", "prairielearn"]) == 2
    results = json.loads((tmp_path / "r.json").read_text())
    valid(results)
    assert results["gradable"] is False and results["message"].startswith("NOT GRADED")
    # the reasons are staff's: on the job's output (instructors' only), not in results.json
    assert "X; container: cannot be set up: Y" in capsys.readouterr().out
    assert "cannot be set up" not in json.dumps(results)


# --- in the simulated container -------------------------------------------------------------------


def _without_the_student(built: Path, copy: Path) -> Path:
    """A copy of the image whose /etc has no container tier user: no tier works in it."""
    subprocess.run(["cp", "-a", str(built), str(copy)], check=True)
    for name in ("passwd", "group", "shadow", "gshadow"):
        path = copy / "etc" / name
        if path.is_file():
            kept = [x for x in path.read_text().splitlines() if not x.startswith("xfmr-student:")]
            path.write_text("\n".join(kept) + "\n")
    return copy


def pl_jobs(tmp_path: Path, variant: str, tests: str | None, names: list[str]) -> tuple:
    """The grader built (three tests, or all), its image, and a job for each named submission
    (submissions()); the image and the jobs."""
    options = ["--course", COURSE, *(["--tests", tests] if tests else [])]
    build(tmp_path / "pl", *options, action="prairielearn")
    built = image(tmp_path / "pl", PRAIRIELEARN, variant, tmp_path / "cache", rebuild=False)
    assert built.build.status == 0, built.build.output
    made = submissions(tmp_path / "in", full=False)
    return built, {name: job(built.folder, PRAIRIELEARN, variant, made[name][0]) for name in names}


def deserved(jobs: dict, expected: dict) -> None:
    """Each job exited 0 (else PrairieLearn ignores its results.json), left nothing running, and
    wrote a valid results.json with the expected gradable, score and message."""
    for name, (gradable, score, says) in expected.items():
        done = jobs[name]
        assert done.ran.status == 0, (name, done.ran.output)
        assert done.results, f"{name}: no results.json\n{done.ran.output}"
        results = json.loads(done.results)
        valid(results)
        first = results["message"].splitlines()[0]
        print(f"\n{name}: {results['score']:.3f} in {done.ran.seconds:.1f} s: {first}")
        assert results["gradable"] is gradable, (name, results)
        assert results["score"] == pytest.approx(score), (name, results)
        assert says in results["message"], (name, results["message"])
        assert done.ran.left == (), f"{name}: left running after run.sh: {done.ran.left}"


@needs_the_simulation
@pytest.mark.slow
def test_every_path_in_a_simulated_prairielearn_container(tmp_path):
    """Docker's restrictions (the container tier), three tests: a grade (of transformer.py, and
    of transformer.py with modules of the student's own beside it), a rejection, a refusal (an
    image without the tier's user) and Python itself missing each leave a valid results.json."""
    built, jobs = pl_jobs(tmp_path, "docker", SUBSET, ["correct", "syntax_error", "two_files"])
    correct = tmp_path / "in" / "correct"
    jobs["refusal"] = job(
        _without_the_student(built.folder, tmp_path / "no-user"), PRAIRIELEARN, "docker", correct
    )
    (built.folder / "root" / "xfmr-grader" / "venv").write_text("/nonexistent\n")  # no Python
    jobs["no_python"] = job(built.folder, PRAIRIELEARN, "docker", correct)
    deserved(
        jobs,
        {
            "correct": (True, 1.0, "3/3 tests passed"),
            # transformer.py with the student's schedule.py and positions.py beside it
            "two_files": (True, 1.0, "3/3 tests passed"),
            "syntax_error": (False, 0.0, "does not parse"),
            "refusal": (False, 0.0, "NOT GRADED"),
            "no_python": (False, 0.0, "NOT GRADED: the autograder failed before it could report"),
        },
    )
    assert jobs["correct"].record.splitlines()[0] == "container", jobs["correct"].record
    assert jobs["refusal"].record.splitlines()[0] == "none", jobs["refusal"].record
    # each tier's reason is staff's: on the job's output, not in what the student sees
    refusal = jobs["refusal"]
    reason = "container: cannot be set up: there is no user 'xfmr-student'"
    assert reason in refusal.ran.output and reason not in refusal.results, refusal
    bad = json.loads(jobs["syntax_error"].results)
    assert "transformer.py line" in bad["format_errors"][0], bad


@needs_the_simulation
@pytest.mark.slow
def test_the_faulty_and_the_forging_examples_in_prairielearns_container(tmp_path):
    built, jobs = pl_jobs(tmp_path, "docker", SUBSET, ["faulty", "forging"])
    deserved(
        jobs,
        {
            "faulty": (True, (SUBSET_POINTS - FAULTY_LOST) / SUBSET_POINTS, "1/3 tests passed"),
            "forging": (True, 1.0, "3/3 tests passed"),
        },
    )
    # the forging daemon ran, as the student's user, and forged nothing
    assert forger_marks(jobs["forging"].ran) == [f"xfmr-forger-ran-as-{student_uid(built.folder)}"]


@needs_the_simulation
@pytest.mark.slow
@pytest.mark.parametrize(
    "variant, tier, tests", [("docker", "container", None), ("userns", "sandbox", SUBSET)]
)
def test_a_whole_grade_in_prairielearns_container(tmp_path, variant, tier, tests):
    """The correct example's whole grade (docker: the container tier), and the sandbox tier
    where nested user namespaces work (userns: three tests)."""
    _, jobs = pl_jobs(tmp_path, variant, tests, ["correct"])
    deserved(jobs, {"correct": (True, 1.0, "tests passed")})
    results = json.loads(jobs["correct"].results)
    assert len(results["tests"]) == (3 if tests else len(SHARED_TESTS))
    assert jobs["correct"].record.splitlines()[0] == tier, jobs["correct"].record
