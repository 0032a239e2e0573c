"""The parent's handle on the fork server (harness.isolation.child.forkserver), which forks a
worker per trusted subject in milliseconds. Only trusted code runs this way: impl, the torch
copy and the mutants in the kill-rate matrix, the tools that derive bars and tolerances, and
grading under the explicit --unsafe-no-sandbox.

The fork server inherits a minimal environment (enough to run Python and import this project)
and / as its working directory, so nothing of the parent's shows in a worker's /proc/PID/environ.

By default each run starts its own (private) fork server. Within `warm_server(idle)` the
process uses the warm one instead (harness.isolation.warm), which outlives the run; where that
cannot be used safely, the run says why and starts its own.
"""

from __future__ import annotations

import contextlib
import json
import os
import socket
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from harness.isolation import warm as persistent
from harness.isolation.worker import Process, Start, kill_group

MAX_MESSAGE = 4096
PROJECT_ROOT = Path(__file__).resolve().parents[2]


def worker_environment() -> dict[str, str]:
    keep = {k: os.environ[k] for k in ("PATH", "LANG", "LC_ALL", "TMPDIR") if k in os.environ}
    path = os.pathsep.join(p for p in (str(PROJECT_ROOT), os.environ.get("PYTHONPATH")) if p)
    return {**keep, "PYTHONPATH": path}


class ForkServer:
    """A connection to a fork server (this run's own, or the warm one's connection server);
    thread-safe, one request at a time."""

    def __init__(self, sock: socket.socket, proc: subprocess.Popen | None = None) -> None:
        self._lock = threading.Lock()
        self._sock, self._proc = sock, proc
        self._closed = False

    @classmethod
    def private(cls) -> ForkServer:
        """A fork server of this run's own, on a socket pair."""
        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        proc = subprocess.Popen(
            [sys.executable, "-m", "harness.isolation.child.forkserver", str(theirs.fileno())],
            pass_fds=(theirs.fileno(),),
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            start_new_session=True,
            cwd="/",
            env=worker_environment(),
        )
        theirs.close()
        return cls(ours, proc)

    @property
    def private_server(self) -> bool:
        return self._proc is not None

    def alive(self) -> bool:
        return not self._closed and (self._proc is None or self._proc.poll() is None)

    def close(self) -> None:
        """Close the connection: a private server exits on it, a warm one's connection server
        too (the warm server stays)."""
        with self._lock:
            self._closed = True
            self._sock.close()

    def _ask(self, request: dict[str, Any], fds: tuple[int, ...] = ()) -> dict[str, Any]:
        with self._lock:
            try:
                socket.send_fds(self._sock, [json.dumps(request).encode()], list(fds))
                reply = self._sock.recv(MAX_MESSAGE)
            except OSError:
                self._closed = True
                raise
        if not reply:
            self._closed = True
            status = f" (status {self._proc.poll()})" if self._proc is not None else ""
            raise OSError(f"the fork server exited{status}")
        return json.loads(reply)

    def spawn(
        self,
        request_fd: int,
        reply_fd: int,
        log_fd: int,
        paths: tuple[str, ...] = (),
        bytecode: bool = True,
    ) -> Process:
        """Fork a worker on these descriptors (the server's copies); `paths` after the project
        on its import path, and no bytecode written where not `bytecode`."""
        request: dict[str, Any] = {"op": "spawn"}
        if paths or not bytecode:
            request |= {"paths": list(paths), "bytecode": bytecode}
        pid = self._ask(request, (request_fd, reply_fd, log_fd))["pid"]
        return _Forked(self, pid)

    def wait(self, pid: int, timeout: float) -> int | None:
        return self._ask({"op": "wait", "pid": pid, "timeout": timeout})["status"]


class _Forked:
    """A worker forked by the server: it leads its own session, so its group is what it started."""

    def __init__(self, server: ForkServer, pid: int) -> None:
        self.server, self.pid = server, pid
        self._done = False

    def wait(self, timeout: float) -> int | None:
        status = self.server.wait(self.pid, timeout)
        self._done = status is not None
        return status

    def kill(self) -> None:
        kill_group(self.pid, reaped=self._done)

    def release(self) -> None:
        pass


_SERVER: ForkServer | None = None
_SERVER_LOCK = threading.Lock()
_WARM_IDLE: float | None = None  # seconds; set within warm_server()


@contextlib.contextmanager
def warm_server(idle: float) -> Iterator[None]:
    """Within this block, fork workers from the warm fork server, which outlives the run and
    exits after `idle` seconds with no run connected (0: this run's own server, as outside).
    On leaving, this process's connection to it is closed (the server stays)."""
    global _WARM_IDLE, _SERVER
    if idle <= 0:
        yield
        return
    with _SERVER_LOCK:
        before, _WARM_IDLE = _WARM_IDLE, idle
        if _SERVER is not None and _SERVER.private_server:
            _SERVER.close()
            _SERVER = None
    try:
        yield
    finally:
        with _SERVER_LOCK:
            _WARM_IDLE = before
            if _SERVER is not None and not _SERVER.private_server:
                _SERVER.close()
                _SERVER = None


def _new_server() -> ForkServer:
    if _WARM_IDLE is None:
        return ForkServer.private()
    try:
        conn = persistent.connect(worker_environment(), _WARM_IDLE)
    except persistent.Refused as e:
        print(f"xfmr: no warm fork server: {e}; this run starts its own", file=sys.stderr)
        return ForkServer.private()
    if conn.started:
        why = f" (the one before ran stale code: {conn.replaced})" if conn.replaced else ""
        print(
            f"xfmr: started a warm fork server, pid {conn.pid}{why}; it exits after "
            f"{_WARM_IDLE:.0f} s unused (`xfmr warm-server stop` stops it now)",
            file=sys.stderr,
        )
    return ForkServer(conn.sock)


def fork_server() -> ForkServer:
    """This process's fork server, started on first use (and again if it died)."""
    global _SERVER
    with _SERVER_LOCK:
        if _SERVER is None or not _SERVER.alive():
            _SERVER = _new_server()
        return _SERVER


def warm() -> None:
    """Start the fork server now: it preloads torch in its own process for a few seconds, and
    what the caller prepares meanwhile no longer waits in line behind that. (Connecting to the
    warm server may start one and wait for it, so that happens on a thread; a failure there
    shows again, raised, at the first worker's start.)"""
    if _WARM_IDLE is None:
        fork_server()
    else:
        threading.Thread(target=_try_fork_server, daemon=True).start()


def _try_fork_server() -> None:
    try:
        fork_server()
    except Exception:  # noqa: BLE001  (raised again where a worker needs it)
        pass


def forked(request_fd: int, reply_fd: int, log_fd: int) -> Process:
    """A `Start` for trusted workers: forked from the fork server."""
    return fork_server().spawn(request_fd, reply_fd, log_fd)


def forked_as_local(paths: tuple[str, ...] = ()) -> Start:
    """A `Start` for code its owner trusts on their own machine (a self-check), forked from the
    fork server instead of started as a plain subprocess (harness.isolation.local.local): with
    `paths` after the project on its import path and no bytecode written, as that would; its
    working folder and limits come from the load request's confinement, as there."""

    def start(request_fd: int, reply_fd: int, log_fd: int) -> Process:
        return fork_server().spawn(request_fd, reply_fd, log_fd, paths, bytecode=False)

    return start
