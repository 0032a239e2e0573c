"""The wire between the grader and its workers cannot be flooded or desynchronised from inside the
sandbox (issue 34), against the real sandbox: forged frames (tests/harness_tests/isolation/hostile/
wire_forged_frame.py) and decoding bombs (wire_decoding_bomb.py), each an overlay on the
example correct submission, graded by one `xfmr grade-batch --jobs 2` beside a correct
classmate, in a process of its own whose peak memory is measured.

Each attack ends its worker with the reason as the error of the test it broke (the load's, for a
frame forged at import: every test), the other tests pass in a fresh worker, its report is
written, nothing of the batch is left running, and the grader's peak RSS stays under
harness.isolation.worker.GRADER_PEAK whatever the workers wrote.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from test_hostile import TESTS, TIME_LIMIT, leftovers, standalone

from harness.isolation.worker import CALL_REPLY, GRADER_PEAK

pytestmark = pytest.mark.slow  # one grade-batch of 9 sandboxed submissions

ROOT = Path(__file__).resolve().parents[3]
CORRECT = ROOT / "examples" / "correct_submission.py"
NOAM, GOLDEN, CAUSAL = TESTS.split(",")

BOMBS = ("lists", "elements", "deep", "layout", "payload")
# submission -> (attack file, its fill)
ATTACKS = {
    **{f"forged_{w}": ("wire_forged_frame", {"WHEN": w}) for w in ("import", "stray", "call")},
    **{f"bomb_{b}": ("wire_decoding_bomb", {"BOMB": b}) for b in BOMBS},
}
PASSED = ("passed", "")
# submission -> test -> (status, words its output holds)
EXPECTED: dict[str, dict[str, tuple[str, str]]] = {
    # the forged answer to the load request is refused from its header: no test is judged on a
    # reply that answered something else
    "forged_import": dict.fromkeys(TESTS.split(","), ("failed", "answers no pending request")),
    # under the load's real id it stands for the load's reply; the worker's own reply, which then
    # answers nothing, ends each worker at the next request
    "forged_stray": dict.fromkeys(TESTS.split(","), ("failed", "answers no pending request")),
    "forged_call": {NOAM: ("failed", "answers no pending request"), GOLDEN: PASSED, CAUSAL: PASSED},
    "bomb_lists": {
        NOAM: ("failed", f"frame JSON of 16777215 bytes exceeds the cap of {CALL_REPLY.json}"),
        GOLDEN: PASSED,
        CAUSAL: PASSED,
    },
    "bomb_elements": {
        NOAM: ("failed", f"values, over the cap of {CALL_REPLY.elements}"),
        GOLDEN: PASSED,
        CAUSAL: PASSED,
    },
    "bomb_deep": {
        NOAM: ("failed", f"nests 20003 deep, over the cap of {CALL_REPLY.depth}"),
        GOLDEN: PASSED,
        CAUSAL: PASSED,
    },
    "bomb_layout": {NOAM: ("failed", "needs 8796093022208"), GOLDEN: PASSED, CAUSAL: PASSED},
    # the largest reply a call may carry, well-formed, standing in for the worker's own: read
    # into one buffer and judged (an array of 8 million zeros is not a rate for each of the
    # law's calls), the worker goes on
    "bomb_payload": {
        NOAM: ("failed", "noam_rates gave no rate for each call"),
        GOLDEN: PASSED,
        CAUSAL: PASSED,
    },
    "classmate": {NOAM: PASSED, GOLDEN: PASSED, CAUSAL: PASSED},
}

# The grader run as a process of its own, its peak RSS said at exit: VmHWM, the high-water mark of
# its own address space (ru_maxrss would carry over pytest's RSS at the fork, 785 MiB in CI).
GRADER = """\
import sys
from harness.cli import main
status = main(sys.argv[1:])
with open("/proc/self/status") as status_file:
    peak = [line.split()[1] for line in status_file if line.startswith("VmHWM:")]
print("PEAK_KIB", peak[0], file=sys.stderr)
sys.exit(status)
"""


@pytest.fixture(scope="module")
def batch(tmp_path_factory):
    folder = tmp_path_factory.mktemp("wire")
    out = tmp_path_factory.mktemp("wire-grades")
    stages = tmp_path_factory.mktemp("wire-stages")
    prefix = CORRECT.read_text() + "\n\n"
    for name, (attack, fill) in ATTACKS.items():
        standalone(attack, folder, prefix, **fill).rename(folder / f"{name}.py")
    (folder / "classmate.py").write_text(CORRECT.read_text())
    args = ["grade-batch", str(folder), "--out", str(out), "--tests", TESTS]
    args += ["--time-limit", TIME_LIMIT, "--jobs", "2"]
    env = {**os.environ, "TMPDIR": str(stages)}  # its sandboxes' command lines name `stages`
    done = subprocess.run(
        [sys.executable, "-c", GRADER, *args],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=900,
    )
    peak = [line.split()[1] for line in done.stderr.splitlines() if line.startswith("PEAK_KIB")]
    assert peak, done.stderr[-3000:]
    names = sorted(p.stem for p in folder.glob("*.py"))
    reports = {n: out / f"{n}.py.gradescope.json" for n in names}
    return {
        "status": done.returncode,
        "stderr": done.stderr,
        "peak": int(peak[0]) << 10,
        "reports": reports,
        "results": {n: json.loads(p.read_text()) for n, p in reports.items() if p.exists()},
        "leftovers": leftovers(str(stages).encode()),
    }


@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_each_attack_gets_the_grade_it_deserves(batch, name):
    assert batch["reports"][name].exists(), batch["stderr"][-3000:]
    tests = {t["name"]: t for t in batch["results"][name]["tests"]}
    for test, (status, words) in EXPECTED[name].items():
        got = tests[test]
        assert got["status"] == status and words in got["output"], (test, got)
        assert "Traceback" not in got["output"] and "grader error" not in got["output"], got


def test_the_grader_stays_within_its_memory_whatever_the_workers_write(batch):
    # without the caps: 2.9 GB on bomb_lists alone (83 MiB otherwise)
    print(f"the grader's peak RSS: {batch['peak'] / 2**20:.0f} MiB")
    assert batch["peak"] < GRADER_PEAK, (batch["peak"] >> 20, GRADER_PEAK >> 20)


def test_nothing_of_the_batch_is_left_running(batch):
    assert batch["leftovers"] == []
    assert batch["status"] == 1  # some submissions failed; the grader itself did not
