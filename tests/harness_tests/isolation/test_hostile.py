"""Hostile submissions and suites (tests/harness_tests/isolation/hostile/) against the real
sandbox: each ends in the grade it deserves with a clear reason, in bounded time, and leaves the
grader, the machine, the project and the reports unharmed. One `xfmr grade-batch` grades every
submission at once, as a course would, with a correct classmate among them.

What "unharmed" means here, checked around the batch: no file of the project, of site-packages,
of the grader's working directory or of /root changed; no process of the batch left; every
report written by the grader and only by it; no traceback of the grader's own.
"""

from __future__ import annotations

import ast
import csv
import ctypes
import hashlib
import json
import os
import re
import secrets
import subprocess
import sys
import sysconfig
import tempfile
import time
from contextlib import contextmanager
from pathlib import Path

import pytest

from harness.cli import main
from harness.jobs.grade import grade
from harness.jobs.mutation_score import mutation_score
from harness.outcomes import Outcome
from harness.shared_tests.laws import BY_NAME
from harness.subjects import module_source

pytestmark = pytest.mark.slow  # one grade-batch of 18 submissions and two mutation scores

ROOT = Path(__file__).resolve().parents[3]
HOSTILE = Path(__file__).parent / "hostile"
# The schedule (every overlay's real fault), the golden forward pass (where most attacks fire)
# and causality (the blind decoder's law). 8 s per test bounds a hang; each takes under 1 s.
# Loading keeps its own limit (a fresh sandbox imports torch in 2-4 s, past 8 s under load).
TESTS = "test_hand_example_noam,test_golden_torch,test_decoder_is_causal"
TIME_LIMIT = "8"
SLEEPER = b"4242.5"  # hostile_detached's grandchild: `sleep 4242.5`


def overlay(name: str, folder: Path, **fill: str) -> Path:
    """A submission: the torch copy with the hostile overlay appended."""
    return standalone(name, folder, (ROOT / "impl" / "torch_copy.py").read_text() + "\n\n", **fill)


def standalone(name: str, folder: Path, prefix: str = "", **fill: str) -> Path:
    text = prefix + (HOSTILE / f"{name}.py").read_text()
    for key, value in fill.items():
        text = text.replace(f"__{key}__", value)
    path = folder / f"{name}.py"
    path.write_text(text)
    return path


def snapshot() -> dict[str, str]:
    """What no submission may change: the project's files (git's view), site-packages' listing,
    the grader's working directory and /root's dot files."""
    git = subprocess.run(
        ["git", "status", "--porcelain", "--untracked-files=all"],
        cwd=ROOT,
        capture_output=True,
        text=True,
    ).stdout
    tracked = subprocess.run(
        ["git", "ls-files", "-s"], cwd=ROOT, capture_output=True, text=True
    ).stdout
    digest = hashlib.sha256()
    for line in tracked.splitlines():
        path = ROOT / line.split("\t", 1)[1]
        if path.is_file():
            digest.update(path.read_bytes())
    site = sysconfig.get_paths()["purelib"]
    root_files = {p.name: p.read_bytes() for p in Path("/root").glob(".*") if p.is_file()}
    return {
        "git status": git,
        "tracked files": digest.hexdigest(),
        "site-packages": "\n".join(sorted(os.listdir(site))),
        "cwd": "\n".join(sorted(os.listdir(os.getcwd()))),
        "/root": hashlib.sha256(repr(sorted(root_files.items())).encode()).hexdigest(),
    }


@contextmanager
def own_stages(folder: Path):
    """Stage this run's sandbox inputs under `folder`, so that its sandboxes (whose command
    lines name their stage) can be told from any other run's on the machine."""
    old = tempfile.tempdir
    tempfile.tempdir = str(folder)
    try:
        yield str(folder).encode()
    finally:
        tempfile.tempdir = old


def leftovers(marker: bytes) -> list[str]:
    """Processes of this run still alive: a sandbox (its command line names the run's stage
    folder), or hostile_detached's grandchild."""
    found = []
    for pid in os.listdir("/proc"):
        if pid.isdigit() and int(pid) != os.getpid():
            try:
                cmd = Path(f"/proc/{pid}/cmdline").read_bytes()
                state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
            except OSError:
                continue
            if state != "Z" and (marker in cmd or SLEEPER in cmd):
                found.append(cmd.replace(b"\0", b" ").decode(errors="replace")[:200])
    return found


TARGETS: dict[str, str] = {}  # attack_escape's write targets, by its labels


