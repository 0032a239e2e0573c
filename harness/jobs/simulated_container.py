"""A simulated autograder container, for `xfmr autograder try` and the CI (tests/harness_tests/
jobs/test_autograder.py, test_prairielearn.py): one simulation, used by both.

What is real: the platform's files (Gradescope's zip, PrairieLearn's image folder) and their
scripts, run as root; the isolation tier their scripts prove, with its nested bubblewrap or its
user switch, rlimits and kills.

What is simulated: the container is bubblewrap run as root (a tmpfs root with this machine's /usr,
/bin and /lib read-only, a writable copy of /etc, its own pid, ipc, uts and network namespaces, a
1777 /tmp, tmpfs /var and /root), not Docker; and the installs the platform's build would download
(apt-get: bubblewrap, python3.11; pip: torch, the project) are skipped (XFMR_SKIP_INSTALL=1):
this machine's interpreter and venv are bound read-only at VENV instead. Its network is its own,
as a Docker container's is: a loopback of its own, up (bubblewrap brings it up), and no route
out, so nothing listening on the staff machine's 127.0.0.1 (a Dask scheduler, a notebook, a dev
server) is reachable from a job. Two variants:

- "docker": Docker's defaults imitated: /proc mounted by bwrap with /proc/sys, /proc/irq,
  /proc/bus and /proc/sysrq-trigger covered (a masked /proc: a nested proc mount is refused),
  Docker's default capabilities only (no CAP_SYS_ADMIN), and a seccomp filter that, as Docker's
  profile does, refuses clone/unshare with CLONE_NEWUSER (EPERM) and clone3 (ENOSYS): bubblewrap
  cannot start, the container tier is what works;
- "userns": a fresh, unmasked /proc, all capabilities and no filter: nested user namespaces
  work, the sandbox tier is what works.

An image is a folder: etc/ (the container's /etc) and root/NAME for each top-level folder the
platform's build writes (/autograder; /xfmr-grader). setup() runs the build once in it; run()
runs one grading job in a throwaway copy of it, a fresh root each time, as Gradescope and
PrairieLearn start a fresh container from the built image for every submission.
"""

from __future__ import annotations

import os
import platform
import shutil
import struct
import subprocess
import sys
import tempfile
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

from harness.isolation.container import USER

VARIANTS = ("docker", "userns")
VENV = "/opt/xfmr-oracle/venv"  # where this machine's venv is bound (setup.sh's default)
DRIVER = Path(__file__).with_name("in_container.sh")
# Docker's default capabilities (moby's oci/caps/defaults.go)
DOCKER_CAPS = (
    "CHOWN DAC_OVERRIDE FSETID FOWNER MKNOD NET_RAW SETGID SETUID SETFCAP SETPCAP "
    "NET_BIND_SERVICE SYS_CHROOT KILL AUDIT_WRITE"
).split()
SKIPPED = (
    "Simulated: bubblewrap as root, not Docker; the build's downloads (setup.sh's apt-get and "
    "pip) are skipped (XFMR_SKIP_INSTALL=1): this machine's interpreter and venv stand in, bound "
    f"read-only at {VENV}"
)


def unavailable() -> str:
    """Why the simulation cannot run here ("" if it can)."""
    if sys.platform != "linux" or platform.machine() != "x86_64":
        return "the simulated container needs Linux on x86_64 (its seccomp filter is x86_64's)"
    if os.geteuid() != 0:
        return "the simulated container is bubblewrap run as root: run this as root"
    if shutil.which("bwrap") is None:
        return "the simulated container needs bubblewrap (apt-get install -y bubblewrap)"
    return ""


def docker_seccomp() -> bytes:
    """A classic BPF seccomp program (x86_64) refusing what Docker's default profile refuses to
    an unprivileged container and bubblewrap needs: clone and unshare with CLONE_NEWUSER
    (EPERM), clone3 (ENOSYS, so that libc falls back to clone)."""

    def op(code: int, jt: int, jf: int, k: int) -> bytes:
        return struct.pack("HBBI", code, jt, jf, k)

    ld, jeq, jset, ret = 0x20, 0x15, 0x45, 0x06
    allow, errno = 0x7FFF0000, 0x00050000
    return b"".join(
        [
            op(ld, 0, 0, 4),  # arch
            op(jeq, 1, 0, 0xC000003E),  # x86_64
            op(ret, 0, 0, allow),
            op(ld, 0, 0, 0),  # syscall number
            op(jeq, 5, 0, 435),  # clone3 -> ENOSYS
            op(jeq, 1, 0, 56),  # clone -> flags
            op(jeq, 0, 2, 272),  # unshare -> flags, else allow
            op(ld, 0, 0, 16),  # args[0]: the flags
            op(jset, 2, 0, 0x10000000),  # CLONE_NEWUSER -> EPERM
            op(ret, 0, 0, allow),
            op(ret, 0, 0, errno | 38),
            op(ret, 0, 0, errno | 1),
        ]
    )


@dataclass(frozen=True)
class Ran:
    """One phase in the container: its command's exit status, wall time (seconds) and output;
    after a job, what was still running of the student's user (or any Python) and the names
    left in /tmp."""

    status: int
    seconds: float
    output: str
    left: tuple[str, ...] = ()
    tmp: tuple[str, ...] = ()


