"""The parent's handle on one worker process: two pipes only the parent writes, a log, a deadline.

How the process starts is the caller's choice (a `Start`): sandboxed for untrusted code
(harness.isolation.sandbox), forked from the trusted fork server for impl and the mutants
(harness.isolation.forkserver). Everything that comes back is untrusted data: a malformed frame,
an early exit or a silence is the worker's failure (WorkerDied, WorkerTimeout), never the
parent's exception.

Each request gets an id (a counter from a random start) that every frame answering it must carry
(harness.wire): a frame of another id, or one that arrives between requests, answers nothing
and ends the worker with that reason, so a reply can never be taken for another request's. What
a request's frames may cost to read is capped by what it asked for (LOAD_REPLY, CALL_REPLY,
STREAM_REPLY), which bounds the grader's own memory whatever a worker writes (GRADER_PEAK).
"""

from __future__ import annotations

import functools
import os
import re
import secrets
import select
import signal
import sys
import tempfile
import time
import unicodedata
from collections.abc import Callable
from typing import Any, Protocol

from harness import wire

# What a worker may send back for one request (harness.wire.Limits: checked from each frame's
# header, and of its JSON before it is parsed). Measured on a full grade (float64, the largest
# dtype): a load's reply is under 100 bytes of JSON (a traced one lists impl's ~60 functions);
# a call's largest reply is the state_dict probe's 5.8 MB of arrays (dropout_sites' 4.3 MB,
# the learning run's 1 MB per checkpoint question, 23 of them), its largest JSON 29 kB (golden)
# with at most ~3000 values, nesting 7 deep; a student suite's events are under 2 kB each.
# Each cap leaves a margin of 10x or more; a probe that needs more is named in REPLY_LIMITS.
LOAD_REPLY = wire.Limits(
    json=256 << 10, payload=0, depth=16, elements=20_000, total_json=256 << 10, total_payload=0
)
CALL_REPLY = wire.Limits(
    json=1 << 20,
    payload=64 << 20,
    depth=32,
    elements=100_000,
    total_json=16 << 20,
    total_payload=256 << 20,
)
STREAM_REPLY = wire.Limits(
    json=1 << 20, payload=0, depth=16, elements=100_000, total_json=64 << 20, total_payload=0
)
REPLY_LIMITS: dict[str, wire.Limits] = {}  # a probe's own caps, where CALL_REPLY's are too small
# The grader's own peak memory (RSS) in a `grade-batch --jobs 2`, whatever its workers write: its
# own working set (GRADER_BASE) plus, for each of the two workers whose frames it reads at once
# (grade-batch runs one worker per submission), at most CALL_REPLY.cost() (88 MiB). Measured as
# the grader's VmHWM (its own address space's high-water mark): 99 MiB for nine correct
# submissions on three tests, 122 MiB on every test, 173 MiB under the forged frames and decoding
# bombs of tests/harness_tests/isolation/test_hostile_wire.py (the old caps let one frame take
# it to 2.9 GB).
# Not ru_maxrss: Linux carries it across exec, so a grader started from a process of 785 MiB
# (pytest, late in a CI run) reports 785 MiB whatever it used itself.
# The base: 163-166 MiB measured on test_hostile_wire's batch when no two bombs' replies are read
# at once (the same at 9c6011f and 380dbaa+, 2026-12-05); 340-344 MiB when two are (CI, and once
# here): the base plus both caps, so 160 MiB had no margin left. 192 MiB: the measured base and
# room for the draws.
GRADER_BASE = 192 << 20
GRADER_PEAK = GRADER_BASE + 2 * CALL_REPLY.cost()

# Loading takes ~0.1 s from the fork server and ~4 s in a fresh sandbox (torch's imports); 60 s
# leaves room for a loaded machine without letting a hang at import stall the run for long.
LOAD_TIMEOUT = 60.0
# How often a wait for a reply checks that the worker still runs (seconds).
_LIVENESS_SLICE = 0.25


# ANSI escape sequences (a student's colored output), then every other control character but
# newline and tab: XML 1.0 forbids most of them and a terminal obeys them.
_ANSI = re.compile(r"\x1b\[[0-?]*[ -/]*[@-~]|\x1b[@-Z\\-_]")
_CONTROL = re.compile(r"[\x00-\x08\x0b-\x1f\x7f-\x9f\ud800-\udfff\ufffe\uffff]")


