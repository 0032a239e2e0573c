"""The next self-check's draws, prepared while the student edits (harness.students.draws_ahead):
a folder is ready whole or not at all, claimed by one check only, never made ready where the
known-correct model failed, and the check that claims it runs on its secret."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

from harness.records import Grade
from harness.shared_tests import bounds_store
from harness.shared_tests.inputs import draw_secret, set_draw_secret
from harness.students import draws_ahead

ROOT = Path(__file__).resolve().parents[3]
CORRECT = ROOT / "examples" / "correct_submission.py"


class Graded:
    """A grade's stand-in: passed, no error."""

    def __init__(self, passed: bool) -> None:
        self.passed, self.error = passed, ""


def fake_check(passed: bool, seen: list):
    def check(model: Path, bounds: Path) -> Grade:
        # what a check keeps: a bound file in the folder it was given, under the secret drawn
        seen.append((model.read_text(), draw_secret(), bounds_store.folder()))
        # the model sits in a private folder inside the preparation's own (swept with it)
        assert model.parent.parent == bounds and model.parent.stat().st_mode & 0o077 == 0
        bounds_store.save(bounds / "kept.npz", (np.ones(2), 1.0))
        return Graded(passed)  # type: ignore[return-value]

    return check


@pytest.fixture
def fixed_secret():
    before = draw_secret()
    yield
    set_draw_secret(before)


def test_a_ready_draw_is_claimed_once_and_sets_the_secret(tmp_path, monkeypatch, fixed_secret):
    monkeypatch.delenv(draws_ahead.SEED_VARIABLE, raising=False)
    root, store, seen = tmp_path / "draws", tmp_path / "bounds", []
    ready = draws_ahead.prepare(root, fake_check(True, seen))
    assert ready is not None and ready.name.startswith(draws_ahead.READY)
    secret = json.loads((ready / draws_ahead.DRAW_FILE).read_text())["secret"]
    ((model, drawn, _),) = seen
    assert drawn == secret and "class Transformer" in model  # the known-correct model
    assert [p.name for p in ready.iterdir() if p.is_dir()] == []  # and is gone once ready
    before = draw_secret()
    with draws_ahead.claimed(root, store) as got:
        assert got and draw_secret() == secret
        assert (store / "kept.npz").is_file()  # its bounds where the check looks
        with draws_ahead.claimed(root, store) as again:  # a second check finds none
            assert not again and draw_secret() == secret
    assert draw_secret() == before  # restored after
    assert list(root.iterdir()) == []  # the claimed folder is gone


def test_a_draw_the_correct_model_fails_is_never_ready(tmp_path, fixed_secret):
    root, seen = tmp_path / "draws", []
    assert draws_ahead.prepare(root, fake_check(False, seen)) is None
    assert len(seen) == 1 and list(root.iterdir()) == []


def test_a_fixed_secret_claims_nothing(tmp_path, monkeypatch, fixed_secret):
    root = tmp_path / "draws"
    draws_ahead.prepare(root, fake_check(True, []))
    monkeypatch.setenv(draws_ahead.SEED_VARIABLE, "7")
    with draws_ahead.claimed(root, tmp_path / "bounds") as got:
        assert not got
    assert len(list(root.glob(f"{draws_ahead.READY}*"))) == 1
    assert not draws_ahead.prepare_next(root)  # nor prepares one


