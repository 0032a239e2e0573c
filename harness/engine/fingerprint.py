"""Content hashes of what decides a result: source files, the library versions, a test's code.

Used twice: the incremental cache (harness.engine.cache) keys each cell by them, and a Dask worker
(harness.engine.cluster) refuses to run a unit when its copy of the project differs from the
client's. Only hashlib and the standard library: nothing is imported that a hash is taken of.
"""

from __future__ import annotations

import hashlib
import inspect
import json
import platform
import sys
import types
from collections.abc import Callable, Iterable
from functools import cache
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path
from typing import Any

PROJECT_ROOT = Path(__file__).resolve().parents[1]
# The packages whose code can change a verdict: the judge (oracle, harness) and the reference.
PROJECT_PACKAGES = ("oracle", "harness", "impl", "mutants", "tasks")
# The libraries whose versions can change a number (and the interpreter's).
LIBRARIES = ("numpy", "torch")


def digest(*parts: Any) -> str:
    """A sha256 of JSON-able parts (bytes hashed as bytes), hex."""
    h = hashlib.sha256()
    for part in parts:
        data = part if isinstance(part, bytes) else json.dumps(part, sort_keys=True).encode()
        h.update(len(data).to_bytes(8, "big"))
        h.update(data)
    return h.hexdigest()


def files_digest(paths: Iterable[Path], root: Path = PROJECT_ROOT) -> str:
    """One hash of these files' relative names and bytes, in name order."""
    h = hashlib.sha256()
    for path in sorted(paths):
        h.update(str(path.relative_to(root)).encode() + b"\0")
        h.update(hashlib.sha256(path.read_bytes()).digest())
    return h.hexdigest()


def tree(*relative: str, suffixes: tuple[str, ...] = (".py", ".json", ".pyi")) -> list[Path]:
    """The files under (or at) these project paths, caches left out."""
    found: list[Path] = []
    for rel in relative:
        base = PROJECT_ROOT / rel
        if base.is_file():
            found.append(base)
        elif base.is_dir():
            found += [
                p
                for p in base.rglob("*")
                if p.is_file() and p.suffix in suffixes and "__pycache__" not in p.parts
            ]
    return found


@cache
def versions() -> dict[str, str]:
    """The interpreter's and the numerical libraries' versions, and the machine kind."""
    found = {"python": sys.version.split()[0], "machine": platform.machine()}
    for name in LIBRARIES:
        try:
            found[name] = version(name)
        except PackageNotFoundError:
            found[name] = "absent"
    return found


@cache
def project() -> str:
    """The whole project's code and data, with the versions: equal on two machines that would
    judge every unit alike (a Dask worker checks the client's against its own)."""
    return digest(files_digest(tree(*PROJECT_PACKAGES)), versions())


def code_closure(fn: Callable[..., Any]) -> str:
    """A hash of `fn`'s source and of every function and constant of its own module it reaches
    by name or holds in its closure, transitively (its helpers), so a change to one test's check
    changes only its hash."""
    module = inspect.getmodule(fn)
    seen: dict[str, str] = {}

    def visit(obj: Any) -> None:
        name = getattr(obj, "__qualname__", repr(obj))
        if name in seen:
            return
        seen[name] = inspect.getsource(obj)
        cells = zip(obj.__code__.co_freevars, obj.__closure__ or (), strict=True)
        refs = [(ref, obj.__globals__.get(ref)) for ref in sorted(_names(obj.__code__))]
        for ref, value in refs + [(f"{name}.{v}", c.cell_contents) for v, c in cells]:
            if isinstance(value, types.FunctionType) and inspect.getmodule(value) is module:
                visit(value)
            elif isinstance(value, int | float | str | bool | tuple) and ref not in seen:
                seen[ref] = repr(value)

    visit(fn)
    return digest(sorted(seen.items()))


def _names(code: types.CodeType) -> set[str]:
    """Global names a code object and its nested ones (lambdas, comprehensions) load."""
    names = set(code.co_names)
    for const in code.co_consts:
        if isinstance(const, types.CodeType):
            names |= _names(const)
    return names
