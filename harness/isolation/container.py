"""The container tier: untrusted workers as a dedicated unprivileged user, for containers where
bubblewrap cannot start (Docker's defaults: a masked /proc, no nested user namespaces; Gradescope's
autograder containers). Chosen explicitly (`xfmr grade --isolation container`; the Gradescope
autograder passes what its setup.sh proved works), never as a silent fallback of the sandbox.

What it gives, per worker:

- the worker runs as USER, a user created at setup with no password, no login shell and no
  groups (uid and gid not 0); the parent, root, switches to it before any subject code: the
  capability bounding set emptied, no supplementary groups, real, effective and saved uid and
  gid all the user's, then no_new_privs (no setuid binary gives anything back);
- its own HOME and TMPDIR: a fresh folder of its own (0700), which is also its working
  directory, removed when the worker ends;
- the worker's own code is a root-owned read-only copy of harness/isolation/child and
  harness/wire.py; its input (the staged submission) is root-owned and read-only to it;
- the reference, the oracle, the project's source and the report folders must be unreadable and
  unwritable to USER: check() proves it in a trial worker before anything untrusted runs (the
  autograder's setup.sh makes them so: /autograder is 0700);
- the worker sets its rlimits itself (harness.isolation.child.confine), as in the sandbox;
  RLIMIT_NPROC counts every process of USER;
- killing a worker kills every process of USER from root, until /proc shows none running
  (sweep(): SIGKILL to each, which reaches a stopped process too, and kill(-1) from a helper no
  process of USER can stop or signal, atomic against fork): a setsid daemon is gone before any
  report is written (grade() sweeps once more at its end); a sweep never raises, and what
  survives it is said in the grade's report.

- where the container lets root make cgroups, each worker runs in one of its own
  (harness.isolation.cgroups: memory of every kind and processes); where it does not, every
  report says so (harness.isolation.tiers: Tier.limits_problem).

What it cannot give (the sandbox tier gives the first two): the network is the container's
(the worker can reach whatever the container can); it sees the container's whole file system
as any unprivileged user does (world-readable files, the process list); and it shares the
kernel with the grader. One submission per container (Gradescope's model): two grades at once
would share USER and kill each other's workers.
"""

from __future__ import annotations

import atexit
import contextlib
import json
import os
import pwd
import shutil
import signal
import subprocess
import tempfile
import threading
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from harness.isolation import cgroups
from harness.isolation.worker import Process, Start, kill_group

USER = "xfmr-student"  # the dedicated user setup.sh creates
PROJECT_ROOT = Path(__file__).resolve().parents[2]


class ContainerUnavailable(RuntimeError):
    """The container tier cannot be set up here; nothing untrusted may run."""


@dataclass(frozen=True)
class Account:
    name: str
    uid: int
    gid: int


@dataclass(frozen=True)
class Code:
    """What a worker runs: the interpreter, its import paths, and the worker's own files
    (relative path inside the copy -> the file or folder in the project)."""

    interpreter: str
    python_paths: tuple[str, ...]
    files: Mapping[str, Path]
    protected_packages: tuple[str, ...]


def account(name: str = USER) -> Account:
    """The dedicated user, checked: it exists, is not root's, and this process can switch to it."""
    if os.geteuid() != 0:
        raise ContainerUnavailable(
            f"the container tier starts workers as the user {name!r} and must run as root "
            "(Gradescope's run_autograder does)"
        )
    try:
        entry = pwd.getpwnam(name)
    except KeyError:
        raise ContainerUnavailable(
            f"there is no user {name!r}: create it (the autograder's setup.sh does: useradd "
            f"--system --user-group --no-create-home --shell /usr/sbin/nologin {name})"
        ) from None
    if entry.pw_uid == 0 or entry.pw_gid == 0:
        raise ContainerUnavailable(f"the user {name!r} has uid or gid 0")
    return Account(name, entry.pw_uid, entry.pw_gid)


# --- the worker's start: root drops to the user, then the worker's own code --------------------

