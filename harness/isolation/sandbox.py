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
  pid namespace ends with its first process, and with it every process inside);
- a seccomp filter (harness.isolation.seccomp): keyrings, ptrace, bpf, perf, mounts, new
  namespaces, modules, kexec, clocks, io_uring and the rest of Docker's default denials fail
  with EPERM;
- neutral paths: the interpreter's installation at PYTHON_HOME, each import folder outside it
  at SITE + a number, the worker's code at LIB, the input at INPUT; the worker's output goes to
  a memfd (harness.isolation.worker). sys.path, sys.executable, __file__, /proc/self/maps and
  readlink of every descriptor name none of the grader's folders.

What /proc/self/mountinfo shows. Its fourth field is each mount's source as a path inside the
source's file system, which no bind mount can rename. So nothing is bound from the project or
the virtualenv: site-packages is a tree of hard links (the same files, no copy) built once per
state of site-packages under a neutral cache folder on the same file system (NEUTRAL_PLACES:
/var/tmp/xfmr-neutral-UID/site-HASH), without the editable install's finder and .pth files,
direct_url.json, the project's own packages and .dist-info; the worker's code is a copy there
(lib-HASH).
Hidden only where such a cache can be made: if no neutral place lies on site-packages' file
system (or hard links are refused), site-packages is bound in place, its masked files covered
by /dev/null, and mountinfo names its folder (`neutral_problem()` says why).
What stays: mountinfo names the interpreter's installation (/root/.pyenv/versions/X or /usr:
not the project's, the virtualenv's or the log's), the stage (/tmp/xfmr-stage-*) and the cache.
And the bytes of the .pyc files that pip compiled in site-packages hold the path they were
compiled at (co_filename, the virtualenv's site-packages): Python rewrites it on import, but a
submission that reads a .pyc as data finds it. Hiding that would need every .pyc recompiled
for the neutral path (16 000 files of torch and its kin, minutes of CPU per install).

The worker then sets its own rlimits (harness.isolation.child.confine) before any subject code.
If any of this cannot be set up, `check()` raises SandboxUnavailable: grading refuses rather
than run untrusted code without it (see --unsafe-no-sandbox).
"""

from __future__ import annotations

import functools
import os
import shutil
import signal
import subprocess
import sys
import sysconfig
import threading
from dataclasses import dataclass
from pathlib import Path

from harness.isolation import cgroups, neutral, seccomp, warm
from harness.isolation.limits import DEFAULT_LIMITS, PROJECT_PACKAGES, Limits
from harness.isolation.staging import UnsafeInput as UnsafeInput  # re-exported
from harness.isolation.staging import staged as staged  # re-exported
from harness.isolation.worker import Process, Start, kill_group

PROJECT_ROOT = Path(__file__).resolve().parents[2]
PROJECT_DIST = "xfmr_oracle"  # the project's distribution, as its .dist-info folder is named
# What the worker may import of the project: its own package and the wire format.
CHILD_FILES = ("harness/__init__.py", "harness/wire.py", "harness/isolation/__init__.py")
CHILD_PACKAGE = "harness/isolation/child"
OPT = "/opt/xfmr"  # everything of the grader's a sandbox sees, at fixed neutral paths
PYTHON_HOME = f"{OPT}/python"  # the interpreter's installation (unless it is the system's /usr)
SITE = f"{OPT}/site"  # each import folder outside it: SITE0, SITE1, ...
LIB = f"{OPT}/lib"  # where the worker's own code is mounted inside
# Where the neutral cache (hard-link trees of site-packages, a copy of the worker's code) may
# live: the first of these on site-packages' file system, outside the project.
NEUTRAL_PLACES = ("/var/tmp", "/tmp")
INPUT = "/sandbox"  # where the run's private input is mounted inside
PROC_MASKED = ("keys", "key-users", "timer_list", "sched_debug", "latency_stats", "kcore")
UID = GID = 65534  # nobody, inside the sandbox's user namespace
# From /etc, only what Python and pytest read (user names, time zone, the loader's cache).
ETC = ("passwd", "group", "nsswitch.conf", "localtime", "ld.so.cache", "hosts")


class SandboxUnavailable(RuntimeError):
    """The sandbox cannot be set up on this machine; nothing untrusted may run."""


# --- what the sandbox sees ----------------------------------------------------------------------


def python_paths() -> list[str]:
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


def interpreter() -> str:
    """This interpreter's real path: what every untrusted worker runs, in either tier."""
    return os.path.realpath(sys.executable)


def _inside(path: str | Path, folder: str | Path) -> bool:
    return Path(path).resolve().is_relative_to(Path(folder).resolve())


def _import_paths() -> list[str]:
    """The folders a worker imports from: stdlib, lib-dynload, purelib, platlib (platstdlib is
    the stdlib's, or in a virtualenv the folder that only holds site-packages)."""
    paths = sysconfig.get_paths()
    found = [paths["stdlib"], os.path.join(paths["stdlib"], "lib-dynload")]
    found += [paths["purelib"], paths["platlib"]]
    unique: list[str] = []
    for p in found:
        if os.path.isdir(p) and p not in unique:
            unique.append(p)
    return unique


def _masked(rel: str) -> bool:
    """Files of an import folder (relative path) a sandbox must not see: they name the project
    (the editable install's finder, compiled or not, and .pth files, an .egg-link,
    direct_url.json) or are the project itself (a non-editable install of its packages, its
    .dist-info with its entry points)."""
    top, _, rest = rel.partition("/")
    if top == "__pycache__":  # the finder's compiled copy names the project too
        return rest.startswith("__editable__")
    if not rest:
        return (
            top.startswith("__editable__")
            or top.endswith((".pth", ".egg-link"))
            or (top in PROJECT_PACKAGES)
            or top.startswith(f"{PROJECT_DIST}-")  # its metadata and entry points
        )
    return top.endswith(".dist-info") and rest == "direct_url.json"


_tree = neutral.tree


def _linked(source: str) -> Path:
    """A tree of hard links to `source` without its masked files, in the neutral cache
    (harness.isolation.neutral). OSError if none can be."""
    return neutral.linked(source, _masked, PROJECT_ROOT, NEUTRAL_PLACES)


def _worker_code() -> Path:
    """A copy of the worker's own code (CHILD_FILES, CHILD_PACKAGE) in the neutral cache, by
    content; OSError if there is no cache."""
    files = [rel for rel in CHILD_FILES]
    package = PROJECT_ROOT / CHILD_PACKAGE
    skip = lambda rel: "__pycache__" in rel.split("/")  # noqa: E731
    files += [f"{CHILD_PACKAGE}/{rel}" for rel, kind, _ in _tree(str(package), skip) if kind == "f"]
    return neutral.code_copy(PROJECT_ROOT, files, NEUTRAL_PLACES)


@dataclass(frozen=True)
class View:
    """What a sandbox sees of the grader's installation, host paths mapped to neutral ones."""

    binds: tuple[tuple[str, str], ...]  # (host source, path inside), read-only, in order
    files_masked: tuple[str, ...]  # inside: covered by /dev/null
    folders_masked: tuple[str, ...]  # inside: covered by an empty tmpfs
    interpreter: str  # inside
    paths: tuple[str, ...]  # sys.path inside, the worker's code first
    env: tuple[tuple[str, str], ...]  # LD_LIBRARY_PATH where the interpreter moved
    problem: str  # why some host path of the project still shows in mountinfo ("" if none)


@functools.lru_cache(maxsize=1)
def view() -> View:
    """The neutral view, worked out once per process (a walk of site-packages, ~0.4 s; the
    first time on a machine also its hard-link tree, a few seconds)."""
    python = interpreter()
    home = str(Path(python).parent.parent)
    system = any(_inside(home, top) for top in ("/usr", "/bin", "/lib"))
    binds: list[tuple[str, str]] = []
    files_masked: list[str] = []
    folders_masked: list[str] = []
    problems: list[str] = []

    def inside(host: str) -> str:
        return str(PYTHON_HOME / Path(host).relative_to(home)) if not system else host

    if not system:
        binds.append((home, PYTHON_HOME))
    paths: list[str] = []
    for folder in _import_paths():
        if _inside(folder, home):
            where = inside(folder)
            shown = folder
        else:
            where = f"{SITE}{sum(w.startswith(SITE) for w in paths)}"
            try:
                shown = str(_linked(folder))
            except OSError as e:
                shown = folder
                problems.append(f"{folder} is bound in place ({e})")
            binds.append((shown, where))
        paths.append(where)
        if shown == folder:  # not a hard-link tree: mask in place
            for rel, kind, _ in _tree(folder, lambda rel: rel.count("/") > 1):
                if _masked(rel):
                    (folders_masked if kind == "d" else files_masked).append(f"{where}/{rel}")
    try:
        lib = str(_worker_code())
        binds.append((lib, LIB))
    except OSError as e:
        problems.append(f"the worker's code is bound from the project ({e})")
        for rel in (*CHILD_FILES, CHILD_PACKAGE):
            binds.append((str(PROJECT_ROOT / rel), f"{LIB}/{rel}"))
    env = []
    if not system and os.path.isdir(os.path.join(home, "lib")):
        env.append(("LD_LIBRARY_PATH", f"{PYTHON_HOME}/lib"))  # its libpython's RUNPATH moved
    return View(
        binds=tuple(binds),
        files_masked=tuple(files_masked),
        folders_masked=tuple(folders_masked),
        interpreter=str(Path(inside(python))) if not system else python,
        paths=(LIB, *paths),
        env=tuple(env),
        problem="; ".join(problems),
    )


def neutral_problem() -> str:
    """Why a host path of the project or the virtualenv still shows in a sandbox's mountinfo
    ("" when none does)."""
    return view().problem


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
    python = interpreter()
    folders = [str(Path(python).parent.parent), *_import_paths()]
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
    seen = view()
    for source, where in seen.binds:
        args += ["--ro-bind", source, where]
    for where in seen.folders_masked:
        args += ["--tmpfs", where]
    for where in seen.files_masked:
        args += ["--ro-bind", "/dev/null", where]
    return args


def command(
    stage: Path, limits: Limits, code: str, *argv: str, seccomp_fd: int | None = None
) -> list[str]:
    """The bwrap command line running `python -c code argv...` on `stage` as /sandbox, under the
    seccomp program bwrap reads from `seccomp_fd` (harness.isolation.seccomp.descriptor())."""
    bwrap = shutil.which("bwrap")
    if bwrap is None:
        raise SandboxUnavailable(
            "bubblewrap (bwrap) is not installed: apt-get install -y bubblewrap"
        )
    seen = view()
    env = {
        "PATH": "/usr/bin:/bin",
        "HOME": "/tmp",
        "TMPDIR": "/tmp",
        "LANG": "C.UTF-8",
        "OMP_NUM_THREADS": "1",
        "MKL_NUM_THREADS": "1",
        **dict(seen.env),
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
    if seccomp_fd is not None:
        args += ["--seccomp", str(seccomp_fd)]
    # /tmp first: nothing else is mounted under it now, but a view must never be hidden by it
    args += ["--size", str(limits.tmp_mb << 20), "--tmpfs", "/tmp"]
    args += mounts()
    args += ["--ro-bind", str(stage), INPUT]
    args += ["--proc", "/proc", "--dev", "/dev", "--remount-ro", "/dev"]
    # /dev is a tmpfs without a size (read-only now); /dev/shm a tmpfs of shm_mb, anyone's
    args += ["--perms", "1777", "--size", str(limits.shm_mb << 20), "--tmpfs", "/dev/shm"]
    # the kernel-wide files of /proc Docker masks too: keyrings' descriptions, timers, debug
    for name in PROC_MASKED:
        if os.path.exists(f"/proc/{name}"):
            args += ["--ro-bind", "/dev/null", f"/proc/{name}"]
    # the sandbox's own root (where the mount points were made) read-only too
    args += ["--chdir", "/tmp", "--remount-ro", "/"]
    # -I: no environment, no user site, no script folder; -S: no site (no .pth file runs);
    # -B: nothing written next to the sources
    boot = f"import sys; sys.path[:0] = {list(seen.paths)!r}\n{code}"
    return [*args, "--", seen.interpreter, "-I", "-S", "-B", "-c", boot, *argv]


# --- running one -----------------------------------------------------------------------------


class _Sandboxed:
    """A worker in its sandbox, as the parent holds it: the bwrap process, and its cgroup."""

    def __init__(self, proc: subprocess.Popen, accounted: cgroups.Accounted) -> None:
        self.proc, self.pid, self.accounted = proc, proc.pid, accounted

    def wait(self, timeout: float) -> int | None:
        try:
            code = self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            return None
        self.accounted.exited(code)
        # bwrap reports a worker killed by signal N as status 128 + N
        if code > 128 and code - 128 in {s.value for s in signal.Signals}:
            return -(code - 128)
        return code

    def kill(self) -> None:
        # bwrap leads its own process group; its death ends the sandbox's pid namespace
        kill_group(self.pid, reaped=self.proc.returncode is not None)

    def release(self) -> None:
        self.accounted.release()


def _seccomp_descriptor() -> int:
    try:
        return seccomp.descriptor(deny_memfd=bool(cgroups.problem()))
    except seccomp.SeccompUnavailable as e:
        raise SandboxUnavailable(str(e)) from None


SERVE = "from harness.isolation.child import serve\nserve.serve(int(sys.argv[1]), int(sys.argv[2]))"


def sandboxed(stage: Path, limits: Limits = DEFAULT_LIMITS) -> Start:
    """A `Start` for an untrusted worker: a fresh sandbox with `stage` as /sandbox."""
    check()

    def start(request_fd: int, reply_fd: int, log_fd: int) -> Process:
        group = worker_group(limits.ram_mb, limits.processes)
        rules = _seccomp_descriptor()
        try:
            argv = command(stage, limits, SERVE, str(request_fd), str(reply_fd), seccomp_fd=rules)
            proc = subprocess.Popen(
                group.wrap(argv) if group else argv,
                pass_fds=(request_fd, reply_fd, rules),
                stdin=subprocess.DEVNULL,
                stdout=log_fd,
                stderr=subprocess.STDOUT,
                start_new_session=True,
                cwd="/",
                env={},
            )
        except BaseException:
            if group:
                group.remove()
            raise
        finally:
            os.close(rules)
        return _Sandboxed(proc, cgroups.Accounted(group, log_fd))

    return start


def worker_group(ram_mb: int, processes: int) -> cgroups.Cgroup | None:
    """A fresh cgroup with these limits for one worker; None where none can be made here
    (`limits_problem` says so in every report). SandboxUnavailable if one could be made when
    the run began but not now."""
    if cgroups.problem():
        return None
    try:
        return cgroups.create(ram_mb << 20, processes)
    except cgroups.CgroupUnavailable as e:
        raise SandboxUnavailable(f"no cgroup for a worker: {e.strerror or e}") from None


# What check() runs inside a trial sandbox: each line a property the sandbox must have.
_PROBE = """
import ctypes, errno, os, socket
# the seccomp filter holds: keyctl(KEYCTL_GET_KEYRING_ID, session keyring) fails with EPERM
libc = ctypes.CDLL(None, use_errno=True)
got = libc.syscall(int(sys.argv[2]), 0, -3, 0)
if got != -1 or ctypes.get_errno() != errno.EPERM:
    print(f"SECCOMP keyctl returned {got} (errno {ctypes.get_errno()}), not EPERM", flush=True)
    raise SystemExit(3)
import numpy, harness.wire  # the worker's imports resolve (its paths are all mounted)
assert not any(p.startswith(sys.argv[1]) for p in [sys.executable, *sys.path]), "host paths"
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
for p in ("/usr/probe", "/sandbox/probe", "/probe", "/etc/probe", "/dev/probe"):
    try:
        open(p, "w")
        raise AssertionError(("writable", p))
    except OSError:
        pass
shm = os.statvfs("/dev/shm")
assert shm.f_blocks * shm.f_frsize <= int(sys.argv[4]), ("/dev/shm unbounded", shm.f_blocks)
open("/dev/shm/probe", "w").write("ok")  # writable: Python's semaphores live there
if sys.argv[3] == "cgroup":  # memfd pages count against the cgroup: past it, the kernel kills
    print("sandbox ok", flush=True)
    fd, chunk = os.memfd_create("probe"), b"1" * (16 << 20)
    for _ in range(64):
        os.write(fd, chunk)
    print("MEMFD 1 GiB held: the cgroup's memory limit does not hold", flush=True)
    raise SystemExit(4)
try:
    os.memfd_create("probe")
    raise AssertionError("memfd_create allowed without a cgroup")
except OSError as e:
    assert e.errno == errno.EPERM, ("memfd_create", e)
print("sandbox ok")
"""
# The trial's cgroup: the probe (an interpreter and numpy, ~60 MiB) fits, its memfd does not.
TRIAL_RAM_MB = 256

_CHECKED: str | None = None
_CHECK_LOCK = threading.Lock()


def check() -> None:
    """Raise SandboxUnavailable unless a trial sandbox shows every property above (run once per
    process; a few hundred milliseconds)."""
    global _CHECKED
    with _CHECK_LOCK:
        if _CHECKED == "ok":
            return
        group = worker_group(TRIAL_RAM_MB, DEFAULT_LIMITS.processes)
        rules = _seccomp_descriptor()
        try:
            with staged() as stage:
                keyctl = str(seccomp.number("keyctl"))
                mode, shm = "cgroup" if group else "none", str(DEFAULT_LIMITS.shm_mb << 20)
                cmd = command(
                    stage,
                    DEFAULT_LIMITS,
                    _PROBE,
                    str(PROJECT_ROOT),
                    keyctl,
                    mode,
                    shm,
                    seccomp_fd=rules,
                )
                done = subprocess.run(
                    group.wrap(cmd) if group else cmd,
                    capture_output=True,
                    text=True,
                    timeout=60,
                    env={},
                    pass_fds=(rules,),
                )
            killed = bool(group and group.oom_kills())
        except (OSError, subprocess.TimeoutExpired) as e:
            raise SandboxUnavailable(f"bwrap did not run: {e}") from None
        finally:
            os.close(rules)
            if group and not group.remove():
                raise SandboxUnavailable(f"the trial's cgroup {group.memory} cannot be removed")
        if "SECCOMP" in done.stdout:
            said = done.stdout.split("SECCOMP", 1)[1].strip().splitlines()[0]
            raise SandboxUnavailable(
                f"the seccomp filter does not hold in the trial sandbox ({said}): bwrap did not "
                "load it; a sandbox without it would share the grader's keyrings"
            )
        if group and "sandbox ok" in done.stdout and not killed:
            said = (done.stdout.strip().splitlines() or ["no output"])[-1]
            raise SandboxUnavailable(
                f"the cgroup's memory limit does not hold in the trial sandbox ({said}; status "
                f"{done.returncode}): a worker could fill the host's memory with memfd or tmpfs"
            )
        ok = done.returncode == (128 + signal.SIGKILL if group else 0)
        if not ok or "sandbox ok" not in done.stdout:
            why = (done.stderr.strip().splitlines() or ["no output"])[-1]
            raise SandboxUnavailable(f"the trial sandbox failed (status {done.returncode}): {why}")
        _CHECKED = "ok"
