"""A student's self-check: `xfmr check` and `pytest --xfmr`, on a machine without bubblewrap,
and without os.fork or AF_UNIX SOCK_SEQPACKET (macOS, Windows): real subprocess runs, each
with a PATH that holds no bwrap."""

import json
import os
import re
import shutil
import subprocess
import sys
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest

from harness.reports import grade as grade_report
from harness.shared_tests.laws import BY_NAME
from harness.students import selfcheck
from harness.students.pytest_plugin import PROFILE, PROFILE_SETTINGS

ROOT = Path(__file__).resolve().parents[3]
FAULTY = "examples/faulty_submission.py"
CORRECT = "examples/correct_submission.py"
# what the faulty example fails (README: its grade, 87/122): the cross-attention reads padding
FAULTY_FAILS = {
    "test_golden_torch",
    "test_source_padding_is_never_read",
    "test_translate_is_greedy_with_beam_one_and_drops_eos",
    "test_beam_search_matches_oracle",
}
QUICK = "test_hand_example_noam,test_decoder_is_causal,test_validation"

# Loaded by every interpreter of a run (the parent and each worker, through PYTHONPATH): no
# os.fork, no SOCK_SEQPACKET, as on Windows and macOS; each process leaves a mark.
NO_FORK = """
import os, socket
for name in ("fork", "forkpty"):
    if hasattr(os, name):
        delattr(os, name)
if hasattr(socket, "SOCK_SEQPACKET"):
    del socket.SOCK_SEQPACKET
with open(os.path.join(os.environ["XFMR_TEST_MARKS"], str(os.getpid())), "w") as f:
    f.write("no fork")
"""


def without_bwrap(extra_path: str = "") -> dict[str, str]:
    """This environment with every PATH folder holding bwrap left out."""
    folders = os.environ.get("PATH", "").split(os.pathsep)
    path = os.pathsep.join(d for d in folders if d and not os.path.exists(os.path.join(d, "bwrap")))
    assert shutil.which("bwrap", path=path) is None
    env = {**os.environ, "PATH": path}
    if extra_path:
        env["PYTHONPATH"] = os.pathsep.join(p for p in (extra_path, env.get("PYTHONPATH")) if p)
    return env


def run(args: list[str], env: dict[str, str], timeout: float = 240) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, *args], cwd=ROOT, env=env, capture_output=True, text=True, timeout=timeout
    )


@pytest.mark.slow
def test_check_needs_no_bwrap_no_fork_and_no_seqpacket(tmp_path):
    # the whole run (the parent and each worker) without os.fork and SOCK_SEQPACKET, bwrap off
    # PATH; the parent would fail loudly if it tried the fork server or the sandbox's trial
    site, marks = tmp_path / "site", tmp_path / "marks"
    site.mkdir(), marks.mkdir()
    (site / "sitecustomize.py").write_text(NO_FORK)
    env = without_bwrap(str(site)) | {"XFMR_TEST_MARKS": str(marks)}
    guard = (
        "import sys\n"
        "from harness.isolation import forkserver, sandbox\n"
        "def refuse(*a, **k): raise AssertionError('a self-check used the fork server or bwrap')\n"
        "forkserver.ForkServer.private = refuse\n"
        "sandbox.check = sandbox.command = refuse\n"
        "from harness.cli import main\n"
        "sys.exit(main(sys.argv[1:]))\n"
    )
    report = tmp_path / "check.json"
    done = run(["-c", guard, "check", CORRECT, "--tests", QUICK, "--json", str(report)], env)
    assert done.returncode == 0, done.stdout + done.stderr
    lines = done.stdout.splitlines()
    assert lines[0] == f"Self-check of {CORRECT} (not a grade)"
    assert selfcheck.SELF_CHECK in done.stdout
    assert "Score: 18/18 (3/3 tests passed)" in done.stdout
    data = json.loads(report.read_text())
    assert data["isolation"] == selfcheck.SELF_CHECK and data["passed"]
    assert [t["name"] for t in data["tests"]] == QUICK.split(",")
    # the parent and at least one worker ran without os.fork and SOCK_SEQPACKET
    assert len(list(marks.iterdir())) >= 2


