"""The sandbox for untrusted code: how a worker is confined, and how nothing it started survives.

Two halves. The parent (trusted), while `guarded`, is a child subreaper; it gives each worker
a Cage (a fresh empty directory, resource limits, a pids cgroup where the machine allows one)
and, after the worker, sweeps every process the worker left behind: a child that double-forked
and called setsid is reparented to the subreaper, where a walk of /proc finds it. The worker
calls `confine` after the harness's own imports and before the first line of submission code
runs: limits, directory, a minimal environment, the project's packages hidden (a meta-path
finder for imports, an audit hook for file opens), and, when it runs as root and the
interpreter is readable by others, the nobody account.
"""

from __future__ import annotations

import ast
import ctypes
import importlib
import importlib.abc
import os
import pwd
import resource
import secrets
import shutil
import signal
import sys
import sysconfig
import tempfile
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from harness.engine import LOAD_TIMEOUT, Worker
from harness.subjects import Subject

# The project's top-level packages: the reference, the oracle, the grader and the faults. A
# submission or a student's suite that reaches any of them is rejected.
PROTECTED = ("impl", "oracle", "harness", "mutants", "tasks")
PROJECT_ROOT = Path(__file__).resolve().parents[1]

_PR_SET_CHILD_SUBREAPER = 36  # linux/prctl.h
_PR_GET_DUMPABLE = 3
_PR_SET_DUMPABLE = 4
_CGROUP_PIDS = Path("/sys/fs/cgroup/pids")


@dataclass(frozen=True)
class Limits:
    """What one worker may use. Wall time is per test and lives on the tests."""

    # A worker peaks at ~0.7 GiB of address space over the whole shared suite, learning run
    # included (measured: VmPeak 681 MB); 2 GiB leaves room and stops a memory bomb after
    # touching at most ~1.3 GiB, seconds of page faults even on a loaded machine.
    memory_mb: int = 2048
    # Largest file the worker may write (save_transformer of a tiny model is kilobytes).
    file_mb: int = 64
    # Processes and threads in the worker's cgroup: torch's pool plus a few, never a fork bomb.
    processes: int = 256

    def rlimits(self) -> dict[str, tuple[int, int]]:
        """The limits as setrlimit arguments (soft = hard: the subject cannot raise them)."""
        mb = 1 << 20
        return {
            "RLIMIT_AS": (self.memory_mb * mb, self.memory_mb * mb),
            "RLIMIT_FSIZE": (self.file_mb * mb, self.file_mb * mb),
            "RLIMIT_CORE": (0, 0),  # a segfault leaves no core file behind
        }


DEFAULT_LIMITS = Limits()


# --- the parent's side ------------------------------------------------------------------------


def _prctl(option: int, value: int = 0) -> int:
    return ctypes.CDLL(None, use_errno=True).prctl(option, value, 0, 0, 0)


_GUARD_LOCK = threading.Lock()
_GUARD_DEPTH = 0
_WAS_DUMPABLE = 1


@contextmanager
def guarded() -> Iterator[None]:
    """While untrusted workers run: make this process a child subreaper (orphans of its workers
    come back to it, not to init, so a sweep can find and reap them) and not dumpable (its
    /proc/PID/fd, environ and mem close to other processes of its user, so a worker cannot
    reach its pipes). Nests, across threads; both are undone when the last user leaves."""
    global _GUARD_DEPTH, _WAS_DUMPABLE
    with _GUARD_LOCK:
        if _GUARD_DEPTH == 0:
            _WAS_DUMPABLE = _prctl(_PR_GET_DUMPABLE)
            _prctl(_PR_SET_CHILD_SUBREAPER, 1)
            _prctl(_PR_SET_DUMPABLE, 0)
        _GUARD_DEPTH += 1
    try:
        yield
    finally:
        with _GUARD_LOCK:
            _GUARD_DEPTH -= 1
            if _GUARD_DEPTH == 0:
                _prctl(_PR_SET_CHILD_SUBREAPER, 0)
                _prctl(_PR_SET_DUMPABLE, max(_WAS_DUMPABLE, 0))


def _stat(pid: int) -> tuple[str, int, int] | None:
    """(state, ppid, start time in clock ticks) of a process, None if it is gone."""
    try:
        raw = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    fields = raw[raw.rindex(")") + 2 :].split()  # the command name may hold spaces and ')'
    return fields[0], int(fields[1]), int(fields[19])


