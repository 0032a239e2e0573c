"""The engine: run a suite of tests over a set of subjects, one worker process per subject.

Running and judging are apart. Each subject is loaded in its own worker (harness.worker, forked
from the zygote that preloaded torch), in its own session so that a timeout kills its whole
process group; the tests' checks run here, in the parent, on plain data the worker sends back.
A hang is a timeout cell, a crash an error cell, and either way a fresh worker runs the
subject's remaining tests. Subjects run in parallel threads, each thread driving one worker.
"""

from __future__ import annotations

import os
import select
import signal
import subprocess
import sys
import tempfile
import threading
import time
import traceback
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

from harness import protocol
from harness.outcomes import Outcome
from harness.subjects import Subject
from harness.suite import Failure, SubjectRaised, Test
from harness.zygote import zygote

# Loading takes milliseconds from the zygote and ~5 s from a fresh interpreter (torch's imports);
# 60 s leaves room for a loaded machine without letting a hang at import stall the run for long.
LOAD_TIMEOUT = 60.0
# How often a wait for a reply checks that the worker still runs (seconds).
_LIVENESS_SLICE = 0.25


class WorkerDied(Exception):
    """The worker stopped answering: it exited, was killed by a signal, or broke the protocol."""


class WorkerTimeout(Exception):
    """The worker did not answer before the deadline."""


@dataclass(frozen=True)
class Cell:
    """One (test, subject) result."""

    outcome: Outcome
    message: str = ""
    seconds: float = 0.0


class Worker:
    """One subject's worker process, spoken to over two pipes that only the harness writes.

    By default it is forked from the zygote, which preloaded torch and the probes
    (harness.zygote); fresh_interpreter=True starts `python -m harness.worker` instead, slower
    to start (~5 s of imports) but sharing nothing with any other worker. Either way it leads its
    own session, so killing its process group takes every process it started.
    """

    def __init__(self, subject: Subject, fresh_interpreter: bool = False):
        self.subject = subject
        self.status: int | None = None  # the exit code once reaped; negative: a signal
        self._log = tempfile.NamedTemporaryFile(prefix="xfmr-worker-", suffix=".log")
        if fresh_interpreter:
            self._start_interpreter()
        else:
            self._start_forked()

    def _start_interpreter(self) -> None:
        req_r, self._req_w = os.pipe()
        self._resp_r, resp_w = os.pipe()
        env = {**os.environ, "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"}
        proc = subprocess.Popen(
            [sys.executable, "-m", "harness.worker", str(req_r), str(resp_w)],
            pass_fds=(req_r, resp_w),
            stdin=subprocess.DEVNULL,
            stdout=self._log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
            env=env,
        )
        os.close(req_r)
        os.close(resp_w)
        self.pid = proc.pid

        def wait(timeout: float) -> int | None:
            try:
                return proc.wait(timeout)
            except subprocess.TimeoutExpired:
                return None

        self._wait_for = wait

    def _start_forked(self) -> None:
        req_r, self._req_w = os.pipe()
        self._resp_r, resp_w = os.pipe()
        server = zygote()
        try:
            self.pid = server.spawn(req_r, resp_w, self._log.fileno())
        finally:
            os.close(req_r)
            os.close(resp_w)
        self._wait_for = lambda timeout: server.wait(self.pid, timeout)

    def load(self, rlimits: dict[str, tuple[int, int]] | None = None) -> None:
        """Set the resource limits in the worker, then import the subject there."""
        request = {"op": "load", "subject": self.subject.to_json(), "rlimits": rlimits or {}}
        self.request(request, time.monotonic() + LOAD_TIMEOUT)

    def request(self, body: dict[str, Any], deadline: float) -> Any:
        """Send one request; the worker's value, or SubjectRaised / WorkerTimeout / WorkerDied."""
        self.send(body)
        return self._value(body, self.receive(deadline))

    def send(self, body: dict[str, Any]) -> None:
        """Write one request frame; WorkerDied if the worker's end is gone."""
        try:
            protocol.write_frame(self._req_w, body)
        except OSError as e:
            raise WorkerDied(self._death(e)) from None

    def receive(self, deadline: float) -> Any:
        """The next frame from the worker, as sent; WorkerTimeout / WorkerDied.

        Waits in short slices, checking that the worker still runs: a worker that exited while
        a process it started holds its end of the pipe open never sends end-of-file.
        """
        while True:
            left = deadline - time.monotonic()
            if left <= 0:
                raise WorkerTimeout()
            if select.select([self._resp_r], [], [], min(left, _LIVENESS_SLICE))[0]:
                break
            if self._reap(0.0) is not None:
                held = protocol.ChannelClosed("and a process it started holds its pipe open")
                raise WorkerDied(self._death(held))
        try:
            return protocol.read_frame(self._resp_r, max(0.0, deadline - time.monotonic()))
        except protocol.FrameTimeout:
            raise WorkerTimeout() from None
        except (protocol.ProtocolError, OSError) as e:
            raise WorkerDied(self._death(e)) from None

    def stream(
        self, body: dict[str, Any], due: Callable[[], float], on_event: Callable[[Any], None]
    ) -> Any:
        """Send a request whose probe emits events (harness.worker.emit) before its reply: each
        event goes to on_event, each frame must arrive by due(); returns the reply's value."""
        self.send(body)
        while True:
            frame = self.receive(due())
            if not (isinstance(frame, dict) and set(frame) == {"event"}):
                return self._value(body, frame)
            on_event(frame["event"])

    def _value(self, body: dict[str, Any], reply: Any) -> Any:
        """A reply frame's value; SubjectRaised for an error reply, WorkerDied for a bad one."""
        ok = isinstance(reply, dict) and isinstance(reply.get("ok"), bool)
        if not ok or (reply["ok"] and "value" not in reply):
            raise WorkerDied(self._death(protocol.ProtocolError("reply is not {ok, value|error}")))
        if not reply["ok"]:
            error = reply.get("error")
            if not isinstance(error, dict) or not {"type", "message"} <= set(error):
                raise WorkerDied(self._death(protocol.ProtocolError("malformed error reply")))
            raise SubjectRaised(body.get("probe", body["op"]), error)
        return reply["value"]

    def _death(self, cause: Exception) -> str:
        """Why the worker stopped answering, from its exit status and the tail of its output."""
        # a worker that crashed closed its pipe as it died: its status is there within a second
        if self._reap(1.0) is None:
            self.kill()
            reason = f"worker stopped answering ({cause}) but kept running; killed"
        else:
            if self.status < 0:
                reason = f"worker killed by signal {signal.Signals(-self.status).name}"
            else:
                reason = f"worker exited with status {self.status}"
            if not isinstance(cause, protocol.ChannelClosed):
                reason += f" after a protocol error ({cause})"
        tail = self.output_tail()
        return f"{reason}; its last output: {tail}" if tail else reason

    def _reap(self, timeout: float) -> int | None:
        """The exit code, waiting up to `timeout` s for it; None if the worker still runs."""
        if self.status is None:
            self.status = self._wait_for(timeout)
        return self.status

    def output_tail(self, n: int = 600) -> str:
        """The last n characters the worker (and the subject) printed."""
        self._log.seek(0, os.SEEK_END)
        size = self._log.tell()
        self._log.seek(max(0, size - n))
        return self._log.read().decode(errors="replace").strip()

    def kill(self) -> None:
        """Kill the worker's whole process group (what it started too) and reap the worker."""
        kills = (os.killpg,) if self.status is not None else (os.killpg, os.kill)
        for kill in kills:  # the group; the worker itself if it has not led one yet
            try:
                kill(self.pid, signal.SIGKILL)
            except (ProcessLookupError, PermissionError):
                pass
        self._reap(30.0)

    def close(self) -> None:
        """Kill whatever is left of the worker and release its pipes and log."""
        self.kill()
        for fd in (self._req_w, self._resp_r):
            os.close(fd)
        self._log.close()


