"""What the grader itself spends on a submission outside the sandbox, and what every report says
about the sandbox's limits (issue 34's gaps after the per-worker cgroups):

- a grade's JSON report hashes the submission: links and special files skipped by name, files
  read in chunks, nothing past staging's caps read at all (a 1 GiB sparse file costs nothing);
- shipping a tree to a cluster (work.pack) and the rejection before staging (grade.rejection)
  look with lstat and count before reading anything;
- Gradescope's output, and every mutation score's and self-check's report, say which limit a
  sandbox lacks ("LIMITS MISSING: ...") or how the code ran (a self-check).
"""

from __future__ import annotations

import hashlib
import json
import os
import signal
from contextlib import contextmanager
from pathlib import Path

import pytest

from harness import grading
from harness.engine import work
from harness.isolation import staging, tiers
from harness.jobs import mutation_score as scoring
from harness.options import CONTAINER, SANDBOX, UNSAFE
from harness.outcomes import Outcome
from harness.records import Cell, Grade, SubjectRun, TestResult
from harness.reports import grade as grade_report
from harness.reports import score as score_report
from harness.reports.gradescope import gradescope

GIB = 1 << 30
MISSING = "LIMITS MISSING: no cgroup per worker (not here): no limit on a worker's memory"


@contextmanager
def deadline(seconds: int):
    """Fail, not hang, where a named pipe would be opened for reading."""

    def expired(signum, frame):
        raise TimeoutError(f"blocked for {seconds} s")

    old = signal.signal(signal.SIGALRM, expired)
    signal.alarm(seconds)
    try:
        yield
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, old)


@pytest.fixture
def reads(monkeypatch) -> list[int]:
    """The bytes every os.read returns from here on (the grader reading a submission)."""
    got: list[int] = []
    real = os.read

    def counted(fd: int, n: int) -> bytes:
        data = real(fd, n)
        got.append(len(data))
        return data

    monkeypatch.setattr(os, "read", counted)
    return got


def sparse(path: Path, size: int = GIB) -> None:
    fd = os.open(path, os.O_CREAT | os.O_WRONLY, 0o644)
    os.truncate(fd, size)
    os.close(fd)


def student_folder(tmp_path: Path) -> Path:
    folder = tmp_path / "student"
    folder.mkdir()
    (folder / "transformer.py").write_text("x = 1\n")
    return folder


# --- 1. the JSON report's sha256 ----------------------------------------------------------------


def test_the_hash_of_a_file_is_its_sha256_read_in_chunks(tmp_path, monkeypatch):
    path = tmp_path / "transformer.py"
    data = os.urandom(3 << 20) + b"tail"
    path.write_bytes(data)
    monkeypatch.setattr(grade_report, "_CHUNK", 1 << 16)
    sizes: list[int] = []
    real = os.read
    monkeypatch.setattr(os, "read", lambda fd, n: sizes.append(n) or real(fd, n))
    assert grade_report.hashed(path) == (hashlib.sha256(data).hexdigest(), "")
    assert max(sizes) <= 1 << 16 and len(sizes) > 40  # never the whole file at once


def test_a_huge_sparse_file_is_not_hashed_nor_read(tmp_path, reads):
    path = tmp_path / "transformer.py"
    sparse(path)
    digest, note = grade_report.hashed(path)
    assert digest == "" and grade_report.sha256_of(path) == ""
    assert "not hashed" in note and f"{GIB} bytes" in note and "64 MiB" in note, note
    folder = student_folder(tmp_path)
    sparse(folder / "weights.bin")
    digest, note = grade_report.hashed(folder)
    assert digest == "" and "weights.bin is 1073741824 bytes" in note, note
    assert sum(reads) == len("x = 1\n"), reads  # transformer.py's bytes only


def test_links_and_special_files_are_skipped_by_name_and_the_rest_hashed(tmp_path, reads):
    folder = student_folder(tmp_path)
    (folder / "pkg").mkdir()
    (folder / "pkg" / "helper.py").write_text("y = 2\n")
    os.mkfifo(folder / "pipe.py")  # opening it for reading would block forever
    (folder / "secret.py").symlink_to("/etc/passwd")
    with deadline(30):
        digest, note = grade_report.hashed(folder)
    assert "pipe.py is a named pipe" in note and "secret.py is a symbolic link" in note, note
    expected = hashlib.sha256()
    for name, text in (("pkg/helper.py", b"y = 2\n"), ("transformer.py", b"x = 1\n")):
        expected.update(len(name).to_bytes(8, "big") + name.encode())
        expected.update(hashlib.sha256(text).digest())
    assert digest == expected.hexdigest()  # the regular files, as a folder always hashed
    assert sum(reads) == 12  # and nothing else was read (not /etc/passwd)
    link = tmp_path / "link.py"
    link.symlink_to(folder / "transformer.py")
    assert grade_report.hashed(link)[0] == "" and "symbolic link" in grade_report.hashed(link)[1]


