"""The sandbox every untrusted run goes through: bubblewrap, with nothing of the grader inside.

One sandbox per worker (a submission's, or a student suite's on one subject), each a fresh
interpreter started by `bwrap` in new user, pid, mount, network, ipc, uts and cgroup namespaces:

- uid 65534 inside, no capabilities, no new user namespaces, its own session;
- its own /proc, so it sees only its own processes: no grader, no classmate, no argv of either;
- no network (only a loopback of its own);
- a read-only view of exactly what it needs: the system's /usr, the interpreter, the Python
  paths it imports from (the project's packages masked if they are installed there), the worker's
  own code (harness/isolation/child, harness/wire.py, two empty __init__.py) and, at /sandbox,
  a private copy of its input (the submission, or a subject and a student's suite);
- a private tmpfs of TMP_MB as /tmp, its working directory and HOME;
- killed with everything it started when the parent kills it or dies (--die-with-parent: its
  pid namespace ends with its first process, and with it every process inside).

The worker then sets its own rlimits (harness.isolation.child.confine) before any subject code.
If any of this cannot be set up, `check()` raises SandboxUnavailable: grading refuses rather
than run untrusted code without it (see --unsafe-no-sandbox).
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import sysconfig
import tempfile
import threading
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from harness.isolation import container, warm
from harness.isolation.forkserver import forked
from harness.isolation.worker import Process, Start, kill_group

PROJECT_ROOT = Path(__file__).resolve().parents[2]
# The project's top-level packages: masked wherever the interpreter's paths hold them.
PROJECT_PACKAGES = ("impl", "oracle", "harness", "mutants", "tasks", "demos")
# What the worker may import of the project: its own package and the wire format.
CHILD_FILES = ("harness/__init__.py", "harness/wire.py", "harness/isolation/__init__.py")
CHILD_PACKAGE = "harness/isolation/child"
LIB = "/xfmr"  # where the worker's own code is mounted inside
INPUT = "/sandbox"  # where the run's private input is mounted inside
UID = GID = 65534  # nobody, inside the sandbox's user namespace
# From /etc, only what Python and pytest read (user names, time zone, the loader's cache).
ETC = ("passwd", "group", "nsswitch.conf", "localtime", "ld.so.cache", "hosts")


class SandboxUnavailable(RuntimeError):
    """The sandbox cannot be set up on this machine; nothing untrusted may run."""


class UnsafeInput(ValueError):
    """An input that cannot be staged for a sandbox (a link, a special file)."""


@dataclass(frozen=True)
class Limits:
    """What one worker may use. Wall time is per test and lives on the tests."""

    # A worker peaks at ~0.7 GiB of address space over the whole shared suite, learning run
    # included (measured: VmPeak 681 MB); 2 GiB leaves room and stops a memory bomb after
    # touching at most ~1.3 GiB, seconds of page faults even on a loaded machine.
    memory_mb: int = 2048
    # Largest file the worker may write (save_transformer of a tiny model is kilobytes).
    file_mb: int = 64
    # The private /tmp: a tmpfs is memory, which RLIMIT_AS does not count.
    tmp_mb: int = 256
    # Processes and threads of the sandbox's user: torch's pool plus a few, never a fork bomb
    # (counted per user namespace, so only the sandbox's own processes count).
    processes: int = 256

    def __post_init__(self) -> None:
        for name in ("memory_mb", "file_mb", "tmp_mb", "processes"):
            if getattr(self, name) <= 0:
                raise ValueError(f"{name} must be positive, got {getattr(self, name)}")

    def rlimits(self) -> dict[str, tuple[int, int]]:
        """The limits as setrlimit arguments (soft = hard: the subject cannot raise them)."""
        mb = 1 << 20
        return {
            "RLIMIT_AS": (self.memory_mb * mb, self.memory_mb * mb),
            "RLIMIT_FSIZE": (self.file_mb * mb, self.file_mb * mb),
            "RLIMIT_NPROC": (self.processes, self.processes),
            "RLIMIT_CORE": (0, 0),  # a segfault leaves no core file behind
        }

    def confine(self) -> dict:
        """The worker's own confinement request (harness.isolation.child.confine)."""
        return {
            "rlimits": {k: list(v) for k, v in self.rlimits().items()},
            "dir": "/tmp",
            "protected": list(PROJECT_PACKAGES),
        }