@functools.cache
def _invisible() -> re.Pattern[str]:
    """Unicode's format characters (category Cf: the bidi controls U+202A-202E, U+2066-2069,
    U+200E/200F and U+061C that reorder what staff read, the zero-width ones U+200B-200D, U+2060
    and U+FEFF, the tag characters, ...) and the line and paragraph separators U+2028/2029 that
    some viewers break a line at. Built once, from the running Python's Unicode tables."""
    found = [c for c in range(sys.maxunicode + 1) if unicodedata.category(chr(c)) == "Cf"]
    found += [0x2028, 0x2029]
    return re.compile("[" + "".join(re.escape(chr(c)) for c in sorted(found)) + "]")


def _shown(char: str) -> str:
    code = ord(char)
    return f"\\u{code:04x}" if code <= 0xFFFF else f"\\U{code:08x}"


def printable(text: str) -> str:
    """Untrusted text made safe for every report and terminal: escape sequences dropped, other
    control characters shown as \\xNN, format characters (bidi controls, zero-width ones) and
    line/paragraph separators as \\uXXXX (\\UXXXXXXXX above U+FFFF), so nothing is silently lost
    or reordered. What it returns holds none of them, so a second call changes nothing."""
    text = _ANSI.sub("", str(text))
    text = _CONTROL.sub(lambda m: f"\\x{ord(m.group()):02x}", text)
    return _invisible().sub(lambda m: _shown(m.group()), text)


class WorkerDied(Exception):
    """The worker stopped answering: it exited, was killed by a signal, or broke the protocol."""


class WorkerTimeout(Exception):
    """The worker did not answer before the deadline."""


# How a subject's NotImplementedError reads in a cell: an unwritten definition of a stub.
NOT_IMPLEMENTED = "not implemented: "
# torch's NotImplementedError for a module with no method named forward (nn.Module's
# placeholder): a forward misspelt or indented outside its class, said as such
_NO_FORWARD = re.compile(r'Module \[(\w+)\] is missing the required "forward" function')


def _not_implemented(error: dict[str, Any]) -> str | None:
    """A NotImplementedError as a student reads it: a stub's unwritten definition by its name,
    or a module without forward by its class; None for one raised inside torch (said whole)."""
    message, where = str(error.get("message", "")), str(error.get("where", ""))
    missing = _NO_FORWARD.search(message)
    if missing:
        owner = missing.group(1)
        return (
            f"{owner} has no method named forward (torch: {message}): nn.Module calls forward, "
            f"so check its spelling and that it is indented inside class {owner}"
        )
    if "/torch/" in where.partition(":")[0]:  # torch's own: its message and place tell more
        return None
    name = message or where.rpartition(" in ")[2]
    return f"{NOT_IMPLEMENTED}{name or 'a definition of the contract'}"


class SubjectRaised(Exception):
    """The subject raised inside a probe; `error` is the worker's description of it."""

    def __init__(self, probe: str, error: dict[str, Any]) -> None:
        self.probe = probe
        self.error = error
        where = f" at {error['where']}" if error.get("where") else ""
        said = f"{probe}: the subject raised {error['type']}: {error['message']}{where}"
        if error["type"] == "NotImplementedError":  # a stub (`xfmr start`) or a missing forward
            said = _not_implemented(error) or said
        super().__init__(printable(said))


class Process(Protocol):
    """A started worker as its launcher sees it."""

    pid: int

    def wait(self, timeout: float) -> int | None:
        """The exit code (negative: killed by that signal), None if still running."""

    def kill(self) -> None:
        """Kill the worker and everything it started."""

    def release(self) -> None:
        """Free what the launcher set up for it (a staging folder), once it is dead."""


# start(request read end, reply write end, log descriptor) -> the running process
Start = Callable[[int, int, int], Process]


