"""The worker process: loads one subject and runs probes on it for the parent.

`python -m harness.worker READ_FD WRITE_FD` reads request frames on READ_FD and answers each on
WRITE_FD (harness.protocol: plain data only). Requests:

- {"op": "load", "subject": spec, "rlimits": {"RLIMIT_AS": [soft, hard], ...}, "sandbox": cage}:
  confine the worker (harness.sandbox, when "sandbox" is given) and set the resource limits
  before any subject code runs, then import the subject.
- {"op": "call", "probe": name, "inputs": {...}}: run harness.probes.PROBES[name](module, **inputs).

Each answer is {"ok": true, "value": ...} or {"ok": false, "error": {type, bases, message,
where}}. The subject's own prints go to the worker's stdout/stderr, never to the protocol pipe.
"""

from __future__ import annotations

import os
import resource
import sys
import traceback
from typing import Any

from harness import protocol


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
    protocol.write_frame(_REPLY_FD, {"event": event})


def serve(read_fd: int, write_fd: int) -> None:
    """Answer requests until the parent closes the pipe or says exit."""
    global _REPLY_FD
    import torch

    from harness import probes, subjects

    # One intra-op thread: the parent runs several workers side by side on few cores.
    torch.set_num_threads(1)
    _REPLY_FD = write_fd
    module = None
    while True:
        try:
            request = protocol.read_frame(read_fd)
        except protocol.ChannelClosed:
            return
        op = request.get("op")
        if op == "exit":
            return
        try:
            if op == "load":
                if "sandbox" in request:  # grading's cage (harness.sandbox), before the subject
                    from harness.sandbox import confine

                    confine(request["sandbox"])
                for name, (soft, hard) in request.get("rlimits", {}).items():
                    resource.setrlimit(getattr(resource, name), (soft, hard))
                module = subjects.load(subjects.Subject.from_json(request["subject"]))
                value: Any = {"module": module.__name__}
            elif op == "call":
                if module is None:
                    raise RuntimeError("call before load")
                probe = probes.PROBES[request["probe"]]
                value = probe(module, **request["inputs"])
            else:
                raise ValueError(f"unknown op {op!r}")
            reply = protocol.encode({"ok": True, "value": value})
        except BaseException as exc:  # SystemExit and KeyboardInterrupt from a subject too
            reply = protocol.encode({"ok": False, "error": describe(exc)})
        view = memoryview(reply)
        while view:
            view = view[os.write(write_fd, view) :]


if __name__ == "__main__":
    # serve from the imported module, not __main__: probes reach emit as harness.worker.emit
    from harness import worker

    worker.serve(int(sys.argv[1]), int(sys.argv[2]))
