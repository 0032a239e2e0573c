"""The container tier's sweeper from root (issue 39): a student's process that stops the sweeper's
helper, a process that stops itself, setsid daemons and a process that forks and exits in a loop
(a new pid every few microseconds) are all gone after one sweep(), which never raises.

The student is a throwaway uid of no account (a forked child drops to it with setresuid, as the
container tier's worker does), so these run on any Linux machine where the tests run as root;
the whole tier, in a simulated Gradescope container, is
tests/harness_tests/jobs/test_autograder.py's and
test_container_sweep_in_a_simulated_gradescope_container below.
"""

from __future__ import annotations

import dataclasses
import json
import os
import pwd
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from harness.isolation import container, tiers

needs_root = pytest.mark.skipif(
    os.geteuid() != 0 or sys.platform != "linux", reason="switching to a throwaway uid needs root"
)

# The student's processes, started by root dropping to the uid in argv[1]: a stopper that
# SIGSTOPs every process of its uid running kill(-1) (the old sweeper's helper, run as the
# student's uid, was one), a process that stops itself, a setsid sleeper, and, with argv[2] ==
# "hop", a chain that forks and exits in a loop. Each writes its role to argv[3] when it runs.
ATTACK = r"""
import os, signal, sys, time
uid, hop, marks = int(sys.argv[1]), sys.argv[2] == "hop", sys.argv[3]
os.setgroups([])
os.setresgid(uid, uid, uid)
os.setresuid(uid, uid, uid)

def mark(role):
    with open(os.path.join(marks, role), "w"):
        pass

def stopper():
    mark("stopper")
    me, needle = os.getpid(), b"kill(" + b"-1"  # not this very text: ours holds it
    while True:
        for entry in os.listdir("/proc"):
            if not entry.isdigit() or int(entry) == me:
                continue
            try:
                with open(f"/proc/{entry}/cmdline", "rb") as f:
                    if needle in f.read():
                        os.kill(int(entry), signal.SIGSTOP)
            except OSError:
                pass

def stopped():
    mark("stopped")
    os.kill(os.getpid(), signal.SIGSTOP)
    time.sleep(600)

def sleeper():
    mark("sleeper")
    time.sleep(600)

def hopper():
    mark("hopper")
    while True:
        if os.fork():
            os._exit(0)

roles = [stopper, stopped, sleeper] + ([hopper] if hop else [])
for role in roles:
    if os.fork() == 0:
        os.setsid()
        try:
            role()
        finally:
            os._exit(0)
"""


def throwaway_uid() -> int:
    """A uid of no account that no process runs as."""
    taken = {entry.pw_uid for entry in pwd.getpwall()}
    for entry in os.listdir("/proc"):
        try:
            status = Path(f"/proc/{entry}/status").read_text()
        except OSError:
            continue
        for line in status.splitlines():
            if line.startswith("Uid:"):
                taken.update(int(u) for u in line.split()[1:])
    # from a place of this process's own, so that two test sessions at once (CI beside a
    # developer's run) do not both take the first free one and sweep each other's processes
    first = 43000 + os.getpid() % 16000
    return next(u for u in [*range(first, 60000), *range(43000, first)] if u not in taken)


@pytest.fixture
def who() -> Iterator[container.Account]:
    """The throwaway student; whatever of it a failed test leaves is swept after."""
    uid = throwaway_uid()
    yield container.Account("throwaway", uid, uid)
    container.sweep(container.Account("throwaway", uid, uid), sys.executable, patience=30)


