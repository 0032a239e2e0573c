"""The wire format between the trusted parent and a subject's worker: JSON plus raw arrays.

Both sides of the trust boundary import this module (harness.isolation on the parent's side,
harness.isolation.child inside the worker), so it imports nothing but numpy.

A frame is a 24-byte header, big-endian: MAGIC, the frame's id (u64), the JSON length (u32) and
the payload length (u64); then the JSON document, then the payload. The document is
{"body": tree, "arrays": [{dtype, shape, nbytes}]}; inside the tree an array is the object
{"__ndarray__": i} and its bytes follow the previous array's in the payload (no padding: the
declared nbytes are dtype * shape and sum to the payload length). Arrays are views of the one
buffer the payload is read into, in a fixed set of little-endian dtypes: nothing the worker
sends is ever unpickled or evaluated, so a subject can at most send wrong data, which the
parent's verdicts judge.

Ids: every request the parent sends has an id of the parent's choosing; every frame the worker
sends while serving it (the reply, and a probe's events and questions before it) carries that
id, and so does the parent's answer to a question. The reader names the id it expects
(`read_frame(expect=...)`) and refuses any other from the header alone, before reading the
frame's body: a frame that answers nothing pending is the worker's protocol error, never an
answer to something else.

Bounded decoding (`Limits`): the reader checks the header against the caps of what it asked for
(one frame's JSON and payload bytes, and a request's total over all its frames: `Budget`)
before allocating anything; then, before json.loads builds a single object, the JSON's nesting
depth and its count of values (a bound from its brackets and commas outside strings); then
each array's description (a dtype of DTYPES, a shape whose product times the item size is the
declared nbytes, the nbytes summing to the payload length) before the payload is allocated,
once, as the buffer the arrays view. So a frame costs the reader at most about
`Limits.cost()` bytes of memory whatever its sender writes.
"""

from __future__ import annotations

import json
import math
import os
import re
import select
import struct
import time
from dataclasses import dataclass
from typing import Any

import numpy as np

MAGIC = b"XFM2"
_HEAD = struct.Struct(">4sQIQ")  # magic, id, JSON length, payload length

# The parent's requests, as the worker reads them (the parent is trusted; pushed weights and
# a batch of inputs are a few MiB).
MAX_JSON = 16 << 20
MAX_PAYLOAD = 256 << 20


@dataclass(frozen=True)
class Limits:
    """What one request may cost its reader: per frame (JSON bytes, payload bytes, nesting
    depth, values in the JSON tree) and over all of the request's frames (a probe's events and
    questions and its reply together: the bytes a reader may keep). Not a worker's resources
    (harness.isolation.limits.Limits, the parent's alone): these are read on both sides of the
    boundary, and the worker imports nothing of the parent's."""

    json: int = MAX_JSON
    payload: int = MAX_PAYLOAD
    depth: int = 64
    elements: int = 4_000_000
    total_json: int = 1 << 40
    total_payload: int = 1 << 40

    def cost(self) -> int:
        """An upper bound, in bytes, on the memory one frame within these limits takes to read
        and decode: the JSON read (1x), its string-free copy (1x), its text (json.loads decodes
        to str: 4x where one character lies outside the BMP), the text of its strings (4x
        again); per value, the brackets' running depth (at most 2 per value, 12 bytes each)
        and the parsed tree (at most 120 bytes per value: a dict entry with its key); and the
        payload (1x: the arrays are views of it)."""
        return 9 * self.json + 150 * self.elements + self.payload


REQUEST = Limits()  # what the worker accepts from the trusted parent


class Budget:
    """A request's running total of received bytes against its Limits' totals."""

    def __init__(self, limits: Limits) -> None:
        self.json, self.payload = limits.total_json, limits.total_payload

    def take(self, n_json: int, n_payload: int) -> None:
        if n_json > self.json or n_payload > self.payload:
            raise ProtocolError(
                f"a frame of {n_json} JSON and {n_payload} payload bytes exceeds what is left "
                f"of the request's total ({self.json} and {self.payload})"
            )
        self.json -= n_json
        self.payload -= n_payload


