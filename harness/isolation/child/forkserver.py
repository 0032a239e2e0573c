"""The fork server: one trusted process that imported torch and the probes once, and forks a
worker for each trusted subject (impl, the torch copy, the mutants) in milliseconds.

Untrusted code never goes through it: each untrusted run starts a fresh interpreter in its own
sandbox (harness.isolation.sandbox). `python -m harness.isolation.child.forkserver FD` serves on
the unix socket FD (SOCK_SEQPACKET: one message per recv), one request at a time:
- spawn, with three descriptors attached (request pipe, reply pipe, log file): fork a worker that
  leads its own session, writes its output to the log and serves harness.isolation.child.serve;
  answers {"pid": pid}. Optional "paths" and "bytecode": false set up the worker as a plain
  subprocess of a self-check would be (harness.isolation.local; `_prepare`).
- wait {"pid", "timeout"}: reap that worker; answers {"status": exit code, negative for a
  signal} or {"status": null} if it is still running after `timeout` seconds.
The fork server is the workers' parent, so only it can reap them and read their exit status.

`python -m harness.isolation.child.forkserver --listen PATH --idle SECONDS` is the warm fork
server (harness.isolation.warm): it preloads once, then listens on the unix socket PATH and forks
one connection server per parent that connects (a process of the same user only: SO_PEERCRED),
which serves that parent exactly as above. It exits once no parent has been connected for
SECONDS, or on SIGTERM. A connection server answers two more requests:
- about: {"pid": the warm server's pid, "files": {path: sha256} of every project file it
  imported, as they were before it imported them, "libraries": {path: [size, mtime_ns]} of each
  imported third-party package's entry file}, so the parent can tell whether it runs current code;
- stop: SIGTERM to the warm server (the connection servers already forked serve on).
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import select
import signal
import socket
import struct
import sys
import sysconfig
import time
from pathlib import Path
from typing import Any

from harness.isolation.limits import PROJECT_PACKAGES

MAX_MESSAGE = 4096
PROJECT_ROOT = Path(__file__).resolve().parents[3]


def preload() -> None:
    """The imports every worker needs, paid once here: torch (~2 s), torch._dynamo (~1.5 s,
    imported by the first optimizer built), safetensors, and the probes; and one tiny update."""
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    os.environ.setdefault("MKL_NUM_THREADS", "1")
    import safetensors.torch  # noqa: F401  (save_transformer / load_transformer)
    import torch

    import harness.isolation.child.probes  # noqa: F401
    import harness.isolation.child.serve  # noqa: F401

    torch.set_num_threads(1)
    # one update of a tiny model: the first optimizer imports torch._dynamo, and the first
    # forward, backward and step set up what every later one reuses; paid here once, not in
    # every forked worker
    layer = torch.nn.Linear(2, 2)
    optimizer = torch.optim.Adam(layer.parameters(), foreach=True)
    torch.softmax(layer(torch.ones(1, 2)), -1).sum().backward()
    optimizer.step()


def _serve(control: socket.socket, about: dict[str, Any] | None = None) -> None:
    from harness.isolation.child import serve

    while True:
        try:
            message, fds, _, _ = socket.recv_fds(control, MAX_MESSAGE, 3)
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
                    _prepare(request)
                    serve.serve(req_r, resp_w)
                    code = 0
                finally:
                    os._exit(code)
            for fd in fds:
                os.close(fd)
            reply: dict[str, Any] = {"pid": pid}
        elif request["op"] == "wait":
            reply = {"status": _reap(request["pid"], request["timeout"])}
        elif request["op"] == "about" and about is not None:
            reply = about
        elif request["op"] == "stop" and about is not None:
            os.kill(about["pid"], signal.SIGTERM)
            reply = {"stopped": about["pid"]}
        else:
            reply = {"error": f"unknown op {request['op']!r}"}
        control.sendall(json.dumps(reply).encode())


def _prepare(request: dict[str, Any]) -> None:
    """A spawn request's own setting of its worker, as a plain subprocess of
    harness.isolation.local would have it: "paths" (the submission's folder: its own helper
    modules import) after the project on the import path, and "bytecode": false (no
    __pycache__ written beside the student's files: python -B)."""
    paths = [str(p) for p in request.get("paths", [])]
    if paths:
        after = sys.path.index(str(PROJECT_ROOT)) + 1 if str(PROJECT_ROOT) in sys.path else 0
        sys.path[after:after] = paths
    if request.get("bytecode") is False:
        sys.dont_write_bytecode = True


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


def _project_sources() -> dict[str, str]:
    """sha256 of every .py file of the project's packages (caches left out): read before the
    preload, so an edit made while it imports shows as a difference, never as current. The
    packages alone: in an installed wheel (the student kit) PROJECT_ROOT is site-packages, whose
    torch would make the `about` reply too large for one packet."""
    found = {}
    for folder, dirs, files in (
        step for package in PROJECT_PACKAGES for step in os.walk(PROJECT_ROOT / package)
    ):
        dirs[:] = [d for d in dirs if not d.startswith(".") and d != "__pycache__"]
        for name in files:
            if name.endswith(".py"):
                path = os.path.join(folder, name)
                found[path] = hashlib.sha256(Path(path).read_bytes()).hexdigest()
    return found


def fingerprint(sources: dict[str, str]) -> dict[str, Any]:
    """What this process imported that a later edit or install could make stale: the project's
    files (their hashes from `sources`) and each third-party package's entry file (its size and
    modification time: an install rewrites it)."""
    stdlib = os.path.realpath(sysconfig.get_paths()["stdlib"])
    files, libraries = {}, {}
    for name, module in list(sys.modules.items()):
        path = getattr(module, "__file__", None)
        if not path or not path.endswith(".py"):
            continue
        path = os.path.realpath(path)
        if path in sources:
            files[path] = sources[path]
        elif "." not in name and not path.startswith(stdlib + os.sep):
            st = os.stat(path)
            libraries[path] = [st.st_size, st.st_mtime_ns]
    return {"pid": os.getpid(), "files": files, "libraries": libraries}


def _same_user(conn: socket.socket) -> bool:
    creds = conn.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, struct.calcsize("3i"))
    _, uid, _ = struct.unpack("3i", creds)
    return uid == os.getuid()