@dataclass
class SuiteRun:
    """The outcome matrix of one run: cells by (test name, subject name), plus timings."""

    tests: list[Test]
    subjects: list[Subject]
    cells: dict[tuple[str, str], Cell] = field(default_factory=dict)
    subject_seconds: dict[str, float] = field(default_factory=dict)
    worker_starts: dict[str, int] = field(default_factory=dict)
    wall_seconds: float = 0.0

    def cell(self, test: str, subject: str) -> Cell:
        return self.cells[(test, subject)]

    def row(self, subject: str) -> list[Outcome]:
        """The subject's outcomes in test order."""
        return [self.cells[(t.name, subject)].outcome for t in self.tests]


# on_cell(subject, test, cell, cells_done, cells_total)
Progress = Callable[[Subject, Test, Cell, int, int], None]


def run_test(test: Test, worker: Worker) -> Cell:
    """Run one test's check against a live worker; the worker may be dead afterwards."""
    start = time.monotonic()
    deadline = start + test.timeout

    def call(probe: str, **inputs: Any) -> Any:
        return worker.request({"op": "call", "probe": probe, "inputs": inputs}, deadline)

    try:
        test.check(call)
        outcome, message = Outcome.PASSED, ""
    except Failure as e:
        outcome, message = Outcome.KILLED, str(e)
    except SubjectRaised as e:
        outcome, message = Outcome.KILLED, str(e)
    except WorkerTimeout:
        worker.kill()
        outcome, message = Outcome.TIMEOUT, f"no answer within {test.timeout:g} s; killed"
    except WorkerDied as e:
        outcome, message = Outcome.ERROR, str(e)
    except Exception:  # the check itself broke: a harness bug, shown in full
        outcome, message = Outcome.ERROR, "harness error in the check:\n" + traceback.format_exc()
    return Cell(outcome, message, time.monotonic() - start)