DEFAULT_LIMITS = Limits()


# --- what the sandbox sees ----------------------------------------------------------------------


def _python_paths() -> list[str]:
    """The interpreter's import paths: stdlib, lib-dynload and site-packages (never '' or the
    project, and no .pth file runs: the worker starts with -I -S and sets sys.path itself)."""
    paths = sysconfig.get_paths()
    found = [paths["stdlib"], os.path.join(paths["stdlib"], "lib-dynload")]
    found += [paths["platstdlib"], paths["purelib"], paths["platlib"]]
    unique = []
    for p in found:
        if os.path.isdir(p) and p not in unique:
            unique.append(p)
    return unique


def _interpreter() -> str:
    return os.path.realpath(sys.executable)


def _inside(path: str | Path, folder: str | Path) -> bool:
    return Path(path).resolve().is_relative_to(Path(folder).resolve())


def mounts() -> list[str]:
    """bwrap's arguments for the read-only view (not the input), refusing any view that would
    show the project (a folder holding the project root is never mounted) or the warm fork
    server's socket (harness.isolation.warm), which runs trusted code outside any sandbox."""
    args: list[str] = []
    for top in ("/usr", "/bin", "/sbin", "/lib", "/lib32", "/lib64"):
        if os.path.islink(top):
            args += ["--symlink", os.readlink(top), top]
        elif os.path.isdir(top):
            args += ["--ro-bind", top, top]
    for name in ETC:
        args += ["--ro-bind-try", f"/etc/{name}", f"/etc/{name}"]
    python = _interpreter()
    folders = [str(Path(python).parent.parent), *_python_paths()]
    runtime = warm.runtime_folder()
    for folder in ("/usr", "/bin", "/sbin", "/lib", "/lib32", "/lib64", *folders):
        if _inside(runtime, folder):
            raise SandboxUnavailable(
                f"the warm fork server's folder {runtime} lies in {folder}, which the sandbox "
                "shows: its socket runs trusted code outside the sandbox; set XFMR_RUNTIME_DIR "
                "elsewhere"
            )
    for folder in folders:
        if _inside(PROJECT_ROOT, folder):
            raise SandboxUnavailable(
                f"the interpreter's folder {folder} holds the project ({PROJECT_ROOT}): a "
                "sandbox would see the grader's source; install the project elsewhere"
            )
        args += ["--ro-bind", folder, folder]
        for package in PROJECT_PACKAGES:  # a non-editable install of this project
            if os.path.isdir(os.path.join(folder, package)):
                args += ["--tmpfs", os.path.join(folder, package)]
    for rel in CHILD_FILES:
        args += ["--ro-bind", str(PROJECT_ROOT / rel), f"{LIB}/{rel}"]
    args += ["--ro-bind", str(PROJECT_ROOT / CHILD_PACKAGE), f"{LIB}/{CHILD_PACKAGE}"]
    return args