@pytest.mark.slow
def test_one_test_at_a_time_or_whole_the_grading_says_the_same():
    # grade, grade-batch, check and pytest --xfmr all run harness.grading.Grading; its two
    # drivers (a whole grade, one test at a time for pytest items) say the same
    names = ["test_golden_torch", "test_source_padding_is_never_read", "test_hand_example_noam"]
    names.append("test_translate_is_greedy_with_beam_one_and_drops_eos")
    tests = [BY_NAME[n] for n in names]
    checked = selfcheck.check(ROOT / FAULTY, tests)
    with selfcheck.runner(ROOT / FAULTY, tests) as one_by_one:
        items = [one_by_one.result(t) for t in tests]
    assert checked.isolation == selfcheck.SELF_CHECK
    assert [(t.name, t.outcome, t.score, t.message) for t in checked.tests] == [
        (t.name, t.outcome, t.score, t.message) for t in items
    ]
    assert checked.diagnosis == one_by_one.found
    assert "decoder.0.cross_attn" in checked.tests[0].message
    assert "padded keys are read" in checked.tests[0].message
    text = selfcheck.text(checked)
    assert text.startswith(f"Self-check of {ROOT / FAULTY} (not a grade)")
    # every line after the heading is a grade's text of it, but for the times
    assert _untimed(grade_report.text(checked))[1:] == _untimed(text)[1:]


def _untimed(text: str) -> list[str]:
    return [re.sub(r"\d+\.\d+", "#", line) for line in text.splitlines()]


@pytest.mark.slow
def test_check_suite_is_mutation_scores_report(tmp_path):
    # the weak example suite: only s08 dies (README: its mutation score, 1/11, FAIL); two of the
    # generated sample, as the incremental run takes (the whole sample's score of this suite is
    # test_mutation_score's, and ten more subjects cost ~20 s of CI here for nothing new)
    report = tmp_path / "score.json"
    args = ["-m", "harness.cli", "check", "--suite", "examples/student_tests_weak"]
    args += ["--generated", "2"]
    done = run([*args, "--suite-json", str(report)], without_bwrap())
    assert done.returncode == 1, done.stdout + done.stderr
    lines = done.stdout.splitlines()
    assert lines[0].startswith("Self-check: Mutation score of examples/student_tests_weak")
    assert lines[1] == selfcheck.SELF_CHECK
    assert "FAIL" in done.stdout and "Score: 1/11" in done.stdout
    data = json.loads(report.read_text())
    assert data["killed"] == ["s08"] and not data["passed"] and not data["false_alarms"]
    assert data["generated"]["drawn"] == 2


def junit_cases(path: Path) -> dict[str, ET.Element]:
    return {c.get("name"): c for c in ET.parse(path).getroot().iter("testcase")}


@pytest.mark.slow
def test_pytest_xfmr_fails_the_faulty_submissions_shared_tests(tmp_path):
    # one full run: the shared tests as pytest items, from the project's root (whose testpaths
    # must not be collected), failing with the grader's message and diagnosis
    xml = tmp_path / "junit.xml"
    args = ["-m", "pytest", "--xfmr", FAULTY, "-p", "no:cacheprovider", f"--junitxml={xml}"]
    done = run(args, without_bwrap())
    assert done.returncode == 1, done.stdout + done.stderr
    cases = junit_cases(xml)
    assert set(cases) == set(BY_NAME)  # the shared tests and nothing else
    failed = {n for n, c in cases.items() if c.find("failure") is not None}
    assert failed == FAULTY_FAILS
    golden = cases["test_golden_torch"].find("failure").text
    assert "first divergence: decoder.0.cross_attn" in golden
    assert "padded keys are read" in golden
    beam = cases["test_beam_search_matches_oracle"].find("failure").text
    assert "not judged: test_golden_torch must pass first" in beam
    assert "xfmr self-check (not a grade)" in done.stdout
    assert "Score: 87/122 (15/19 shared tests passed)" in done.stdout


@pytest.mark.slow
def test_pytest_xfmr_runs_the_strong_example_suite(tmp_path):
    # the fixture, the module path and the grader's Hypothesis profile: the strong suite passes
    xml = tmp_path / "junit.xml"
    suite = "examples/student_tests_strong"
    args = ["-m", "pytest", "--xfmr", "impl/transformer.py", suite, "-p", "no:cacheprovider"]
    done = run([*args, f"--junitxml={xml}"], without_bwrap())
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr
    cases = junit_cases(xml)
    assert len(cases) == 28 and not any(n.startswith("test_golden") for n in cases)
    # without the plugin the same suite cannot even set up
    bare = run(["-m", "pytest", suite, "-p", "no:xfmr", "-p", "no:cacheprovider", "-x"], os.environ)
    assert bare.returncode == 1 and "fixture 'transformer' not found" in bare.stdout