def escape_targets(fill: dict[str, str]) -> dict[str, str]:
    """The paths attack_escape writes to (as it computes them inside), by label."""
    site = sysconfig.get_paths()["purelib"]
    return {
        "tasks/addition.py": f"{fill['PROJECT']}/tasks/addition.py",
        "expected_matrix.json": f"{fill['PROJECT']}/harness/data/expected_matrix.json",
        "site .pth": f"{site}/xfmr_evil.pth",
        "usercustomize": f"{site}/usercustomize.py",
        "grader cwd conftest": f"{fill['GRADER_CWD']}/conftest.py",
        "grader cwd sitecustomize": f"{fill['GRADER_CWD']}/sitecustomize.py",
        "root bashrc": "/root/.bashrc",
        "report": fill["REPORT"],
    }


@pytest.fixture(scope="module")
def batch(tmp_path_factory):
    """Every hostile submission and one correct classmate, graded by one `xfmr grade-batch`."""
    folder = tmp_path_factory.mktemp("hostile")
    out = tmp_path_factory.mktemp("grades")
    overlays = sorted(
        p.stem for p in HOSTILE.glob("hostile_*.py") if p.stem != "hostile_results_file"
    )
    overlays += ["attack_wire", "attack_nan", "attack_blind_decoder", "attack_paths"]
    for name in overlays:
        overlay(name, folder, PROJECT=str(ROOT))
    overlay("attack_signals", folder, REPORT=str(out / "attack_signals.py.gradescope.json"))
    fill = {
        "PROJECT": str(ROOT),
        "REPORT": str(out / "attack_escape.py.gradescope.json"),
        "GRADER_CWD": os.getcwd(),
    }
    standalone("attack_escape", folder, **fill)
    TARGETS.update(escape_targets(fill))
    standalone("attack_classmate", folder)
    (folder / "victim.py").write_text((ROOT / "impl" / "torch_copy.py").read_text())
    before = snapshot()
    start = time.monotonic()
    with own_stages(tmp_path_factory.mktemp("stages")) as marker:
        status = main(
            ["grade-batch", str(folder), "--out", str(out), "--tests", TESTS]
            + ["--time-limit", TIME_LIMIT, "--jobs", "2"]
        )
    wall = time.monotonic() - start
    names = sorted(p.stem for p in folder.glob("*.py"))
    results = {n: json.loads((out / f"{n}.py.gradescope.json").read_text()) for n in names}
    time.sleep(4)  # attack_signals' lingering child would rewrite its report after 3 s
    after = {n: json.loads((out / f"{n}.py.gradescope.json").read_text()) for n in names}
    return {
        "status": status,
        "out": out,
        "results": results,
        "after": after,
        "wall": wall,
        "before": before,
        "changed": {k: v for k, v in snapshot().items() if v != before[k]},
        "leftovers": leftovers(marker),
    }


def mount_skeleton() -> set[str]:
    """What a sandbox's private /tmp holds before anything runs: the first folder of each
    read-only view that lies under /tmp (a checkout and its virtualenv there), nothing else."""
    paths = [sys.prefix, *sysconfig.get_paths().values(), str(ROOT)]
    return {Path(p).relative_to("/tmp").parts[0] for p in paths if p.startswith("/tmp/")}


def outputs(batch, name: str) -> dict[str, tuple[str, str]]:
    return {t["name"]: (t["status"], t["output"]) for t in batch["results"][name]["tests"]}


def findings(batch, name: str) -> dict:
    """What a standalone attack reported through its grade (FINDINGS {...})."""
    _, output = outputs(batch, name)["test_hand_example_noam"]
    match = re.search(r"FINDINGS (\{.*\})", output)
    assert match, output
    return json.loads(match.group(1))


# overlay -> (test, words its output must hold)
EXPECTED = {
    "hostile_exit0": ("test_golden_torch", "worker exited with status 0"),
    "hostile_systemexit": ("test_golden_torch", "raised SystemExit"),
    "hostile_patch_compare": ("test_golden_torch", "max abs error"),
    "hostile_hang": ("test_hand_example_noam", f"timed out: no answer within {TIME_LIMIT} s"),
    "hostile_memory": ("test_golden_torch", "can't allocate memory"),
    "hostile_segfault": ("test_golden_torch", "killed by signal SIGSEGV"),
    "hostile_detached": ("test_golden_torch", "worker exited with status 0"),
    "hostile_tensor_subclass": ("test_golden_torch", "max abs error 0.25"),
    "hostile_import_reference": ("test_golden_torch", "imports impl.transformer"),
    "hostile_import_dynamic": ("test_golden_torch", "ProtectedImport"),
    # forged frames: the grader's parser says why, and the worker's test is lost, not the grader
    "attack_wire": ("test_hand_example_noam", "protocol error (frame does not parse"),
    "attack_nan": ("test_golden_torch", "max abs error inf"),
    "attack_blind_decoder": ("test_decoder_is_causal", "does not read its targets"),
    "attack_signals": ("test_hand_example_noam", "worker killed by signal SIGKILL"),
}