def command(stage: Path, limits: Limits, code: str, *argv: str) -> list[str]:
    """The bwrap command line running `python -c code argv...` on `stage` as /sandbox."""
    bwrap = shutil.which("bwrap")
    if bwrap is None:
        raise SandboxUnavailable(
            "bubblewrap (bwrap) is not installed: apt-get install -y bubblewrap"
        )
    env = {
        "PATH": "/usr/bin:/bin",
        "HOME": "/tmp",
        "TMPDIR": "/tmp",
        "LANG": "C.UTF-8",
        "OMP_NUM_THREADS": "1",
        "MKL_NUM_THREADS": "1",
    }
    args = [
        bwrap,
        "--unshare-all",
        "--unshare-user",
        "--disable-userns",
        "--die-with-parent",
        "--new-session",
    ]
    args += ["--cap-drop", "ALL", "--uid", str(UID), "--gid", str(GID)]
    args += ["--hostname", "sandbox", "--clearenv"]
    for key, value in env.items():
        args += ["--setenv", key, value]
    # /tmp first: the read-only views below may lie under /tmp (a virtualenv in a CI checkout
    # there) and must be mounted on top of the private tmpfs, not hidden by it
    args += ["--size", str(limits.tmp_mb << 20), "--tmpfs", "/tmp"]
    args += mounts()
    args += ["--ro-bind", str(stage), INPUT]
    args += ["--proc", "/proc", "--dev", "/dev"]
    # the sandbox's own root (where the mount points were made) read-only too
    args += ["--chdir", "/tmp", "--remount-ro", "/"]
    # -I: no environment, no user site, no script folder; -S: no site (no .pth file runs);
    # -B: nothing written next to the sources
    boot = f"import sys; sys.path[:0] = {[LIB, *_python_paths()]!r}\n{code}"
    return [*args, "--", _interpreter(), "-I", "-S", "-B", "-c", boot, *argv]


# --- staging an input ---------------------------------------------------------------------------


@contextmanager
def staged(files: Mapping[str, Path] = {}, texts: Mapping[str, str] = {}) -> Iterator[Path]:  # noqa: B006
    """A private folder (mode 700) holding copies of `files` and the `texts`, removed after.

    A link or a special file anywhere in an input is refused (UnsafeInput): a copy that follows
    links could bring the grader's own files in, and a `loop -> .` link never ends."""
    stage = Path(tempfile.mkdtemp(prefix="xfmr-stage-"))
    try:
        for name, source in files.items():
            _copy(Path(source), stage / name)
        for name, text in texts.items():
            (stage / name).write_text(text)
        yield stage
    finally:
        shutil.rmtree(stage, ignore_errors=True)


def _copy(source: Path, target: Path) -> None:
    if source.is_symlink():
        raise UnsafeInput(f"{source.name} is a symbolic link; submissions may hold none")
    if source.is_file():
        shutil.copyfile(source, target)
        return
    if not source.is_dir():
        raise UnsafeInput(f"{source.name} is neither a file nor a folder")
    target.mkdir()
    for entry in sorted(os.scandir(source), key=lambda e: e.name):
        if entry.name == "__pycache__":
            continue
        _copy(Path(entry.path), target / entry.name)


# --- running one -----------------------------------------------------------------------------


class _Sandboxed:
    """A worker in its sandbox, as the parent holds it: the bwrap process."""

    def __init__(self, proc: subprocess.Popen) -> None:
        self.proc, self.pid = proc, proc.pid

    def wait(self, timeout: float) -> int | None:
        try:
            code = self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            return None
        # bwrap reports a worker killed by signal N as status 128 + N
        if code > 128 and code - 128 in {s.value for s in signal.Signals}:
            return -(code - 128)
        return code

    def kill(self) -> None:
        # bwrap leads its own process group; its death ends the sandbox's pid namespace
        kill_group(self.pid, reaped=self.proc.returncode is not None)

    def release(self) -> None:
        pass


SERVE = "from harness.isolation.child import serve\nserve.serve(int(sys.argv[1]), int(sys.argv[2]))"


def sandboxed(stage: Path, limits: Limits = DEFAULT_LIMITS) -> Start:
    """A `Start` for an untrusted worker: a fresh sandbox with `stage` as /sandbox."""
    check()

    def start(request_fd: int, reply_fd: int, log_fd: int) -> Process:
        proc = subprocess.Popen(
            command(stage, limits, SERVE, str(request_fd), str(reply_fd)),
            pass_fds=(request_fd, reply_fd),
            stdin=subprocess.DEVNULL,
            stdout=log_fd,
            stderr=subprocess.STDOUT,
            start_new_session=True,
            cwd="/",
            env={},
        )
        return _Sandboxed(proc)

    return start


