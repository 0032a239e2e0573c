"""The executor seam (harness.engine.work) and the incremental cell cache (harness.engine.cache)."""

from __future__ import annotations

import dataclasses
import json
import multiprocessing
import os
import shutil
import subprocess
import sys
import threading
from pathlib import Path

import pytest

from harness.cli import main
from harness.engine import fingerprint, work
from harness.engine.cache import Store, cell_keys, incremental_suite, suite_run_key
from harness.engine.coverage import split
from harness.engine.run import run_subject, run_subject_apart, run_suite
from harness.jobs.matrix import matrix_subjects
from harness.outcomes import Outcome
from harness.shared_tests.laws import BY_NAME
from mutants import catalog
from mutants.patch import Patch

HAND = [BY_NAME["test_hand_example_label_smoothing"], BY_NAME["test_hand_example_noam"]]
SUBJECTS = [s for s in matrix_subjects() if s.name in ("impl", "s07", "s08")]


# --- one subject's tests in two workers (a grade with a second core) -------------------------


def test_tests_run_apart_give_run_subjects_cells_in_its_order_from_two_workers():
    # s08 fails the Noam hand example and passes the other two: the split keeps every outcome
    # and message, and the order of the tests, whichever worker ran them
    s08 = next(s for s in SUBJECTS if s.name == "s08")
    tests = [*HAND, BY_NAME["test_validation"]]
    alone, one_start = run_subject(s08, tests, lambda test, cell: None)
    apart, two_starts = run_subject_apart(s08, tests, {"test_hand_example_noam"})
    assert list(apart) == [t.name for t in tests]
    assert {k: (c.outcome, c.message) for k, c in apart.items()} == {
        k: (c.outcome, c.message) for k, c in alone.items()
    }
    assert apart["test_hand_example_noam"].outcome is Outcome.KILLED
    assert len(one_start) == 1 and len(two_starts) == 2
    assert len(run_subject_apart(s08, tests, {"no such test"})[1]) == 1  # nothing apart: one


# --- --scheduler ------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "text, want",
    [
        ("tcp://10.0.0.5:8786", work.Scheduler(address="tcp://10.0.0.5:8786")),
        ("tls://sched.example.org:8786/", work.Scheduler(address="tls://sched.example.org:8786")),
        ("local:3", work.Scheduler(local_workers=3)),
    ],
)
def test_a_scheduler_is_an_address_or_a_local_cluster(text, want):
    assert work.scheduler(text) == want


@pytest.mark.parametrize("command", ["matrix", "grade-batch", "mutation-score"])
@pytest.mark.parametrize("value", ["local:0", "local:x", "8786", "http://host:8786", "tcp://"])
def test_a_bad_scheduler_is_a_one_line_usage_error(command, value, capsys, tmp_path):
    positional = [] if command == "matrix" else [str(tmp_path)]
    with pytest.raises(SystemExit) as exit:
        main([command, *positional, "--scheduler", value])
    assert exit.value.code == 2
    [error] = [line for line in capsys.readouterr().err.splitlines() if "error:" in line]
    assert "--scheduler" in error and repr(value) in error


def test_an_unreachable_scheduler_stops_the_run_with_exit_2(capsys, monkeypatch):
    pytest.importorskip("distributed")
    monkeypatch.setattr("harness.engine.cluster.CONNECT_TIMEOUT", "1s")
    argv = ["matrix", "--only", "impl", "--tests", "test_hand_example_noam", "--quiet"]
    assert main([*argv, "--scheduler", "tcp://127.0.0.1:9"]) == 2  # the discard port: no one
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "cannot reach the Dask scheduler tcp://127.0.0.1:9" in err[0]