_DROP = r"""
import ctypes, os, sys
_uid, _gid, _home = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3]
del sys.argv[1:4]
_libc = ctypes.CDLL(None, use_errno=True)
for _cap in range(64):  # the bounding set emptied (needs CAP_SETPCAP, which root has)
    if _libc.prctl(24, _cap, 0, 0, 0) != 0:  # PR_CAPBSET_DROP
        if ctypes.get_errno() == 22:  # EINVAL: past the kernel's last capability
            break
        raise OSError(ctypes.get_errno(), "PR_CAPBSET_DROP")
os.setgroups([])
os.setresgid(_gid, _gid, _gid)
os.setresuid(_uid, _uid, _uid)  # permitted and effective capabilities go with it
# the inheritable set (and with it the ambient one) emptied too: capset, version 3, all zero
_header = (ctypes.c_uint32 * 2)(0x20080522, 0)
if _libc.capset(_header, (ctypes.c_uint32 * 6)()) != 0:
    raise OSError(ctypes.get_errno(), "capset")
if _libc.prctl(38, 1, 0, 0, 0) != 0:  # PR_SET_NO_NEW_PRIVS
    raise OSError(ctypes.get_errno(), "PR_SET_NO_NEW_PRIVS")
os.umask(0o077)
os.chdir(_home)
sys.path[:0] = PATHS
"""

# the worker's private folder is its HOME, not /tmp (which the container shares)
_SERVE = """
from harness.isolation.child import confine as _confine, serve
_inner = _confine.confine
_confine.confine = lambda spec: _inner({**spec, "dir": _home})
serve.serve(int(sys.argv[1]), int(sys.argv[2]))
"""


def command(code: Code, lib: Path, who: Account, home: Path, body: str, *argv: str) -> list[str]:
    """The command line running `body` as `who` in `home`, with the worker's code at `lib`."""
    boot = _DROP.replace("PATHS", repr([str(lib), *code.python_paths])) + body
    ids = (str(who.uid), str(who.gid), str(home))
    return [code.interpreter, "-I", "-S", "-B", "-c", boot, *ids, *argv]


def environment(home: Path) -> dict[str, str]:
    return {
        "PATH": "/usr/bin:/bin",
        "HOME": str(home),
        "TMPDIR": str(home),
        "LANG": "C.UTF-8",
        "OMP_NUM_THREADS": "1",
        "MKL_NUM_THREADS": "1",
    }


_LIB: dict[tuple, Path] = {}
_LIB_LOCK = threading.Lock()


def worker_code(code: Code) -> Path:
    """A root-owned, read-only copy of the worker's own code (once per process), so that the
    user needs to read nothing of the project."""
    key = tuple(sorted((k, str(v)) for k, v in code.files.items()))
    with _LIB_LOCK:
        if key in _LIB and _LIB[key].is_dir():
            return _LIB[key]
        lib = Path(tempfile.mkdtemp(prefix="xfmr-worker-code-"))
        atexit.register(shutil.rmtree, lib, True)
        for rel, source in code.files.items():
            target = lib / rel
            target.parent.mkdir(parents=True, exist_ok=True)
            if source.is_dir():
                shutil.copytree(source, target, ignore=shutil.ignore_patterns("__pycache__"))
            else:
                shutil.copyfile(source, target)
        readable(lib)
        _LIB[key] = lib
        return lib


def readable(folder: Path) -> None:
    """Make `folder` and everything in it readable (not writable) to every user: the root-owned
    views a worker reads (its code, its staged input)."""
    os.chmod(folder, 0o755)
    for parent, dirs, files in os.walk(folder):
        for d in dirs:
            os.chmod(os.path.join(parent, d), 0o755, follow_symlinks=False)
        for f in files:
            os.chmod(os.path.join(parent, f), 0o644, follow_symlinks=False)


def private_home(who: Account) -> Path:
    home = Path(tempfile.mkdtemp(prefix="xfmr-home-"))  # 0700, root's: then the user's
    os.chown(home, who.uid, who.gid)
    return home


