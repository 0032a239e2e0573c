"""The wire format between the judge and its workers: arrays and JSON without pickle; frames
that are malformed, oversize, of another request or never come are refused, and what one frame
may cost its reader is bounded before anything is allocated (issue 34)."""

from __future__ import annotations

import json
import os
import struct
import subprocess
import sys
import threading
import time
import tracemalloc
from contextlib import contextmanager
from pathlib import Path

import numpy as np
import pytest

from harness import wire as protocol
from harness.isolation.local import Local
from harness.isolation.worker import Process, Worker, WorkerDied
from harness.wire import Limits

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


# --- bounded decoding (issue 34) --------------------------------------------------------------

CALL = Limits(json=1 << 20, payload=64 << 20, depth=32, elements=100_000)


def _peak(work) -> int:
    """The most memory (bytes, Python's and numpy's allocations) `work()` held at once."""
    tracemalloc.start()
    try:
        work()
        return tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()


def _tree(value: str) -> bytes:
    return b'{"body": ' + value.encode() + b', "arrays": []}'


@pytest.mark.parametrize(
    "doc, message",
    [
        # millions of empty lists: counted before json.loads builds one
        (_tree("[" + "[]," * 60_000 + "[]]"), "holds up to 120006 values, over the cap of 100000"),
        (_tree("[" * 33 + "]" * 33), "nests 34 deep, over the cap of 32"),
        (_tree("[" * 100_000 + "]" * 100_000), "over the cap of 100000"),
    ],
)
def test_the_json_tree_is_measured_before_it_is_parsed(doc, message, monkeypatch):
    def loads(*args, **kwargs):
        raise AssertionError("json.loads ran on a tree over the caps")

    monkeypatch.setattr(protocol.json, "loads", loads)
    with pytest.raises(protocol.ProtocolError, match=message):
        protocol.parse(_frame_raw(doc), CALL)


def test_brackets_and_commas_inside_strings_are_no_structure():
    text = "[[[[,,,,{{{{" * 1000
    back = protocol.parse(protocol.encode({"s": text, "q": 'a "quoted\\" [ string'}), CALL)
    assert back == {"s": text, "q": 'a "quoted\\" [ string'}


@pytest.mark.parametrize(
    "doc",
    [
        _tree("[" + "[]," * 49_990 + "[]]"),  # the most containers the value cap lets through
        _tree(json.dumps(["\U0001f600" * 1000] * 250, ensure_ascii=False)),  # 4-byte text
        _tree("[" + "0.5," * 49_990 + "1.5]"),
    ],
)
def test_a_frame_within_its_limits_costs_at_most_what_they_say(doc):
    assert len(doc) <= CALL.json
    assert _peak(lambda: protocol.parse(_frame_raw(doc), CALL)) <= CALL.cost()


def test_sizes_and_layout_are_checked_before_the_payload_is_allocated():
    r, w = os.pipe()
    try:
        # a header announcing a terabyte: refused from the header alone
        os.write(w, struct.pack(HEAD, protocol.MAGIC, 0, 10, 1 << 40))
        got = _peak(lambda: pytest.raises(protocol.ProtocolError, protocol.read_frame, r, 1.0))
        assert got < 1 << 20
        # an array of 2**40 float64 declared in 8 bytes: refused before the payload is read
        meta = [{"dtype": "float64", "shape": [1 << 40], "nbytes": 8}]
        os.write(w, _frame({"body": {"__ndarray__": 0}, "arrays": meta}, b"12345678"))
        with pytest.raises(protocol.ProtocolError, match="needs 8796093022208"):
            protocol.read_frame(r, 1.0, CALL)
        assert os.read(r, 100) == b"12345678"  # still unread
    finally:
        os.close(r)
        os.close(w)


def test_the_payload_is_read_once_into_the_buffer_the_arrays_view():
    big = np.arange(4 << 20, dtype=np.float64)  # 32 MiB
    frame = protocol.encode({"a": big, "b": big[:3].astype(np.float32)}, 9)
    r, w = os.pipe()

    def write() -> None:
        view = memoryview(frame)
        while view:
            view = view[os.write(w, view) :]

    writer = threading.Thread(target=write)
    got: list = []
    try:
        writer.start()
        peak = _peak(lambda: got.append(protocol.read_frame(r, 10.0, CALL, expect=9)))
    finally:
        writer.join()
        os.close(r)
        os.close(w)
    frame_id, body = got[0]
    assert frame_id == 9 and np.array_equal(body["a"], big) and body["b"].dtype == np.float32
    assert body["a"].base is not None and body["a"].flags.writeable  # a view, not a copy
    assert peak < big.nbytes + (1 << 20)


