"""The parent's handle on the fork server (harness.isolation.child.forkserver), which forks a
worker per trusted subject in milliseconds. Only trusted code runs this way: impl, the torch
copy and the mutants in the kill-rate matrix, the tools that derive bars and tolerances, and
grading under the explicit --unsafe-no-sandbox.

The fork server inherits a minimal environment (enough to run Python and import this project)
and / as its working directory, so nothing of the parent's shows in a worker's /proc/PID/environ.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import threading
from pathlib import Path
from typing import Any

from harness.isolation.worker import Process, kill_group

MAX_MESSAGE = 4096
PROJECT_ROOT = Path(__file__).resolve().parents[2]


def _environment() -> dict[str, str]:
    keep = {k: os.environ[k] for k in ("PATH", "LANG", "LC_ALL", "TMPDIR") if k in os.environ}
    path = os.pathsep.join(p for p in (str(PROJECT_ROOT), os.environ.get("PYTHONPATH")) if p)
    return {**keep, "PYTHONPATH": path}


class ForkServer:
    """The fork server process; thread-safe, one request at a time."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._sock, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        self._proc = subprocess.Popen(
            [sys.executable, "-m", "harness.isolation.child.forkserver", str(theirs.fileno())],
            pass_fds=(theirs.fileno(),),
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            start_new_session=True,
            cwd="/",
            env=_environment(),
        )
        theirs.close()

    def alive(self) -> bool:
        return self._proc.poll() is None

    def _ask(self, request: dict[str, Any], fds: tuple[int, ...] = ()) -> dict[str, Any]:
        with self._lock:
            socket.send_fds(self._sock, [json.dumps(request).encode()], list(fds))
            reply = self._sock.recv(MAX_MESSAGE)
        if not reply:
            raise OSError(f"the fork server exited (status {self._proc.poll()})")
        return json.loads(reply)

    def spawn(self, request_fd: int, reply_fd: int, log_fd: int) -> Process:
        """Fork a worker on these descriptors (the server's copies)."""
        pid = self._ask({"op": "spawn"}, (request_fd, reply_fd, log_fd))["pid"]
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


def fork_server() -> ForkServer:
    """This process's fork server, started on first use (and again if it died)."""
    global _SERVER
    with _SERVER_LOCK:
        if _SERVER is None or not _SERVER.alive():
            _SERVER = ForkServer()
        return _SERVER


def warm() -> None:
    """Start the fork server now: it preloads torch in its own process for a few seconds, and
    what the caller prepares meanwhile no longer waits in line behind that."""
    fork_server()


def forked(request_fd: int, reply_fd: int, log_fd: int) -> Process:
    """A `Start` for trusted workers: forked from the fork server."""
    return fork_server().spawn(request_fd, reply_fd, log_fd)