class _Contained:
    """A worker running as the user: killing it kills every process of the user."""

    def __init__(
        self,
        proc: subprocess.Popen,
        who: Account,
        code: Code,
        home: Path,
        accounted: cgroups.Accounted,
    ) -> None:
        self.proc, self.pid = proc, proc.pid
        self.who, self.code, self.home = who, code, home
        self.accounted = accounted
        self.swept = ""  # what the last sweep could not kill ("" when nothing)

    def wait(self, timeout: float) -> int | None:
        try:
            code = self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            return None
        self.accounted.exited(code)
        return code

    def kill(self) -> None:
        """Never raises: what a sweep could not kill is said by the grade's final sweep
        (harness.jobs.grade), which meets it again."""
        kill_group(self.pid, reaped=self.proc.returncode is not None)
        self.swept = sweep(self.who, self.code.interpreter)

    def release(self) -> None:
        self.accounted.release()
        shutil.rmtree(self.home, ignore_errors=True)


SERVE = _SERVE


def group(ram_mb: int, processes: int) -> cgroups.Cgroup | None:
    """A cgroup of its own for one worker where the container lets the grader make one (None
    where it does not: the sandbox's limits_problem says so in every report)."""
    if cgroups.problem():
        return None
    try:
        return cgroups.create(ram_mb << 20, processes)
    except cgroups.CgroupUnavailable as e:
        raise ContainerUnavailable(f"no cgroup for a worker: {e.strerror or e}") from None


def contained(
    stage: Path, code: Code, ram_mb: int = 1024, processes: int = 256, user: str = USER
) -> Start:
    """A `Start` for an untrusted worker as `user`, reading `stage` (made read-only to it) where
    it lies, in a cgroup of its own (`ram_mb`, `processes`) where one can be made."""
    check(code, user=user)
    who = account(user)
    lib = worker_code(code)
    readable(stage)

    def start(request_fd: int, reply_fd: int, log_fd: int) -> Process:
        home = private_home(who)
        mine = None
        try:
            mine = group(ram_mb, processes)
            argv = command(code, lib, who, home, SERVE, str(request_fd), str(reply_fd))
            proc = subprocess.Popen(
                mine.wrap(argv) if mine else argv,
                pass_fds=(request_fd, reply_fd),
                stdin=subprocess.DEVNULL,
                stdout=log_fd,
                stderr=subprocess.STDOUT,
                start_new_session=True,
                cwd="/",
                env=environment(home),
            )
        except BaseException:
            if mine:
                mine.remove()
            shutil.rmtree(home, ignore_errors=True)
            raise
        return _Contained(proc, who, code, home, cgroups.Accounted(mine, log_fd))

    return start


# --- every process of the user, killed ---------------------------------------------------------


def running(uid: int) -> list[tuple[int, str]]:
    """The processes of `uid` (real or effective) that still run (zombies are dead: they only
    wait for their parent), as (pid, name)."""
    found = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        fields = _status(int(entry))
        uids = fields.get("Uid", "").split()[:2]
        state = fields.get("State", "").split()
        if str(uid) in uids and state[:1] != ["Z"]:
            found.append((int(entry), fields.get("Name", "").strip()))
    return found


def _status(pid: int) -> dict[str, str]:
    """/proc/PID/status as fields ({} if the process is gone)."""
    try:
        status = Path(f"/proc/{pid}/status").read_text()
    except OSError:  # gone meanwhile
        return {}
    return dict(line.split(":", 1) for line in status.splitlines() if ":" in line)


def _kill_if_theirs(pid: int, uid: int) -> None:
    """SIGKILL `pid` from root if it is still a process of `uid`: through a pidfd opened before
    the check, so a pid reused meanwhile by anyone else's process is never signalled."""
    try:
        fd = os.pidfd_open(pid)
    except OSError:  # gone, or a kernel without pidfds (before 5.3): the pid itself
        if str(uid) in _status(pid).get("Uid", "").split()[:2]:
            with contextlib.suppress(OSError):
                os.kill(pid, signal.SIGKILL)
        return
    try:
        if str(uid) in _status(pid).get("Uid", "").split()[:2]:
            with contextlib.suppress(OSError):
                signal.pidfd_send_signal(fd, signal.SIGKILL)
    finally:
        os.close(fd)