SANDBOX_TIER, CONTAINER_TIER = "sandbox", "container"  # --isolation's choices
TIERS = (SANDBOX_TIER, CONTAINER_TIER)


def _container_code() -> container.Code:
    """What a container-tier worker runs: this interpreter and the worker's own files."""
    files = {rel: PROJECT_ROOT / rel for rel in (*CHILD_FILES, CHILD_PACKAGE)}
    return container.Code(_interpreter(), tuple(_python_paths()), files, PROJECT_PACKAGES)


def starter(
    stage: Path, limits: Limits, unsafe: bool = False, isolation: str = SANDBOX_TIER
) -> tuple[Start, Path]:
    """How an untrusted run's workers start on its staged input, and where they find it: in a
    sandbox of their own at /sandbox; in the container tier (chosen, never a fallback) as the
    dedicated user, at the stage itself (harness.isolation.container); or, unsafe, forked from
    the trusted fork server (rlimits only), at the stage itself."""
    if unsafe:
        return forked, stage
    if isolation == CONTAINER_TIER:
        return container.contained(stage, _container_code()), stage
    if isolation != SANDBOX_TIER:
        raise ValueError(f"isolation is one of {TIERS}, not {isolation!r}")
    return sandboxed(stage, limits), Path(INPUT)


def tier_check(isolation: str, hidden: Sequence[Path] = ()) -> None:
    """Raise SandboxUnavailable / container.ContainerUnavailable unless the chosen tier can be
    set up here (`hidden`: folders the container tier must show to be out of the user's reach,
    the reports' folders)."""
    if isolation == CONTAINER_TIER:
        container.check(_container_code(), hidden)
    else:
        check()


# What check() runs inside a trial sandbox: each line a property the sandbox must have.
_PROBE = """
import os, socket
import numpy, harness.wire  # the worker's imports resolve (its paths are all mounted)
assert os.getuid() == 65534 and os.getgid() == 65534, ("uid", os.getuid())
caps = [l for l in open("/proc/self/status") if l.startswith("CapEff")][0].split()[1]
assert int(caps, 16) == 0, ("capabilities", caps)
assert sorted(p for p in os.listdir("/proc") if p.isdigit()) <= ["1", "2", "3"], "pid namespace"
for name in ("impl", "oracle", "mutants", "tasks", ".git", "examples", "CONTRACT.md"):
    assert not os.path.exists(os.path.join(sys.argv[1], name)), ("the project is visible", name)
assert sorted(os.listdir("/sys/class/net") if os.path.isdir("/sys/class/net") else []) in (
    [], ["lo"]), "network"
try:
    socket.create_connection(("1.1.1.1", 53), timeout=1)
    raise AssertionError("network reachable")
except OSError:
    pass
open("/tmp/probe", "w").write("ok")
for p in ("/usr/probe", "/sandbox/probe", "/probe", "/etc/probe"):
    try:
        open(p, "w")
        raise AssertionError(("writable", p))
    except OSError:
        pass
print("sandbox ok")
"""

_CHECKED: str | None = None
_CHECK_LOCK = threading.Lock()


def check() -> None:
    """Raise SandboxUnavailable unless a trial sandbox shows every property above (run once per
    process; a few hundred milliseconds)."""
    global _CHECKED
    with _CHECK_LOCK:
        if _CHECKED == "ok":
            return
        with staged() as stage:
            cmd = command(stage, DEFAULT_LIMITS, _PROBE, str(PROJECT_ROOT))
            try:
                done = subprocess.run(cmd, capture_output=True, text=True, timeout=60, env={})
            except (OSError, subprocess.TimeoutExpired) as e:
                raise SandboxUnavailable(f"bwrap did not run: {e}") from None
        if done.returncode != 0 or "sandbox ok" not in done.stdout:
            why = (done.stderr.strip().splitlines() or ["no output"])[-1]
            raise SandboxUnavailable(f"the trial sandbox failed (status {done.returncode}): {why}")
        _CHECKED = "ok"