@pytest.mark.slow
def test_pytest_xfmr_gives_a_suite_the_graders_subject_and_profile(tmp_path):
    # a conftest's own profile loses to the grader's; the module path and the fixture are the
    # implementation named by --xfmr, one module: here a student's folder of two files, whose
    # relative and absolute imports of each other resolve
    mine = tmp_path / "mine"
    mine.mkdir()
    (mine / "schedule.py").write_text("VALUE = 1\n")
    code = (ROOT / CORRECT).read_text()
    (mine / "transformer.py").write_text(code + "\nfrom .schedule import VALUE\nimport schedule\n")
    suite = tmp_path / "suite"
    suite.mkdir()
    (suite / "conftest.py").write_text(
        "import hypothesis\n"
        "hypothesis.settings.register_profile('mine', deadline=1, derandomize=False)\n"
        "hypothesis.settings.load_profile('mine')\n"
    )
    (suite / "test_it.py").write_text(
        "import hypothesis\n"
        "import tinyllm.xfmr.transformer as T\n\n"
        "def test_profile():\n"
        "    s = hypothesis.settings()\n"
        "    assert s.deadline is None and s.derandomize and s.database is None\n\n"
        "def test_subject(transformer):\n"
        "    assert transformer is T\n"
        f"    assert transformer.__file__ == {str(mine / 'transformer.py')!r}\n"
        "    assert transformer.VALUE == transformer.schedule.VALUE == 1\n"
        "    assert transformer.noam_rate(0, 16, 4) > 0\n"
    )
    args = ["-m", "pytest", "--xfmr", str(mine), str(suite), "-p", "no:cacheprovider"]
    done = run(args, without_bwrap())
    assert done.returncode == 0, done.stdout + done.stderr
    assert "2 passed" in done.stdout


def test_the_plugins_profile_is_the_graders():
    hypothesis = pytest.importorskip("hypothesis")
    from harness.isolation.child import student_suite

    graders = hypothesis.settings.get_profile(student_suite.PROFILE)
    assert PROFILE == student_suite.PROFILE
    for name, value in PROFILE_SETTINGS.items():
        assert getattr(graders, name) == value, name


@pytest.mark.slow
def test_pytest_xfmr_never_imports_the_implementation_itself(tmp_path):
    # the implementation is loaded only by workers (pytest would import a path it is given):
    # one that raises at import fails each shared item with the grader's load message
    mark = tmp_path / "imported"
    boom = tmp_path / "boom.py"
    boom.write_text(
        "import sys\n"
        f"open({str(mark)!r}, 'a').write(str('pytest' in sys.modules))\n"
        "raise RuntimeError('boom at import')\n"
    )
    args = ["-m", "pytest", "--xfmr", str(boom), "--xfmr-tests", "test_hand_example_noam"]
    done = run([*args, "-p", "no:cacheprovider"], without_bwrap())
    assert done.returncode == 1, done.stdout + done.stderr
    assert "failed: load: the subject raised RuntimeError: boom at import" in done.stdout
    assert "1 failed" in done.stdout
    assert mark.read_text() == "False"  # once, in a worker, never in pytest's process


def test_nothing_to_check_is_a_usage_error(tmp_path):
    done = run(["-m", "harness.cli", "check"], without_bwrap())
    assert done.returncode == 2 and "name your transformer.py" in done.stderr
    done = run(["-m", "pytest", "--xfmr", str(tmp_path), "-p", "no:cacheprovider"], os.environ)
    assert done.returncode == 4 and "nor a folder holding transformer.py" in done.stderr


def test_a_rejected_file_fails_every_test_with_the_rejection(tmp_path):
    # pytest --xfmr on a file that is no submission: each shared test says why, none runs it
    bad = tmp_path / "transformer.txt"
    bad.write_text("not python")
    with selfcheck.runner(bad) as runner:
        results = [runner.result(BY_NAME[name]) for name in sorted(BY_NAME)[:2]]
    assert [r.passed for r in results] == [False, False]
    assert all(r.message == runner.rejected and "not a .py file" in r.message for r in results)
