"""The warm fork server: a fork server that outlives the run that started it, so that the next
run (`xfmr matrix --incremental` after an edit) forks its first worker in milliseconds instead of
waiting ~3 s for torch's imports. Gradle's and Bazel's daemons make the same trade.

It serves trusted code only, like the private fork server (harness.isolation.forkserver), and
only its own user:
- its socket lives in a folder of this user's alone (XFMR_RUNTIME_DIR, else
  $XDG_RUNTIME_DIR/xfmr-oracle, else /tmp/xfmr-oracle-UID): created 0700, and refused (`Refused`)
  if it is a link, another user's, or open to others, because whoever controls that socket
  would run every trusted subject and answer for it;
- the socket itself is 0600, and each side checks the other's uid (SO_PEERCRED);
- a connecting parent asks what the server imported (`about`) and uses it only if every project
  file it imported is unchanged and every third-party package's entry file is as it was; a stale
  server is stopped and a fresh one started, under a lock, so two runs never race to start one.

One server per interpreter, project folder and environment (the socket's name hashes them). It
exits after `idle` seconds with no run connected; `xfmr warm-server stop` stops it sooner.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import json
import os
import socket
import stat
import struct
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

START_TIMEOUT = 60.0  # seconds for a new server to import torch and listen, on a loaded machine
ABOUT_MESSAGE = 1 << 20  # the `about` reply lists a few dozen files
SOCKET_PATH_MAX = 108  # sun_path's size on Linux, the terminating NUL included


class Refused(Exception):
    """The warm server cannot be used safely here (the reason is the message)."""


@dataclass(frozen=True)
class Place:
    """Where one warm server lives: its folder, socket, lock and log."""

    folder: Path
    key: str

    @property
    def socket(self) -> Path:
        return self.folder / f"forkserver-{self.key}.sock"

    @property
    def lock(self) -> Path:
        return self.folder / f"forkserver-{self.key}.lock"

    @property
    def log(self) -> Path:
        return self.folder / f"forkserver-{self.key}.log"


def runtime_folder() -> Path:
    if os.environ.get("XFMR_RUNTIME_DIR"):
        return Path(os.environ["XFMR_RUNTIME_DIR"])
    if os.environ.get("XDG_RUNTIME_DIR"):
        return Path(os.environ["XDG_RUNTIME_DIR"]) / "xfmr-oracle"
    return Path("/tmp") / f"xfmr-oracle-{os.getuid()}"


def place(env: dict[str, str], folder: Path | None = None) -> Place:
    """The server for this interpreter, project and worker environment."""
    project = Path(__file__).resolve().parents[2]
    what = [os.path.realpath(sys.executable), sys.version, str(project), sorted(env.items())]
    key = hashlib.sha256(json.dumps(what).encode()).hexdigest()[:16]
    return Place(folder or runtime_folder(), key)


def private_folder(folder: Path) -> None:
    """Create `folder` 0700, or check that it is a real folder of this user's that nobody else
    can enter; raises Refused otherwise."""
    try:
        folder.mkdir(mode=0o700, parents=True, exist_ok=True)
        st = os.lstat(folder)
    except OSError as e:
        raise Refused(f"cannot create {folder}: {e}") from e
    if not stat.S_ISDIR(st.st_mode):
        raise Refused(f"{folder} is not a folder (a link or a file)")
    if st.st_uid != os.getuid():
        raise Refused(f"{folder} belongs to uid {st.st_uid}, not to this user ({os.getuid()})")
    if st.st_mode & 0o077:
        raise Refused(f"{folder} is open to other users (mode {stat.S_IMODE(st.st_mode):o})")


def checked_place(env: dict[str, str], folder: Path | None = None) -> Place:
    """`place(env, folder)`, its folder checked private (created if missing) and its socket's
    path short enough for AF_UNIX; raises Refused otherwise."""
    where = place(env, folder)
    private_folder(where.folder)
    if len(os.fsencode(where.socket)) >= SOCKET_PATH_MAX:
        raise Refused(f"{where.socket} is too long for a unix socket ({SOCKET_PATH_MAX} bytes)")
    return where


def peer_uid(sock: socket.socket) -> int:
    creds = sock.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, struct.calcsize("3i"))
    return struct.unpack("3i", creds)[1]


def ask(sock: socket.socket, request: dict[str, Any]) -> dict[str, Any]:
    sock.send(json.dumps(request).encode())
    reply = sock.recv(ABOUT_MESSAGE)
    if not reply:
        raise OSError("the warm fork server closed the connection")
    return json.loads(reply)


def stale(about: dict[str, Any]) -> str | None:
    """Why a server that reported `about` runs other code than is on disk now; None if current."""
    for path, digest in about["files"].items():
        try:
            now = hashlib.sha256(Path(path).read_bytes()).hexdigest()
        except OSError:
            return f"{path} is gone"
        if now != digest:
            return f"{path} changed since the server imported it"
    for path, (size, mtime) in about["libraries"].items():
        try:
            st = os.stat(path)
        except OSError:
            return f"{path} is gone"
        if (st.st_size, st.st_mtime_ns) != (size, mtime):
            return f"{path} was reinstalled since the server imported it"
    return None


def _connect(where: Place) -> socket.socket | None:
    """A connection to the server at `where`, if one listens there; checked to be this user's."""
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    try:
        sock.connect(str(where.socket))
    except (FileNotFoundError, ConnectionRefusedError):
        sock.close()
        return None
    if peer_uid(sock) != os.getuid():
        sock.close()
        raise Refused(f"{where.socket} is served by another user's process")
    return sock