def run_subject(
    subject: Subject,
    tests: Sequence[Test],
    on_cell: Callable[[Test, Cell], None],
    rlimits: dict[str, tuple[int, int]] | None = None,
    make_worker: Callable[[Subject], Worker] = Worker,
) -> tuple[dict[str, Cell], int]:
    """Every test on one subject in order, restarting the worker after a timeout or a crash."""
    cells: dict[str, Cell] = {}
    worker: Worker | None = None
    load_failure: Cell | None = None  # a subject that cannot load fails every test the same way
    starts = 0
    try:
        for test in tests:
            if not test.applies(subject):
                cell = Cell(Outcome.NOT_APPLICABLE)
            elif load_failure is not None:
                cell = load_failure
            else:
                if worker is None:
                    starts += 1
                    worker, load_failure = _start(subject, rlimits, make_worker)
                    if load_failure is not None:
                        cells[test.name] = load_failure
                        on_cell(test, load_failure)
                        continue
                cell = run_test(test, worker)
                if cell.outcome in (Outcome.TIMEOUT, Outcome.ERROR):
                    worker.close()
                    worker = None
            cells[test.name] = cell
            on_cell(test, cell)
    finally:
        if worker is not None:
            worker.close()
    return cells, starts


def _start(
    subject: Subject,
    rlimits: dict[str, tuple[int, int]] | None,
    make_worker: Callable[[Subject], Worker],
) -> tuple[Worker | None, Cell | None]:
    """A loaded worker, or the cell that its failure to load gives every test."""
    start = time.monotonic()
    worker = make_worker(subject)
    try:
        worker.load(rlimits)
        return worker, None
    except SubjectRaised as e:  # the subject raised at import: every test fails on it
        cell = Cell(Outcome.KILLED, str(e), time.monotonic() - start)
    except WorkerTimeout:
        seconds = time.monotonic() - start  # the worker's own load limit, LOAD_TIMEOUT or less
        cell = Cell(Outcome.TIMEOUT, f"loading took over {seconds:.0f} s; killed", seconds)
    except WorkerDied as e:
        cell = Cell(Outcome.ERROR, f"load: {e}", time.monotonic() - start)
    worker.close()
    return None, cell


def run_suite(
    tests: Sequence[Test],
    subjects: Sequence[Subject],
    jobs: int | None = None,
    progress: Progress | None = None,
    rlimits: dict[str, tuple[int, int]] | None = None,
    make_worker: Callable[[Subject], Worker] = Worker,
) -> SuiteRun:
    """Every test on every subject: up to `jobs` subjects at once (default: the CPU count).

    rlimits: resource limits each worker sets before loading its subject. make_worker: how a
    worker is started (a Worker subclass that confines untrusted code, say).
    """
    names = [t.name for t in tests]
    if len(set(names)) != len(names):
        raise ValueError(f"test names must be unique, got {names}")
    if len({s.name for s in subjects}) != len(subjects):
        raise ValueError(f"subject names must be unique, got {[s.name for s in subjects]}")
    run = SuiteRun(list(tests), list(subjects))
    total = len(tests) * len(subjects)
    lock = threading.Lock()
    started = time.monotonic()

    def one(subject: Subject) -> None:
        t0 = time.monotonic()

        def on_cell(test: Test, cell: Cell) -> None:
            with lock:
                run.cells[(test.name, subject.name)] = cell
                if progress is not None:
                    progress(subject, test, cell, len(run.cells), total)

        _, starts = run_subject(subject, tests, on_cell, rlimits, make_worker)
        with lock:
            run.subject_seconds[subject.name] = time.monotonic() - t0
            run.worker_starts[subject.name] = starts

    with ThreadPoolExecutor(max_workers=jobs or os.cpu_count() or 1) as pool:
        for future in [pool.submit(one, s) for s in subjects]:
            future.result()
    run.wall_seconds = time.monotonic() - started
    return run


def print_progress(subject: Subject, test: Test, cell: Cell, done: int, total: int) -> None:
    """A progress line per cell on stderr."""
    print(
        f"[{done:>3}/{total}] {subject.name:<10} {test.name:<52} {cell.outcome.value:<8} "
        f"{cell.seconds:6.2f} s",
        file=sys.stderr,
        flush=True,
    )


def in_process_call(module: Any) -> Callable[..., Any]:
    """`call` for a trusted module run in this process (deriving bars, calibrating tolerances):
    the probes' values still round-trip through the wire format, as a worker's would."""
    from harness.probes import PROBES

    def call(probe: str, **inputs: Any) -> Any:
        inputs = protocol.parse(protocol.encode(inputs))
        return protocol.parse(protocol.encode(PROBES[probe](module, **inputs)))

    return call