def new_image(image: Path) -> tuple[Path, Path]:
    """An empty image at `image`: etc/ a copy of this machine's /etc; root/, for the folders the
    platform's files go in. Returns root/ and etc/."""
    (image / "root").mkdir(parents=True)
    subprocess.run(["cp", "-a", "/etc", str(image / "etc")], check=True)
    return image / "root", image / "etc"


def _args(variant: str, image: Path, out: Path) -> tuple[list[str], tuple[int, ...]]:
    args = ["bwrap", "--unshare-pid", "--unshare-ipc", "--unshare-uts", "--hostname", "grader"]
    args += ["--unshare-net"]  # a network of its own: its own loopback, nothing of this machine's
    args += ["--ro-bind", "/usr", "/usr", "--bind", str(image / "etc"), "/etc", "--dev", "/dev"]
    for top in ("/bin", "/sbin", "/lib", "/lib64", "/lib32"):
        if os.path.islink(top):
            args += ["--symlink", os.readlink(top), top]
        elif os.path.isdir(top):
            args += ["--ro-bind", top, top]
    args += ["--perms", "1777", "--tmpfs", "/tmp", "--tmpfs", "/var", "--dir", "/var/log"]
    args += ["--tmpfs", "/root"]
    for folder in [*reversed(Path(sys.base_prefix).parents[:-2]), *Path(VENV).parents[:-1][::-1]]:
        args += ["--perms", "0755", "--dir", str(folder)]  # as an image's would be
    args += ["--ro-bind", sys.base_prefix, sys.base_prefix, "--ro-bind", sys.prefix, VENV]
    for folder in sorted((image / "root").iterdir()):
        args += ["--bind", str(folder), f"/{folder.name}"]
    args += ["--bind", str(out), "/xfmr-out", "--ro-bind", str(DRIVER), "/xfmr-driver.sh"]
    args += ["--chdir", "/", "--clearenv", "--setenv", "PATH", "/usr/sbin:/usr/bin:/sbin:/bin"]
    fds: tuple[int, ...] = ()
    if variant == "docker":
        args += ["--proc", "/proc", "--cap-drop", "ALL"]
        for cap in DOCKER_CAPS:
            args += ["--cap-add", f"CAP_{cap}"]
        read, write = os.pipe()
        os.write(write, docker_seccomp())
        os.close(write)
        args += ["--seccomp", str(read)]
        fds = (read,)
    else:
        args += ["--dir", "/proc", "--cap-add", "ALL"]
    return args, fds


def _phase(
    variant: str,
    image: Path,
    phase: str,
    command: Sequence[str],
    workdir: str,
    student: str,
    timeout: float,
) -> Ran:
    if variant not in VARIANTS:
        raise ValueError(f"no simulated container {variant!r}: one of {VARIANTS}")
    with tempfile.TemporaryDirectory(prefix="xfmr-out-") as folder:
        out = Path(folder)
        out.chmod(0o700)
        args, fds = _args(variant, image, out)
        args += ["--", "/bin/bash", "/xfmr-driver.sh", variant, phase, workdir, student, *command]
        try:
            done = subprocess.run(
                args, pass_fds=fds, capture_output=True, text=True, timeout=timeout
            )
        except subprocess.TimeoutExpired:
            return Ran(124, timeout, f"the simulated container ran past {timeout:g} s")
        finally:
            for fd in fds:
                os.close(fd)

        def read(name: str) -> str:
            path = out / name
            return path.read_text(errors="replace") if path.is_file() else ""

        said = read("status").split()
        if done.returncode != 0 or len(said) != 3:
            why = f"the simulated container failed (bwrap status {done.returncode})"
            return Ran(-1, 0.0, "\n".join(p for p in (why, done.stderr, read("output")) if p))
        status, begun, ended = int(said[0]), float(said[1]), float(said[2])
        left = tuple(read("left").splitlines())
        return Ran(status, ended - begun, read("output"), left, tuple(read("tmp").split()))


def setup(
    image: Path,
    variant: str,
    command: Sequence[str],
    workdir: str = "/",
    student: str = USER,
    timeout: float = 600,
) -> Ran:
    """The platform's build, once, in the image itself (what it writes stays)."""
    return _phase(variant, image, "setup", command, workdir, student, timeout)


def run(
    image: Path,
    variant: str,
    command: Sequence[str],
    place: Callable[[Path], None],
    collect: Callable[[Path], None],
    workdir: str = "/",
    student: str = USER,
    timeout: float = 900,
) -> Ran:
    """One grading job in a throwaway copy of the image: place(root) puts the submission where
    the platform does, before; collect(root) reads what the job left, after (the copy is then
    removed)."""
    with tempfile.TemporaryDirectory(prefix="xfmr-job-") as folder:
        fresh = Path(folder) / "image"
        subprocess.run(["cp", "-a", str(image), str(fresh)], check=True)
        place(fresh / "root")
        ran = _phase(variant, fresh, "run", command, workdir, student, timeout)
        collect(fresh / "root")
        return ran
