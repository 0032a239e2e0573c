"""The fork server: one trusted process that imported torch and the probes once, and forks a
worker for each trusted subject (impl, the torch copy, the mutants) in milliseconds.

Untrusted code never goes through it: each untrusted run starts a fresh interpreter in its own
sandbox (harness.isolation.sandbox). `python -m harness.isolation.child.forkserver FD` serves on
the unix socket FD (SOCK_SEQPACKET: one message per recv), one request at a time:
- spawn, with three descriptors attached (request pipe, reply pipe, log file): fork a worker that
  leads its own session, writes its output to the log and serves harness.isolation.child.serve;
  answers {"pid": pid}.
- wait {"pid", "timeout"}: reap that worker; answers {"status": exit code, negative for a
  signal} or {"status": null} if it is still running after `timeout` seconds.
The fork server is the workers' parent, so only it can reap them and read their exit status.
"""

from __future__ import annotations

import json
import os
import socket
import sys
import time
from typing import Any

MAX_MESSAGE = 4096


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


def _serve(control: socket.socket) -> None:
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
                    serve.serve(req_r, resp_w)
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


if __name__ == "__main__":
    preload()
    _serve(socket.socket(fileno=int(sys.argv[1])))
