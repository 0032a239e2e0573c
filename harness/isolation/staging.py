"""Staging an untrusted input: a private copy of a submission (or a student's suite) for its
sandbox, made without ever opening anything but regular files and folders, within a cap.

Everything is looked at with lstat before it is opened: a symbolic link (a copy that follows
it could bring the grader's own files in; a `loop -> .` link never ends), a named pipe (opening
one blocks until a writer comes: forever), a socket or a device is refused with its name. A
regular file is then opened with O_NOFOLLOW | O_NONBLOCK and checked again with fstat (the same
inode, still a regular file: nothing swapped in between), and copied in chunks that stop at the
cap, whatever the file grows to meanwhile.

The caps (MAX_BYTES, MAX_ENTRIES) bound what one stage costs the host's disk: a sparse file's
apparent size is checked against what is left of the cap before a byte of it is read, so a 1 GiB
hole is refused, never expanded into 1 GiB of real disk.
"""

from __future__ import annotations

import os
import shutil
import stat
import tempfile
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path

# What one submission may hold, all files together. A submission is source: impl's transformer
# is ~40 kB, the largest real-world base in tests/harness_tests/realworld under 0.5 MB, and a
# student's folder may add notebooks, a README with figures, a tiny model's checkpoint (a few
# kB). 64 MiB is 100x any of these, and the cluster's own cap on a shipped submission
# (harness.engine.work.MAX_SHIPPED): what can be shipped can be staged.
MAX_BYTES = 64 << 20
# Files and folders one submission may hold: a handful of modules, a student's tests, a
# package's folders; 1000 leaves room for a stray .git folder of a small project while a
# folder of a million empty files (inodes, a walk of minutes) is refused early.
MAX_ENTRIES = 1000
_CHUNK = 1 << 20

_KINDS = {
    stat.S_IFIFO: "a named pipe",
    stat.S_IFSOCK: "a socket",
    stat.S_IFCHR: "a character device",
    stat.S_IFBLK: "a block device",
}


class UnsafeInput(ValueError):
    """An input that cannot be staged for a sandbox (a link, a special file, over a cap)."""


def kind_problem(mode: int, where: str) -> str:
    """Why a file of this (lstat) mode is refused ("" for a regular file or a folder)."""
    if stat.S_ISREG(mode) or stat.S_ISDIR(mode):
        return ""
    if stat.S_ISLNK(mode):
        return f"{where} is a symbolic link; submissions may hold none"
    kind = _KINDS.get(stat.S_IFMT(mode), "a special file")
    return f"{where} is {kind}, not a regular file or folder; submissions may hold none"


def size_problem(size: int, where: str, left: int = MAX_BYTES) -> str:
    """Why a file of `size` bytes (its apparent size) cannot be staged with `left` bytes left."""
    if size <= left:
        return ""
    return (
        f"{where} is {size} bytes, past the cap of {MAX_BYTES >> 20} MiB on a whole submission "
        f"({left} bytes were left of it); a submission is source code: leave out data and "
        "checkpoints"
    )


class _Budget:
    def __init__(self) -> None:
        self.bytes, self.entries = MAX_BYTES, MAX_ENTRIES

    def entry(self, where: str) -> None:
        self.entries -= 1
        if self.entries < 0:
            raise UnsafeInput(
                f"the submission holds more than {MAX_ENTRIES} files and folders (at {where}); "
                "submit the source alone"
            )


def open_regular(path: Path, where: str, expected: os.stat_result | None = None) -> int:
    """A read-only descriptor of the regular file at `path`, never blocking and never through a
    link: UnsafeInput if it is anything else, or no longer the file `expected` (lstat) was."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
    except OSError as e:
        raise UnsafeInput(f"{where} cannot be opened: {e.strerror or e}") from None
    try:
        info = os.fstat(fd)
        problem = kind_problem(info.st_mode, where)
        if not problem and expected is not None:
            if (info.st_dev, info.st_ino) != (expected.st_dev, expected.st_ino):
                problem = f"{where} was replaced while it was staged"
        if problem:
            raise UnsafeInput(problem)
    except BaseException:
        os.close(fd)
        raise
    return fd


def read_capped(fd: int, cap: int, where: str) -> bytes:
    """At most `cap` bytes of `fd`; UnsafeInput if it holds more (it grew since fstat)."""
    chunks: list[bytes] = []
    got = 0
    while True:
        chunk = os.read(fd, min(_CHUNK, cap + 1 - got))
        if not chunk:
            return b"".join(chunks)
        got += len(chunk)
        if got > cap:
            raise UnsafeInput(size_problem(got, where, cap))
        chunks.append(chunk)


def _copy_file(
    source: Path, target: Path, where: str, info: os.stat_result, budget: _Budget
) -> None:
    if problem := size_problem(info.st_size, where, budget.bytes):
        raise UnsafeInput(problem)  # refused before a byte is read: a sparse file stays a hole
    fd = open_regular(source, where, info)
    try:
        if problem := size_problem(os.fstat(fd).st_size, where, budget.bytes):
            raise UnsafeInput(problem)
        out = os.open(target, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o644)
        try:
            while True:
                chunk = os.read(fd, min(_CHUNK, budget.bytes + 1))
                if not chunk:
                    break
                budget.bytes -= len(chunk)
                if budget.bytes < 0:  # it grew past the cap while being copied
                    raise UnsafeInput(size_problem(MAX_BYTES - budget.bytes, where, 0))
                view = memoryview(chunk)
                while view:
                    view = view[os.write(out, view) :]
        finally:
            os.close(out)
    finally:
        os.close(fd)


def _copy(source: Path, target: Path, where: str, budget: _Budget) -> None:
    try:
        info = os.lstat(source)
    except OSError as e:
        raise UnsafeInput(f"{where} cannot be read: {e.strerror or e}") from None
    if problem := kind_problem(info.st_mode, where):
        raise UnsafeInput(problem)
    budget.entry(where)
    if stat.S_ISREG(info.st_mode):
        _copy_file(source, target, where, info, budget)
        return
    target.mkdir()
    with os.scandir(source) as found:
        entries = []
        for entry in found:
            if entry.name != "__pycache__":
                budget.entry(f"{where}/{entry.name}")  # counted as listed: no huge list held
                entries.append(entry.name)
    budget.entries += len(entries)  # each is counted again as it is copied
    for name in sorted(entries):
        _copy(source / name, target / name, f"{where}/{name}", budget)


@contextmanager
def staged(files: Mapping[str, Path] = {}, texts: Mapping[str, str] = {}) -> Iterator[Path]:  # noqa: B006
    """A private folder (mode 700) holding copies of `files` (untrusted: within the caps,
    refused as above with UnsafeInput) and the `texts` (the grader's own), removed after."""
    stage = Path(tempfile.mkdtemp(prefix="xfmr-stage-"))
    try:
        budget = _Budget()
        for name, source in files.items():
            _copy(Path(source), stage / name, name, budget)
        for name, text in texts.items():
            (stage / name).write_text(text)
        yield stage
    finally:
        shutil.rmtree(stage, ignore_errors=True)