def attack(who: container.Account, hop: bool) -> None:
    """ATTACK's processes, as `who`, each running when this returns."""
    marks = Path(tempfile.mkdtemp(prefix="xfmr-sweep-marks-"))  # pytest's tmp_path is root's
    try:
        os.chmod(marks, 0o777)
        argv = [sys.executable, "-I", "-S", "-c", ATTACK, str(who.uid), "hop" if hop else ""]
        subprocess.run([*argv, str(marks)], check=True, timeout=30)
        roles = {"stopper", "stopped", "sleeper"} | ({"hopper"} if hop else set())
        deadline = time.monotonic() + 30
        while {p.name for p in marks.iterdir()} != roles:
            assert time.monotonic() < deadline, sorted(p.name for p in marks.iterdir())
            time.sleep(0.05)
    finally:
        shutil.rmtree(marks, ignore_errors=True)


@needs_root
def test_sweep_from_root_kills_a_stopper_a_stopped_process_and_a_forking_chain(who):
    attack(who, hop=True)
    assert len(container.running(who.uid)) >= 3
    begun = time.monotonic()
    left = container.sweep(who, sys.executable, patience=30)
    print(f"\nsweep: {time.monotonic() - begun:.2f} s")
    assert left == ""
    time.sleep(0.5)  # nothing was only hiding between two looks at /proc
    assert container.running(who.uid) == []


@needs_root
def test_root_alone_kills_what_a_stopper_would_stop(who, monkeypatch):
    """Without the kill(-1) helper (a container with no free uid for it), root's SIGKILL to each
    process /proc shows is enough for processes that do not fork: stopped ones die too."""
    monkeypatch.setattr(container, "_kill_all", lambda who, interpreter: "disabled here")
    attack(who, hop=False)
    assert container.sweep(who, sys.executable, patience=30) == ""
    time.sleep(0.5)
    assert container.running(who.uid) == []


def test_a_sweep_that_cannot_finish_says_so_and_never_raises(monkeypatch):
    monkeypatch.setattr(container, "running", lambda uid: [(4242, "survivor")])
    monkeypatch.setattr(container, "_kill_if_theirs", lambda pid, uid: None)
    monkeypatch.setattr(container, "_kill_all", lambda who, interpreter: "")
    who = container.Account("throwaway", 43210, 43210)
    left = container.sweep(who, sys.executable, patience=0.2)
    assert left.startswith("SWEEP FAILED: 1 processes of throwaway survived") and "4242" in left

    def broken(uid: int) -> list[tuple[int, str]]:
        raise PermissionError("/proc is not readable")

    monkeypatch.setattr(container, "running", broken)
    left = container.sweep(who, sys.executable, patience=0.2)
    assert "SWEEP FAILED" in left and "PermissionError" in left
    assert container.sweep_user(sys.executable, user="xfmr-no-such-user").startswith(
        "SWEEP FAILED: "
    )


def test_a_failed_final_sweep_is_said_in_every_report_and_the_grade_stands(
    tmp_path, monkeypatch, proven
):
    """grade()'s final sweep in the container tier (the workers here are stand-ins): its failure
    joins the grade's isolation text (text, JSON, Gradescope), never an exception, and the
    verdicts already judged stand."""
    from harness import grading
    from harness.jobs.grade import grade
    from harness.outcomes import Outcome
    from harness.records import Cell
    from harness.reports import grade as grade_report
    from harness.reports.gradescope import gradescope
    from harness.shared_tests.laws import SHARED_TESTS

    said = "SWEEP FAILED: 1 processes of xfmr-student survived 10 s of SIGKILL from root: 7 x"
    tests = SHARED_TESTS[:1]
    cells = {tests[0].name: Cell(Outcome.PASSED, "")}
    # the container tier's record, its workers' start a stand-in
    tier = dataclasses.replace(tiers.CONTAINER, start=lambda *a: (None, Path("/sandbox/input")))
    monkeypatch.setattr(grading, "run_subject_apart", lambda *a: (cells, [1.0]))
    monkeypatch.setattr(container, "sweep_user", lambda interpreter: said)
    submission = tmp_path / "transformer.py"
    submission.write_text("x = 1\n")
    g = grade(submission, tests, tier=tier)
    assert not g.error and g.passed and g.score == tests[0].points
    assert said in g.isolation
    assert said in grade_report.text(g)
    assert said in json.dumps(grade_report.to_json(g))
    results = gradescope(g)  # staff's: in the hidden test, never in what the student reads
    assert said not in results["output"] and said in results["tests"][-1]["output"]
    assert results["tests"][-1]["visibility"] == "hidden"


