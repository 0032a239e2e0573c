"""The oracle's derived bounds kept on disk between self-checks (`xfmr check`, `pytest --xfmr`).

A self-check draws the same inputs every time (its secret is the public one), so the bounds the
parent derives for them (verdicts.derived: the oracle's value and, by Monte Carlo arithmetic,
the bound of each number; about a second and a half of CPU per check, in the parent, beside two
workers on a 2-core laptop) are the same every time too. Within `kept(folder)` a derivation is
looked up in `folder` first and written there after: keyed by the function, the dtype, the
inputs' digest, numpy's version and a digest of the oracle's own files (its sources, or in the
student kit its sealed bytecode), so a changed oracle or another numpy derives afresh.

Only a self-check keeps bounds: its verdicts judge the student's own code on the student's own
machine, where a cache the student edits fools no one but its editor. A grade, the kill-rate
matrix and every tool derive in memory alone (verdicts._BOUNDS), as before.

The files are plain numpy archives read with allow_pickle=False: the value's structure (tuples,
lists, dicts with string keys, arrays, numpy and Python scalars, None) is a JSON tree beside the
arrays. A value of any other structure is not kept; a file that cannot be read is derived afresh
and written again.
"""

from __future__ import annotations

import contextlib
import dataclasses
import hashlib
import json
import os
import sys
import tempfile
import threading
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import numpy as np

import oracle

KEPT_FILES = 256  # the oldest go first beyond this (a self-check writes about 20, ~4 MB)

_FOLDER: list[Path | None] = [None]
_LOCK = threading.Lock()
_ORACLE_DIGEST: list[str] = []
_CODE_DIGESTS: dict[str, str] = {}


class _NotPlain(Exception):
    """A value the store does not keep: derived in memory only."""


def folder() -> Path | None:
    """Where bounds are kept now; None: nowhere (in memory only)."""
    return _FOLDER[0]


@contextlib.contextmanager
def kept(where: Path) -> Iterator[None]:
    """Within: derivations are looked up in, and written to, `where` (created if need be)."""
    before = _FOLDER[0]
    _FOLDER[0] = Path(where)
    try:
        yield
    finally:
        _FOLDER[0] = before


def oracle_digest() -> str:
    """A digest of every file of the oracle package (whatever it ships as), computed once."""
    with _LOCK:
        if not _ORACLE_DIGEST:
            h = hashlib.sha256(np.__version__.encode())
            root = Path(oracle.__file__).resolve().parent
            for path in sorted(p for p in root.rglob("*") if p.is_file()):
                if "__pycache__" in path.parts:
                    continue
                h.update(path.relative_to(root).as_posix().encode() + b"\0")
                h.update(path.read_bytes())
            _ORACLE_DIGEST.append(h.hexdigest())
        return _ORACLE_DIGEST[0]


def digest(x: Any, h: Any) -> None:
    """Feed `x` (the oracle's Params, arrays, sequences, dicts, scalars) to the hash `h`, all of
    it: the key of a derivation of `x` (verdicts.derived's, `remembered`'s)."""
    if isinstance(x, oracle.Params):
        h.update(repr((x.scheme, x.spec.norm, x.spec.tie, x.spec.d_model)).encode())
        for name in sorted(x.arrays):
            digest(name, h)
            digest(x.arrays[name], h)
        for extra in (x.spec.pos_table, x.spec.logits_bias):
            digest(extra, h)
        h.update(repr(dataclasses.replace(x.spec, pos_table=None, logits_bias=None)).encode())
    elif isinstance(x, np.ndarray):
        h.update(repr((x.dtype.str, x.shape)).encode() + np.ascontiguousarray(x).tobytes())
    elif isinstance(x, (tuple, list)):
        h.update(f"{type(x).__name__}{len(x)}(".encode())
        for v in x:
            digest(v, h)
        h.update(b")")
    elif isinstance(x, dict):
        h.update(f"dict{len(x)}(".encode())
        for k in sorted(x, key=repr):
            digest(k, h)
            digest(x[k], h)
        h.update(b")")
    else:
        h.update(repr(x).encode())


def _keyable(x: Any) -> bool:
    """Whether `digest` reads all of `x` (another object is digested by its repr, which may
    leave things out): only such arguments are kept."""
    if isinstance(x, (oracle.Params, np.ndarray, np.generic, int, float, str, bytes)) or x is None:
        return True
    if isinstance(x, dict):
        return all(isinstance(k, (str, int)) and _keyable(v) for k, v in x.items())
    return isinstance(x, (tuple, list)) and all(_keyable(v) for v in x)