def test_what_dead_processes_left_is_swept_and_only_a_preparation_is_stopped(tmp_path, monkeypatch):
    """A preparation is known by the lock it holds on its folder's LOCK_FILE, never by its id
    alone: a live one is stopped with SIGKILL (even one that ignores SIGTERM, as a child does
    where a CI runner or a shell's `trap '' TERM` left it ignored); a folder whose lock nobody
    holds is swept, and the process now bearing its id (a bystander) is never signalled."""
    monkeypatch.delenv(draws_ahead.SEED_VARIABLE, raising=False)
    root = tmp_path / "draws"
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    live = root / f"{draws_ahead.PREPARING}PID-0001"
    holder = (
        "import fcntl, signal, sys, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); "
        "f = open(sys.argv[1], 'w'); fcntl.flock(f, fcntl.LOCK_EX); print('held', flush=True); "
        "time.sleep(60)"
    )
    live.mkdir(parents=True)
    preparation = subprocess.Popen(
        [sys.executable, "-c", holder, str(live / draws_ahead.LOCK_FILE)],
        stdout=subprocess.PIPE, text=True,
    )  # fmt: skip
    bystander = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        assert preparation.stdout is not None and preparation.stdout.readline() == "held\n"
        live = live.rename(root / f"{draws_ahead.PREPARING}{preparation.pid}-0001")
        for prefix in (draws_ahead.PREPARING, draws_ahead.CLAIMED):
            (root / f"{prefix}{dead.pid}-00ff").mkdir(parents=True)
        # a dead preparation's folder, its lock file left behind, its id now the bystander's
        reused = root / f"{draws_ahead.PREPARING}{bystander.pid}-0002"
        reused.mkdir()
        (reused / draws_ahead.LOCK_FILE).touch()
        live_claim = root / f"{draws_ahead.CLAIMED}{os.getpid()}-0003"
        live_claim.mkdir()
        assert draws_ahead._running(live) and not draws_ahead._running(reused)
        with draws_ahead.claimed(root, tmp_path / "bounds") as got:
            assert not got
        assert preparation.wait(timeout=30) == -signal.SIGKILL  # the check needs the CPU
        assert bystander.poll() is None  # never signalled
        left = sorted(p.name for p in root.iterdir())
        # the stopped preparation's folder goes at the next sweep; the live claim stays
        assert live_claim.name in left and not any(str(dead.pid) in n for n in left)
        assert not any(str(bystander.pid) in n for n in left)
        draws_ahead._sweep(root)
        assert sorted(p.name for p in root.iterdir()) == [live_claim.name]
    finally:
        for p in (preparation, bystander):
            p.kill()
            p.wait()


def test_a_preparation_holds_its_lock_while_it_runs_and_leaves_none(tmp_path, fixed_secret):
    """While the check runs, the preparation's folder reads as running (its lock held by this
    process); afterwards nothing holds it and no starting folder is left."""
    root, seen = tmp_path / "draws", []

    def check(model: Path, bounds: Path) -> Grade:
        seen.append(draws_ahead._running(bounds))
        return Graded(True)  # type: ignore[return-value]

    ready = draws_ahead.prepare(root, check)
    assert seen == [True] and ready is not None
    assert not draws_ahead._running(ready)
    assert [p.name for p in root.iterdir()] == [ready.name]


@pytest.mark.slow
def test_xfmr_check_prepares_the_next_checks_draws(tmp_path):
    """From outside, as a student runs it: the first check leaves a ready draw behind (the
    known-correct model checked on it in the background), the second claims it and passes."""
    env = {
        **os.environ,
        "XFMR_CHECK_CACHE": str(tmp_path),
        "XFMR_CHECK_AHEAD": "1",
        "XFMR_RUNTIME_DIR": str(tmp_path / "run"),
    }
    env.pop(draws_ahead.SEED_VARIABLE, None)
    command = [sys.executable, "-m", "harness", "check", str(CORRECT)]
    try:
        first = subprocess.run(command, env=env, capture_output=True, text=True, timeout=300)
        assert first.returncode == 0, first.stdout + first.stderr
        draws = tmp_path / "draws"
        deadline = time.monotonic() + 180
        while not list(draws.glob(f"{draws_ahead.READY}*")) and time.monotonic() < deadline:
            time.sleep(0.5)
        (ready,) = draws.glob(f"{draws_ahead.READY}*")
        kept = {p.name for p in ready.glob("*.npz")}
        assert len(kept) >= 10  # every bound of the correct model's check
        second = subprocess.run(command, env=env, capture_output=True, text=True, timeout=300)
        assert second.returncode == 0, second.stdout + second.stderr
        assert not ready.exists()  # claimed and gone
        assert kept <= {p.name for p in (tmp_path / "bounds").glob("*.npz")}
    finally:
        subprocess.run(
            [sys.executable, "-m", "harness", "warm-server", "stop"], env=env, timeout=60
        )
        for busy in (tmp_path / "draws").glob(f"{draws_ahead.PREPARING}*"):
            pid = int(busy.name[len(draws_ahead.PREPARING) :].split("-")[0])
            try:
                os.kill(pid, 9)
            except ProcessLookupError:
                pass
