"""Hostile submissions against the host's resources, in the real sandbox (issue 34): a folder
holding a named pipe, a folder holding a huge sparse file, a /dev/shm fill and a memfd fill.

Each is graded by the command line in a process of its own with a timeout (the grader must never
hang), and each ends with the score it deserves, a report saying why, and nothing left behind:
no process, no staged copy, no cgroup. The memory fills never cost the host more than the
documented figures (Limits.shm_mb for /dev/shm, Limits.ram_mb for anything else).
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from contextlib import contextmanager
from pathlib import Path

import pytest

from harness.grading import rejection
from harness.isolation import cgroups, sandbox, staging, static_check, tiers
from harness.isolation.limits import DEFAULT_LIMITS
from harness.jobs.grade import grade
from harness.shared_tests.laws import BY_NAME

pytestmark = pytest.mark.slow  # a few grades in real sandboxes

ROOT = Path(__file__).resolve().parents[3]
HOSTILE = Path(__file__).parent / "hostile"
NOAM = "test_hand_example_noam"
GOLDEN = "test_golden_torch"
GRADE_TIMEOUT = 240  # a whole grade of two tests: a hang is a failure, never a stuck suite


@contextmanager
def deadline(seconds: int):
    """Fail (not hang) an in-process step that blocks longer than `seconds` (SIGALRM interrupts
    a blocking open() of a named pipe in this thread)."""

    def expired(signum, frame):
        raise TimeoutError(f"blocked for {seconds} s: the grader hangs")

    old = signal.signal(signal.SIGALRM, expired)
    signal.alarm(seconds)
    try:
        yield
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, old)


def torch_copy() -> str:
    return (ROOT / "impl" / "torch_copy.py").read_text()


def graded(submission: Path, tmp: Path, tests: str) -> dict:
    """`xfmr grade submission --json` in a process of its own, its stages under tmp/stages:
    the report, with what the run left behind."""
    stages = tmp / "stages"
    stages.mkdir()
    report = tmp / "grade.json"
    cmd = [sys.executable, "-m", "harness.cli", "grade", str(submission), "--json", str(report)]
    cmd += ["--tests", tests]
    start = time.monotonic()
    proc = subprocess.Popen(
        cmd,
        cwd=ROOT,
        env={**os.environ, "TMPDIR": str(stages)},
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        out, err = proc.communicate(timeout=GRADE_TIMEOUT)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.communicate()
        pytest.fail(f"the grader hung on {submission.name} for {GRADE_TIMEOUT} s")
    return {
        "status": proc.returncode,
        "stderr": err,
        "stdout": out,
        "seconds": time.monotonic() - start,
        "report": json.loads(report.read_text()) if report.is_file() else None,
        "processes": processes_naming(str(stages).encode()),
        "stages": sorted(p.name for p in stages.glob("xfmr-stage-*")),
        "cgroups": cgroups_of(proc.pid),
    }


def processes_naming(marker: bytes) -> list[str]:
    found = []
    for pid in os.listdir("/proc"):
        if pid.isdigit() and int(pid) != os.getpid():
            try:
                cmd = Path(f"/proc/{pid}/cmdline").read_bytes()
                state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
            except OSError:
                continue
            if state != "Z" and marker in cmd:
                found.append(cmd.replace(b"\0", b" ").decode(errors="replace")[:200])
    return found


def cgroups_of(pid: int) -> list[str]:
    """The cgroups a grader of this pid made that still exist."""
    try:
        place = cgroups.locate()
    except cgroups.CgroupUnavailable:
        return []
    prefix = f"{cgroups.PREFIX}{pid}-"
    return sorted(str(p) for _, parent in place.parents for p in parent.glob(f"{prefix}*"))


def by_name(report: dict) -> dict[str, dict]:
    return {t["name"]: t for t in report["tests"]}


def assert_nothing_left(run: dict) -> None:
    assert run["processes"] == [], run["processes"]
    assert run["stages"] == [], run["stages"]
    assert run["cgroups"] == [], run["cgroups"]
    assert "Traceback" not in run["stderr"], run["stderr"]


def needs_cgroups() -> None:
    if cgroups.problem():
        pytest.skip(f"no cgroup can be made here: {cgroups.problem()}")


# --- folders ---------------------------------------------------------------------------------


def test_a_folder_with_a_named_pipe_is_rejected_not_hung(tmp_path):
    folder = tmp_path / "student"
    folder.mkdir()
    (folder / "transformer.py").write_text(torch_copy())
    os.mkfifo(folder / "helper.py")  # opening it for reading blocks until a writer comes
    run = graded(folder, tmp_path, NOAM)
    report = run["report"]
    assert run["status"] == 1 and report is not None, run["stderr"]
    assert "helper.py is a named pipe" in report["rejected"], report["rejected"]
    assert report["score"] == 0 and all(t["score"] == 0 for t in report["tests"])
    assert_nothing_left(run)


def test_a_folder_with_a_huge_sparse_file_is_rejected_unread(tmp_path):
    folder = tmp_path / "student"
    folder.mkdir()
    (folder / "transformer.py").write_text(torch_copy())
    subprocess.run(["truncate", "-s", "1G", str(folder / "weights.bin")], check=True)
    run = graded(folder, tmp_path, NOAM)
    report = run["report"]
    assert run["status"] == 1 and report is not None, run["stderr"]
    said = report["rejected"]
    assert "weights.bin is 1073741824 bytes" in said and "64 MiB" in said, said
    assert report["score"] == 0
    assert_nothing_left(run)


def test_a_sparse_file_is_refused_before_a_byte_of_it_is_read(tmp_path, monkeypatch):
    # never expanded: the copy checks the apparent size first; nothing lands on the host's disk
    folder = tmp_path / "student"
    folder.mkdir()
    (folder / "transformer.py").write_text("x = 1\n")
    os.truncate(os.open(folder / "weights.bin", os.O_CREAT | os.O_WRONLY, 0o644), 1 << 30)
    read = []
    real = os.read

    def counted(fd: int, n: int) -> bytes:
        data = real(fd, n)
        read.append(len(data))
        return data

    monkeypatch.setattr(staging.os, "read", counted)
    monkeypatch.setattr(staging.tempfile, "tempdir", str(tmp_path))
    with deadline(30), pytest.raises(staging.UnsafeInput, match="past the cap of 64 MiB"):
        with staging.staged({"student": folder}):
            pass
    assert sum(read) == len("x = 1\n"), read  # transformer.py's bytes only
    assert not list(tmp_path.glob("xfmr-stage-*"))


def test_the_static_check_never_opens_a_special_file_or_reads_a_huge_one(tmp_path):
    folder = tmp_path / "student"
    folder.mkdir()
    (folder / "transformer.py").write_text("x = 1\n")
    os.mkfifo(folder / "helper.py")
    big = folder / "big.py"
    big.touch()
    os.truncate(big, 1 << 30)
    with deadline(30):
        found = static_check.check_submission(folder)
        said = rejection(folder / "transformer.py", folder)
    assert found == [
        f"big.py does not parse (it is {1 << 30} bytes; the check parses a source "
        "file of at most 1 MiB)"
    ], found
    # rejection() refuses it by its size before the static check reads anything
    assert "big.py is 1073741824 bytes, past the cap of 64 MiB" in said, said


def test_a_submission_past_the_file_count_is_refused(tmp_path):
    folder = tmp_path / "student"
    folder.mkdir()
    for i in range(staging.MAX_ENTRIES + 1):
        (folder / f"f{i}.txt").touch()
    with pytest.raises(staging.UnsafeInput, match=f"more than {staging.MAX_ENTRIES} files"):
        with staging.staged({"student": folder}):
            pass


def test_a_file_that_grows_past_the_cap_while_copied_is_cut_off(tmp_path, monkeypatch):
    monkeypatch.setattr(staging, "MAX_BYTES", 1 << 20)
    source = tmp_path / "grows.py"
    source.write_bytes(b"#" * 1000)
    real = os.read

    def growing(fd, n):  # the file grows behind the fstat: the copy still stops at the cap
        if os.fstat(fd).st_size < (4 << 20):
            with open(source, "ab") as f:
                f.write(b"#" * (1 << 20))
        return real(fd, n)

    monkeypatch.setattr(staging.os, "read", growing)
    with pytest.raises(staging.UnsafeInput, match="past the cap"):
        with staging.staged({"grows.py": source}):
            pass


# --- memory outside the address-space limit ---------------------------------------------------


def overlay(name: str, folder: Path) -> Path:
    path = folder / f"{name}.py"
    path.write_text(torch_copy() + "\n\n" + (HOSTILE / f"{name}.py").read_text())
    return path


def test_a_dev_shm_fill_stops_at_its_size(tmp_path):
    run = graded(overlay("resource_shm_fill", tmp_path), tmp_path, f"{NOAM},{GOLDEN}")
    report = run["report"]
    assert report is not None, run["stderr"]
    tests = by_name(report)
    noam = tests[NOAM]
    assert noam["score"] == 0 and "No space left on device" in noam["message"], noam
    assert tests[GOLDEN]["outcome"] == "passed", tests[GOLDEN]  # grading went on
    assert_nothing_left(run)


def test_a_memfd_fill_is_stopped_by_the_cgroup(tmp_path):
    needs_cgroups()
    run = graded(overlay("resource_memfd_fill", tmp_path), tmp_path, f"{NOAM},{GOLDEN}")
    report = run["report"]
    assert report is not None, run["stderr"]
    tests = by_name(report)
    noam = tests[NOAM]
    assert noam["score"] == 0 and noam["outcome"] in ("killed", "error"), noam
    said = noam["message"]
    ram = DEFAULT_LIMITS.ram_mb
    assert f"memory limit of {ram} MiB" in said, said
    peak = int(said.split("(peak ", 1)[1].split(" MiB", 1)[0])
    assert peak <= ram < 4096, said  # below the 4 GiB it tried: the host lost <= ram
    assert tests[GOLDEN]["outcome"] == "passed", tests[GOLDEN]  # a fresh sandbox went on
    assert_nothing_left(run)


# --- the trial sandbox proves the limits --------------------------------------------------------


def test_a_cgroup_that_does_not_hold_the_sandbox_is_refused(monkeypatch):
    # the group is made but the sandbox is not put in it: the trial's memfd fill is not stopped
    needs_cgroups()
    monkeypatch.setattr(cgroups.Cgroup, "wrap", lambda self, argv: argv)
    monkeypatch.setattr(sandbox, "_CHECKED", None)
    before = set(cgroups.leftovers())  # groups of this process's other workers, if any are live
    with deadline(120), pytest.raises(sandbox.SandboxUnavailable, match="does not hold"):
        sandbox.check()
    assert set(cgroups.leftovers()) <= before  # the trial's group is gone


def test_without_cgroups_memfd_is_refused_and_every_report_says_so(monkeypatch, tmp_path):
    monkeypatch.setattr(cgroups, "problem", lambda: "no cgroup in this test")
    monkeypatch.setattr(sandbox, "_CHECKED", None)
    with deadline(120):
        sandbox.check()  # the trial shows memfd_create refused and /dev/shm bounded
    assert "LIMITS MISSING" in tiers.SANDBOX.limits_problem()
    assert "no cgroup in this test" in tiers.CONTAINER.limits_problem()
    with deadline(200):
        g = grade(overlay("resource_memfd_fill", tmp_path), [BY_NAME[NOAM]])
    assert "LIMITS MISSING" in g.isolation and "no cgroup in this test" in g.isolation
    [noam] = g.tests
    assert noam.score == 0 and "Operation not permitted" in noam.message, noam.message
    monkeypatch.setattr(sandbox, "_CHECKED", None)  # the next test's check runs with cgroups


# --- the cgroup module on both hierarchies ----------------------------------------------------


def test_cgroup_v2_and_v1_are_located_under_the_graders_own_group(tmp_path):
    v2 = tmp_path / "v2"
    (v2 / "grader").mkdir(parents=True)
    (v2 / "cgroup.controllers").write_text("cpu memory pids\n")
    (v2 / "grader" / "cgroup.controllers").write_text("memory pids\n")
    proc = tmp_path / "cgroup"
    proc.write_text("0::/grader\n")
    place = cgroups.locate(v2, proc)
    assert place.version == 2 and dict(place.parents) == {
        "memory": v2 / "grader",
        "pids": v2 / "grader",
    }
    (v2 / "grader" / "cgroup.controllers").write_text("cpu\n")
    with pytest.raises(cgroups.CgroupUnavailable, match="not delegated"):
        cgroups.locate(v2, proc)
    v1 = tmp_path / "v1"
    for controller in ("memory", "pids"):
        (v1 / controller / "a").mkdir(parents=True)
        (v1 / controller / "cgroup.procs").touch()
    proc.write_text("4:memory:/a\n8:pids:/\n0::/\n")
    place = cgroups.locate(v1, proc)
    assert place.version == 1
    assert dict(place.parents) == {"memory": v1 / "memory" / "a", "pids": v1 / "pids"}
    with pytest.raises(cgroups.CgroupUnavailable, match="no cgroup v1 memory"):
        cgroups.locate(tmp_path / "nothing", proc)


def test_a_real_cgroup_holds_its_limits_and_leaves_nothing(tmp_path):
    needs_cgroups()
    before = set(cgroups.leftovers())
    group = cgroups.create(64 << 20, 8)
    assert group.limit() == 64 << 20 and group.pids_limit() == 8
    fill = (
        "import os\nfd = os.memfd_create('x')\nfor _ in range(16): os.write(fd, b'1' * (16 << 20))"
    )
    done = subprocess.run(group.wrap([sys.executable, "-c", fill]), timeout=60)
    assert done.returncode == -signal.SIGKILL and group.oom_kills() == 1
    assert group.peak() <= 64 << 20
    assert group.remove() and set(cgroups.leftovers()) <= before
    assert group.remove()  # the folders are gone: a second remove is harmless
