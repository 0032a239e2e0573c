"""A zygote: one process that imported torch and the probes once, and forks every worker.

A worker started from a fresh interpreter spends ~2 s importing torch and ~3 s more importing
torch._dynamo the first time it builds an optimizer; forked from the zygote it starts in
milliseconds. The zygote imports no subject: each forked worker loads its own.

`python -m harness.zygote FD` serves on the unix socket FD (SOCK_SEQPACKET: one message per
recv), one request at a time:
- spawn, with three descriptors attached (request pipe, reply pipe, log file): fork a worker that
  leads its own session, writes its output to the log and serves harness.worker's protocol;
  answers {"pid": pid}.
- wait {"pid", "timeout"}: reap that worker; answers {"status": exit code, negative for a
  signal} or {"status": null} if it is still running after `timeout` seconds.
The zygote is the workers' parent, so only it can reap them and read their exit status.
Workers inherit the zygote's environment and working directory: a minimal environment (enough to
run Python and import this project) and /, so nothing of the parent's shows in /proc/PID/environ.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

_MAX_MESSAGE = 4096


def _serve(control: socket.socket) -> None:
    from harness import worker

    while True:
        try:
            message, fds, _, _ = socket.recv_fds(control, _MAX_MESSAGE, 3)
        except OSError:
            return
        if not message:
            return  # the parent is gone
        request = json.loads(message)
        if request["op"] == "spawn":
            pid = os.fork()
            if pid == 0:  # the worker
                code = 1
                try:
                    control.close()
                    os.setsid()
                    req_r, resp_w, log = fds
                    os.dup2(log, 1)
                    os.dup2(log, 2)
                    os.close(log)
                    worker.serve(req_r, resp_w)
                    code = 0
                finally:
                    os._exit(code)
            for fd in fds:
                os.close(fd)
            reply: dict[str, Any] = {"pid": pid}
        elif request["op"] == "wait":
            reply = {"status": _reap(request["pid"], request["timeout"])}
        else:
            reply = {"error": f"unknown op {request['op']!r}"}
        control.sendall(json.dumps(reply).encode())


def _reap(pid: int, timeout: float) -> int | None:
    deadline = time.monotonic() + timeout
    while True:
        try:
            done, status = os.waitpid(pid, os.WNOHANG)
        except ChildProcessError:
            return None  # already reaped: an unknown status
        if done:
            return os.waitstatus_to_exitcode(status)
        if time.monotonic() >= deadline:
            return None
        time.sleep(0.01)


def _zygote_env() -> dict[str, str]:
    """What the zygote (and so every forked worker's /proc/PID/environ) may see of the parent's
    environment: enough to run Python and import this project, nothing else."""
    root = str(Path(__file__).resolve().parent.parent)
    keep = {k: os.environ[k] for k in ("PATH", "LANG", "LC_ALL", "TMPDIR") if k in os.environ}
    path = os.pathsep.join(p for p in (root, os.environ.get("PYTHONPATH")) if p)
    return {**keep, "PYTHONPATH": path}


class Zygote:
    """The parent's handle on the zygote process; thread-safe, one request at a time."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._sock, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        self._proc = subprocess.Popen(
            [sys.executable, "-m", "harness.zygote", str(theirs.fileno())],
            pass_fds=(theirs.fileno(),),
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            start_new_session=True,
            cwd="/",
            env=_zygote_env(),
        )
        theirs.close()

    def alive(self) -> bool:
        return self._proc.poll() is None

    def _ask(self, request: dict[str, Any], fds: tuple[int, ...] = ()) -> dict[str, Any]:
        with self._lock:
            socket.send_fds(self._sock, [json.dumps(request).encode()], list(fds))
            reply = self._sock.recv(_MAX_MESSAGE)
        if not reply:
            raise OSError(f"the zygote exited (status {self._proc.poll()})")
        return json.loads(reply)

    def spawn(self, request_fd: int, reply_fd: int, log_fd: int) -> int:
        """Fork a worker on these descriptors (the zygote's copies); its pid."""
        return self._ask({"op": "spawn"}, (request_fd, reply_fd, log_fd))["pid"]

    def wait(self, pid: int, timeout: float) -> int | None:
        """The worker's exit code (negative: killed by that signal), None if still running."""
        return self._ask({"op": "wait", "pid": pid, "timeout": timeout})["status"]


_ZYGOTE: Zygote | None = None
_ZYGOTE_LOCK = threading.Lock()


def zygote() -> Zygote:
    """This process's zygote, started on first use (and again if it died)."""
    global _ZYGOTE
    with _ZYGOTE_LOCK:
        if _ZYGOTE is None or not _ZYGOTE.alive():
            _ZYGOTE = Zygote()
        return _ZYGOTE


if __name__ == "__main__":
    import harness.preload  # noqa: F401  (the slow imports, paid once here)

    _serve(socket.socket(fileno=int(sys.argv[1])))