@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_hostile_submission_fails_with_its_reason(batch, name):
    test, words = EXPECTED[name]
    status, output = outputs(batch, name)[test]
    assert status == "failed" and words in output, output
    assert batch["results"][name]["score"] < sum(
        t["max_score"] for t in batch["results"][name]["tests"]
    )


def test_forged_answers_are_judged_as_unreadable_not_as_grader_errors(batch):
    # strings and a 1-D table where arrays belong: the check says so in one line
    status, output = outputs(batch, "attack_wire")["test_golden_torch"]
    assert status == "failed" and "Traceback" not in output, output
    for name, result in batch["results"].items():
        assert "grader error" not in result["output"], (name, result["output"])
        for t in result["tests"]:
            assert "grader error" not in t["output"] and "Traceback" not in t["output"], (name, t)


def test_memory_bomb_in_python_is_a_memory_error(batch):
    status, output = outputs(batch, "hostile_memory")["test_hand_example_noam"]
    assert status == "failed" and "MemoryError" in output, output


def test_the_reference_is_not_there_to_read(batch):
    _, output = outputs(batch, "hostile_import_dynamic")["test_golden_torch"]
    assert "No such file or directory" in output and "impl/transformer.py" in output, output


def test_no_route_out_of_the_sandbox(batch):
    # the old cage's escapes, each tried from inside: no read of the project (so nothing to
    # steal: the score is 0), no write outside the private /tmp, nothing of the judge in memory,
    # no other process in view, no network, the unprivileged uid
    found = findings(batch, "attack_escape")
    assert set(found["read"]) >= {"double slash", "symlink in cwd", "dir_fd", "cat", "git objects"}
    assert all(v is None for v in found["read"].values()), found["read"]
    # a write may only land in the sandbox's own /tmp (where a checkout under /tmp has the empty
    # folders its interpreter is mounted on); test_nothing_outside_the_run_changed shows the
    # real files untouched
    assert all(
        not wrote or TARGETS[name].startswith("/tmp/") for name, wrote in found["wrote"].items()
    ), found["wrote"]
    assert found["modules"] == []
    # the only process in view is its own sandbox's pid 1 (bwrap's reaper): it may stop that
    assert found["processes"] == [] and found.get("stopped parent") in (None, 1)
    assert found["network"] == []
    assert found["identity"]["uid"] == 65534
    assert batch["results"]["attack_escape"]["score"] == 0


def test_classmates_are_out_of_reach(batch):
    # the attacker sees neither the victim's file nor the grader's command line, and its
    # SIGKILL of every process it may signal reaches only its own sandbox
    found = findings(batch, "attack_classmate")
    assert found["submissions"] == []
    assert not any("grade-batch" in c or "pytest" in c for c in found["cmdlines"]), found
    assert set(found["tmp"]) <= mount_skeleton()  # its own /tmp: empty but for mount points
    assert batch["results"]["attack_classmate"]["score"] == 0
    victim = batch["results"]["victim"]
    assert victim["score"] == sum(t["max_score"] for t in victim["tests"]) > 0


def test_nothing_outside_the_run_changed(batch):
    assert batch["changed"] == {}


def test_no_process_is_left_behind(batch):
    # hostile_detached's `sleep 4242.5` in its own session, attack_signals' CLONE_PARENT child
    assert batch["leftovers"] == []


def test_reports_are_the_graders_alone(batch):
    # attack_escape appended to its report path and attack_signals' child wanted to rewrite its
    # own after the grader left: both reports are what the grader wrote
    for name in ("attack_escape", "attack_signals"):
        assert batch["after"][name] == batch["results"][name]
    assert batch["results"]["attack_escape"]["score"] == 0
    noam = {t["name"]: t for t in batch["results"]["attack_signals"]["tests"]}
    assert noam["test_hand_example_noam"]["status"] == "failed"