def listen(path: str, idle: float) -> None:
    """The warm fork server's loop (see the module's doc)."""
    sources = _project_sources()
    preload()
    about = fingerprint(sources)
    old_umask = os.umask(0o177)  # the socket: read and write for this user only
    try:
        listener = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        listener.bind(path)
    finally:
        os.umask(old_umask)
    inode = os.stat(path).st_ino
    listener.listen(16)

    stopping = []

    def stop(signum: int, frame: Any) -> None:
        # noted, not raised: a handler's exception is lost where the signal lands inside
        # os.fork's own callbacks; the loop sees the note within its select's half second
        stopping.append(signum)

    signal.signal(signal.SIGTERM, stop)
    serving: set[int] = set()
    last_active = time.monotonic()
    try:
        while not stopping and (serving or time.monotonic() - last_active < idle):
            ready, _, _ = select.select([listener], [], [], 0.5)
            for pid in list(serving):
                if os.waitpid(pid, os.WNOHANG)[0]:
                    serving.discard(pid)
            if serving:
                last_active = time.monotonic()
            if not ready:
                continue
            conn, _ = listener.accept()
            if not _same_user(conn):
                conn.close()
                continue
            pid = os.fork()
            if pid == 0:  # this parent's connection server
                code = 1
                try:
                    signal.signal(signal.SIGTERM, signal.SIG_DFL)
                    listener.close()
                    _serve(conn, about)
                    code = 0
                finally:
                    os._exit(code)
            conn.close()
            serving.add(pid)
            last_active = time.monotonic()
    finally:
        try:
            if os.stat(path).st_ino == inode:  # still this server's socket
                os.unlink(path)
        except FileNotFoundError:
            pass


def main(argv: list[str]) -> None:
    parser = argparse.ArgumentParser(prog="python -m harness.isolation.child.forkserver")
    parser.add_argument("fd", nargs="?", type=int, help="serve this one parent on socket FD")
    parser.add_argument("--listen", metavar="PATH", help="be the warm server on this socket")
    parser.add_argument("--idle", type=float, default=600.0, help="seconds idle before exiting")
    args = parser.parse_args(argv)
    if (args.fd is None) == (args.listen is None):
        parser.error("give exactly one of FD and --listen PATH")
    if args.listen is not None:
        listen(args.listen, args.idle)
    else:
        preload()
        _serve(socket.socket(fileno=args.fd))


if __name__ == "__main__":
    main(sys.argv[1:])
