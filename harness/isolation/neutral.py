"""The neutral cache a sandbox's view is built from (harness.isolation.sandbox): hard-link trees
of site-packages without the project's files, and a copy of the worker's own code, each under a
folder named by its content in a cache of this user's (/var/tmp/xfmr-neutral-UID), so that no
mount a sandbox sees names a host path of the project or the virtualenv.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import stat
import tempfile
import time
from collections.abc import Callable, Sequence
from pathlib import Path

Skip = Callable[[str], bool]


def tree(top: str, skip: Skip = lambda rel: False) -> list[tuple[str, str, int]]:
    """(relative path, kind 'd'/'f'/'l', inode) of everything under `top` but `skip`, sorted;
    other kinds (sockets, pipes, devices) are left out."""
    found: list[tuple[str, str, int]] = []
    stack = [""]
    while stack:
        rel = stack.pop()
        with os.scandir(os.path.join(top, rel)) as entries:
            for e in entries:
                sub = f"{rel}/{e.name}" if rel else e.name
                if skip(sub):
                    continue
                if e.is_symlink():
                    found.append((sub, "l", e.inode()))
                elif e.is_dir(follow_symlinks=False):
                    found.append((sub, "d", e.inode()))
                    stack.append(sub)
                elif e.is_file(follow_symlinks=False):
                    found.append((sub, "f", e.inode()))
    return sorted(found)


def _neutral_cache(device: int, avoid: Path, places: Sequence[str]) -> Path | None:
    """This user's neutral cache folder on file system `device` (made 0700) in one of `places`,
    never inside `avoid` (the project), or None."""
    for place in places:
        folder = Path(place) / f"xfmr-neutral-{os.getuid()}"
        try:
            if os.stat(place).st_dev != device or folder.resolve().is_relative_to(avoid.resolve()):
                continue
            try:
                folder.mkdir(mode=0o700)
            except FileExistsError:
                pass
            info = os.lstat(folder)
        except OSError:
            continue
        mine = stat.S_ISDIR(info.st_mode) and info.st_uid == os.getuid()
        if mine and not info.st_mode & 0o077:
            return folder
    return None


def _publish(build: Path, target: Path) -> Path:
    """Move a finished `build` to `target` (another process may have won the race: keep its)."""
    build.chmod(0o755)
    try:
        build.rename(target)
    except OSError:
        shutil.rmtree(build, ignore_errors=True)
        if not target.is_dir():
            raise
    return target


def _prune(cache: Path, days: float = 2.0) -> None:
    """Remove the hard-link trees and code copies no process has used for `days` (site-packages
    or the worker's code has changed since: each costs only its folders, but they add up)."""
    for old in [*cache.glob("site-*"), *cache.glob("lib-*")]:
        try:
            if time.time() - old.stat().st_mtime > days * 86400:
                shutil.rmtree(old, ignore_errors=True)
        except OSError:
            pass


def linked(source: str, masked: Skip, avoid: Path, places: Sequence[str]) -> Path:
    """A tree of hard links to `source` without its `masked` files, in the neutral cache: the
    same files under a name that is no host path of the project's. OSError if none can be."""
    cache = _neutral_cache(os.stat(source).st_dev, avoid, places)
    if cache is None:
        raise OSError(f"no folder of {tuple(places)} is this user's and on {source}'s device")
    entries = tree(source, masked)
    key = hashlib.sha256(repr((source, entries)).encode()).hexdigest()[:32]
    target = cache / f"site-{key}"
    if target.is_dir():
        os.utime(target)  # in use: _prune keeps it
        return target
    _prune(cache)
    build = Path(tempfile.mkdtemp(prefix=".build-", dir=cache))
    try:
        for rel, kind, _ in entries:
            here = os.path.join(source, rel)
            if kind == "d":
                os.mkdir(build / rel)
            elif kind == "f":
                os.link(here, build / rel, follow_symlinks=False)
            else:
                os.symlink(os.readlink(here), build / rel)
    except BaseException:
        shutil.rmtree(build, ignore_errors=True)
        raise
    return _publish(build, target)


def code_copy(root: Path, files: Sequence[str], places: Sequence[str]) -> Path:
    """A copy of `files` (relative to `root`) in the neutral cache, by content; OSError if
    there is no cache."""
    digest = hashlib.sha256()
    for rel in sorted(files):
        digest.update(f"{rel}\0".encode() + (root / rel).read_bytes() + b"\0")
    cache = _neutral_cache(os.stat(root).st_dev, root, places) or _neutral_cache(
        os.stat(places[0]).st_dev, root, places
    )
    if cache is None:
        raise OSError(f"no folder of {tuple(places)} is this user's")
    target = cache / f"lib-{digest.hexdigest()[:32]}"
    if target.is_dir():
        os.utime(target)  # in use: _prune keeps it
        return target
    _prune(cache)
    build = Path(tempfile.mkdtemp(prefix=".build-", dir=cache))
    try:
        for rel in files:
            (build / rel).parent.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(root / rel, build / rel)
    except BaseException:
        shutil.rmtree(build, ignore_errors=True)
        raise
    return _publish(build, target)
