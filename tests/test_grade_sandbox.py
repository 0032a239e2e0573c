"""The sandbox's sweep: a detached grandchild is found and killed, with or without a cgroup."""

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from harness.sandbox import Cage, Limits, guarded, processes

# fork, setsid, fork again, and exec with an empty environment (no marker to find it by)
DETACH = """
import os
if os.fork() == 0:
    os.setsid()
    if os.fork() == 0:
        os.execve("/bin/sleep", ["sleep", "4343.5"], {})
    os._exit(0)
"""


def sleepers() -> list[int]:
    found = []
    for pid, (state, _, _) in processes().items():
        try:
            if state != "Z" and b"4343.5" in Path(f"/proc/{pid}/cmdline").read_bytes():
                found.append(pid)
        except OSError:
            pass
    return found


@pytest.mark.parametrize("use_cgroup", [True, False])
def test_sweep_kills_a_detached_grandchild(use_cgroup):
    cage = Cage(Limits(), use_cgroup=use_cgroup)
    with guarded():
        try:
            worker = subprocess.Popen([sys.executable, "-c", DETACH], start_new_session=True)
            cage.admit(worker.pid)
            worker.wait(timeout=30)
            deadline = time.monotonic() + 10
            while not sleepers() and time.monotonic() < deadline:
                time.sleep(0.05)
            assert sleepers(), "the grandchild should be running before the sweep"
            # orphaned, it came back to this process (a child subreaper), not to init
            assert all(processes()[p][1] == os.getpid() for p in sleepers())
            assert cage.sweep() >= 1
            assert sleepers() == []
        finally:
            cage.close()
    assert not cage.dir.exists()
