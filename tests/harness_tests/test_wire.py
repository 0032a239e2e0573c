"""The wire format between the judge and its workers: arrays and JSON without pickle, and
frames that are malformed, oversize or never come are refused."""

from __future__ import annotations

import json
import os
import struct
import time

import numpy as np
import pytest

from harness import wire as protocol

# --- the wire format --------------------------------------------------------------------------


def test_arrays_and_json_round_trip_without_pickle():
    body = {
        "f64": np.arange(6, dtype=np.float64).reshape(2, 3) / 7,
        "f32": np.float32([1.5, np.nan]),
        "i64": np.int64([[1, -2]]),
        "bool": np.array([True, False]),
        "empty": np.zeros((0, 4)),
        "scalar": np.float64(2.5),
        "nested": [{"x": 1, "y": None, "z": "text"}, (3.0, float("inf"))],
    }
    back = protocol.parse(protocol.encode(body))
    for key in ("f64", "i64", "bool", "empty"):
        assert back[key].dtype == body[key].dtype and np.array_equal(back[key], body[key])
    assert np.array_equal(back["f32"], body["f32"], equal_nan=True)
    assert back["scalar"] == 2.5 and back["nested"] == [
        {"x": 1, "y": None, "z": "text"},
        [3.0, float("inf")],
    ]
    assert back["f64"].flags.writeable


@pytest.mark.parametrize(
    "value", [np.array([object()]), {1: "int key"}, {"__ndarray__": 0}, b"raw"]
)
def test_values_the_format_does_not_carry_are_refused(value):
    with pytest.raises(protocol.ProtocolError):
        protocol.encode(value)


HEAD = ">4sQIQ"  # magic, id, JSON length, payload length


def _frame_raw(raw: bytes, payload: bytes = b"", frame_id: int = 0) -> bytes:
    return struct.pack(HEAD, protocol.MAGIC, frame_id, len(raw), len(payload)) + raw + payload


def _frame(doc: dict, payload: bytes = b"", frame_id: int = 0) -> bytes:
    return _frame_raw(json.dumps(doc).encode(), payload, frame_id)


@pytest.mark.parametrize(
    "frame, message",
    [
        (b"PKL1" + bytes(20), "bad frame magic"),
        (_frame({"body": 1}), "exactly 'body' and 'arrays'"),
        (_frame({"body": {"__ndarray__": 0}, "arrays": []}), "bad array reference"),
        (
            _frame(
                {"body": 0, "arrays": [{"dtype": "object", "shape": [1], "nbytes": 8}]}, bytes(8)
            ),
            "bad description",
        ),
        (
            _frame(
                {"body": 0, "arrays": [{"dtype": "float64", "shape": [2], "nbytes": 8}]}, bytes(8)
            ),
            "needs 16",
        ),
        (_frame({"body": 0, "arrays": []}, bytes(3)), "the arrays use 0"),
        (_frame_raw(b"{]x"), "does not parse"),
    ],
)
def test_malformed_frames_are_rejected(frame, message):
    with pytest.raises(protocol.ProtocolError, match=message):
        protocol.parse(frame)


def test_oversize_frames_are_rejected_before_reading_them():
    r, w = os.pipe()
    try:
        os.write(w, struct.pack(HEAD, protocol.MAGIC, 0, 10, 1 << 40))
        with pytest.raises(protocol.ProtocolError, match="exceeds the cap"):
            protocol.read_frame(r, timeout=1.0)
        os.write(w, protocol.encode({"x": np.zeros(1000)}))
        with pytest.raises(protocol.ProtocolError, match="exceeds the cap"):
            protocol.read_frame(r, timeout=1.0, limits=protocol.Limits(payload=100))
    finally:
        os.close(r)
        os.close(w)


def test_a_silent_or_closed_pipe_is_a_timeout_or_closed_channel():
    r, w = os.pipe()
    os.write(w, protocol.encode([1, 2])[:10])  # a partial frame, then silence
    start = time.monotonic()
    with pytest.raises(protocol.FrameTimeout):
        protocol.read_frame(r, timeout=0.3)
    assert time.monotonic() - start < 2
    os.close(w)
    with pytest.raises(protocol.ChannelClosed):
        protocol.read_frame(r, timeout=1.0)
    os.close(r)