def processes() -> dict[int, tuple[str, int, int]]:
    """Every process: pid -> (state, ppid, start ticks)."""
    table = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit() and (stat := _stat(int(entry))) is not None:
            table[int(entry)] = stat
    return table


def descendants(root: int, table: dict[int, tuple[str, int, int]] | None = None) -> set[int]:
    """Every process below `root` in the parent tree (not root itself)."""
    table = processes() if table is None else table
    children: dict[int, list[int]] = {}
    for pid, (_, ppid, _) in table.items():
        children.setdefault(ppid, []).append(pid)
    found, todo = set(), [root]
    while todo:
        for child in children.get(todo.pop(), ()):
            if child not in found:
                found.add(child)
                todo.append(child)
    return found


def _environ_has(pid: int, marker: bytes) -> bool:
    try:
        return marker in Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
    except OSError:
        return False


def _now_ticks() -> int:
    """Clock ticks since boot, the unit of /proc/PID/stat's start time."""
    return int(float(Path("/proc/uptime").read_text().split()[0]) * os.sysconf("SC_CLK_TCK"))


_LIVE_WORKERS: set[int] = set()  # pids of workers still serving, which a sweep must spare


class Cage:
    """One worker's confinement, prepared by the parent: its private directory, its limits,
    its cgroup (when /sys/fs/cgroup/pids is writable) and the sweep that ends its processes."""

    def __init__(
        self, limits: Limits, probes: tuple[str, ...] = (), use_cgroup: bool = True
    ) -> None:
        self.limits = limits
        self.probes = probes  # modules the worker imports before confining: more probes
        self.token = secrets.token_hex(8)
        self.born = _now_ticks()
        self.dir = Path(tempfile.mkdtemp(prefix="xfmr-cage-"))
        self.user = _nobody() if os.geteuid() == 0 and _others_can_run_python() else None
        if self.user is not None:
            os.chown(self.dir, self.user[0], self.user[1])
        self.cgroup = self._make_cgroup() if use_cgroup else None
        self.pid: int | None = None

    def _make_cgroup(self) -> Path | None:
        path = _CGROUP_PIDS / f"xfmr-{self.token}"
        try:
            path.mkdir()
            (path / "pids.max").write_text(str(self.limits.processes))
        except OSError:  # no cgroup v1 pids controller, or not ours to write: /proc walks only
            return None
        return path

    def spec(self) -> dict[str, Any]:
        """What the worker's `confine` needs, as plain data (no report path is ever in it)."""
        return {
            "dir": str(self.dir),
            "env": {
                "PATH": "/usr/bin:/bin",
                "HOME": str(self.dir),
                "TMPDIR": str(self.dir),
                "LANG": "C.UTF-8",
                "OMP_NUM_THREADS": "1",
                "MKL_NUM_THREADS": "1",
                "XFMR_CAGE": self.token,
            },
            "rlimits": {k: list(v) for k, v in self.limits.rlimits().items()},
            "user": list(self.user) if self.user else None,
            "protected": list(PROTECTED),
            "probes": list(self.probes),
            "project_root": str(PROJECT_ROOT),
        }

    def admit(self, pid: int) -> None:
        """Put the freshly started worker in the cage (before it loads any submission code)."""
        self.pid = pid
        _LIVE_WORKERS.add(pid)
        if self.cgroup is not None:
            try:
                (self.cgroup / "cgroup.procs").write_text(str(pid))
            except OSError:
                self.cgroup = None

    def strays(self) -> set[int]:
        """Every live process this worker left: in its cgroup, below it, carrying its marker,
        or an orphan reparented to this subreaper since the cage was made."""
        table = processes()
        me = os.getpid()
        found: set[int] = set()
        if self.cgroup is not None:
            try:
                found |= {int(p) for p in (self.cgroup / "cgroup.procs").read_text().split()}
            except OSError:
                pass
        if self.pid is not None and self.pid in table:
            found |= descendants(self.pid, table)
        marker = f"XFMR_CAGE={self.token}".encode()
        for pid in descendants(me, table):
            state, ppid, start = table[pid]
            orphan = ppid == me and start >= self.born
            if orphan or _environ_has(pid, marker):
                found.add(pid)
        found -= {me, self.pid, *_spared()}  # the worker itself: its owner kills and reaps it
        return {p for p in found if p in table and table[p][0] != "Z"} | _zombies(found, table)

    def sweep(self, rounds: int = 50) -> int:
        """Kill everything the worker left (freeze first, so nothing forks mid-sweep); reap
        the orphans that came to this process. Returns how many processes it killed."""
        killed: set[int] = set()
        for _ in range(rounds):
            strays = self.strays()
            if not strays:
                break
            for sig in (signal.SIGSTOP, signal.SIGKILL):
                for pid in strays:
                    try:
                        os.kill(pid, sig)
                    except (ProcessLookupError, PermissionError):
                        pass
            killed |= strays
            _reap(strays)
        return len(killed)

    def close(self) -> None:
        """Sweep, then remove the directory and the cgroup."""
        if self.pid is not None:
            _LIVE_WORKERS.discard(self.pid)
        self.sweep()
        shutil.rmtree(self.dir, ignore_errors=True)
        if self.cgroup is not None:
            for _ in range(100):  # rmdir succeeds once the killed processes have left it
                try:
                    self.cgroup.rmdir()
                    break
                except OSError:
                    time.sleep(0.01)


