# ruff: noqa: F821  (an overlay: noam_rate comes from the source it is appended to)
# Attack (issue 34): write frames of its own on the worker's reply pipe, so that the grader takes
# one for the answer to its pending request and every later reply answers the one before.
# __WHEN__ (filled in by the test) says where:
# - "import": at import, a well-formed answer to the pending load request, its id guessed;
# - "stray": at import, the same answer under the load request's real id (read from the
#   worker's memory): the worker's own reply then follows, answering nothing;
# - "call": inside noam_rate, a well-formed answer under the previous request's id (a replayed
#   reply), then the true rates.
# Fault: none of its own; whatever it forges must end its worker, never desynchronise the wire.
import json as _json
import os as _os
import struct as _struct
import sys as _sys

_WHEN = "__WHEN__"


def _serving() -> dict:
    """The worker's serve loop's locals (its reply descriptor, the pending request's id): the
    grader's modules are out of sys.modules, but its frames are on the stack below ours."""
    frame = _sys._getframe()
    while "request_id" not in frame.f_locals:
        frame = frame.f_back
    return frame.f_locals


def _forge(body: object, frame_id: int) -> None:
    doc = _json.dumps({"body": body, "arrays": []}).encode()
    head = _struct.pack(">4sQIQ", b"XFM2", frame_id % (1 << 64), len(doc), 0)
    _os.write(_serving()["write_fd"], head + doc)


def _current_id() -> int:
    return _serving()["request_id"]


if _WHEN == "import":
    _forge({"ok": True, "value": {"module": "transformer"}}, 1)
elif _WHEN == "stray":
    _forge({"ok": True, "value": {"module": "transformer"}}, _current_id())

_honest_noam_rate = noam_rate


def noam_rate(step, d_model, warmup, factor=1.0):
    if _WHEN == "call":
        _forge({"ok": True, "value": [0.5, 0.5, 0.5]}, _current_id() - 1)
    return _honest_noam_rate(step, d_model, warmup, factor)