def test_the_json_report_says_what_the_hash_left_out(tmp_path):
    folder = student_folder(tmp_path)
    os.mkfifo(folder / "pipe.py")
    g = Grade(str(folder), [], "rejected: pipe.py is a named pipe", {}, 0.1, SANDBOX)
    with deadline(30):
        report = grade_report.to_json(g)
    assert len(report["sha256"]) == 64 and "pipe.py is a named pipe" in report["sha256_note"]
    clean = grade_report.to_json(replace_submission(g, folder / "transformer.py"))
    assert clean["sha256_note"] == ""


def replace_submission(g: Grade, path: Path) -> Grade:
    return Grade(str(path), g.tests, g.rejected, g.diagnosis, g.seconds, g.isolation)


# --- 2. Gradescope's output says which limit is missing ---------------------------------------


def one_test() -> list[TestResult]:
    return [TestResult("test_x", "law_x", Outcome.PASSED, 1.0, 1.0, "", 0.1, "visible")]


@pytest.mark.parametrize("tier", [SANDBOX, CONTAINER])
def test_gradescope_says_limits_missing_but_not_a_plain_tier(tier):
    plain = gradescope(Grade("s.py", one_test(), "", {}, 1.0, tier))
    assert tier not in plain["output"]
    assert len(plain["tests"]) == 1  # no staff notes, no staff test
    # said to staff only: in the one hidden test (tests/harness_tests/reports/test_staff_only.py)
    missing = gradescope(Grade("s.py", one_test(), "", {}, 1.0, f"{tier}; {MISSING}"))
    assert MISSING not in missing["output"] and missing["output"] == "1/1 tests passed"
    assert (
        missing["tests"][-1]["visibility"] == "hidden" and MISSING in missing["tests"][-1]["output"]
    )
    unsafe = gradescope(Grade("s.py", one_test(), "", {}, 1.0, UNSAFE))
    assert UNSAFE not in unsafe["output"] and UNSAFE in unsafe["tests"][-1]["output"]


# --- 3. shipping and rejecting: lstat and count before reading --------------------------------


def test_pack_refuses_a_huge_sparse_file_before_reading_it(tmp_path, reads):
    folder = student_folder(tmp_path)
    sparse(folder / "weights.bin")
    with pytest.raises(work.TooLarge, match="weights.bin is 1073741824 bytes"):
        work.pack(folder)
    assert sum(reads) <= len("x = 1\n"), reads


def test_pack_counts_entries_as_they_are_listed(tmp_path, monkeypatch):
    monkeypatch.setattr(work, "MAX_ENTRIES", 50)
    folder = student_folder(tmp_path)
    for i in range(60):
        (folder / f"f{i}.txt").touch()
    with pytest.raises(work.TooLarge, match="more than 50 files and folders"):
        work.pack(folder)


def test_pack_keeps_special_files_and_links_unopened(tmp_path):
    folder = student_folder(tmp_path)
    os.mkfifo(folder / "pipe.py")
    (folder / "link.py").symlink_to("/etc/passwd")
    with deadline(30):
        tree = work.pack(folder)
    assert tree["dir"]["pipe.py"] == {"special": True}
    assert tree["dir"]["link.py"] == {"link": "/etc/passwd"}
    assert tree["dir"]["transformer.py"] == {"file": b"x = 1\n"}


def test_pack_stops_a_file_that_grows_past_the_cap_while_read(tmp_path, monkeypatch):
    folder = student_folder(tmp_path)
    monkeypatch.setattr(work, "MAX_SHIPPED", 1 << 20)
    grows = folder / "grows.py"
    grows.write_bytes(b"#" * 1000)
    real_open = staging.open_regular

    def opened_then_grown(path, where, expected=None):
        fd = real_open(path, where, expected)
        if path.name == "grows.py":  # between the size check and the reading
            with open(path, "ab") as f:
                f.write(b"#" * (2 << 20))
        return fd

    monkeypatch.setattr(work, "open_regular", opened_then_grown)
    with pytest.raises(work.TooLarge, match="past the cap"):
        work.pack(folder)


@pytest.fixture
def never_parsed(monkeypatch):
    """The static check (which reads the .py files) must not be reached."""

    def refuse(path):
        raise AssertionError(f"the static check read {path}")

    monkeypatch.setattr(grading, "check_submission", refuse)


def test_rejection_refuses_a_huge_sparse_file_unread(tmp_path, reads, never_parsed):
    folder = student_folder(tmp_path)
    sparse(folder / "weights.bin")
    said = grading.rejection(folder / "transformer.py", folder)
    assert said.startswith("rejected: weights.bin is 1073741824 bytes") and "64 MiB" in said
    assert reads == []
    lone = tmp_path / "huge.py"
    sparse(lone)
    assert "huge.py is 1073741824 bytes" in grading.rejection(lone)


