"""Workers that hang, crash, print or fail to import never break a run: each becomes a cell
and the run goes on."""

from __future__ import annotations

import os
import time
from pathlib import Path

import pytest

from harness.engine.run import Launch, run_suite, trusted_call
from harness.isolation.limits import DEFAULT_LIMITS
from harness.isolation.sandbox import INPUT, sandboxed, staged
from harness.outcomes import Outcome, mutant_outcome
from harness.shared_tests.laws import BY_NAME
from harness.shared_tests.laws.values import golden_comparisons
from harness.shared_tests.record import Failure, Test
from harness.subjects import Kind, Subject

# --- workers ----------------------------------------------------------------------------------

# A subject whose noam_rate misbehaves on chosen steps; everything else is absent.
HOSTILE = """
import ctypes, os, sys, time

CHILD_FILE = {child_file!r}

def noam_rate(step, d_model, warmup, factor=1.0):
    if step == 1:
        time.sleep(3600)                      # hangs
    if step == 2:
        os._exit(0)                           # exits "successfully" mid-test
    if step == 3:
        ctypes.string_at(0)                   # segfaults
    if step == 4:
        raise ValueError("bad step")          # an ordinary failure
    if step == 5:                             # prints protocol-looking junk everywhere
        for stream in (sys.stdout, sys.stderr):
            stream.write("XFM1" + "\\x00" * 40 + "garbage\\n")
            stream.flush()
    if step == 6:                             # leaves a child behind in its process group
        pid = os.fork()
        if pid == 0:
            time.sleep(3600)
        open(CHILD_FILE, "w").write(str(pid))
        time.sleep(3600)
    n = step + 1
    return factor * d_model**-0.5 * min(n**-0.5, n * warmup**-1.5)
"""


def rate_test(name: str, step: int, timeout: float = 10.0) -> Test:
    def check(call):
        (rate,) = call("noam_rates", cases=[[step, 16, 4, 1.0]])
        want = 16**-0.5 * min((step + 1) ** -0.5, (step + 1) * 4**-1.5)
        if rate != want:
            raise Failure(f"rate {rate}, expected {want}")

    return Test(name, f"noam_rate at step {step}", check, timeout)


@pytest.fixture
def hostile(tmp_path) -> Subject:
    path = tmp_path / "hostile.py"
    path.write_text(HOSTILE.replace("{child_file!r}", repr(str(tmp_path / "child.pid"))))
    return Subject("hostile", Kind.SUBMISSION, path=str(path))


def test_hangs_and_crashes_become_cells_and_the_run_goes_on(hostile):
    tests = [
        rate_test("ok", 0),
        rate_test("hangs", 1, timeout=1.0),
        rate_test("ok_after_hang", 7),
        rate_test("exits_0", 2),
        rate_test("segfaults", 3),
        rate_test("raises", 4),
        rate_test("prints_junk", 5),
        Test("broken_check", "a harness bug", lambda call: {}["missing"], 5.0),
    ]
    run = run_suite(tests, [hostile], jobs=1)
    cell = {t.name: run.cell(t.name, "hostile") for t in tests}
    assert cell["ok"].outcome is Outcome.PASSED
    assert cell["hangs"].outcome is Outcome.TIMEOUT and 1.0 <= cell["hangs"].seconds < 5
    assert cell["ok_after_hang"].outcome is Outcome.PASSED
    assert cell["exits_0"].outcome is Outcome.ERROR
    assert "exited with status 0" in cell["exits_0"].message
    assert cell["segfaults"].outcome is Outcome.ERROR
    assert "SIGSEGV" in cell["segfaults"].message
    assert cell["raises"].outcome is Outcome.KILLED
    assert "ValueError: bad step" in cell["raises"].message
    assert cell["prints_junk"].outcome is Outcome.PASSED
    # a check that cannot read an answer charges the subject, in one line (no traceback)
    assert cell["broken_check"].outcome is Outcome.KILLED
    assert "could not be judged: KeyError" in cell["broken_check"].message
    assert "Traceback" not in cell["broken_check"].message
    # a fresh worker after the hang, the exit and the segfault
    assert run.worker_starts["hostile"] == 4


