"""A control group of its own for every untrusted worker: a memory limit that counts what the
address-space limit cannot (tmpfs pages, memfd pages, SysV shared memory, the page cache and
kernel memory the worker causes) and a limit on its processes and threads.

Both hierarchies are read as the kernel mounts them:

- cgroup v1 (a `memory` and a `pids` controller mounted apart, as on this project's machines):
  a folder of its own in each, under the grader's own cgroup (/proc/self/cgroup), with
  memory.limit_in_bytes (and memory.memsw.limit_in_bytes where swap is counted: no swapping
  past it) and pids.max;
- cgroup v2 (the unified hierarchy with the memory and pids controllers): one folder under the
  grader's own cgroup, with memory.max, memory.swap.max = 0, memory.oom.group = 1 and pids.max.

A worker enters its group before its first instruction: `wrap` prefixes its command with a
shell that writes its own pid into the group's cgroup.procs and then execs the command, so
nothing it starts is ever outside the group (moving a process later would leave the children
it already forked behind). `remove` kills whatever is still in the group and removes it; a group
left by a grader that died (its pid in the name is gone) is removed by the next `create`.

Where no group can be made (no write access to the hierarchy, a read-only /sys/fs/cgroup in a
container, v2 without the controllers delegated), `problem()` says why, and the callers say so
in every report (harness.isolation.tiers: Tier.limits_problem).
"""

from __future__ import annotations

import errno
import functools
import os
import secrets
import signal
import time
from dataclasses import dataclass
from pathlib import Path

ROOT = Path("/sys/fs/cgroup")
PREFIX = "xfmr-"  # every group this grader makes: xfmr-<grader pid>-<random>
CONTROLLERS = ("memory", "pids")


class CgroupUnavailable(OSError):
    """No control group can be made for a worker here; the message says why."""


@dataclass(frozen=True)
class Place:
    """Where groups are made: the folder of each controller (v1: one per controller; v2: the
    same folder for both), and which hierarchy it is."""

    version: int
    parents: tuple[tuple[str, Path], ...]  # (controller, folder)


def _own_paths(proc_cgroup: Path) -> dict[str, str]:
    """The grader's own cgroup per controller ("" for v2's unified line) from /proc/self/cgroup."""
    found: dict[str, str] = {}
    for line in proc_cgroup.read_text().splitlines():
        _, names, path = line.split(":", 2)
        for name in names.split(",") if names else [""]:
            found[name] = path
    return found


def locate(root: Path = ROOT, proc_cgroup: Path = Path("/proc/self/cgroup")) -> Place:
    """Where this process may make its workers' groups; CgroupUnavailable with the reason."""
    try:
        own = _own_paths(proc_cgroup)
    except (OSError, ValueError) as e:
        raise CgroupUnavailable(errno.ENOENT, f"cannot read {proc_cgroup}: {e}") from None
    if (root / "cgroup.controllers").is_file():  # the unified hierarchy alone: v2
        parent = root / own.get("", "/").lstrip("/")
        try:
            have = (parent / "cgroup.controllers").read_text().split()
        except OSError as e:
            raise CgroupUnavailable(
                e.errno or errno.ENOENT, f"cgroup v2 at {parent}: {e}"
            ) from None
        lacking = [c for c in CONTROLLERS if c not in have]
        if lacking:
            raise CgroupUnavailable(
                errno.ENOTSUP,
                f"cgroup v2: the controllers {lacking} are not delegated to {parent}",
            )
        return Place(2, tuple((c, parent) for c in CONTROLLERS))
    parents = []
    for controller in CONTROLLERS:
        mount = root / controller
        if not (mount / "cgroup.procs").is_file():
            raise CgroupUnavailable(
                errno.ENOENT, f"no cgroup v1 {controller} controller is mounted at {mount}"
            )
        # inside a cgroup namespace the path may not exist from here: the mount's root then
        path = own.get(controller, "/").lstrip("/")
        parent = mount / path if (mount / path).is_dir() else mount
        parents.append((controller, parent))
    return Place(1, tuple(parents))


def _write(path: Path, value: str) -> None:
    with open(path, "w") as f:
        f.write(value)


def _read_int(path: Path, key: str | None = None) -> int:
    """A number from a cgroup file (the line `key N` of a keyed file); 0 if unreadable."""
    try:
        text = path.read_text()
    except OSError:
        return 0
    if key is None:
        text = text.strip()
        return 0 if text == "max" else int(text or 0)
    for line in text.splitlines():
        name, _, value = line.partition(" ")
        if name == key:
            return int(value)
    return 0


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