# kill(-1, SIGKILL) with the user's effective uid but a real and saved uid of nobody's (`bystander`,
# a uid no process runs as): it reaches every process whose real or saved uid is the user's in one
# step the kernel makes atomic against fork (a process that forks and exits in a loop is caught),
# and no process of the user may signal, trace or stop it (the kernel lets a process signal
# another only where its real or effective uid is the other's real or saved uid). Root's own
# processes are out of its reach: none has the bystander's or the user's uid.
_KILL_ALL = """
import os, signal, sys
user, group, bystander = (int(a) for a in sys.argv[1:4])
os.setgroups([])
os.setresgid(group, group, group)
os.setresuid(bystander, user, bystander)
try:
    os.kill(-1, signal.SIGKILL)
except ProcessLookupError:  # nothing left to kill
    pass
"""


def _bystander(who: Account) -> int | None:
    """A uid no process runs as and no account names (from 65533 down), or None."""
    used = {who.uid}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            used.update(int(u) for u in _status(int(entry)).get("Uid", "").split())
    with contextlib.suppress(OSError):
        used.update(entry.pw_uid for entry in pwd.getpwall())
    return next((u for u in range(65533, 1000, -1) if u not in used), None)


def _kill_all(who: Account, interpreter: str) -> str:
    """kill(-1) as described at _KILL_ALL, from a helper started as root; "" if it ran, else why
    not (the sweep goes on from root alone)."""
    bystander = _bystander(who)
    if bystander is None:
        return "no free uid for the kill(-1) helper"
    argv = [str(who.uid), str(who.gid), str(bystander)]
    try:
        done = subprocess.run(
            [interpreter, "-I", "-S", "-c", _KILL_ALL, *argv],
            env={},
            cwd="/",
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
            timeout=5,
        )
    except (OSError, subprocess.SubprocessError) as e:
        return f"the kill(-1) helper did not run: {type(e).__name__}: {e}"
    if done.returncode != 0:
        tail = done.stderr.decode(errors="replace").strip().splitlines()
        return f"the kill(-1) helper failed: {(tail or ['no output'])[-1][:200]}"
    return ""


def sweep(who: Account, interpreter: str, patience: float = 10.0) -> str:
    """Kill every process of `who` from root and wait until /proc shows none running; "" when
    none is left, else what survives and why: said in the report, never raised (a worker's
    close and a grade's end call it). Each round: kill(-1) from a helper the user can neither
    stop nor signal (_KILL_ALL), then SIGKILL from root to every process /proc shows of the
    user's (a stopped one too: SIGKILL reaches it), until none is left or `patience` runs out."""
    deadline = time.monotonic() + patience
    helper = ""
    try:
        while left := running(who.uid):
            if time.monotonic() > deadline:
                said = ", ".join(f"{pid} {name}" for pid, name in left[:8])
                return (
                    f"SWEEP FAILED: {len(left)} processes of {who.name} survived {patience:g} s "
                    f"of SIGKILL from root: {said}" + (f" ({helper})" if helper else "")
                )
            helper = _kill_all(who, interpreter)
            for pid, _ in running(who.uid):
                _kill_if_theirs(pid, who.uid)
            time.sleep(0.01)
    except Exception as e:  # the sweep's own failure: said, never raised
        return f"SWEEP FAILED: the sweep of {who.name}'s processes broke: {type(e).__name__}: {e}"
    return ""


def sweep_user(interpreter: str, user: str = USER, patience: float = 10.0) -> str:
    """sweep() of the container tier's user at a grade's end; "" or what went wrong, never
    raised."""
    try:
        who = account(user)
    except ContainerUnavailable as e:
        return f"SWEEP FAILED: {e}"
    return sweep(who, interpreter, patience)