def _spared() -> set[int]:
    """Processes a sweep never touches: live workers, and the zygote that forks them."""
    zygote = getattr(sys.modules.get("harness.zygote"), "_ZYGOTE", None)
    proc = getattr(zygote, "_proc", None)
    return _LIVE_WORKERS | ({proc.pid} if proc is not None else set())


def _zombies(pids: set[int], table: dict[int, tuple[str, int, int]]) -> set[int]:
    """The dead among `pids` that are this process's children: they need reaping, not killing."""
    me = os.getpid()
    return {p for p in pids if p in table and table[p][0] == "Z" and table[p][1] == me}


def _reap(pids: set[int]) -> None:
    """Collect the exit status of those of `pids` that are this process's children."""
    deadline = time.monotonic() + 2.0
    pending = set(pids)
    while pending and time.monotonic() < deadline:
        for pid in list(pending):
            try:
                done, _ = os.waitpid(pid, os.WNOHANG)
            except ChildProcessError:  # not our child (or already reaped): its parent reaps it
                pending.discard(pid)
                continue
            if done:
                pending.discard(pid)
        if pending:
            time.sleep(0.005)


def _others_can_run_python() -> bool:
    """Can another account read this interpreter's library and the project? (A Python built
    under /root, mode 700, cannot be run by nobody: the worker then stays root.)"""
    paths = {sysconfig.get_paths()[k] for k in ("stdlib", "purelib", "platlib")}
    for path in [*paths, str(PROJECT_ROOT)]:
        p = Path(path).resolve()
        for d in [p, *p.parents]:
            if d.exists() and d.stat().st_mode & 0o005 != 0o005:
                return False
    return True


def _nobody() -> tuple[int, int] | None:
    try:
        entry = pwd.getpwnam("nobody")
    except KeyError:
        return None
    return entry.pw_uid, entry.pw_gid


# --- the static check -------------------------------------------------------------------------


# CPython 3.11's parser keeps its recursion depth per interpreter, not per thread: two threads
# parsing at once (grade-batch) fail with "AST constructor recursion depth mismatch".
_AST_LOCK = threading.Lock()


def forbidden_imports(source: str, filename: str = "<submission>") -> list[str]:
    """Where `source` imports a protected package: import statements, and __import__ /
    importlib.import_module called with a literal name. ["line 3: import impl.transformer"]."""
    try:
        with _AST_LOCK:
            tree = ast.parse(source, filename)
    except SyntaxError as e:
        return [f"line {e.lineno}: the file does not parse ({e.msg})"]
    found = []
    for node in ast.walk(tree):
        names: list[str] = []
        if isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            names = [node.module]
        elif isinstance(node, ast.Call) and node.args:
            func = node.func
            callee = func.attr if isinstance(func, ast.Attribute) else getattr(func, "id", "")
            arg = node.args[0]
            if callee in ("__import__", "import_module") and isinstance(arg, ast.Constant):
                names = [str(arg.value)]
        for name in names:
            if name.split(".")[0] in PROTECTED:
                found.append(f"line {node.lineno}: imports {name}")
    return found