@pytest.mark.slow
def test_the_default_paths_import_nothing_of_dask(tmp_path):
    (tmp_path / "broken.py").write_text("def (:\n")  # rejected before any sandbox starts
    code = (
        "import sys\nfrom pathlib import Path\nfrom harness.cli import main\n"
        "main(['matrix', '--only', 'impl', '--tests', 'test_hand_example_noam', '--quiet'])\n"
        "from harness.jobs.grade import grade_batch, DEFAULT_LIMITS, SHARED_TESTS\n"
        f"[g] = grade_batch(Path({str(tmp_path)!r}), SHARED_TESTS, DEFAULT_LIMITS, None, 2)\n"
        "assert g.rejected, g\n"
        "loaded = sorted(m for m in sys.modules if m.split('.')[0] in ('dask', 'distributed'))\n"
        "print('LOADED', loaded)\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert "LOADED []" in done.stdout, done.stdout + done.stderr


# --- files as plain data ----------------------------------------------------------------------


def test_a_packed_tree_comes_back_as_it_was_links_and_all(tmp_path):
    source = tmp_path / "pkg"
    (source / "sub").mkdir(parents=True)
    (source / "__init__.py").write_text("x = 1\n")
    (source / "sub" / "data.bin").write_bytes(bytes(range(256)))
    (source / "__pycache__").mkdir()
    (source / "__pycache__" / "stale.pyc").write_bytes(b"junk")
    os.symlink("/etc/passwd", source / "link")
    os.mkfifo(source / "fifo")
    tree = work.pack(source)
    json.dumps(tree, default=lambda b: b.hex())  # plain data only
    work.unpack(tree, tmp_path / "copy")
    copy = tmp_path / "copy"
    assert (copy / "__init__.py").read_text() == "x = 1\n"
    assert (copy / "sub" / "data.bin").read_bytes() == bytes(range(256))
    assert os.readlink(copy / "link") == "/etc/passwd"  # a link stays a link, never followed
    assert not (copy / "__pycache__").exists() and not (copy / "fifo").is_file()
    with pytest.raises(ValueError, match="may not name"):
        work.unpack({"dir": {"../escape": {"file": b""}}}, tmp_path / "bad")


def test_a_unit_lost_on_the_cluster_is_that_units_error_only():
    pytest.importorskip("distributed")
    from distributed.scheduler import KilledWorker

    from harness.engine import cluster

    class Future:
        def __init__(self, error):
            self.error = error

        def result(self):
            raise self.error

    unit = work.Unit("u", int, int, dict, str, lambda why: f"lost: {why}")
    ex = cluster.DaskExecutor.__new__(cluster.DaskExecutor)
    assert ex._result(unit, Future(KilledWorker("k", "w", 3))).startswith("lost: the Dask workers")
    assert ex._result(unit, Future(RuntimeError("boom"))).endswith("RuntimeError: boom")
    for fatal in (cluster.NoSandbox("no bwrap"), cluster.WorkerMismatch("other")):
        with pytest.raises(work.ClusterProblem):  # fail closed: the whole run stops
            ex._result(unit, Future(fatal))


def test_a_worker_refuses_units_it_would_judge_differently_or_could_not_cage(monkeypatch):
    pytest.importorskip("distributed")
    from harness.engine import cluster
    from harness.isolation import sandbox

    assert cluster.remote(len, "abc", fingerprint.project(), sandboxed=False) == 3
    with pytest.raises(cluster.WorkerMismatch, match="different project"):
        cluster.remote(len, "abc", "0" * 64, sandboxed=False)

    def no_sandbox():
        raise sandbox.SandboxUnavailable("bwrap: setting up uid map: Permission denied")

    monkeypatch.setattr(sandbox, "check", no_sandbox)
    with pytest.raises(cluster.NoSandbox, match="cannot set up the sandbox"):
        cluster.remote(len, "abc", fingerprint.project(), sandboxed=True)


# --- the incremental cache --------------------------------------------------------------------


def edited(monkeypatch, mutant_id: str, old: str, new: str) -> None:
    """One line of one mutant's patch changed (mutants are data: the catalog's record)."""
    m = catalog.get(mutant_id)
    patches = tuple(Patch(p.old, p.new.replace(old, new)) for p in m.patches)
    assert patches != m.patches
    monkeypatch.setitem(catalog._BY_ID, mutant_id, dataclasses.replace(m, patches=patches))


def test_an_unchanged_cell_is_reused_and_equals_a_fresh_one(tmp_path):
    store = Store(tmp_path)
    first, reuse1 = incremental_suite(HAND, SUBJECTS, store)
    second, reuse2 = incremental_suite(HAND, SUBJECTS, store)
    # s07 (the loss) and s08 (the rate) each change what the other hand example never calls:
    # those two cells are impl's, inferred (harness.engine.coverage), and stored like the rest
    assert (reuse1.reused, reuse1.ran, reuse1.inferred) == (0, 4, 2)
    assert (reuse2.reused, reuse2.ran, reuse2.inferred) == (6, 0, 0)
    assert not second.cell("test_hand_example_noam", "s07").ran
    fresh = run_suite(HAND, SUBJECTS)
    for s in SUBJECTS:
        assert second.row(s.name) == first.row(s.name) == fresh.row(s.name)
    assert second.worker_starts == {"impl": 0, "s07": 0, "s08": 0}  # nothing ran


def test_a_one_line_patch_change_reruns_that_mutants_row_only(tmp_path, monkeypatch):
    store = Store(tmp_path)
    before = cell_keys(HAND, SUBJECTS)
    incremental_suite(HAND, SUBJECTS, store)
    # s07's smoothing mass becomes a different (still wrong) constant
    edited(monkeypatch, "s07", "# mutant s07", "# mutant s07 (edited)")
    after = cell_keys(HAND, SUBJECTS)
    assert {k for k in before if before[k] != after[k]} == {(t.name, "s07") for t in HAND}
    run, reuse = incremental_suite(HAND, SUBJECTS, store)
    assert (reuse.reused, reuse.ran, reuse.inferred) == (4, 1, 1)  # the noam cell: inferred
    assert run.worker_starts["impl"] == run.worker_starts["s08"] == 0 < run.worker_starts["s07"]
    assert run.cell("test_hand_example_label_smoothing", "s07").outcome is Outcome.KILLED


def test_a_lone_changed_row_is_split_by_measured_time():
    weight = {"a": 30.0, "b": 1.0, "c": 2.0, "d": 1.0, "e": 25.0}
    assert split(list("abcde"), 2, weight) == [["a"], ["b", "c", "d", "e"]]
    assert split(list("abcde"), 3, weight) == [["a"], ["e"], ["b", "c", "d"]]
    assert split(["a"], 4, weight) == [["a"]] and split([], 2, weight) == []


def test_a_change_to_one_checks_code_changes_that_column_only(monkeypatch):
    keys = cell_keys(HAND, SUBJECTS)
    changed = dataclasses.replace(HAND[1], check=lambda call: None)
    other = cell_keys([HAND[0], changed], SUBJECTS)
    differ = {k for k in keys if keys[k] != other[k]}
    assert differ == {("test_hand_example_noam", s.name) for s in SUBJECTS}


def test_a_checks_key_holds_what_its_closure_holds():
    def made(step):
        def check(call):
            call("noam_rates", cases=[[step, 16, 4, 1.0]])

        return check

    assert fingerprint.code_closure(made(1)) == fingerprint.code_closure(made(1))
    assert fingerprint.code_closure(made(1)) != fingerprint.code_closure(made(2))


@pytest.mark.parametrize(
    "damage",
    [
        lambda b: b[: len(b) // 2],  # cut short
        lambda b: b.replace(b'"killed"', b'"passed"'),  # content that no longer matches its hash
        lambda b: b"",
        lambda b: b"\x00\xff" * 10,
    ],
)
def test_a_damaged_entry_is_a_miss_and_is_written_again(tmp_path, damage):
    store = Store(tmp_path)
    key = fingerprint.digest("a cell")
    store.put(key, {"outcome": "killed", "message": "m"})
    [path] = (p for p in tmp_path.rglob("*.json"))
    path.write_bytes(damage(path.read_bytes()))
    assert store.get(key) is None and store.damaged == 1
    store.put(key, {"outcome": "killed", "message": "m"})
    assert store.get(key) == {"outcome": "killed", "message": "m"}


def test_a_half_written_entry_of_a_killed_run_is_never_read(tmp_path):
    store = Store(tmp_path)
    key = fingerprint.digest("killed mid-write")
    code = (
        "import os, sys\nfrom harness.engine.cache import Store\n"
        "real = os.replace\n"
        "def die(*a): os._exit(9)  # killed between the write and the rename\n"
        "os.replace = die\n"
        f"Store(sys.argv[1]).put({key!r}, {{'outcome': 'passed', 'message': 'x' * 100000}})\n"
    )
    done = subprocess.run([sys.executable, "-c", code, str(tmp_path)], timeout=60)
    assert done.returncode == 9
    assert [p.name[:5] for p in tmp_path.rglob("*") if p.is_file()] == [".tmp-"]
    assert store.get(key) is None and store.damaged == 0  # a plain miss


def _writer(root: str, n: int, seed: int) -> None:
    store = Store(Path(root))
    for i in range(n):
        key = fingerprint.digest("shared", i % 7)  # the same keys from every writer
        store.put(key, {"outcome": "passed", "message": f"{i % 7}" * 5000})
        store.put(fingerprint.digest("own", seed, i), {"outcome": "killed", "message": ""})


@pytest.mark.slow
def test_concurrent_writers_leave_only_whole_entries(tmp_path):
    procs = [
        multiprocessing.get_context("spawn").Process(target=_writer, args=(str(tmp_path), 60, s))
        for s in range(3)
    ]
    threads = [threading.Thread(target=_writer, args=(str(tmp_path), 60, 10 + s)) for s in range(2)]
    for w in procs + threads:
        w.start()
    store = Store(tmp_path)
    reads = [store.get(fingerprint.digest("shared", i % 7)) for i in range(300)]  # meanwhile
    for w in procs + threads:
        w.join(60)
    assert all(p.exitcode == 0 for p in procs)
    assert all(r is None or r["message"] == r["message"][0] * 5000 for r in reads)
    assert store.damaged == 0
    for i in range(7):
        assert store.get(fingerprint.digest("shared", i)) == {
            "outcome": "passed",
            "message": f"{i}" * 5000,
        }
    entries = [p for p in tmp_path.rglob("*.json") if not p.name.startswith(".tmp-")]
    assert len(entries) == 7 + 5 * 60 and not list(tmp_path.rglob(".tmp-*"))


@pytest.mark.slow
def test_incremental_matrix_check_sees_every_cell(tmp_path, capsys):
    argv = ["matrix", "--only", "impl,s08", "--tests", "test_hand_example_noam", "--quiet"]
    argv += ["--incremental", "--cache-dir", str(tmp_path)]
    assert main(argv) == 0
    assert "incremental: 0 of 2 cells reused, 2 run" in capsys.readouterr().out
    assert main(argv) == 0
    out = capsys.readouterr().out
    assert "incremental: 2 of 2 cells reused, 0 run" in out
    assert "s08" in out and "K" in out  # the reused kill is in the printed grid


# --- mutation-score --incremental -------------------------------------------------------------

WEAK = Path(__file__).resolve().parents[3] / "examples" / "student_tests_weak"


def suite_keys(suite_dir: Path) -> dict[str, str]:
    from harness.jobs.mutation_score import subjects

    suite = work.pack(suite_dir)
    return {s.name: suite_run_key(s.payload(), suite, {"module": "m"}) for s in subjects()}


def test_a_suite_runs_key_follows_its_subject_and_the_suites_files(tmp_path, monkeypatch):
    shutil.copytree(WEAK, tmp_path / "suite")
    before = suite_keys(tmp_path / "suite")
    edited(monkeypatch, "s07", "# mutant s07", "# mutant s07 (edited)")
    after = suite_keys(tmp_path / "suite")
    assert [name for name in before if before[name] != after[name]] == ["s07"]
    test_file = next((tmp_path / "suite").glob("test_*.py"))
    test_file.write_text(test_file.read_text() + "\n# one more line\n")
    changed = suite_keys(tmp_path / "suite")
    assert all(changed[name] != after[name] for name in after)


@pytest.mark.slow
def test_mutation_score_incremental_reuses_every_run_of_an_unchanged_suite(tmp_path, capsys):
    argv = ["mutation-score", str(WEAK), "--incremental", "--cache-dir", str(tmp_path)]
    # impl, the torch copy and s01-s11, then the run's generated sample (two of it: the rest
    # would cost minutes and add nothing): the same secret draws the same sample, so its runs
    # are reused too
    argv += ["--generated", "2"]
    n = 13 + 2
    first = main([*argv, "--json", str(tmp_path / "first.json")])
    assert f"incremental: 0 of {n} subjects' runs reused" in capsys.readouterr().out
    second = main([*argv, "--json", str(tmp_path / "second.json")])
    assert f"incremental: {n} of {n} subjects' runs reused" in capsys.readouterr().out
    a, b = (json.loads((tmp_path / f"{n}.json").read_text()) for n in ("first", "second"))
    assert first == second and a["score"] == b["score"] and a["killed"] == b["killed"]
    assert [c["outcome"] for c in a["cells"]] == [c["outcome"] for c in b["cells"]]


@pytest.mark.slow
def test_a_shipped_suite_run_equals_the_local_one():
    """What a Dask worker runs for mutation-score (run_shipped: the suite as plain data, unpacked
    and run there) gives what the local run gives (the transport itself is test_cluster's)."""
    from harness.isolation.limits import DEFAULT_LIMITS
    from harness.jobs.mutation_score import MODULE, run_on, run_shipped, subjects
    from harness.records import SubjectRun

    source = subjects()[0].payload()["source"]  # impl
    local = run_on(source, WEAK, MODULE, DEFAULT_LIMITS, 30.0)
    payload = {
        "source": source,
        "tests": work.pack(WEAK),
        "module_name": MODULE,
        "limits": dataclasses.asdict(DEFAULT_LIMITS),
        "time_limit": 30.0,
        "tier": "sandbox",
    }
    shipped = SubjectRun.from_json(json.loads(json.dumps(run_shipped(payload))))  # plain data back
    assert local.collected == shipped.collected and len(local.collected) == 3
    assert local.error == shipped.error == ""
    assert {k: c.outcome for k, c in local.cells.items()} == {
        k: c.outcome for k, c in shipped.cells.items()
    }