# The dtypes that may cross the wire, each pinned to little-endian.
DTYPES: dict[str, np.dtype] = {
    name: np.dtype(code)
    for name, code in {
        "float64": "<f8",
        "float32": "<f4",
        "float16": "<f2",
        "int64": "<i8",
        "int32": "<i4",
        "int16": "<i2",
        "int8": "i1",
        "uint8": "u1",
        "bool": "?",
    }.items()
}
_ARRAY_KEY = "__ndarray__"
_MAX_NDIM = 32


class ProtocolError(Exception):
    """A frame that is malformed, too large, or uses a value the format does not carry."""


class ChannelClosed(ProtocolError):
    """The other end closed the pipe (for a worker: it exited or was killed)."""


class Unanswered(ProtocolError):
    """A frame whose id answers no pending request (a forged or stray frame)."""


class FrameTimeout(Exception):
    """No complete frame arrived before the deadline."""


def encode(body: Any, frame_id: int = 0) -> bytes:
    """One frame holding `body`: dicts with str keys, lists, tuples, str, int, float, bool,
    None and numpy arrays (or numpy scalars) of the DTYPES."""
    arrays: list[np.ndarray] = []
    tree = _to_tree(body, arrays)
    meta = [{"dtype": a.dtype.name, "shape": list(a.shape), "nbytes": a.nbytes} for a in arrays]
    doc = json.dumps({"body": tree, "arrays": meta}, allow_nan=True).encode()
    payload = b"".join(a.tobytes() for a in arrays)
    return _HEAD.pack(MAGIC, frame_id, len(doc), len(payload)) + doc + payload


def _to_tree(value: Any, arrays: list[np.ndarray]) -> Any:
    if value is None or isinstance(value, bool | int | str):
        return value
    if isinstance(value, float):
        return value
    if isinstance(value, np.generic):
        return _to_tree(value.item(), arrays)
    if isinstance(value, np.ndarray):
        if value.dtype.name not in DTYPES:
            raise ProtocolError(f"dtype {value.dtype} cannot cross the wire: {list(DTYPES)}")
        arrays.append(np.ascontiguousarray(value, dtype=DTYPES[value.dtype.name]))
        return {_ARRAY_KEY: len(arrays) - 1}
    if isinstance(value, list | tuple):
        return [_to_tree(v, arrays) for v in value]
    if isinstance(value, dict):
        out = {}
        for k, v in value.items():
            if not isinstance(k, str) or k == _ARRAY_KEY:
                raise ProtocolError(f"dict keys must be str other than {_ARRAY_KEY!r}, got {k!r}")
            out[k] = _to_tree(v, arrays)
        return out
    raise ProtocolError(f"cannot send a {type(value).__name__}: only JSON values and arrays")


# A JSON string: what lies between its quotes is no structure (unrolled: linear, no backtracking).
_STRING = re.compile(rb'"[^"\\]*(?:\\.[^"\\]*)*"', re.DOTALL)
_NOT_BRACKETS = bytes(b for b in range(256) if b not in b"[]{}")
_STEP = np.zeros(256, np.int32)
_STEP[list(b"[{")] = 1
_STEP[list(b"]}")] = -1