class Worker:
    """One subject's worker process."""

    def __init__(self, start: Start) -> None:
        self.status: int | None = None  # the exit code once reaped; negative: a signal
        # a memfd: its name inside a sandbox (readlink /proc/self/fd/1) is no host path
        self._log = (
            os.fdopen(os.memfd_create("xfmr-worker-log"), "w+b")
            if hasattr(os, "memfd_create")
            else tempfile.TemporaryFile(prefix="xfmr-worker-", suffix=".log")
        )
        req_r, self._req_w = os.pipe()
        self._resp_r, resp_w = os.pipe()
        try:
            self.process = start(req_r, resp_w, self._log.fileno())
        except BaseException:
            for fd in (self._req_w, self._resp_r):
                os.close(fd)
            self._log.close()
            raise
        finally:
            os.close(req_r)
            os.close(resp_w)
        self.pid = self.process.pid
        # each request's id: a counter from a random start (no stray frame matches it by luck)
        self._next_id = secrets.randbits(63)
        self._pending: int | None = None  # the id of the request awaiting its reply
        # when a set: every request is traced and the subject's functions it ran are added here
        # (harness.isolation.child.calls; trusted subjects only)
        self.calls: set[str] | None = None

    def load(
        self,
        subject: dict[str, Any],
        deadline: float,
        probes: tuple[str, ...] = ("probes",),
        confine: dict[str, Any] | None = None,
    ) -> None:
        """Import the named probe modules, confine the worker, then load the subject there."""
        request = {"op": "load", "subject": subject, "probes": list(probes)}
        self.request({**request, "confine": confine or {}}, deadline)

    def call(
        self,
        probe: str,
        deadline: float,
        on_ask: Callable[[Any], Any] | None = None,
        **inputs: Any,
    ) -> Any:
        """Run one probe on the loaded subject; on_ask answers the questions it asks on the way
        (serve.ask), if it may ask any. Its frames are capped by REPLY_LIMITS[probe], or
        CALL_REPLY."""
        body = {"op": "call", "probe": probe, "inputs": inputs}
        return self.request(body, deadline, on_ask, REPLY_LIMITS.get(probe, CALL_REPLY))

    def request(
        self,
        body: dict[str, Any],
        deadline: float,
        on_ask: Callable[[Any], Any] | None = None,
        limits: wire.Limits | None = None,
    ) -> Any:
        """Send one request; the worker's value, or SubjectRaised / WorkerTimeout / WorkerDied.

        With on_ask, each question frame ({"ask": ...}) before the reply is answered with
        on_ask's value; a question nobody may answer is a protocol error. If on_ask raises, the
        worker, left waiting for an answer, is killed: the exception goes on to the caller.
        `limits` caps every frame of the request and their total (default: LOAD_REPLY for a
        load, CALL_REPLY otherwise)."""
        if limits is None:
            limits = LOAD_REPLY if body.get("op") == "load" else CALL_REPLY
        if self.calls is not None:
            body = {**body, "trace": True}
        budget = wire.Budget(limits)
        request_id = self.send(body)
        reply = self.receive(deadline, limits, budget)
        while on_ask is not None and isinstance(reply, dict) and set(reply) == {"ask"}:
            try:
                answer = on_ask(reply["ask"])
            except BaseException:
                self.kill()
                raise
            self.send({"answer": answer}, answering=request_id)
            reply = self.receive(deadline, limits, budget)
        self._pending = None
        if self.calls is not None:
            called = reply.get("called") if isinstance(reply, dict) else None
            if not isinstance(called, list) or not all(isinstance(n, str) for n in called):
                raise WorkerDied(self._death(wire.ProtocolError("a traced reply without called")))
            self.calls.update(called)
        return self._value(body, reply)

    def send(self, body: dict[str, Any], answering: int | None = None) -> int:
        """Write one request frame (or, `answering` a request's question, the answer frame under
        its id); the request's id. WorkerDied if the worker's end is gone, or if a frame came
        while no request was pending (it answers nothing: a forged or stray frame)."""
        if answering is None:
            self._check_quiet()
            frame_id = self._pending = self._next_id
            self._next_id = (self._next_id + 1) % (1 << 64)
        else:
            frame_id = answering
        try:
            wire.write_frame(self._req_w, body, frame_id)
        except OSError as e:
            raise WorkerDied(self._death(e)) from None
        return frame_id

    def _check_quiet(self) -> None:
        """WorkerDied if the reply pipe holds anything while no request is pending: a frame
        that answers nothing, or the end of the pipe (the worker is gone)."""
        if not select.select([self._resp_r], [], [], 0)[0]:
            return
        try:
            stray = os.read(self._resp_r, 1)
        except OSError as e:
            raise WorkerDied(self._death(e)) from None
        if not stray:
            raise WorkerDied(self._death(wire.ChannelClosed("the reply pipe closed")))
        said = wire.Unanswered("a frame arrived between requests: it answers no pending request")
        raise WorkerDied(self._death(said))

    def receive(
        self,
        deadline: float,
        limits: wire.Limits = CALL_REPLY,
        budget: wire.Budget | None = None,
    ) -> Any:
        """The next frame of the pending request from the worker, as sent; WorkerTimeout /
        WorkerDied (also for a frame of another id, or one over `limits` or the `budget`).

        Waits in short slices, checking that the worker still runs: a worker that exited while
        a process it started holds its end of the pipe open never sends end-of-file.
        """
        if self._pending is None:
            raise WorkerDied(self._death(wire.ProtocolError("no request is pending")))
        while True:
            left = deadline - time.monotonic()
            if left <= 0:
                raise WorkerTimeout()
            if select.select([self._resp_r], [], [], min(left, _LIVENESS_SLICE))[0]:
                break
            if self._reap(0.0) is not None:
                held = wire.ChannelClosed("and a process it started holds its pipe open")
                raise WorkerDied(self._death(held))
        left = max(0.0, deadline - time.monotonic())
        try:
            _, body = wire.read_frame(self._resp_r, left, limits, self._pending, budget)
        except wire.FrameTimeout:
            raise WorkerTimeout() from None
        except (wire.ProtocolError, OSError) as e:
            raise WorkerDied(self._death(e)) from None
        return body

    def stream(
        self, body: dict[str, Any], due: Callable[[], float], on_event: Callable[[Any], None]
    ) -> Any:
        """Send a request whose probe emits events (channel.emit) before its reply: each event goes
        to on_event, each frame must arrive by due() (all of them within STREAM_REPLY); returns
        the reply's value."""
        budget = wire.Budget(STREAM_REPLY)
        self.send(body)
        while True:
            frame = self.receive(due(), STREAM_REPLY, budget)
            if not (isinstance(frame, dict) and set(frame) == {"event"}):
                self._pending = None
                return self._value(body, frame)
            on_event(frame["event"])

    def _value(self, body: dict[str, Any], reply: Any) -> Any:
        """A reply frame's value; SubjectRaised for an error reply, WorkerDied for a bad one."""
        ok = isinstance(reply, dict) and isinstance(reply.get("ok"), bool)
        if not ok or (reply["ok"] and "value" not in reply):
            raise WorkerDied(self._death(wire.ProtocolError("reply is not {ok, value|error}")))
        if not reply["ok"]:
            error = reply.get("error")
            fields = isinstance(error, dict) and {"type", "message"} <= set(error)
            if not fields or not all(isinstance(error[k], str) for k in ("type", "message")):
                raise WorkerDied(self._death(wire.ProtocolError("malformed error reply")))
            if not isinstance(error.get("bases", []), list) or not isinstance(
                error.get("where", ""), str
            ):
                raise WorkerDied(self._death(wire.ProtocolError("malformed error reply")))
            raise SubjectRaised(str(body.get("probe", body["op"])), error)
        return reply["value"]

    def _death(self, cause: Exception) -> str:
        """Why the worker stopped answering, from its exit status and the tail of its output."""
        # a worker that crashed closed its pipe as it died: its status is there within a second
        status = self._reap(1.0)
        if status is None:
            self.kill()
            if isinstance(cause, wire.ProtocolError) and not isinstance(cause, wire.ChannelClosed):
                reason = f"worker killed after a protocol error ({cause})"
            else:
                reason = f"worker stopped answering ({cause}) but kept running; killed"
        else:
            if status < 0:
                reason = f"worker killed by signal {_signal_name(-status)}"
            else:
                reason = f"worker exited with status {status}"
            if not isinstance(cause, wire.ChannelClosed):
                reason += f" after a protocol error ({cause})"
        tail = printable(self.output_tail())
        return f"{reason}; its last output: {tail}" if tail else reason

    def _reap(self, timeout: float) -> int | None:
        """The exit code, waiting up to `timeout` s for it; None if the worker still runs."""
        if self.status is None:
            self.status = self.process.wait(timeout)
        return self.status

    def output_tail(self, n: int = 600) -> str:
        """The last n characters the worker (and the subject) printed."""
        self._log.seek(0, os.SEEK_END)
        size = self._log.tell()
        self._log.seek(max(0, size - n))
        return self._log.read().decode(errors="replace").strip()

    def kill(self) -> None:
        """Kill the worker and everything it started, and reap it."""
        self.process.kill()
        self._reap(30.0)

    def close(self) -> None:
        """Kill whatever is left of the worker and release its pipes, log and launcher state."""
        try:
            self.kill()
        finally:
            for fd in (self._req_w, self._resp_r):
                os.close(fd)
            self._log.close()
            self.process.release()


def kill_group(pid: int, reaped: bool) -> None:
    """SIGKILL the process group `pid` leads and, unless it was already reaped (its pid may be
    someone else's by now), `pid` itself: a worker or a sandbox, and whatever it started."""
    for kill in (os.killpg,) if reaped else (os.killpg, os.kill):
        try:
            kill(pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass


def _signal_name(number: int) -> str:
    try:
        return signal.Signals(number).name
    except ValueError:
        return str(number)