def test_batch_is_bounded_and_summarized(batch):
    assert batch["status"] == 1  # some submission failed
    # 19 submissions, 2 at a time: a sandbox starts in ~2 s; one 8 s hang, one 8 s stop
    assert batch["wall"] < 150
    rows = list(csv.DictReader((batch["out"] / "grades.csv").open()))
    assert sorted(r["submission"] for r in rows) == sorted(f"{n}.py" for n in batch["results"])
    hardest = list(csv.DictReader((batch["out"] / "hardest_tests.csv").open()))
    assert {r["test"] for r in hardest} == set(TESTS.split(","))


def test_a_fit_that_never_trains_does_not_learn(tmp_path):
    # its own losses fall to zero; its weights never move: fit's first update is not Adam's step
    g = grade(overlay("attack_lazy_fit", tmp_path), [BY_NAME["test_learns_reversed_addition"]])
    [result] = g.tests
    assert result.outcome is Outcome.KILLED, result.message
    assert "moved 0 of" in result.message and "not Adam's step" in result.message, result.message


def test_a_package_with_a_link_loop_is_rejected(tmp_path):
    package = tmp_path / "pkg"
    package.mkdir()
    (package / "__init__.py").write_text((ROOT / "impl" / "torch_copy.py").read_text())
    (package / "loop").symlink_to(".")
    g = grade(package, [BY_NAME["test_hand_example_noam"]])
    assert "symbolic link" in g.rejected and g.score == 0


def cli(*args: str, env: dict | None = None) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "harness.cli", *args],
        capture_output=True,
        text=True,
        timeout=300,
        env=env,
        cwd=ROOT,
    )


def test_a_report_path_that_is_not_a_file_is_a_usage_error(tmp_path):
    (tmp_path / "grade.json").mkdir()
    done = cli("grade", "impl/torch_copy.py", "--json", str(tmp_path / "grade.json"))
    assert done.returncode == 2 and "is not a file" in done.stderr, done.stderr
    assert "Traceback" not in done.stderr


def test_without_a_sandbox_grading_refuses_unless_told_it_is_unsafe(tmp_path):
    # no bwrap on PATH: exit 2 with the reason; --unsafe-no-sandbox runs, and the report says so
    env = {**os.environ, "PATH": str(tmp_path)}
    args = ["grade", "impl/torch_copy.py", "--tests", "test_hand_example_noam"]
    done = cli(*args, env=env)
    assert done.returncode == 2 and "refusing to run untrusted code" in done.stderr, done.stderr
    report = tmp_path / "results.json"
    done = cli(*args, "--unsafe-no-sandbox", "--gradescope", str(report), env=env)
    assert done.returncode == 0, done.stderr
    results = json.loads(report.read_text())  # UNSAFE is staff's: the hidden test, not output
    assert "UNSAFE" in done.stdout and "UNSAFE" not in results["output"]
    assert (
        "UNSAFE" in results["tests"][-1]["output"]
        and results["tests"][-1]["visibility"] == "hidden"
    )


def test_planted_results_never_stand_in_for_the_report(tmp_path):
    # the submission looks for report paths in every command line it can see and writes a
    # perfect result there (and in /tmp, and in its working directory)
    submission = overlay("hostile_results_file", tmp_path)
    report, scope = tmp_path / "grade.json", tmp_path / "results.json"
    done = cli(
        "grade",
        str(submission),
        "--tests",
        TESTS,
        "--time-limit",
        TIME_LIMIT,
        "--json",
        str(report),
        "--gradescope",
        str(scope),
    )
    assert done.returncode == 1, done.stdout + done.stderr
    grade_report = json.loads(report.read_text())
    assert not grade_report["passed"] and grade_report["score"] < grade_report["max_score"]
    noam = {t["name"]: t for t in json.loads(scope.read_text())["tests"]}["test_hand_example_noam"]
    assert noam["status"] == "failed" and "expected 0.03125" in noam["output"]


# --- students' suites -----------------------------------------------------------------------


def normalized_hash(module: str) -> str:
    """What the old harness handed a suite: the ast round trip of the subject's source."""
    text = ast.unparse(ast.parse(module_source(module)[1]))
    return hashlib.sha256(text.encode()).hexdigest()


