"""The wire format between the trusted parent and a subject's worker: JSON plus raw arrays.

Both sides of the trust boundary import this module (harness.isolation on the parent's side,
harness.isolation.child inside the worker), so it imports nothing but numpy.

A frame is MAGIC, the JSON length (u32) and the payload length (u64), big-endian, then the JSON
document, then the payload. The document is {"body": tree, "arrays": [{dtype, shape, nbytes}]};
inside the tree an array is the object {"__ndarray__": i} and its bytes follow the previous
array's in the payload. Arrays are rebuilt with np.frombuffer into a fixed set of little-endian
dtypes: nothing the worker sends is ever unpickled or evaluated, so a subject can at most send
wrong data, which the parent's verdicts judge.
"""

from __future__ import annotations

import json
import math
import os
import select
import struct
import time
from typing import Any

import numpy as np

MAGIC = b"XFM1"
_HEAD = struct.Struct(">4sIQ")  # magic, JSON length, payload length

# Default caps: far above anything a probe returns (a tiny model's gradients are kilobytes),
# far below what could exhaust the parent's memory.
MAX_JSON = 16 << 20
MAX_PAYLOAD = 256 << 20

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


class ProtocolError(Exception):
    """A frame that is malformed, too large, or uses a value the format does not carry."""


class ChannelClosed(ProtocolError):
    """The other end closed the pipe (for a worker: it exited or was killed)."""


class FrameTimeout(Exception):
    """No complete frame arrived before the deadline."""


def encode(body: Any) -> bytes:
    """One frame holding `body`: dicts with str keys, lists, tuples, str, int, float, bool,
    None and numpy arrays (or numpy scalars) of the DTYPES."""
    arrays: list[np.ndarray] = []
    tree = _to_tree(body, arrays)
    meta = [{"dtype": a.dtype.name, "shape": list(a.shape), "nbytes": a.nbytes} for a in arrays]
    doc = json.dumps({"body": tree, "arrays": meta}, allow_nan=True).encode()
    payload = b"".join(a.tobytes() for a in arrays)
    return _HEAD.pack(MAGIC, len(doc), len(payload)) + doc + payload


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


def decode(doc: bytes, payload: bytes) -> Any:
    """The body of a frame from its JSON document and payload (the inverse of encode)."""
    try:
        return _decode(doc, payload)
    except ProtocolError:
        raise
    except (ValueError, RecursionError, MemoryError, TypeError, KeyError) as e:
        # what an untrusted peer can make the parser do: too deep a tree (RecursionError), an
        # integer of more digits than int() converts (ValueError), a malformed description
        raise ProtocolError(f"frame does not parse: {type(e).__name__}: {str(e)[:200]}") from None


def _decode(doc: bytes, payload: bytes) -> Any:
    parsed = json.loads(doc)
    if not isinstance(parsed, dict) or set(parsed) != {"body", "arrays"}:
        raise ProtocolError("frame JSON must be an object with exactly 'body' and 'arrays'")
    meta = parsed["arrays"]
    if not isinstance(meta, list):
        raise ProtocolError("'arrays' must be a list")
    arrays, offset = [], 0
    for i, m in enumerate(meta):
        arrays.append(_array(i, m, payload, offset))
        offset += m["nbytes"]
    if offset != len(payload):
        raise ProtocolError(f"payload holds {len(payload)} bytes, the arrays use {offset}")
    return _from_tree(parsed["body"], arrays)


