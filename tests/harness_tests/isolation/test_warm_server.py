"""The warm fork server (harness.isolation.warm): reused across runs while current, replaced
when stale, refused where its socket's folder is not this user's alone, gone when idle."""

from __future__ import annotations

import os
import shutil
import socket
import sysconfig
import tempfile
import time
from pathlib import Path

import pytest

from harness.cli import main
from harness.engine.run import run_suite
from harness.isolation import forkserver, warm
from harness.isolation.child import forkserver as child_forkserver
from harness.isolation.forkserver import worker_environment
from harness.outcomes import Outcome
from harness.shared_tests.laws import SHARED_TESTS
from harness.subjects import Kind, Subject

IMPL = Subject("impl", Kind.CORRECT, module="impl.transformer")
S08 = Subject("s08", Kind.MUTANT, module="impl.transformer", mutant="s08")
QUICK = [t for t in SHARED_TESTS if t.name == "test_hand_example_noam"]
ENV = worker_environment()


def running(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"


@pytest.fixture
def folder():
    """A runtime folder of this test's own, whose server is stopped afterwards. Short, in /tmp
    itself: under pytest-xdist, tmp_path (/tmp/pytest-of-root/pytest-10/popen-gw1/ and 30
    characters of the test's name) left the socket's path over AF_UNIX's 108 bytes once pytest's
    run counter reached two digits."""
    path = Path(tempfile.mkdtemp(prefix="xw-", dir="/tmp"))  # mode 0o700
    yield path
    path.chmod(0o700)  # as a test may have opened it
    warm.stop(ENV, path)
    shutil.rmtree(path, ignore_errors=True)


def quick_cells() -> dict:
    run = run_suite(QUICK, [IMPL, S08])
    return {k: c.outcome for k, c in run.cells.items()}


@pytest.mark.slow
def test_runs_fork_from_one_warm_server_while_it_is_current(folder, monkeypatch, capfd):
    monkeypatch.setenv("XFMR_RUNTIME_DIR", str(folder))
    with forkserver.warm_server(60):
        first = quick_cells()
    started = warm.status(ENV, folder)
    assert started is not None and started["stale"] is None
    assert "started a warm fork server" in capfd.readouterr().err
    assert forkserver._SERVER is None  # the run's connection closed on leaving the block
    with forkserver.warm_server(60):
        second = quick_cells()
    assert "started" not in capfd.readouterr().err
    assert warm.status(ENV, folder)["pid"] == started["pid"]
    assert (
        first
        == second
        == {
            ("test_hand_example_noam", "impl"): Outcome.PASSED,
            ("test_hand_example_noam", "s08"): Outcome.KILLED,
        }
    )
    # it imported the worker's code, and reports each file by its hash before importing it
    assert str(Path(child_forkserver.__file__).resolve()) in started["files"]


@pytest.mark.slow
def test_a_stale_server_is_stopped_and_replaced(folder, monkeypatch):
    old = warm.connect(ENV, 60, folder)
    old.sock.close()
    reasons = iter(["/x.py changed since the server imported it"])
    monkeypatch.setattr(warm, "stale", lambda about: next(reasons, None))
    new = warm.connect(ENV, 60, folder)
    new.sock.close()
    assert new.started and new.replaced == "/x.py changed since the server imported it"
    assert new.pid != old.pid and not running(old.pid) and running(new.pid)


def test_staleness_is_read_from_the_files_on_disk(tmp_path):
    about = child_forkserver.fingerprint(child_forkserver._project_sources())
    assert about["files"] and about["libraries"] and warm.stale(about) is None
    path = next(iter(about["files"]))
    assert "changed" in warm.stale({**about, "files": {path: "0" * 64}})
    assert "is gone" in warm.stale({**about, "files": {str(tmp_path / "gone.py"): "0" * 64}})
    lib, (size, mtime) = next(iter(about["libraries"].items()))
    assert "reinstalled" in warm.stale({**about, "libraries": {lib: [size, mtime + 1]}})


@pytest.mark.slow
def test_a_folder_others_can_enter_is_refused_and_the_run_starts_its_own(
    folder, monkeypatch, capfd
):
    folder.chmod(0o755)
    with pytest.raises(warm.Refused, match="open to other users"):
        warm.connect(ENV, 60, folder)
    monkeypatch.setenv("XFMR_RUNTIME_DIR", str(folder))
    with forkserver.warm_server(60):
        cells = quick_cells()
    assert "no warm fork server" in capfd.readouterr().err
    assert cells[("test_hand_example_noam", "impl")] is Outcome.PASSED
    assert not list(folder.iterdir())  # nothing was started there


def test_a_socket_path_too_long_is_refused(tmp_path):
    deep = tmp_path / ("x" * 100)
    with pytest.raises(warm.Refused, match="too long for a unix socket"):
        warm.connect(ENV, 60, deep)


def test_a_link_or_another_users_folder_is_refused(tmp_path):
    real = tmp_path / "real"
    real.mkdir(mode=0o700)
    (tmp_path / "link").symlink_to(real)
    with pytest.raises(warm.Refused, match="not a folder"):
        warm.private_folder(tmp_path / "link")
    if os.getuid() != 0:
        pytest.skip("giving a folder to another user needs root")
    os.chown(real, 65534, 65534)
    with pytest.raises(warm.Refused, match="belongs to uid 65534"):
        warm.private_folder(real)


@pytest.fixture
def reachable_folder():
    """A runtime folder in /tmp itself (pytest's own folders are closed to other users)."""
    path = Path(tempfile.mkdtemp(prefix="xfmr-warm-test-", dir="/tmp"))
    yield path
    path.chmod(0o700)
    warm.stop(ENV, path)
    shutil.rmtree(path)


@pytest.mark.skipif(os.getuid() != 0, reason="connecting as another user needs root")
@pytest.mark.slow
def test_the_server_answers_no_other_user(reachable_folder):
    folder = reachable_folder
    conn = warm.connect(ENV, 60, folder)
    conn.sock.close()
    sock_path = warm.place(ENV, folder).socket
    folder.chmod(0o711)
    sock_path.chmod(0o666)  # only the server's own check stands in the way now
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:
        code = 3
        try:
            os.close(read)
            os.setgid(65534)
            os.setuid(65534)
            sock = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
            sock.connect(str(sock_path))
            sock.settimeout(10)
            try:
                sock.send(b'{"op": "about"}')
                said = b"closed" if sock.recv(1 << 20) == b"" else b"answered"
            except (ConnectionResetError, BrokenPipeError):
                said = b"closed"
            os.write(write, said)
            code = 0
        except BaseException as e:
            os.write(write, repr(e).encode())
        finally:
            os._exit(code)
    os.close(write)
    _, status = os.waitpid(pid, 0)
    said = os.read(read, 1000)
    assert said == b"closed" and os.waitstatus_to_exitcode(status) == 0


@pytest.mark.slow
def test_an_idle_server_exits_and_removes_its_socket(folder):
    conn = warm.connect(ENV, 1.0, folder)
    conn.sock.close()
    deadline = time.monotonic() + 20
    while running(conn.pid) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not running(conn.pid)
    assert not warm.place(ENV, folder).socket.exists()


@pytest.mark.slow
def test_the_warm_server_command(folder, monkeypatch, capsys):
    monkeypatch.setenv("XFMR_RUNTIME_DIR", str(folder))
    assert main(["warm-server", "status"]) == 1
    assert main(["warm-server", "start", "--idle", "1"]) == 0
    assert main(["warm-server", "status"]) == 0
    assert main(["warm-server", "stop"]) == 0
    assert main(["warm-server", "status"]) == 1
    out = capsys.readouterr().out
    assert "no warm fork server runs" in out and ", current, at " in out
    assert "stopped the warm fork server" in out
    folder.chmod(0o770)
    assert main(["warm-server", "status"]) == 2


def test_no_sandbox_is_set_up_where_it_would_show_the_warm_servers_socket(monkeypatch):
    """A socket that forks trusted workers must never be inside what a sandboxed submission can
    see: a runtime folder in a folder the sandbox mounts makes grading refuse."""
    from harness.isolation import sandbox

    sandbox.mounts()  # the session's folder: fine
    for shown in ("/usr/xfmr-runtime", sysconfig.get_paths()["purelib"] + "/xfmr-runtime"):
        monkeypatch.setenv("XFMR_RUNTIME_DIR", shown)
        with pytest.raises(sandbox.SandboxUnavailable, match="warm fork server's folder"):
            sandbox.mounts()
