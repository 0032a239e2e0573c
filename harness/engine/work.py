"""Where a unit of work runs: the executor seam of the engine and the jobs.

A unit is one subject's row of the kill-rate matrix, one submission's grade, or one subject's run
of a student's suite. Each unit can run two ways:

- `run()`, in this process: what the local executor (the default) does, in a pool of threads,
  each thread driving its own caged worker process, exactly as before the seam existed;
- `task(payload)` somewhere else: `task` is a module-level function of the project and
  `payload` plain data (source text and bytes, test names, limits), so a Dask worker on another
  machine can run it with its own copy of the project; what comes back is plain data too, which
  `decode` turns into the unit's result here.

The Dask executor lives in harness.engine.cluster; harness.engine.executors chooses between the
two and imports it only when a --scheduler is given: nothing of dask is imported by the default
paths.
"""

from __future__ import annotations

import argparse
import os
import re
import stat
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor, as_completed
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Generic, Protocol, TypeVar

from harness.isolation.staging import (
    MAX_BYTES,
    MAX_ENTRIES,
    UnsafeInput,
    open_regular,
    read_capped,
    size_problem,
)

R = TypeVar("R")
Done = Callable[[int, Any], None]  # done(index, result) as each unit finishes


@dataclass(frozen=True)
class Unit(Generic[R]):
    """One unit of work, runnable here or, as plain data, on a remote worker."""

    label: str  # for progress and error messages
    run: Callable[[], R]  # here, in this process
    task: Callable[[Any], Any]  # a module-level function: task(payload) -> plain data
    payload: Callable[[], Any]  # the plain data `task` needs (built only when shipped)
    decode: Callable[[Any], R]  # task's plain data back into the result
    lost: Callable[[str], R]  # the result when the unit could not be run at all (said why)
    sandboxed: bool = False  # the task runs untrusted code: the worker must have the sandbox


class Executor(Protocol):
    """Runs units; returns their results in the units' order."""

    description: str
    width: int  # how many units it runs at once

    def run(self, units: Sequence[Unit[R]], done: Done | None = None) -> list[R]:
        """Every unit's result, in order; `done(index, result)` as each one finishes."""

    def close(self) -> None:
        """Release what the executor started (threads, a cluster)."""


class LocalExecutor:
    """Today's behaviour: up to `jobs` units at once in threads of this process."""

    def __init__(self, jobs: int | None = None) -> None:
        self.jobs = max(1, jobs or os.cpu_count() or 1)
        self.width = self.jobs  # units at once
        self.description = f"local, {self.jobs} at once"

    def run(self, units: Sequence[Unit[R]], done: Done | None = None) -> list[R]:
        results: list[Any] = [None] * len(units)
        with ThreadPoolExecutor(max_workers=self.jobs) as pool:
            futures = {pool.submit(u.run): i for i, u in enumerate(units)}
            for future in as_completed(futures):
                i = futures[future]
                results[i] = future.result()
                if done is not None:
                    done(i, results[i])
        return results

    def close(self) -> None:
        pass


# --- --scheduler --------------------------------------------------------------------------------

SCHEDULER_HELP = (
    "run the units on a Dask cluster: tcp://HOST:PORT (an existing scheduler) or local:N "
    "(a LocalCluster of N worker processes); default: this process's threads"
)
_ADDRESS = re.compile(r"^(tcp|tls|ws|wss|inproc)://[^\s/]+(:\d{1,5})?/?$")
_LOCAL = re.compile(r"^local:(\d+)$")


@dataclass(frozen=True)
class Scheduler:
    """A checked --scheduler value: an address, or a local cluster's worker count."""

    address: str | None = None
    local_workers: int | None = None

    def __str__(self) -> str:
        return self.address or f"local:{self.local_workers}"


def scheduler(text: str) -> Scheduler:
    """An argparse type for --scheduler: tcp://HOST:PORT or local:N (N >= 1)."""
    if m := _LOCAL.match(text):
        if int(m.group(1)) < 1:
            raise argparse.ArgumentTypeError(f"local:N needs N >= 1, got {text!r}")
        return Scheduler(local_workers=int(m.group(1)))
    if _ADDRESS.match(text):
        return Scheduler(address=text.rstrip("/"))
    raise argparse.ArgumentTypeError(
        f"{text!r} is neither a scheduler address (tcp://HOST:PORT) nor local:N"
    )


def add_scheduler(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--scheduler", type=scheduler, metavar="ADDRESS", help=SCHEDULER_HELP)


class ClusterProblem(RuntimeError):
    """The cluster cannot be used as asked (unreachable, a worker that cannot set up the sandbox
    or runs another version of the project): the run stops, nothing is judged."""


# --- files as plain data ------------------------------------------------------------------------

# What one shipped file tree may weigh and hold: staging's own caps (a submission or a student
# suite is kilobytes), so that what can be shipped can be staged and the reverse.
MAX_SHIPPED = MAX_BYTES


class TooLarge(ValueError):
    """A tree over MAX_SHIPPED bytes or MAX_ENTRIES files and folders."""


def pack(path: Path) -> dict[str, Any]:
    """A file or folder as plain data, links and special files kept as what they are (never
    followed, never opened), so that the receiving side stages and refuses exactly what this
    side would. Every entry is looked at with lstat and counted before anything of it is read: a
    file's apparent size is checked against what is left of MAX_SHIPPED first (a huge sparse file
    is refused unread), then read within that cap (it cannot grow past it meanwhile); a folder's
    entries are counted as they are listed (TooLarge past MAX_ENTRIES, no huge list held).
    UnsafeInput if a file was replaced between its lstat and its opening."""
    left = [MAX_SHIPPED, MAX_ENTRIES]  # bytes, entries

    def count(where: str) -> None:
        left[1] -= 1
        if left[1] < 0:
            raise TooLarge(f"{path} holds more than {MAX_ENTRIES} files and folders (at {where})")

    def one(p: Path, where: str) -> dict[str, Any]:
        info = os.lstat(p)
        if stat.S_ISLNK(info.st_mode):
            return {"link": os.readlink(p)}
        if stat.S_ISREG(info.st_mode):
            if problem := size_problem(info.st_size, where, left[0]):
                raise TooLarge(problem)
            fd = open_regular(p, where, info)  # UnsafeInput if it was swapped meanwhile
            try:
                data = read_capped(fd, left[0], where)
            except UnsafeInput as e:  # it grew past the cap while being read
                raise TooLarge(str(e)) from None
            finally:
                os.close(fd)
            left[0] -= len(data)
            return {"file": data}
        if stat.S_ISDIR(info.st_mode):
            names = []
            with os.scandir(p) as found:
                for entry in found:
                    if entry.name != "__pycache__":
                        count(f"{where}/{entry.name}")
                        names.append(entry.name)
            return {"dir": {name: one(p / name, f"{where}/{name}") for name in sorted(names)}}
        return {"special": True}

    count(path.name)
    return one(path, path.name)


def unpack(tree: dict[str, Any], path: Path) -> None:
    """Recreate a packed tree at `path` (a private folder of the receiving side)."""
    if "file" in tree:
        path.write_bytes(tree["file"])
    elif "dir" in tree:
        path.mkdir()
        for name, sub in tree["dir"].items():
            if "/" in name or name in ("", ".", ".."):
                raise ValueError(f"a packed tree may not name {name!r}")
            unpack(sub, path / name)
    elif "link" in tree:
        os.symlink(tree["link"], path)
    else:
        os.mkfifo(path)  # a special file stays one: staging refuses it as it would have