def _array(i: int, m: Any, payload: bytes, offset: int) -> np.ndarray:
    ok = isinstance(m, dict) and set(m) == {"dtype", "shape", "nbytes"}
    if not ok or m["dtype"] not in DTYPES or not isinstance(m["shape"], list):
        raise ProtocolError(f"array {i}: bad description {m!r}")
    shape = m["shape"]
    if not all(isinstance(s, int) and not isinstance(s, bool) and s >= 0 for s in shape):
        raise ProtocolError(f"array {i}: bad shape {shape!r}")
    dtype = DTYPES[m["dtype"]]
    nbytes = math.prod(shape) * dtype.itemsize
    if m["nbytes"] != nbytes or offset + nbytes > len(payload):
        raise ProtocolError(
            f"array {i}: {m['nbytes']} bytes declared, shape {shape} of {m['dtype']} needs "
            f"{nbytes}, {len(payload) - offset} left in the payload"
        )
    flat = np.frombuffer(payload, dtype=dtype, count=math.prod(shape), offset=offset)
    return flat.reshape(shape).copy()


def _from_tree(value: Any, arrays: list[np.ndarray]) -> Any:
    if isinstance(value, list):
        return [_from_tree(v, arrays) for v in value]
    if isinstance(value, dict):
        if _ARRAY_KEY in value:
            i = value[_ARRAY_KEY]
            if set(value) != {_ARRAY_KEY} or not isinstance(i, int) or not 0 <= i < len(arrays):
                raise ProtocolError(f"bad array reference {value!r}")
            return arrays[i]
        return {k: _from_tree(v, arrays) for k, v in value.items()}
    return value


def parse(frame: bytes, max_json: int = MAX_JSON, max_payload: int = MAX_PAYLOAD) -> Any:
    """The body of one whole frame held in memory (the inverse of encode)."""
    if len(frame) < _HEAD.size:
        raise ProtocolError(f"a frame of {len(frame)} bytes is shorter than its header")
    n_json, n_payload = _check_head(frame[: _HEAD.size], max_json, max_payload)
    if len(frame) != _HEAD.size + n_json + n_payload:
        raise ProtocolError(
            f"frame of {len(frame)} bytes, its header announces {_HEAD.size + n_json + n_payload}"
        )
    doc = frame[_HEAD.size : _HEAD.size + n_json]
    return decode(doc, frame[_HEAD.size + n_json :])


def _check_head(head: bytes, max_json: int, max_payload: int) -> tuple[int, int]:
    magic, n_json, n_payload = _HEAD.unpack(head)
    if magic != MAGIC:
        raise ProtocolError(f"bad frame magic {magic!r}, expected {MAGIC!r}")
    if n_json > max_json:
        raise ProtocolError(f"frame JSON of {n_json} bytes exceeds the cap of {max_json}")
    if n_payload > max_payload:
        raise ProtocolError(f"frame payload of {n_payload} bytes exceeds the cap of {max_payload}")
    return n_json, n_payload


def write_frame(fd: int, body: Any) -> None:
    """Send one frame on a pipe (blocking until written)."""
    data = memoryview(encode(body))
    while data:
        data = data[os.write(fd, data) :]


def read_frame(
    fd: int,
    timeout: float | None = None,
    max_json: int = MAX_JSON,
    max_payload: int = MAX_PAYLOAD,
) -> Any:
    """Receive one frame, waiting at most `timeout` seconds in all (None: forever)."""
    deadline = None if timeout is None else time.monotonic() + timeout
    n_json, n_payload = _check_head(_read_exact(fd, _HEAD.size, deadline), max_json, max_payload)
    doc = _read_exact(fd, n_json, deadline)
    return decode(doc, _read_exact(fd, n_payload, deadline))


def _read_exact(fd: int, n: int, deadline: float | None) -> bytes:
    chunks, got = [], 0
    while got < n:
        if deadline is not None:
            left = deadline - time.monotonic()
            if left <= 0 or not select.select([fd], [], [], left)[0]:
                raise FrameTimeout(f"no complete frame within the time limit ({got}/{n} bytes)")
        chunk = os.read(fd, min(n - got, 1 << 20))
        if not chunk:
            raise ChannelClosed(f"pipe closed after {got} of {n} bytes")
        chunks.append(chunk)
        got += len(chunk)
    return b"".join(chunks)