def test_a_suite_cannot_recognise_subjects_by_order_or_text(tmp_path):
    # slot files in a shared place, and the hashes of the correct subjects' text: with a
    # private /tmp per subject, a secret order and rewritten sources, neither works
    suite = tmp_path / "suite"
    suite.mkdir()
    (suite / "test_slots.py").write_text((HOSTILE / "suites/slots/test_slots.py").read_text())
    hashes = ",".join(normalized_hash(m) for m in ("impl.transformer", "impl.torch_copy"))
    text = (HOSTILE / "suites/recognise/test_recognise.py").read_text()
    (suite / "test_recognise.py").write_text(text.replace("__HASHES__", hashes))
    (tmp_path / "stages").mkdir()
    with own_stages(tmp_path / "stages") as marker:
        score = mutation_score(suite, jobs=2, generated=0)  # the published subjects suffice
    assert score.killed == [] and not score.passed
    # the slot test passes everywhere; the recognising test fails on the correct subjects
    assert "test_recognise.py::test_is_a_correct_subject" in score.false_alarms
    assert leftovers(marker) == []


def test_a_suite_that_forges_events_is_its_own_error(tmp_path, capsys):
    # its forged event breaks its own run on impl: the suite is broken, said in one line, and
    # no mutant is run (exit 2), never a traceback of the grader's
    status = main(["mutation-score", str(HOSTILE / "suites" / "events")])
    err = capsys.readouterr().err
    assert status == 2 and "no mutant was run" in err, err
    assert "could not be judged: TypeError: an event must be an object" in err
    assert "Traceback" not in err


# --- kernel state and host paths (issue 21) ---------------------------------------------------

SESSION, USER = -3, -4  # KEY_SPEC_SESSION_KEYRING, KEY_SPEC_USER_KEYRING


class Keyrings:
    """The test's own view of its kernel keyrings (the grader's: its sandboxes share its uid)."""

    def __init__(self) -> None:
        from harness.isolation import seccomp

        self.libc = ctypes.CDLL(None, use_errno=True)
        self.keyctl, self.add_key = seccomp.number("keyctl"), seccomp.number("add_key")

    def _check(self, got: int, what: str) -> int:
        if got < 0:
            raise OSError(ctypes.get_errno(), f"{what}: {os.strerror(ctypes.get_errno())}")
        return got

    def add(self, description: str, payload: str, ring: int) -> int:
        data = payload.encode()
        got = self.libc.syscall(self.add_key, b"user", description.encode(), data, len(data), ring)
        return self._check(got, "add_key")

    def read(self, key: int) -> bytes:
        buf = ctypes.create_string_buffer(1 << 16)
        n = self._check(self.libc.syscall(self.keyctl, 11, key, buf, 1 << 16), "KEYCTL_READ")
        return buf.raw[: min(n, 1 << 16)]

    def listing(self) -> dict[int, list[str]]:
        """Each keyring's keys, described ("type;uid;gid;perm;description")."""
        found = {}
        for ring in (SESSION, USER):
            ids = self.read(ring)
            described = []
            for i in range(0, len(ids) - 3, 4):
                what = ctypes.create_string_buffer(512)
                key = int.from_bytes(ids[i : i + 4], "little")
                self._check(self.libc.syscall(self.keyctl, 6, key, what, 512), "KEYCTL_DESCRIBE")
                described.append(what.value.decode())
            found[ring] = sorted(described)
        return found

    def unlink(self, key: int, ring: int) -> None:
        self._check(self.libc.syscall(self.keyctl, 9, key, ring), "KEYCTL_UNLINK")


def keyrings_or_skip() -> Keyrings:
    rings = Keyrings()
    try:
        rings.listing()
    except OSError as e:
        pytest.skip(f"the kernel refuses keyrings to the test process itself ({e})")
    return rings


def test_a_sandbox_whose_seccomp_filter_does_not_hold_is_refused(monkeypatch):
    # bwrap started without the filter: the trial sandbox's keyctl succeeds, grading refuses
    from harness.isolation import sandbox

    keyrings_or_skip()
    real = sandbox.command
    monkeypatch.setattr(sandbox, "command", lambda *a, seccomp_fd=None, **k: real(*a, **k))
    monkeypatch.setattr(sandbox, "_CHECKED", None)
    with pytest.raises(sandbox.SandboxUnavailable, match="the seccomp filter does not hold"):
        sandbox.check()


def test_without_libseccomp_no_sandbox_starts(monkeypatch):
    from harness.isolation import sandbox, seccomp

    monkeypatch.setitem(sys.modules, "pyseccomp", None)  # import pyseccomp: ImportError
    monkeypatch.setattr(sandbox, "_CHECKED", None)
    seccomp.program.cache_clear()
    try:
        with pytest.raises(sandbox.SandboxUnavailable, match=r"pip install pyseccomp"):
            sandbox.check()
    finally:
        seccomp.program.cache_clear()


