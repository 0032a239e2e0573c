"""The grader's environment is never the student's fault (harness.canary, harness.grading):
the workers are proven on a correct model before any verdict, a failed proof is a GRADER
ERROR (exit 3, nothing charged, the fix named), and the address-space limit is relative to what
a worker maps once torch is imported, so a torch build that maps gigabytes at import (the CUDA
build a plain `pip install torch` gives on Linux: 3.1 GiB) runs as the CPU build does."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from harness import canary
from harness.outcomes import Outcome
from harness.records import Grade, TestResult

ROOT = Path(__file__).resolve().parents[2]
CORRECT = ROOT / "examples" / "correct_submission.py"
GIB = 1 << 30


@pytest.fixture
def cache(tmp_path, monkeypatch):
    folder = tmp_path / "canary"
    monkeypatch.setenv(canary.CACHE, str(folder))
    monkeypatch.setattr(canary, "_proven", {})
    return folder


def _grade(passed: bool, message: str = "") -> Grade:
    outcome = Outcome.PASSED if passed else Outcome.KILLED
    score = 15.0 if passed else 0.0
    test = TestResult("test_golden_torch", "law", outcome, score, 15.0, message, 0.1, "visible")
    return Grade("transformer.py", [test], seconds=0.5)


def test_a_pass_is_kept_per_environment_and_a_failure_never(cache):
    runs: list[Path] = []

    def passing(path: Path) -> Grade:
        runs.append(path)
        assert path.read_text() == canary.SUBJECT.read_text()  # the correct model, staged
        return _grade(True)

    assert canary.prove("sandbox; limits A", passing) == ""
    assert canary.prove("sandbox; limits A", passing) == ""
    assert len(runs) == 1  # proven once in this process
    canary._proven.clear()
    assert canary.prove("sandbox; limits A", passing) == ""
    assert len(runs) == 1, "a later process reads the pass from the cache"
    assert len(list(cache.glob("*.json"))) == 1
    assert canary.prove("sandbox; limits B", passing) == ""
    assert len(runs) == 2, "other limits are another environment"

    def failing(path: Path) -> Grade:
        runs.append(path)
        return _grade(False, "failed: load: the subject raised MemoryError: ")

    for _ in range(2):
        said = canary.prove("container; limits A", failing)
        assert said.startswith(canary.GRADER_ERROR) and "nothing was charged" in said
        assert "--memory-mb" in said, "the fix of a memory error is named"
    assert len(runs) == 4, "a failed proof is tried again, never kept"


def test_a_grader_that_breaks_while_proving_says_so(cache):
    def broken(path: Path) -> Grade:
        raise OSError("no space left on device")

    said = canary.prove("sandbox", broken)
    assert said.startswith(canary.GRADER_ERROR) and "OSError: no space left" in said


def test_an_unreadable_cache_entry_is_a_miss(cache):
    key = canary.fingerprint("sandbox")
    cache.mkdir(parents=True)
    (cache / f"{key}.json").write_text("{not json")
    runs = []
    assert canary.prove("sandbox", lambda p: runs.append(p) or _grade(True)) == ""
    assert runs and json.loads((cache / f"{key}.json").read_text())["passed"] is True


@pytest.mark.parametrize(
    ("said", "fix"),
    [
        ("ImportError: x.so: failed to map segment from shared object", "--memory-mb"),
        ("timed out: no answer within 60 s", "--jobs"),
        ("ModuleNotFoundError: No module named 'safetensors'", "reinstall"),
        ("something else entirely", "report this message"),
    ],
)
def test_each_cause_gets_its_fix(said, fix):
    assert fix in canary.fix_for(said)


# --- the address space, relative to the worker's own mappings ----------------------------------

# A worker that has mapped 4 GiB (reserved, untouched: as a CUDA build's libraries are) before
# the limit is set: the subject still gets its headroom, and no more.
_MAPPED_FIRST = textwrap.dedent(
    """
    import mmap, sys
    from harness.isolation.child import confine
    reserved = mmap.mmap(-1, 4 << 30, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS,
                         prot=mmap.PROT_READ)
    before = confine.mapped_bytes()
    confine.confine({"address_space_headroom_mb": 256})
    small = bytearray(100 << 20)  # within the headroom
    try:
        big = bytearray(512 << 20)
        print("ALLOCATED", before)
    except MemoryError:
        print("MEMORYERROR", before)
    """
)


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="RLIMIT_AS is Linux's")
def test_the_limit_is_headroom_over_what_the_worker_mapped():
    done = subprocess.run(
        [sys.executable, "-c", _MAPPED_FIRST],
        capture_output=True,
        text=True,
        cwd=ROOT,
        timeout=60,
    )
    assert done.returncode == 0, done.stderr
    verdict, before = done.stdout.split()
    assert int(before) > 4 * GIB, "the mapping came first"
    assert verdict == "MEMORYERROR", "the headroom still bounds the subject"


# A worker whose interpreter maps 4 GiB at start-up, before torch and the submission (what a
# CUDA build does at import), for a self-check's plain-subprocess workers.
_SITE = textwrap.dedent(
    """
    import mmap
    _reserved = mmap.mmap(-1, 4 << 30, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS,
                          prot=mmap.PROT_READ)
    """
)


def _xfmr(folder: Path, *argv: str, **env: str) -> subprocess.CompletedProcess:
    """`xfmr ARGV --tests` two quick shared tests, in `folder`, with a canary cache of its own."""
    env = dict(os.environ, **env, **{canary.CACHE: str(folder / "cache")})
    tests = ["--tests", "test_golden_torch,test_hand_example_noam"]
    command = [sys.executable, "-m", "harness", *argv, *tests]
    return subprocess.run(command, capture_output=True, text=True, env=env, cwd=folder, timeout=300)


@pytest.mark.slow
@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="RLIMIT_AS is Linux's")
def test_a_worker_that_maps_gigabytes_at_start_still_grades(tmp_path):
    site = tmp_path / "site"
    site.mkdir()
    (site / "sitecustomize.py").write_text(_SITE)
    done = _xfmr(tmp_path, "check", str(CORRECT), PYTHONPATH=str(site))
    assert done.returncode == 0, done.stdout + done.stderr
    assert "Score: 20/20" in done.stdout, done.stdout


@pytest.mark.slow
def test_workers_that_cannot_run_a_correct_model_are_a_grader_error(tmp_path):
    # 1 MiB of headroom: the worker cannot even map the submission's libraries; a correct
    # submission is not charged for it, and the grade says what to change
    done = _xfmr(tmp_path, "grade", str(CORRECT), "--memory-mb", "1", "--json", "g.json")
    assert done.returncode == 3, done.stdout + done.stderr
    assert "GRADER ERROR" in done.stdout and "--memory-mb" in done.stdout, done.stdout
    assert "nothing was charged" in done.stdout
    grade = json.loads((tmp_path / "g.json").read_text())
    assert grade["grader_error"].startswith("GRADER ERROR")
    assert not list((tmp_path / "cache").glob("*.json")), "a failed proof is not kept"


def test_a_grader_traceback_is_said_by_its_exception_not_its_first_line():
    """A failed proof whose grade broke the grader names the exception (the traceback's last
    line), so staff read what broke, not 'Traceback (most recent call last):'."""
    error = 'Traceback (most recent call last):\n  File "x.py", line 1\nOSError: the server closed'
    said = canary.reason(Grade("canary", [], error=error))
    assert "OSError: the server closed" in said and "most recent call" not in said
    said = canary.reason(Grade("canary", [], rejected="a first line\nand a second"))
    assert "a first line" in said and "a second" not in said
