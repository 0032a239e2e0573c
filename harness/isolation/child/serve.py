"""The worker process: loads one subject and runs probes on it for the parent.

Started inside the sandbox (harness.isolation.sandbox) or forked by the trusted fork server
(harness.isolation.child.forkserver), it reads request frames on one pipe and answers each on
another (harness.wire: plain data only). Requests:

- {"op": "load", "subject": {"path"} or {"source", "filename"}, "probes": [module, ...],
  "confine": {"rlimits", "dir"}}: import the named probe modules of this package, confine
  (harness.isolation.child.confine), then load the subject.
- {"op": "call", "probe": name, "inputs": {...}}: run PROBES[name](module, **inputs).
- {"op": "exit"}.

Each answer is {"ok": true, "value": ...} or {"ok": false, "error": {type, bases, message,
where}}. The subject's own prints go to the worker's stdout/stderr, never to the reply pipe.
"""

from __future__ import annotations

import importlib
import os
import sys
import traceback
from typing import Any

from harness import wire

# The probe modules a load request may name (student_suite imports pytest: only when asked).
PROBE_MODULES = ("probes", "student_suite")


def describe(exc: BaseException) -> dict[str, Any]:
    """An exception as plain data: class name, base class names, message, innermost frame."""
    bases = [c.__name__ for c in type(exc).__mro__]
    try:
        message = str(exc)[:4000]
    except Exception:  # a subject's exception whose __str__ itself fails
        message = "<message could not be read>"
    frames = traceback.extract_tb(exc.__traceback__)
    where = f"{frames[-1].filename}:{frames[-1].lineno} in {frames[-1].name}" if frames else ""
    return {"type": type(exc).__name__, "bases": bases, "message": message, "where": where}


_REPLY_FD: int | None = None


def emit(event: Any) -> None:
    """Send an event frame ({"event": ...}) ahead of the current request's reply: a probe that
    runs long (a student's pytest suite) reports progress, so a hang costs only one step."""
    if _REPLY_FD is None:
        raise RuntimeError("emit outside serve")
    wire.write_frame(_REPLY_FD, {"event": event})


def serve(read_fd: int, write_fd: int) -> None:
    """Answer requests until the parent closes the pipe or says exit."""
    global _REPLY_FD
    import torch

    from harness.isolation.child import confine, load, probes

    # One intra-op thread: the parent runs several workers side by side on few cores.
    torch.set_num_threads(1)
    _REPLY_FD = write_fd
    module = None
    while True:
        try:
            request = wire.read_frame(read_fd)
        except wire.ChannelClosed:
            return
        op = request.get("op")
        if op == "exit":
            return
        try:
            if op == "load":
                for name in request.get("probes", []):
                    if name not in PROBE_MODULES:
                        raise ValueError(f"unknown probe module {name!r}")
                    importlib.import_module(f"harness.isolation.child.{name}")
                confine.confine(request.get("confine", {}))
                module = load.subject(request["subject"])
                value: Any = {"module": module.__name__}
            elif op == "call":
                if module is None:
                    raise RuntimeError("call before load")
                value = probes.PROBES[request["probe"]](module, **request["inputs"])
            else:
                raise ValueError(f"unknown op {op!r}")
            reply = wire.encode({"ok": True, "value": value})
        except BaseException as exc:  # SystemExit and KeyboardInterrupt from a subject too
            reply = wire.encode({"ok": False, "error": describe(exc)})
        view = memoryview(reply)
        while view:
            view = view[os.write(write_fd, view) :]


def main() -> None:
    """`python -c` entry of a sandboxed worker: serve on the descriptors in argv."""
    serve(int(sys.argv[1]), int(sys.argv[2]))


if __name__ == "__main__":
    # serve from the imported module, not __main__: probes reach emit as serve.emit
    from harness.isolation.child import serve as this

    this.serve(int(sys.argv[1]), int(sys.argv[2]))