def test_a_submission_cannot_reach_the_graders_keyrings(tmp_path, capsys):
    # the grader's session keyring holds a secret; the submission reads, searches and plants
    # keys: every call is denied (EPERM, the seccomp filter), /proc/keys is masked, the secret is
    # in no report, the keyrings are as they were, and the real fault alone decides the grade
    rings = keyrings_or_skip()
    secret, description = secrets.token_hex(16), f"xfmr-grader-{secrets.token_hex(4)}"
    try:
        key = rings.add(description, secret, SESSION)
    except OSError as e:
        pytest.skip(f"the kernel refuses keyrings to the test process itself ({e})")
    try:
        assert rings.read(key) == secret.encode()  # the grader itself can
        before = rings.listing()
        fill = {"KEYCTL": str(rings.keyctl), "ADD_KEY": str(rings.add_key)}
        submission = overlay("attack_keyring", tmp_path, DESCRIPTION=description, **fill)
        report, scope = tmp_path / "grade.json", tmp_path / "results.json"
        status = main(
            ["grade", str(submission), "--tests", TESTS]  # no hang here: the default limit
            + ["--json", str(report), "--gradescope", str(scope)]
        )
        printed = capsys.readouterr()
        after = rings.listing()
    finally:
        rings.unlink(key, SESSION)
    texts = [report.read_text(), scope.read_text(), printed.out, printed.err]
    assert not any(secret in text for text in texts)
    assert after == before
    tests = {t["name"]: t for t in json.loads(scope.read_text())["tests"]}
    match = re.search(r"FINDINGS (\{.*\})", tests["test_hand_example_noam"]["output"])
    assert match, tests["test_hand_example_noam"]["output"]
    found = json.loads(match.group(1))
    assert found["calls"] and all(got == [-1, 1] for got in found["calls"].values()), found
    # /proc/keys (descriptions of every key the uid may view) is covered by /dev/null
    assert found["read"] == [] and found["proc_keys"] == "PermissionError"
    assert description not in json.dumps(found)
    # the grade it deserves: its noam_rate is broken, the rest is the correct torch copy
    assert status == 1 and tests["test_hand_example_noam"]["status"] == "failed"
    assert tests["test_golden_torch"]["status"] == "passed", tests["test_golden_torch"]
    assert tests["test_decoder_is_causal"]["status"] == "passed"


def test_a_suite_cannot_share_fingerprints_through_the_keyring(tmp_path):
    # the suite records each subject's behaviour in the user keyring and passes only the
    # majority's: denied the keyring, it passes everywhere, kills nothing, on every run alike
    rings = keyrings_or_skip()
    before = rings.listing()
    (tmp_path / "stages").mkdir()
    with own_stages(tmp_path / "stages") as marker:
        first, second = (
            mutation_score(HOSTILE / "suites" / "keyring", jobs=2, generated=0) for _ in "12"
        )
    assert first.killed == second.killed == [] and first.score == second.score == 0.0
    assert not first.false_alarms and not second.false_alarms
    assert rings.listing() == before
    assert leftovers(marker) == []


def test_no_host_path_of_the_grader_shows_inside(batch):
    # mountinfo's mount roots, the finder files, descriptors 0-2, sys.path, the executable,
    # torch's __file__ and the mapped files: none names the project, the virtualenv or a log
    found = findings(batch, "attack_paths")
    text = json.dumps(found)
    venv = sysconfig.get_paths()["purelib"]
    for host in {str(ROOT), sys.prefix, os.path.realpath(sys.prefix), venv}:
        assert host not in text, (host, found)
    assert "xfmr-worker-" not in text.replace("/memfd:xfmr-worker-log", ""), found["fds"]
    assert found["fds"]["1"] == found["fds"]["2"] == "/memfd:xfmr-worker-log (deleted)"
    assert found["finders"] == {}  # the editable finder, .pth files and direct_url.json masked
    # the submission's own folder, then the worker's code, the stdlib and site-packages
    assert found["sys.path"][:2] == ["/sandbox", "/opt/xfmr/lib"], found["sys.path"]
    assert all(p.startswith("/opt/xfmr/") for p in found["sys.path"][1:]), found["sys.path"]
    assert found["executable"][0].startswith("/opt/xfmr/python/")
    assert status_of(batch, "attack_paths") == ("failed", "passed", "passed")


def status_of(batch, name: str) -> tuple[str, ...]:
    tests = outputs(batch, name)
    return tuple(tests[t][0] for t in TESTS.split(","))