def code_digest(fn: Callable[..., Any]) -> str:
    """A digest of the file that defines `fn` (a law's helper changes with its module, which
    the oracle's digest does not cover), computed once per module."""
    name = getattr(fn, "__module__", None) or "?"
    with _LOCK:
        if name not in _CODE_DIGESTS:
            module = sys.modules.get(name)
            try:
                text = Path(module.__file__).read_bytes()  # type: ignore[union-attr,arg-type]
            except (AttributeError, TypeError, OSError):
                text = b"?"
            _CODE_DIGESTS[name] = hashlib.sha256(text).hexdigest()
        return _CODE_DIGESTS[name]


def file_for(key: tuple[Any, ...], args: tuple[Any, ...], fn: Callable[..., Any]) -> Path | None:
    """The file that holds the derivation of `key` (verdicts.derived's key of fn and `args`),
    where bounds are kept; None where they are not, or the arguments are not all keyable. The
    name holds the oracle's digest and that of fn's module."""
    where = folder()
    if where is None or not all(_keyable(a) for a in args):
        return None
    name = hashlib.sha256(repr((key, oracle_digest(), code_digest(fn))).encode()).hexdigest()
    return where / f"{name[:40]}.npz"


def remembered(fn: Callable[..., Any], *args: Any) -> Any:
    """fn(*args), looked up and kept where bounds are kept (fn a pure function of the parent's
    inputs whose value is plain data: the oracle's searches); outside `kept()` just fn(*args)."""
    h = hashlib.sha256()
    digest(args, h)
    path = file_for((fn.__module__, fn.__qualname__, h.digest()), args, fn)
    if path is not None and (found := load(path)) is not None:
        return found
    value = fn(*args)
    if path is not None:
        save(path, value)
    return value


def _tree(value: Any, arrays: list[np.ndarray]) -> Any:
    if value is None or isinstance(value, (bool, str)):
        return {"k": "plain", "v": value}
    if isinstance(value, np.ndarray):
        if value.dtype.kind not in "biuf":
            raise _NotPlain(value.dtype)
        arrays.append(value)
        return {"k": "array", "i": len(arrays) - 1}
    if isinstance(value, np.generic):
        if value.dtype.kind not in "biuf":
            raise _NotPlain(value.dtype)
        arrays.append(np.asarray(value))
        return {"k": "scalar", "i": len(arrays) - 1}
    if isinstance(value, (int, float)):
        arrays.append(np.asarray(value, dtype=np.float64 if isinstance(value, float) else None))
        return {"k": type(value).__name__, "i": len(arrays) - 1}
    if isinstance(value, (tuple, list)):
        return {"k": type(value).__name__, "v": [_tree(v, arrays) for v in value]}
    if isinstance(value, dict) and all(isinstance(k, str) for k in value):
        return {"k": "dict", "v": [[k, _tree(v, arrays)] for k, v in value.items()]}
    if isinstance(value, dict) and all(type(k) is int for k in value):
        return {"k": "idict", "v": [[k, _tree(v, arrays)] for k, v in value.items()]}
    raise _NotPlain(type(value).__name__)


def _untree(node: Any, arrays: Any) -> Any:
    kind = node["k"]
    if kind == "plain":
        return node["v"]
    if kind == "array":
        return arrays[f"arr_{node['i']}"]
    if kind == "scalar":
        return arrays[f"arr_{node['i']}"][()]
    if kind in ("int", "float"):
        return {"int": int, "float": float}[kind](arrays[f"arr_{node['i']}"][()])
    if kind in ("tuple", "list"):
        items = [_untree(v, arrays) for v in node["v"]]
        return tuple(items) if kind == "tuple" else items
    if kind in ("dict", "idict"):
        return {k: _untree(v, arrays) for k, v in node["v"]}
    raise ValueError(f"unknown node {kind!r}")


def load(path: Path) -> Any | None:
    """The derivation kept at `path`; None if there is none, or none that can be read."""
    try:
        with np.load(path, allow_pickle=False) as archive:
            arrays = {name: archive[name] for name in archive.files}
        tree = json.loads(str(arrays.pop("tree")))
        return _untree(tree, arrays)
    except Exception:  # missing, truncated, not an archive, another layout: derived afresh
        return None


def save(path: Path, value: Any) -> None:
    """Keep `value` at `path` (written whole or not at all); what cannot be kept is not."""
    arrays: list[np.ndarray] = []
    try:
        tree = _tree(value, arrays)
    except _NotPlain:
        return
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        with tempfile.NamedTemporaryFile(dir=path.parent, suffix=".tmp", delete=False) as f:
            np.savez(f, *arrays, tree=np.array(json.dumps(tree)))  # arr_0, arr_1, ...
        os.replace(f.name, path)
        _prune(path.parent)
    except OSError:
        with contextlib.suppress(OSError, NameError):
            os.unlink(f.name)


def _prune(where: Path) -> None:
    files = sorted(where.glob("*.npz"), key=lambda p: p.stat().st_mtime)
    for old in files[: max(0, len(files) - KEPT_FILES)]:
        with contextlib.suppress(OSError):
            old.unlink()