@pytest.mark.slow
def test_a_timeout_kills_the_workers_whole_process_group(hostile, tmp_path):
    run = run_suite([rate_test("forks", 6, timeout=1.5)], [hostile], jobs=1)
    assert run.cell("forks", "hostile").outcome is Outcome.TIMEOUT
    child = int((tmp_path / "child.pid").read_text())
    for _ in range(100):  # the zygote reaps the worker; init reaps the orphaned child
        try:
            os.kill(child, 0)
        except ProcessLookupError:
            break
        time.sleep(0.05)
    else:
        pytest.fail(f"the worker's child {child} survived the timeout")


def test_a_subject_that_fails_to_import_fails_every_test_once(tmp_path):
    path = tmp_path / "broken.py"
    path.write_text("raise ImportError('no such thing')\n")
    subject = Subject("broken", Kind.SUBMISSION, path=str(path))
    run = run_suite([rate_test("a", 0), rate_test("b", 0)], [subject], jobs=1)
    for name in ("a", "b"):
        assert run.cell(name, "broken").outcome is Outcome.KILLED
        assert "ImportError: no such thing" in run.cell(name, "broken").message
    assert run.worker_starts["broken"] == 1


@pytest.mark.slow
def test_a_sandboxed_worker_speaks_the_same_protocol(hostile):
    with staged({"hostile.py": Path(hostile.path)}) as stage:
        spec = {"path": f"{INPUT}/hostile.py"}
        worker = Launch(sandboxed(stage), spec, confine=DEFAULT_LIMITS.confine()).worker()
        try:
            value = worker.call("noam_rates", time.monotonic() + 60, cases=[[7, 16, 4, 1.0]])
            assert value == [16**-0.5 * min(8**-0.5, 8 * 4**-1.5)]
        finally:
            worker.close()


FLOAT32_ONLY = """
import torch
from impl.torch_copy import *  # noqa: F403
from impl import torch_copy


class Transformer(torch_copy.Transformer):
    def forward(self, *args):
        if next(self.parameters()).dtype != torch.float32:
            raise TypeError("this subject runs in float32 only")
        return super().forward(*args)
"""


@pytest.mark.slow
def test_a_float32_only_subject_is_judged_with_bounds_derived_for_float32(tmp_path):
    path = tmp_path / "float32_only.py"
    path.write_text(FLOAT32_ONLY)
    subject = Subject("f32", Kind.SUBMISSION, path=str(path))
    golden = BY_NAME["test_golden_torch"]
    run = run_suite([golden], [subject], jobs=1)
    assert run.cell(golden.name, "f32").outcome is Outcome.PASSED
    with trusted_call(subject) as call:
        comparisons = list(golden_comparisons(call))
    assert {dtype for dtype, *_ in comparisons} == {"float32"}


def test_trusted_call_runs_probes_in_a_worker():
    with trusted_call(Subject("impl", Kind.CORRECT, module="impl.transformer")) as call:
        assert call("noam_rates", cases=[[0, 16, 4, 1.0]]) == [0.03125]


def test_outcomes_count_as_stryker_does():
    assert Outcome.KILLED.detected and Outcome.TIMEOUT.detected
    assert not Outcome.ERROR.detected and not Outcome.PASSED.detected
    assert Outcome.ERROR.false_alarm and not Outcome.NOT_APPLICABLE.false_alarm
    assert mutant_outcome([Outcome.PASSED, Outcome.ERROR, Outcome.TIMEOUT]) is Outcome.TIMEOUT
    assert mutant_outcome([Outcome.NOT_APPLICABLE]) is Outcome.NOT_APPLICABLE


def test_only_a_broken_stdout_is_a_quiet_exit(monkeypatch):
    # `xfmr ... | head` ends quietly; a broken pipe of the job's own (a worker's) is an error
    from harness import cli

    r, w = os.pipe()
    with os.fdopen(w, "w") as out:
        monkeypatch.setattr("sys.stdout", out)
        assert not cli._stdout_is_broken()
        os.close(r)
        assert cli._stdout_is_broken()
        monkeypatch.undo()
        try:
            out.close()
        except BrokenPipeError:
            pass
