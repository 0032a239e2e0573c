"""A `Start` for code its owner trusts on their own machine: a worker as a plain subprocess.

`xfmr check` and `pytest --xfmr` (a student's self-check) run the student's own code on the
student's own laptop, so there is nothing to protect from it and no sandbox; and a laptop may be
a Mac (no AF_UNIX SOCK_SEQPACKET for the fork server) or Windows (neither bubblewrap nor
os.fork). So each worker is a fresh interpreter running the worker's own serve loop
(harness.isolation.child.local), started with subprocess alone, the request and reply pipes
handed over as inherited descriptors (POSIX: pass_fds) or inherited handles (Windows: msvcrt,
named to the child in argv). Nothing here touches os.fork, sockets or bwrap.

The worker speaks the same protocol, loads the subject the same way and runs the same probes as
a sandboxed one; only the walls differ: the resource limits the platform offers (Linux: memory,
file size, no core files; macOS: no address-space limit; Windows: none), a private working
folder, and the same refusal to import the grader's own packages.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from harness.isolation.limits import DEFAULT_LIMITS, PROJECT_PACKAGES
from harness.isolation.worker import Process, Start, kill_group

PROJECT_ROOT = Path(__file__).resolve().parents[2]
# The child's entry: serve on the channels named in argv (harness.isolation.child.local).
ENTRY = "harness.isolation.child.local"
WINDOWS = os.name == "nt"


# The address space a worker may map beyond its own once torch is imported, as in the sandbox
# (harness.isolation.limits.Limits.memory_mb, which says why).
HEADROOM_MB = DEFAULT_LIMITS.memory_mb


def rlimits(file_mb: int = 64) -> dict[str, list[int]]:
    """The sandbox's fixed limits that mean the same on a laptop: the largest file, no core
    files. Not RLIMIT_NPROC: outside a user namespace it counts every process of the user, the
    browser's too."""
    if WINDOWS:
        return {}
    mb = 1 << 20
    return {"RLIMIT_FSIZE": [file_mb * mb] * 2, "RLIMIT_CORE": [0, 0]}


def confinement(folder: Path, memory_mb: int = HEADROOM_MB) -> dict[str, Any]:
    """The worker's own confinement request (harness.isolation.child.confine): limits (the
    address space relative to what the worker has mapped, Linux only: macOS does not enforce
    it), the private folder as its working directory, the grader's packages refused."""
    spec: dict[str, Any] = {"rlimits": rlimits(), "dir": str(folder)}
    if sys.platform.startswith("linux"):
        spec["address_space_headroom_mb"] = memory_mb
    return spec | {"protected": list(PROJECT_PACKAGES)}


def environment(paths: tuple[str, ...] = ()) -> dict[str, str]:
    """The user's own environment (their machine, their code), with this project first on the
    import path, then `paths` (the submission's folder: its own helper modules import), and one
    intra-op thread per worker as in the sandbox."""
    env = dict(os.environ)
    found = [str(PROJECT_ROOT), *paths, env.get("PYTHONPATH", "")]
    env["PYTHONPATH"] = os.pathsep.join(p for p in found if p)
    env.update(OMP_NUM_THREADS="1", MKL_NUM_THREADS="1", PYTHONDONTWRITEBYTECODE="1")
    return env


class Local:
    """A worker started as a plain subprocess, as the parent holds it."""

    def __init__(self, proc: subprocess.Popen) -> None:
        self.proc, self.pid = proc, proc.pid

    def wait(self, timeout: float) -> int | None:
        try:
            return self.proc.wait(timeout)  # negative: killed by that signal (POSIX)
        except subprocess.TimeoutExpired:
            return None

    def kill(self) -> None:
        if WINDOWS:  # the worker and every process it started (/T), then the worker itself
            subprocess.run(
                ["taskkill", "/F", "/T", "/PID", str(self.pid)],
                stdout=subprocess.DEVNULL,
                stderr=subprocess.DEVNULL,
                check=False,
            )
            if self.proc.poll() is None:
                self.proc.kill()
        else:  # it leads its own session: its group is what it started
            kill_group(self.pid, reaped=self.proc.returncode is not None)

    def release(self) -> None:
        pass


def local(folder: Path, paths: tuple[str, ...] = ()) -> Start:
    """A `Start` for trusted workers: plain subprocesses working in `folder`, with `paths`
    after the project on their import path."""
    env = environment(paths)

    def start(request_fd: int, reply_fd: int, log_fd: int) -> Process:
        common: dict[str, Any] = {
            "stdin": subprocess.DEVNULL,
            "stdout": log_fd,
            "stderr": subprocess.STDOUT,
            "cwd": str(folder),
            "env": env,
        }
        if WINDOWS:
            return Local(_start_windows(request_fd, reply_fd, common))
        argv = [sys.executable, "-B", "-m", ENTRY, "fds", str(request_fd), str(reply_fd)]
        proc = subprocess.Popen(
            argv, pass_fds=(request_fd, reply_fd), start_new_session=True, **common
        )
        return Local(proc)

    return start


def _start_windows(request_fd: int, reply_fd: int, common: dict[str, Any]) -> subprocess.Popen:
    """Windows: the pipes' handles made inheritable and handed to the child alone
    (STARTUPINFO's handle list), named in argv; the child opens descriptors on them."""
    if sys.platform != "win32":  # never: called only where WINDOWS (mypy: the Windows stubs)
        raise OSError("STARTUPINFO's handle list is Windows only")
    import msvcrt  # Windows only

    handles = [msvcrt.get_osfhandle(fd) for fd in (request_fd, reply_fd)]
    for handle in handles:
        os.set_handle_inheritable(handle, True)
    info = subprocess.STARTUPINFO()
    info.lpAttributeList = {"handle_list": handles}
    argv = [sys.executable, "-B", "-m", ENTRY, "handles", *map(str, handles)]
    flags = subprocess.CREATE_NEW_PROCESS_GROUP
    try:
        return subprocess.Popen(argv, startupinfo=info, creationflags=flags, **common)
    finally:
        for handle in handles:
            os.set_handle_inheritable(handle, False)


@contextmanager
def workspace(prefix: str = "xfmr-check-") -> Iterator[Path]:
    """A private folder for a run's workers (their working directory and tempdir), removed
    after."""
    folder = Path(tempfile.mkdtemp(prefix=prefix))
    try:
        yield folder
    finally:
        shutil.rmtree(folder, ignore_errors=True)
