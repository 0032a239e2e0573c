"""Hostile submissions (tests/hostile/) end in a failing grade with a clear reason, in bounded
time, and leave the grader, the machine and the reports unharmed."""

import csv
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
import torch

from harness.cli import main
from harness.sandbox import processes

ROOT = Path(__file__).resolve().parents[1]
HOSTILE = Path(__file__).parent / "hostile"
# Two cheap tests: the schedule (every overlay's real fault) and the golden forward pass (where
# most attacks fire). 5 s per test bounds the hang; each test takes well under 1 s.
TESTS = "test_hand_example_noam,test_golden_torch"
TIME_LIMIT = "5"


def compose(name: str, folder: Path) -> Path:
    """A submission: the torch copy with the hostile overlay appended."""
    path = folder / f"{name}.py"
    base = (ROOT / "impl" / "torch_copy.py").read_text()
    path.write_text(base + "\n\n" + (HOSTILE / f"{name}.py").read_text())
    return path


def leftovers() -> list[int]:
    """The hostile_detached child's `sleep 4242.5`, if anything left it running."""
    found = []
    for pid in processes():
        try:
            if b"4242.5" in Path(f"/proc/{pid}/cmdline").read_bytes():
                found.append(pid)
        except OSError:
            pass
    return found


@pytest.fixture(scope="module")
def batch(tmp_path_factory):
    """Every hostile overlay but the results-file one, graded by one `xfmr grade-batch`."""
    folder = tmp_path_factory.mktemp("hostile")
    out = tmp_path_factory.mktemp("grades")
    names = sorted(p.stem for p in HOSTILE.glob("hostile_*.py") if p.stem != "hostile_results_file")
    for name in names:
        compose(name, folder)
    start = time.monotonic()
    status = main(
        ["grade-batch", str(folder), "--out", str(out), "--tests", TESTS]
        + ["--time-limit", TIME_LIMIT, "--jobs", "2"]
    )
    wall = time.monotonic() - start
    results = {n: json.loads((out / f"{n}.gradescope.json").read_text()) for n in names}
    return status, out, results, wall


def outputs(results: dict, name: str) -> dict[str, tuple[str, str]]:
    return {t["name"]: (t["status"], t["output"]) for t in results[name]["tests"]}


# hostile -> (test, words its output must hold)
EXPECTED = {
    "hostile_exit0": ("test_golden_torch", "worker exited with status 0"),
    "hostile_systemexit": ("test_golden_torch", "raised SystemExit"),
    "hostile_patch_compare": ("test_golden_torch", "max abs error"),
    "hostile_hang": ("test_hand_example_noam", "timed out: no answer within 5 s"),
    "hostile_memory": ("test_golden_torch", "can't allocate memory"),
    "hostile_segfault": ("test_golden_torch", "killed by signal SIGSEGV"),
    "hostile_detached": ("test_golden_torch", "worker exited with status 0"),
    "hostile_tensor_subclass": ("test_golden_torch", "max abs error 0.25"),
    "hostile_import_reference": ("test_golden_torch", "imports impl.transformer"),
    "hostile_import_dynamic": ("test_golden_torch", "ProtectedImport"),
}


@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_hostile_submission_fails_with_its_reason(batch, name):
    _, _, results, _ = batch
    test, words = EXPECTED[name]
    status, output = outputs(results, name)[test]
    assert status == "failed" and words in output, output
    assert results[name]["score"] < sum(t["max_score"] for t in results[name]["tests"])


def test_memory_bomb_in_python_is_a_memory_error(batch):
    _, _, results, _ = batch
    status, output = outputs(results, "hostile_memory")["test_hand_example_noam"]
    assert status == "failed" and "MemoryError" in output, output


def test_reading_the_reference_is_blocked(batch):
    _, _, results, _ = batch
    _, output = outputs(results, "hostile_import_dynamic")["test_golden_torch"]
    assert "ProtectedRead" in output and "impl/transformer.py" in output


def test_batch_is_bounded_and_summarized(batch):
    status, out, results, wall = batch
    assert status == 1  # some submission failed
    # 10 submissions, 2 at a time: one 5 s hang, the rest seconds each
    assert wall < 60
    rows = list(csv.DictReader((out / "grades.csv").open()))
    assert sorted(r["submission"] for r in rows) == sorted(f"{n}.py" for n in results)
    assert all(r["passed"] == "False" for r in rows)
    hardest = list(csv.DictReader((out / "hardest_tests.csv").open()))
    assert {r["test"] for r in hardest} == set(TESTS.split(","))
    assert int(hardest[0]["failed"]) >= int(hardest[-1]["failed"])


def test_no_process_is_left_behind(batch):
    # hostile_detached started `sleep 4242.5` in its own session, holding the worker's pipes
    assert leftovers() == []


def test_grader_is_unharmed(batch):
    # the comparison patches ran in workers, never here
    assert np.allclose.__module__.startswith("numpy")
    assert not np.allclose([0.0], [1.0]) and not torch.allclose(torch.zeros(1), torch.ones(1))
    assert os.getcwd() != "/"


def test_planted_results_never_stand_in_for_the_report(tmp_path):
    # the submission finds the report paths in the grader's command line and writes a
    # perfect result there (and in /tmp, and in its working directory)
    planted = Path("/tmp/results.json")
    existed = planted.exists()
    submission = compose("hostile_results_file", tmp_path)
    report, scope = tmp_path / "grade.json", tmp_path / "results.json"
    cmd = [sys.executable, "-m", "harness.cli", "grade", str(submission), "--tests", TESTS]
    cmd += ["--time-limit", TIME_LIMIT, "--json", str(report), "--gradescope", str(scope)]
    try:
        done = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
    finally:
        if planted.exists() and not existed:
            planted.unlink()
    assert done.returncode == 1, done.stdout + done.stderr
    grade = json.loads(report.read_text())
    assert not grade["passed"] and grade["score"] < grade["max_score"]
    gradescope = json.loads(scope.read_text())
    noam = {t["name"]: t for t in gradescope["tests"]}["test_hand_example_noam"]
    assert noam["status"] == "failed" and "expected 0.03125" in noam["output"]