@contextlib.contextmanager
def _locked(where: Place) -> Iterator[None]:
    fd = os.open(where.lock, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW, 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)


_STARTED: list[subprocess.Popen] = []  # kept, so no handle is collected while its server runs


def _start(where: Place, env: dict[str, str], idle: float) -> subprocess.Popen:
    with contextlib.suppress(FileNotFoundError):
        where.socket.unlink()  # a server that died without removing it
    log = os.open(where.log, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW, 0o600)
    try:
        proc = subprocess.Popen(
            [sys.executable, "-m", "harness.isolation.child.forkserver", "--listen",
             str(where.socket), "--idle", str(idle)],
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=log,
            start_new_session=True,
            cwd="/",
            env=env,
        )  # fmt: skip
    finally:
        os.close(log)
    _STARTED.append(proc)
    return proc


def _wait_listening(where: Place, proc: subprocess.Popen) -> socket.socket:
    deadline = time.monotonic() + START_TIMEOUT
    while time.monotonic() < deadline:
        sock = _connect(where)
        if sock is not None:
            return sock
        if proc.poll() is not None:
            tail = where.log.read_text(errors="replace")[-2000:]
            code = proc.returncode
            raise OSError(f"the warm fork server exited ({code}) before listening:\n{tail}")
        time.sleep(0.05)
    proc.kill()
    raise OSError(f"the warm fork server did not listen within {START_TIMEOUT:.0f} s")


@dataclass
class Connection:
    sock: socket.socket
    pid: int  # the warm server's
    started: bool  # by this call
    replaced: str | None  # why a stale server was stopped first


def connect(env: dict[str, str], idle: float, folder: Path | None = None) -> Connection:
    """A connection to the current warm server, started (or restarted, if stale) as needed."""
    where = checked_place(env, folder)
    with _locked(where):
        sock, replaced = _connect(where), None
        if sock is not None:
            about = ask(sock, {"op": "about"})
            replaced = stale(about)
            if replaced is None:
                return Connection(sock, about["pid"], False, None)
            ask(sock, {"op": "stop"})
            sock.close()
            _gone(about["pid"])
        proc = _start(where, env, idle)
        sock = _wait_listening(where, proc)
        about = ask(sock, {"op": "about"})
        return Connection(sock, about["pid"], True, replaced)


def _gone(pid: int, timeout: float = 10.0) -> None:
    """Wait until process `pid` (a server told to stop) has exited and removed its socket."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        with contextlib.suppress(ChildProcessError):
            os.waitpid(pid, os.WNOHANG)  # if this process started it, reap it
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return
        time.sleep(0.02)


def status(env: dict[str, str], folder: Path | None = None) -> dict[str, Any] | None:
    """The running server's `about` and its staleness; None if none runs."""
    where = checked_place(env, folder)
    sock = _connect(where)
    if sock is None:
        return None
    with sock:
        about = ask(sock, {"op": "about"})
    return {**about, "socket": str(where.socket), "stale": stale(about)}


def stop(env: dict[str, str], folder: Path | None = None) -> int | None:
    """Stop the running server; its pid, or None if none ran."""
    where = checked_place(env, folder)
    with _locked(where):
        sock = _connect(where)
        if sock is None:
            return None
        with sock:
            pid = ask(sock, {"op": "stop"})["stopped"]
        _gone(pid)
        return pid