def _document(doc: bytes | bytearray, limits: Limits) -> tuple[Any, list[Any]]:
    """The frame's JSON document parsed, its depth and size checked before json.loads builds
    anything: (body tree, array descriptions)."""
    bare = _STRING.sub(b'""', doc)  # strings emptied: what is left is structure and numbers
    opens = bare.count(b"[") + bare.count(b"{")
    # every value but the first of each container follows a comma (a key counts as one):
    # in valid JSON this bounds the values; in invalid JSON json.loads refuses it anyway
    values = opens + bare.count(b",") + 1
    if values > limits.elements:
        raise ProtocolError(
            f"frame does not parse: its JSON holds up to {values} values, over the cap of "
            f"{limits.elements}"
        )
    brackets = bare.translate(None, _NOT_BRACKETS)
    del bare
    if brackets:
        depth = int(np.cumsum(_STEP[np.frombuffer(brackets, np.uint8)]).max())
        if depth > limits.depth:
            raise ProtocolError(
                f"frame does not parse: its JSON nests {depth} deep, over the cap of {limits.depth}"
            )
    del brackets
    try:
        parsed = json.loads(doc)
    except (ValueError, RecursionError, MemoryError, TypeError) as e:
        # what an untrusted peer can make the parser do: an integer of more digits than int()
        # converts (ValueError), malformed text
        raise ProtocolError(f"frame does not parse: {type(e).__name__}: {str(e)[:200]}") from None
    if not isinstance(parsed, dict) or set(parsed) != {"body", "arrays"}:
        raise ProtocolError("frame JSON must be an object with exactly 'body' and 'arrays'")
    if not isinstance(parsed["arrays"], list):
        raise ProtocolError("'arrays' must be a list")
    return parsed["body"], parsed["arrays"]


def _layout(meta: list[Any], n_payload: int) -> list[tuple[np.dtype, tuple[int, ...], int]]:
    """Each array's (dtype, shape, offset), checked against the payload's length before the
    payload is allocated: a dtype of DTYPES, nbytes = dtype * shape, the nbytes summing to it."""
    layout, offset = [], 0
    for i, m in enumerate(meta):
        ok = isinstance(m, dict) and set(m) == {"dtype", "shape", "nbytes"}
        if not ok or not isinstance(m["dtype"], str) or m["dtype"] not in DTYPES:
            raise ProtocolError(f"array {i}: bad description {str(m)[:200]}")
        shape = m["shape"]
        if not isinstance(shape, list) or len(shape) > _MAX_NDIM:
            raise ProtocolError(f"array {i}: bad shape {str(shape)[:200]}")
        if not all(isinstance(s, int) and not isinstance(s, bool) and s >= 0 for s in shape):
            raise ProtocolError(f"array {i}: bad shape {str(shape)[:200]}")
        dtype = DTYPES[m["dtype"]]
        nbytes = math.prod(shape) * dtype.itemsize
        declared = m["nbytes"]
        if type(declared) is not int or declared != nbytes or offset + nbytes > n_payload:
            raise ProtocolError(
                f"array {i}: {str(declared)[:40]} bytes declared, a shape of {len(shape)} "
                f"axes of {m['dtype']} needs {str(nbytes)[:40]}, {n_payload - offset} left in "
                "the payload"
            )
        layout.append((dtype, tuple(shape), offset))
        offset += nbytes
    if offset != n_payload:
        raise ProtocolError(f"payload holds {n_payload} bytes, the arrays use {offset}")
    return layout


def _views(
    layout: list[tuple[np.dtype, tuple[int, ...], int]], payload: np.ndarray
) -> list[np.ndarray]:
    """The arrays as views of the payload buffer (writeable; no copy)."""
    arrays = []
    for i, (dtype, shape, offset) in enumerate(layout):
        count = math.prod(shape)
        try:
            flat = payload[offset : offset + count * dtype.itemsize].view(dtype)
            arrays.append(flat.reshape(shape))
        except ValueError as e:  # a shape numpy cannot hold (an axis of 10**30 and one of 0)
            raise ProtocolError(f"array {i}: {e}") from None
    return arrays


def _from_tree(value: Any, arrays: list[np.ndarray]) -> Any:
    if isinstance(value, list):
        return [_from_tree(v, arrays) for v in value]
    if isinstance(value, dict):
        if _ARRAY_KEY in value:
            i = value[_ARRAY_KEY]
            if set(value) != {_ARRAY_KEY} or type(i) is not int or not 0 <= i < len(arrays):
                raise ProtocolError(f"bad array reference {str(value)[:200]}")
            return arrays[i]
        return {k: _from_tree(v, arrays) for k, v in value.items()}
    return value


