"""The worker process: loads one subject and runs probes on it for the parent.

Started inside the sandbox (harness.isolation.sandbox) or forked by the trusted fork server
(harness.isolation.child.forkserver), it reads request frames on one pipe and answers each on
another (harness.wire: plain data only). Requests:

- {"op": "load", "subject": {"path"} or {"source", "filename"}, "probes": [module, ...],
  "confine": {"rlimits", "dir"}}: import the named probe modules of this package, confine
  (harness.isolation.child.confine), then load the subject.
- {"op": "call", "probe": name, "inputs": {...}}: run PROBES[name](module, **inputs).
- {"op": "exit"}.

While a call runs, its probe may send frames ahead of the reply (harness.isolation.child.channel):
{"event": ...} (progress, no answer) or {"ask": ...}, answered by the parent's {"answer": ...}.
Every frame of a request (its events, questions, answers and reply) carries the request's id
in its header (harness.wire); the parent refuses any frame of another id.

A load or call request with "trace": true also answers "called": the subject's functions that
ran meanwhile (harness.isolation.child.calls; for trusted subjects only, see there).

Each answer is {"ok": true, "value": ...} or {"ok": false, "error": {type, bases, message,
where}}. The subject's own prints go to the worker's stdout/stderr, never to the reply pipe.
"""

from __future__ import annotations

import importlib
import os
import sys
import traceback
from collections.abc import Iterator
from contextlib import contextmanager
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


def serve(read_fd: int, write_fd: int) -> None:
    """Answer requests until the parent closes the pipe or says exit."""
    import torch

    from harness.isolation.child import calls, channel, confine, load, probes

    # One intra-op thread: the parent runs several workers side by side on few cores.
    torch.set_num_threads(1)
    channel.attach(read_fd, write_fd)
    module = None
    filename = ""  # the loaded subject's file, whose functions a traced request records
    while True:
        try:
            request_id, request = wire.read_frame(read_fd)
        except wire.ChannelClosed:
            return
        channel.serving(request_id)  # its events, questions and reply carry its id
        op = request.get("op")
        if op == "exit":
            return
        traced = request.get("trace") is True
        called: set[str] = set()
        try:
            if op == "load":
                for name in request.get("probes", []):
                    if name not in PROBE_MODULES:
                        raise ValueError(f"unknown probe module {name!r}")
                    importlib.import_module(f"harness.isolation.child.{name}")
                confine.confine(request.get("confine", {}))
                spec = request["subject"]
                if traced and "source" not in spec:
                    raise ValueError("call coverage needs a subject sent as source text")
                filename = str(spec.get("filename", "<subject>"))
                with calls.recorded(filename) if traced else _untraced() as called:
                    module = load.subject(spec)
                value: Any = {"module": module.__name__}
            elif op == "call":
                if module is None:
                    raise RuntimeError("call before load")
                probe = probes.PROBES[request["probe"]]
                # every probe starts from the same global random state, so what a test sees
                # never depends on the tests that ran before it in this worker
                reseed()
                with calls.recorded(filename) if traced else _untraced() as called:
                    value = probe(module, **request["inputs"])
            else:
                raise ValueError(f"unknown op {op!r}")
            answer = {"ok": True, "value": value}
            reply = wire.encode(
                {**answer, "called": sorted(called)} if traced else answer, request_id
            )
        except BaseException as exc:  # SystemExit and KeyboardInterrupt from a subject too
            failed = {"ok": False, "error": describe(exc)}
            # a call that raised ran functions too (a validation test's calls raise on purpose)
            reply = wire.encode(
                {**failed, "called": sorted(called)} if traced else failed, request_id
            )
        view = memoryview(reply)
        while view:
            view = view[os.write(write_fd, view) :]


@contextmanager
def _untraced() -> Iterator[set[str]]:
    yield set()


def reseed() -> None:
    """The global generators (torch's, numpy's legacy one, Python's) at seed 0."""
    import random

    import numpy as np
    import torch

    torch.manual_seed(0)
    np.random.seed(0)
    random.seed(0)


def main() -> None:
    """`python -c` entry of a sandboxed worker: serve on the descriptors in argv."""
    serve(int(sys.argv[1]), int(sys.argv[2]))


if __name__ == "__main__":
    # serve from the imported module, not __main__: one copy of the module state
    from harness.isolation.child import serve as this

    this.serve(int(sys.argv[1]), int(sys.argv[2]))