def test_rejection_refuses_special_files_and_links_unopened(tmp_path, never_parsed):
    folder = student_folder(tmp_path)
    os.mkfifo(folder / "helper.py")
    with deadline(30):
        said = grading.rejection(folder / "transformer.py", folder)
    assert said == (
        "rejected: helper.py is a named pipe, not a regular file or folder; submissions may "
        "hold none"
    )
    (folder / "helper.py").unlink()
    (folder / "sub").mkdir()
    (folder / "sub" / "x.py").symlink_to("/etc/passwd")
    assert "sub/x.py is a symbolic link" in grading.rejection(folder / "transformer.py", folder)


def test_rejection_counts_a_folder_before_listing_it_whole(tmp_path, monkeypatch, never_parsed):
    folder = student_folder(tmp_path)
    (folder / "data").mkdir()
    for i in range(staging.MAX_ENTRIES + 1):
        (folder / "data" / f"f{i}.py").touch()
    said = grading.rejection(folder / "transformer.py", folder)
    assert said == (
        f"rejected: the submission holds more than {staging.MAX_ENTRIES} files and folders: "
        "submit source"
    )
    # a folder of many modules and no transformer.py: submitted() and rejection() list at
    # most MAX_ENTRIES + 1 names of it
    listed: list[int] = []
    real = grading.os.scandir

    class Counting:
        def __init__(self, path):
            self.inner = real(path)

        def __enter__(self):
            return self

        def __exit__(self, *exc):
            self.inner.close()

        def __iter__(self):
            for entry in self.inner:
                listed.append(1)
                yield entry

    monkeypatch.setattr(grading.os, "scandir", Counting)
    crowd = folder / "data"
    assert grading.submitted(crowd) == crowd
    said = grading.rejection(crowd, None)
    assert f"more than {staging.MAX_ENTRIES} entries" in said, said
    assert len(listed) <= 2 * (staging.MAX_ENTRIES + 1)


# --- 4. a mutation score's and a self-check's reports say how the code ran --------------------


class Instant:
    """An executor whose every unit is a suite run of one test that passes."""

    width, description = 1, "instant"

    def run(self, units, done=None):
        runs = []
        for i, _ in enumerate(units):
            r = SubjectRun({"t.py::test_a": Cell(Outcome.PASSED, "")}, ["t.py::test_a"])
            runs.append(r)
            if done is not None:
                done(i, r)
        return runs

    def close(self):
        pass


def every_report(s, tests_dir: Path) -> dict[str, str]:
    return {
        "text": score_report.text(s, str(tests_dir)),
        "json": json.dumps(score_report.to_json(s)),
        "gradescope": json.dumps(score_report.gradescope(s)),  # staff notes in a hidden test
        "stryker": json.dumps(score_report.stryker(s, str(tests_dir))),
    }


@pytest.mark.slow
def test_every_report_of_a_mutation_score_says_which_limit_is_missing(tmp_path, monkeypatch):
    monkeypatch.setattr(tiers.Tier, "limits_problem", lambda tier: MISSING)
    s = scoring.mutation_score(tmp_path, executor=Instant(), generated=0)
    assert s.isolation == f"{SANDBOX}; {MISSING}"
    for name, report in every_report(s, tmp_path).items():
        assert MISSING in report, name
    monkeypatch.setattr(tiers.Tier, "limits_problem", lambda tier: "")
    s = scoring.mutation_score(tmp_path, executor=Instant(), generated=0)
    assert s.isolation == SANDBOX and "LIMITS MISSING" not in json.dumps(every_report(s, tmp_path))
    s = scoring.mutation_score(tmp_path, executor=Instant(), generated=0, tier=tiers.UNSAFE)
    assert all(UNSAFE in r for r in every_report(s, tmp_path).values())


def test_every_report_of_a_suite_self_check_says_it_is_one(tmp_path, monkeypatch):
    from harness.students import selfcheck

    def run_suite_on(source, tests_dir, module_name, time_limit, memory_mb=2048, stop=()):
        return SubjectRun({"t.py::test_a": Cell(Outcome.PASSED, "")}, ["t.py::test_a"])

    monkeypatch.setattr(selfcheck, "run_suite_on", run_suite_on)
    s = selfcheck.suite_check(tmp_path, generated=0)
    assert s.isolation == selfcheck.SELF_CHECK
    assert json.loads(json.dumps(score_report.to_json(s)))["isolation"] == selfcheck.SELF_CHECK
    text = selfcheck.suite_text(s, str(tmp_path)).splitlines()
    assert text[0].startswith("Self-check: Mutation score") and text[1] == selfcheck.SELF_CHECK
    assert text.count(selfcheck.SELF_CHECK) == 1