def test_a_frame_of_another_id_is_refused_from_its_header():
    r, w = os.pipe()
    try:
        os.write(w, protocol.encode({"ok": True, "value": 1}, 41))
        with pytest.raises(protocol.Unanswered, match="id 41 answers no pending request"):
            protocol.read_frame(r, 1.0, CALL, expect=42)
    finally:
        os.close(r)
        os.close(w)


def test_a_requests_frames_share_one_budget():
    budget = protocol.Budget(Limits(total_json=100, total_payload=10))
    budget.take(60, 10)
    with pytest.raises(protocol.ProtocolError, match="exceeds what is left"):
        budget.take(60, 0)


# --- the parent's side: ids, strays and per-request caps (harness.isolation.worker) -----------

# A fake worker speaking the wire: `python -c FAKE scenario R W`.
FAKE = """\
import os
import sys
import numpy as np
from harness import wire
scenario, r, w = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
while True:
    try:
        rid, request = wire.read_frame(r)
    except wire.ChannelClosed:
        break
    if scenario == "wrong id":
        wire.write_frame(w, {"ok": True, "value": 1}, rid - 1)
    elif scenario == "stray":
        one, two = ({"ok": True, "value": v} for v in (1, 2))
        two = wire.encode(one, rid) + wire.encode(two, rid)
        os.write(w, two)  # both at once: the second waits in the pipe as the first is read
    elif scenario == "ask":
        wire.write_frame(w, {"ask": "stop?"}, rid)
        aid, answer = wire.read_frame(r)
        wire.write_frame(w, {"ok": True, "value": [aid == rid, answer["answer"]]}, rid)
    elif scenario == "event":
        wire.write_frame(w, {"event": 1}, rid)
        wire.write_frame(w, {"event": 2}, rid + 1)
    elif scenario == "arrays":
        wire.write_frame(w, {"ok": True, "value": np.zeros(4)}, rid)
    else:
        wire.write_frame(w, {"ok": True, "value": rid}, rid)
"""


@contextmanager
def fake_worker(scenario: str):
    def start(request_fd: int, reply_fd: int, log_fd: int) -> Process:
        argv = [sys.executable, "-c", FAKE, scenario, str(request_fd), str(reply_fd)]
        env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[2])}
        proc = subprocess.Popen(
            argv, pass_fds=(request_fd, reply_fd), stdout=log_fd, stderr=log_fd, env=env,
            start_new_session=True,
        )  # fmt: skip
        return Local(proc)

    worker = Worker(start)
    try:
        yield worker
    finally:
        worker.close()


def _soon() -> float:
    return time.monotonic() + 30


def test_each_request_has_its_own_id():
    with fake_worker("echo") as worker:
        first, second = worker.call("p", _soon()), worker.call("p", _soon())
    assert second == first + 1


def test_a_reply_under_another_id_ends_the_worker():
    with fake_worker("wrong id") as worker:
        with pytest.raises(WorkerDied, match="protocol error .*answers no pending request"):
            worker.call("p", _soon())
        assert worker.status is not None  # killed and reaped


def test_a_frame_after_the_reply_ends_the_worker_at_the_next_request():
    with fake_worker("stray") as worker:
        assert worker.call("p", _soon()) == 1
        with pytest.raises(WorkerDied, match="arrived between requests: it answers no pending"):
            worker.call("p", _soon())


def test_a_question_is_answered_under_its_requests_id():
    with fake_worker("ask") as worker:
        assert worker.call("p", _soon(), on_ask=lambda q: {"stop": q == "stop?"}) == [
            True,
            {"stop": True},
        ]


def test_an_event_under_another_id_ends_the_stream():
    events: list = []
    with fake_worker("event") as worker:
        with pytest.raises(WorkerDied, match="answers no pending request"):
            worker.stream({"op": "call", "probe": "p", "inputs": {}}, _soon, events.append)
    assert events == [1]


def test_a_load_reply_carries_no_arrays():
    with fake_worker("arrays") as worker:
        with pytest.raises(WorkerDied, match="payload of 32 bytes exceeds the cap of 0"):
            worker.load({"path": "x"}, _soon())