def decode(doc: bytes | bytearray, payload: bytes | np.ndarray, limits: Limits = REQUEST) -> Any:
    """The body of a frame from its JSON document and payload (the inverse of encode)."""
    tree, meta = _document(doc, limits)
    buffer = payload if isinstance(payload, np.ndarray) else np.frombuffer(payload, np.uint8)
    return _from_tree(tree, _views(_layout(meta, len(buffer)), buffer))


def parse(frame: bytes, limits: Limits = REQUEST, expect: int | None = None) -> Any:
    """The body of one whole frame held in memory (the inverse of encode)."""
    if len(frame) < _HEAD.size:
        raise ProtocolError(f"a frame of {len(frame)} bytes is shorter than its header")
    _, n_json, n_payload = _check_head(frame[: _HEAD.size], limits, expect)
    if len(frame) != _HEAD.size + n_json + n_payload:
        raise ProtocolError(
            f"frame of {len(frame)} bytes, its header announces {_HEAD.size + n_json + n_payload}"
        )
    doc = frame[_HEAD.size : _HEAD.size + n_json]
    payload = np.frombuffer(bytearray(frame[_HEAD.size + n_json :]), np.uint8)
    return decode(doc, payload, limits)


def id_of(frame: bytes) -> int:
    """The id in a frame's header."""
    return int(_HEAD.unpack(frame[: _HEAD.size])[1])


def _check_head(
    head: bytes | bytearray, limits: Limits, expect: int | None
) -> tuple[int, int, int]:
    magic, fid, n_json, n_payload = _HEAD.unpack(head)
    if magic != MAGIC:
        raise ProtocolError(f"bad frame magic {bytes(magic)!r}, expected {MAGIC!r}")
    if expect is not None and fid != expect:
        raise Unanswered(
            f"a frame with id {fid} answers no pending request (the pending one is {expect})"
        )
    if n_json > limits.json:
        raise ProtocolError(f"frame JSON of {n_json} bytes exceeds the cap of {limits.json}")
    if n_payload > limits.payload:
        raise ProtocolError(
            f"frame payload of {n_payload} bytes exceeds the cap of {limits.payload}"
        )
    return fid, n_json, n_payload


def write_frame(fd: int, body: Any, frame_id: int = 0) -> None:
    """Send one frame on a pipe (blocking until written)."""
    data = memoryview(encode(body, frame_id))
    while data:
        data = data[os.write(fd, data) :]


def read_frame(
    fd: int,
    timeout: float | None = None,
    limits: Limits = REQUEST,
    expect: int | None = None,
    budget: Budget | None = None,
) -> tuple[int, Any]:
    """Receive one frame, waiting at most `timeout` seconds in all (None: forever): its id and
    body. With `expect`, a frame of any other id is refused (Unanswered) from its header; with
    a `budget`, its sizes are taken from the request's totals before its body is read."""
    deadline = None if timeout is None else time.monotonic() + timeout
    head = bytearray(_HEAD.size)
    _read_into(fd, memoryview(head), deadline)
    fid, n_json, n_payload = _check_head(head, limits, expect)
    if budget is not None:
        budget.take(n_json, n_payload)
    doc = bytearray(n_json)
    _read_into(fd, memoryview(doc), deadline)
    tree, meta = _document(doc, limits)
    del doc
    layout = _layout(meta, n_payload)
    # np.empty: pages are committed only as the sender's bytes arrive
    payload = np.empty(n_payload, np.uint8)
    _read_into(fd, payload.data, deadline)
    return fid, _from_tree(tree, _views(layout, payload))


def _read_into(fd: int, buffer: memoryview, deadline: float | None) -> None:
    """Fill `buffer` from the pipe, in place."""
    got, n = 0, len(buffer)
    while got < n:
        if deadline is not None:
            left = deadline - time.monotonic()
            if left <= 0 or not select.select([fd], [], [], left)[0]:
                raise FrameTimeout(f"no complete frame within the time limit ({got}/{n} bytes)")
        k = os.readv(fd, [buffer[got : got + (1 << 20)]])
        if not k:
            raise ChannelClosed(f"pipe closed after {got} of {n} bytes")
        got += k