def check_submission(path: Path) -> list[str]:
    """The forbidden imports of a .py file or of every .py file in a package directory."""
    files = sorted(path.rglob("*.py")) if path.is_dir() else [path]
    problems = []
    for file in files:
        text = file.read_text(errors="replace")
        where = file.relative_to(path) if path.is_dir() else file.name
        problems += [f"{where} {p}" for p in forbidden_imports(text, str(file))]
    return problems


# --- the worker's side ------------------------------------------------------------------------


class ProtectedImport(ImportError):
    """A submission tried to import one of the project's own packages."""


class ProtectedRead(PermissionError):
    """A submission tried to open one of the project's own files (to exec the reference, say).

    An OSError, so that traceback printers that read source lines skip the file quietly."""


class _Blocker(importlib.abc.MetaPathFinder):
    """Refuses every import of a protected package, however it is spelled."""

    def __init__(self, protected: tuple[str, ...]) -> None:
        self.protected = protected

    def find_spec(self, name, path=None, target=None):  # noqa: ANN001 (importlib's signature)
        if name.split(".")[0] in self.protected:
            raise ProtectedImport(
                f"submissions may not import {name!r}: the packages {', '.join(self.protected)} "
                "belong to the grader"
            )
        return None


def confine(spec: dict[str, Any]) -> None:
    """In the worker, before any submission code: limits, directory, environment, hidden
    project packages and, for a root worker, the nobody account. Cannot be undone from inside."""
    for module in spec["probes"]:  # registers their probes while the harness is importable
        importlib.import_module(module)
    for name, (soft, hard) in spec["rlimits"].items():
        resource.setrlimit(getattr(resource, name), (soft, hard))
    os.chdir(spec["dir"])
    os.environ.clear()
    os.environ.update(spec["env"])
    tempfile.tempdir = spec["dir"]
    protected = tuple(spec["protected"])
    # The harness's own modules keep working through the references they hold; the submission
    # finds none of them in sys.modules and the finder refuses to import them afresh.
    for name in [m for m in sys.modules if m.split(".")[0] in protected]:
        del sys.modules[name]
    sys.meta_path.insert(0, _Blocker(protected))
    roots = tuple(str(Path(spec["project_root"]) / p) + os.sep for p in protected)

    def audit(event: str, args: tuple) -> None:
        # reading the reference's or the oracle's source to exec it is importing it by hand
        if event == "open" and isinstance(args[0], str | bytes):
            path = os.path.abspath(os.fsdecode(args[0]))
            if path.startswith(roots):
                raise ProtectedRead(f"submissions may not read the grader's file {path}")

    sys.addaudithook(audit)
    if spec.get("user"):
        uid, gid = spec["user"]
        os.setgroups([])
        os.setgid(gid)
        os.setuid(uid)


# --- a caged worker ---------------------------------------------------------------------------


class SandboxedWorker(Worker):
    """An engine worker in a Cage: the submission is copied into the cage's directory, the
    worker confines itself before loading it, and closing the worker sweeps what it left."""

    def __init__(
        self,
        subject: Subject,
        limits: Limits,
        load_timeout: float = LOAD_TIMEOUT,
        probes: tuple[str, ...] = (),
    ) -> None:
        self.cage = Cage(limits, probes)
        self.load_timeout = load_timeout
        super().__init__(subject)
        self.cage.admit(self.pid)

    def load(self, rlimits: dict[str, tuple[int, int]] | None = None) -> None:
        """Copy the submission in, then confine the worker and load it there."""
        subject = self.subject
        if subject.path is not None:
            name = "submission" if Path(subject.path).is_dir() else "submission.py"
            subject = replace(subject, path=str(self.copy_in(Path(subject.path), name)))
        request = {"op": "load", "subject": subject.to_json(), "sandbox": self.cage.spec()}
        self.request(request, time.monotonic() + self.load_timeout)

    def copy_in(self, path: Path, name: str) -> Path:
        """A copy of a file or folder in the cage's directory, readable by the worker."""
        target = self.cage.dir / name
        if path.is_dir():
            shutil.copytree(path, target, ignore=shutil.ignore_patterns("__pycache__"))
        else:
            shutil.copyfile(path, target)
        if self.cage.user is not None:
            for p in [target, *target.rglob("*")]:
                os.chown(p, *self.cage.user)
        return target

    def kill(self) -> None:
        super().kill()
        self.cage.sweep()

    def close(self) -> None:
        super().close()
        self.cage.close()
