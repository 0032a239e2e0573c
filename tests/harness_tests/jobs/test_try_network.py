"""`xfmr autograder try`'s container has a network of its own, as Docker gives a container: a
listener on the staff machine's loopback (a socket listening on 127.0.0.1 in this test's process:
a Dask scheduler, a notebook, a dev server) is unreachable from inside the job, on Gradescope's
and PrairieLearn's, while the job's own loopback is up.

The proof is a submission's: examples/correct_submission.py with a few lines appended that, when
a worker imports it, connect to the test's listener and to a listener of their own on the job's
127.0.0.1, and leave the outcome as a file name in the job's /tmp (the container tier's workers,
under Docker's restrictions, share the container's /tmp, where the simulation reads it after the
job, as test_autograder.py's forging submission does). The test's listener must have no
connection waiting, the mark must say the connection was refused and the job's own loopback
answered, and the grade must be whole (the code under test did load and run).
"""

from __future__ import annotations

import json
import socket
import subprocess
import sys

import pytest
from test_autograder import ROOT, build, needs_the_simulation

from harness.jobs import simulated_container as sim
from harness.jobs.autograder_files import GRADESCOPE, PRAIRIELEARN
from harness.jobs.autograder_try import image, job

TEST = "test_hand_example_noam"  # one cheap test: the grade is not the point, the import is

REACH = r"""
# --- appended by the test: from inside the job, reach the staff machine's loopback ------------
def _xfmr_reach():
    import errno as _errno
    import os as _os
    import socket as _socket

    def _try(port):
        try:
            _socket.create_connection(("127.0.0.1", port), timeout=3).close()
            return "connected"
        except OSError as e:
            return _errno.errorcode.get(e.errno, str(e.errno)) if e.errno else type(e).__name__

    own = _socket.socket()
    own.bind(("127.0.0.1", 0))
    own.listen()
    mine = _try(own.getsockname()[1])
    own.close()
    staff = _try(%d)
    open("/tmp/xfmr-net-staff-%%s-own-%%s-as-%%d" %% (staff, mine, _os.getuid()), "w").close()


_xfmr_reach()
"""


def marks(tmp: tuple[str, ...]) -> list[str]:
    return sorted({name.rsplit("-as-", 1)[0] for name in tmp if name.startswith("xfmr-net-")})


@pytest.fixture
def staff_listener():
    """A listener on this machine's loopback, as a staff laptop's scheduler or notebook: it
    would complete any connection made to it (the kernel's backlog) without an accept."""
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(8)
    listener.setblocking(False)
    yield listener
    listener.close()


def untouched(listener: socket.socket) -> None:
    try:
        peer = listener.accept()
    except BlockingIOError:
        return
    raise AssertionError(f"the job reached the staff machine's 127.0.0.1: {peer[1]}")


@needs_the_simulation
def test_the_simulated_container_has_a_network_of_its_own(tmp_path, staff_listener):
    """The container itself, as root, under Docker's restrictions: the staff listener refuses,
    its own loopback answers; and the same probe on this machine reaches the listener (the
    control: the probe can tell)."""
    port = staff_listener.getsockname()[1]
    probe = (REACH % port).replace('open("/tmp/', 'print("/tmp/').replace(', "w").close()', ")")
    sim.new_image(tmp_path / "image")
    ran = sim.run(
        tmp_path / "image",
        "docker",
        [f"{sim.VENV}/bin/python", "-c", probe],
        lambda _: None,
        lambda _: None,
    )
    assert ran.status == 0, ran.output
    assert "/tmp/xfmr-net-staff-ECONNREFUSED-own-connected-as-0" in ran.output, ran.output
    untouched(staff_listener)
    here = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, check=True)
    assert "/tmp/xfmr-net-staff-connected-own-connected" in here.stdout, here.stdout
    staff_listener.setblocking(True)
    staff_listener.settimeout(5)
    staff_listener.accept()[0].close()  # the control's connection, waiting


@needs_the_simulation
@pytest.mark.slow
@pytest.mark.parametrize("platform", [GRADESCOPE, PRAIRIELEARN], ids=lambda p: p.name)
def test_a_submission_in_the_try_job_cannot_reach_the_staff_loopback(
    tmp_path, staff_listener, platform
):
    port = staff_listener.getsockname()[1]
    submission = tmp_path / "in" / "transformer.py"
    submission.parent.mkdir()
    correct = (ROOT / "examples" / "correct_submission.py").read_text()
    submission.write_text(correct + REACH % port)
    if platform is GRADESCOPE:
        files = tmp_path / "autograder.zip"
        build(files, "--tests", TEST)
    else:
        files = tmp_path / "pl"
        build(files, "--tests", TEST, "--course", "CS 182", action="prairielearn")
    built = image(files, platform, "docker", tmp_path / "cache", rebuild=False)
    assert built.build.status == 0, built.build.output
    done = job(built.folder, platform, "docker", submission.parent)
    assert done.record.splitlines()[0] == "container", done.record  # workers share its /tmp
    results = json.loads(done.results)
    # the submission loaded and passed: its appended code ran in a worker
    if platform is GRADESCOPE:
        assert results["score"] > 0 and results["output"] == "1/1 tests passed", results
    else:
        assert results["gradable"] is True and results["score"] == 1.0, results
    assert marks(done.ran.tmp) == ["xfmr-net-staff-ECONNREFUSED-own-connected"], done.ran.tmp
    untouched(staff_listener)