# --- the whole tier, in the simulated Gradescope container (slow: CI runs it) -----------------

# Appended to the correct example: at import, a setsid daemon of the student's user that SIGSTOPs
# every process of its uid running kill(-1) (the former sweeper's helper ran as that uid: the
# grade became "GRADER ERROR", 0/122, and this daemon survived), marking in /tmp that it ran and
# each stop that succeeded.
STOPPER = r'''

# --- appended: a daemon that stops the sweeper's helper ---------------------------------------
import subprocess as _subprocess
import sys as _sys

_STOP = """
import os, signal, time
me, needle = os.getpid(), b"kill(" + b"-1"
open("/tmp/xfmr-forger-ran-stopper-as-%d" % os.getuid(), "w").close()
end = time.time() + 300
while time.time() < end:
    for entry in os.listdir("/proc"):
        if not entry.isdigit() or int(entry) == me:
            continue
        try:
            with open("/proc/%s/cmdline" % entry, "rb") as f:
                if needle in f.read():
                    os.kill(int(entry), signal.SIGSTOP)
                    open("/tmp/xfmr-forger-ran-stopper-stopped-%s" % entry, "w").close()
        except OSError:
            pass
"""
_subprocess.Popen(
    [_sys.executable, "-c", _STOP],
    start_new_session=True,
    stdin=_subprocess.DEVNULL,
    stdout=_subprocess.DEVNULL,
    stderr=_subprocess.DEVNULL,
)
'''


@pytest.mark.slow
def test_a_student_that_stops_the_sweeper_in_a_simulated_gradescope_container(tmp_path):
    """Issue 39's attack where it was found: Docker's defaults (the container tier), one
    submission whose daemon stops the sweeper's helper. It gets its deserved score (the subset's
    three tests pass), no GRADER ERROR, a valid results.json, and nothing of the student's user
    runs after run_autograder."""
    ag = pytest.importorskip("test_autograder")  # the helpers beside this file
    from harness.jobs import simulated_container
    from harness.jobs.autograder_files import GRADESCOPE
    from harness.jobs.autograder_try import image, job

    if simulated_container.unavailable():
        pytest.skip(simulated_container.unavailable())
    files = tmp_path / "in" / "stopper"
    files.mkdir(parents=True)
    correct = (ag.ROOT / "examples" / "correct_submission.py").read_text()
    (files / "transformer.py").write_text(correct + STOPPER)
    ag.build(tmp_path / "subset.zip", "--tests", ag.SUBSET)
    built = image(tmp_path / "subset.zip", GRADESCOPE, "docker", tmp_path / "cache", rebuild=False)
    assert built.build.status == 0, built.build.output
    record = (built.folder / "root" / "autograder" / "source" / "isolation").read_text()
    assert record.splitlines()[0] == "container", record
    done = job(built.folder, GRADESCOPE, "docker", files)
    assert done.results, done.ran.output
    results = json.loads(done.results)
    ag.valid(results)
    marks = [name for name in done.ran.tmp if name.startswith("xfmr-forger-ran")]
    print(f"\nstopper: {results['score']:g} in {done.ran.seconds:.1f} s; marks {marks}")
    assert "GRADER ERROR" not in results["output"] and "SWEEP FAILED" not in results["output"]
    assert results["score"] == ag.SUBSET_POINTS, (results["output"], done.ran.output)
    assert done.ran.left == ()  # nothing of the student's user runs
    student = ag.student_uid(built.folder)
    assert f"xfmr-forger-ran-stopper-as-{student}" in marks, marks  # the attack did run
    assert not [m for m in marks if "-stopped-" in m], marks  # and stopped no helper