class Cgroup:
    """One worker's group (a folder per controller), made with its limits by `create`."""

    def __init__(self, place: Place, folders: dict[str, Path], memory_bytes: int) -> None:
        self.place, self.folders, self.memory_bytes = place, folders, memory_bytes

    @property
    def memory(self) -> Path:
        return self.folders["memory"]

    def procs_files(self) -> list[Path]:
        """The cgroup.procs of each folder (one for v2)."""
        return [f / "cgroup.procs" for f in dict.fromkeys(self.folders.values())]

    def wrap(self, argv: list[str]) -> list[str]:
        """`argv`, started inside the group: /bin/sh writes its own pid into every cgroup.procs,
        then execs argv (same pid); it exits 125 without running argv if a write fails."""
        files = [str(p) for p in self.procs_files()]
        script = (
            'n=$1; shift; while [ "$n" -gt 0 ]; do echo $$ > "$1" || exit 125; shift; '
            'n=$((n-1)); done; exec "$@"'
        )
        return ["/bin/sh", "-c", script, "xfmr-cgroup", str(len(files)), *files, *argv]

    def oom_kills(self) -> int:
        """How many processes the kernel killed for the group's memory limit."""
        if self.place.version == 1:
            return _read_int(self.memory / "memory.oom_control", "oom_kill")
        return _read_int(self.memory / "memory.events", "oom_kill")

    def peak(self) -> int:
        """The most memory the group held at once (bytes; 0 where the kernel does not say)."""
        if self.place.version == 1:
            return _read_int(self.memory / "memory.max_usage_in_bytes")
        return _read_int(self.memory / "memory.peak")

    def limit(self) -> int:
        """The memory limit as the kernel reads it back."""
        name = "memory.limit_in_bytes" if self.place.version == 1 else "memory.max"
        return _read_int(self.memory / name)

    def pids_limit(self) -> int:
        return _read_int(self.folders["pids"] / "pids.max")

    def members(self) -> list[int]:
        found: set[int] = set()
        for procs in self.procs_files():
            try:
                found.update(int(p) for p in procs.read_text().split())
            except OSError:
                pass
        return sorted(found)

    def remove(self, patience: float = 10.0) -> bool:
        """Kill what is left in the group and remove its folders; False if some folder
        survived `patience` seconds (a process that would not die)."""
        deadline = time.monotonic() + patience
        for folder in dict.fromkeys(reversed(list(self.folders.values()))):
            while True:
                for pid in self.members():
                    try:
                        os.kill(pid, signal.SIGKILL)
                    except OSError:
                        pass
                try:
                    folder.rmdir()
                    break
                except FileNotFoundError:
                    break
                except OSError:  # EBUSY: a member not yet gone
                    if time.monotonic() > deadline:
                        return False
                    time.sleep(0.02)
        return True


def _prune(parent: Path) -> None:
    """Remove the empty groups of graders that are gone (xfmr-<pid>-*, that pid not alive)."""
    try:
        entries = list(parent.glob(f"{PREFIX}*"))
    except OSError:
        return
    for folder in entries:
        pid = folder.name[len(PREFIX) :].split("-", 1)[0]
        if pid.isdigit() and int(pid) != os.getpid() and not _alive(int(pid)):
            try:
                folder.rmdir()
            except OSError:
                pass


def create(memory_bytes: int, pids: int, place: Place | None = None) -> Cgroup:
    """A fresh group with these limits; CgroupUnavailable (and nothing left) if it cannot be."""
    place = place or locate()
    name = f"{PREFIX}{os.getpid()}-{secrets.token_hex(4)}"
    folders: dict[str, Path] = {}
    group = Cgroup(place, folders, memory_bytes)
    try:
        for controller, parent in place.parents:
            folder = parent / name
            if folder not in folders.values():
                _prune(parent)
                folder.mkdir()
            folders[controller] = folder
        memory = folders["memory"]
        if place.version == 1:
            _write(memory / "memory.limit_in_bytes", str(memory_bytes))
            if (memory / "memory.memsw.limit_in_bytes").exists():  # swap counted: none past it
                try:
                    _write(memory / "memory.memsw.limit_in_bytes", str(memory_bytes))
                except OSError:
                    pass
        else:
            _write(memory / "memory.max", str(memory_bytes))
            for file, value in (("memory.swap.max", "0"), ("memory.oom.group", "1")):
                if (memory / file).exists():
                    _write(memory / file, value)
        _write(folders["pids"] / "pids.max", str(pids))
        if group.limit() != memory_bytes or group.pids_limit() != pids:
            raise CgroupUnavailable(
                errno.EINVAL,
                f"the kernel reads back memory {group.limit()} and pids {group.pids_limit()}, "
                f"not {memory_bytes} and {pids}",
            )
    except OSError as e:
        group.remove(1.0)
        if isinstance(e, CgroupUnavailable):
            raise
        where = e.filename or place.parents[0][1]
        raise CgroupUnavailable(
            e.errno or errno.EIO, f"cannot make a cgroup at {where}: {e.strerror or e}"
        ) from None
    return group


@functools.lru_cache(maxsize=1)
def problem() -> str:
    """Why no worker gets a group here ("" when one can be made: a trial group is made and
    removed, once per process)."""
    try:
        create(64 << 20, 16).remove()
    except CgroupUnavailable as e:
        return str(e.strerror or e)
    return ""


def leftovers() -> list[str]:
    """The groups of this grader (this pid) that still exist, for tests and sweeps."""
    try:
        place = locate()
    except CgroupUnavailable:
        return []
    mine = f"{PREFIX}{os.getpid()}-"
    return sorted(str(p) for _, parent in place.parents for p in parent.glob(f"{mine}*"))


class Accounted:
    """What a worker's handle keeps of its group (None where there is none): it says in the
    worker's log when the kernel killed the worker for the group's memory limit, and removes
    the group once the worker is gone."""

    def __init__(self, group: Cgroup | None, log_fd: int) -> None:
        self.group = group
        self._log = os.dup(log_fd) if group is not None else -1
        self._said = False

    def exited(self, code: int | None) -> None:
        """Called with the worker's exit status: a memory-limit kill is said in its log."""
        if self.group is None or code in (None, 0) or self._said or self._log < 0:
            return
        if self.group.oom_kills():
            self._said = True
            mb = self.group.memory_bytes >> 20
            line = (
                f"\n[grader] the worker reached its memory limit of {mb} MiB (all its memory "
                "together: resident, /tmp, /dev/shm, memfd, shared memory); the kernel killed "
                f"it (peak {self.group.peak() >> 20} MiB)\n"
            )
            try:
                os.pwrite(self._log, line.encode(), os.fstat(self._log).st_size)
            except OSError:
                pass

    def release(self) -> None:
        if self.group is not None:
            self.group.remove()
            self.group = None
        if self._log >= 0:
            os.close(self._log)
            self._log = -1