# --- the trial: every property above, shown by a worker of the user ----------------------------

_PROBE = """
import json, os
import numpy, harness.wire  # the worker's imports resolve
want = json.loads(sys.argv[1])
assert (os.getuid(), os.geteuid(), os.getgid(), os.getegid()) == tuple(want["ids"]), "uid"
assert os.getgroups() == [], ("groups", os.getgroups())
status = dict(l.split(":", 1) for l in open("/proc/self/status") if ":" in l)
for cap in ("CapInh", "CapPrm", "CapEff", "CapBnd", "CapAmb"):
    assert int(status.get(cap, "0").strip(), 16) == 0, ("capabilities", cap, status.get(cap))
assert status["NoNewPrivs"].strip() == "1", "no_new_privs"
for folder in want["hidden"]:
    for attempt in (lambda: os.listdir(folder), lambda: open(os.path.join(folder, "probe"), "w")):
        try:
            attempt()
        except OSError:
            continue
        raise AssertionError(("readable or writable", folder))
for name in want["files"]:
    try:
        open(name).read(1)
    except OSError:
        continue
    raise AssertionError(("readable", name))
for folder in sys.path[1:]:
    for package in want["packages"]:
        assert not os.path.exists(os.path.join(folder, package)), ("visible", folder, package)
for folder in ["/usr", "/etc", "/", sys.path[0]]:
    try:
        open(os.path.join(folder, "probe"), "w")
        raise AssertionError(("writable", folder))
    except OSError:
        pass
open(os.path.join(os.environ["HOME"], "probe"), "w").write("ok")
print("container ok")
"""

_CHECKED: set[tuple] = set()
_CHECK_LOCK = threading.Lock()


def check(code: Code, hidden: Sequence[Path] = (), user: str = USER) -> None:
    """Raise ContainerUnavailable unless a trial worker, as `user`, shows every property above:
    its ids, no capabilities at all, no_new_privs, the project (and `hidden`: the report folders)
    neither readable nor writable, nothing of the project on its import paths, no system folder
    writable, its HOME writable. Once per process and set of folders."""
    who = account(user)
    folders = sorted({str(PROJECT_ROOT), *(str(Path(h).resolve()) for h in hidden)})
    key = (user, tuple(folders))
    with _CHECK_LOCK:
        if key in _CHECKED:
            return
        files = [str(PROJECT_ROOT / p) for p in ("oracle/__init__.py", "impl/transformer.py")]
        want = {
            "ids": [who.uid, who.uid, who.gid, who.gid],
            "hidden": folders,
            "files": files,
            "packages": list(code.protected_packages),
        }
        lib = worker_code(code)
        home = private_home(who)
        trial = group(256, 256)
        try:
            cmd = command(code, lib, who, home, _PROBE, json.dumps(want))
            done = subprocess.run(
                trial.wrap(cmd) if trial else cmd,
                capture_output=True,
                text=True,
                timeout=60,
                env=environment(home),
                cwd="/",
            )
            counted = trial.peak() if trial else 1
        except (OSError, subprocess.TimeoutExpired) as e:
            raise ContainerUnavailable(f"the trial worker did not run: {e}") from None
        finally:
            left = sweep(who, code.interpreter)
            shutil.rmtree(home, ignore_errors=True)
            if trial:
                trial.remove()
        if left:
            raise ContainerUnavailable(f"after the trial worker: {left}")
        if not counted:  # the kernel charged nothing to its group: the limits would not hold
            raise ContainerUnavailable("the trial worker's memory was not counted in its cgroup")
        if done.returncode != 0 or "container ok" not in done.stdout:
            why = (done.stderr.strip().splitlines() or ["no output"])[-1]
            raise ContainerUnavailable(
                f"the trial worker as {user} failed (status {done.returncode}): {why}"
            )
        _CHECKED.add(key)
