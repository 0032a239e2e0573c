"""The one writer of reports: atomic, and checked before any work starts.

A report is written only by the trusted parent, only once every worker is gone, by renaming a
fresh file over the path: a file planted at the path, or a link left there, is replaced, never
written through. `report_path_problem` runs before grading, so a path that cannot be written is
a usage error and no result is lost at the end.
"""

from __future__ import annotations

import json
import os
import sys
import tempfile
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any


def write_report(path: str | Path, content: str | dict[str, Any]) -> None:
    """Write atomically (a temporary file renamed over the target): a file planted at the path,
    or a link left there, is replaced, never written through."""
    path = Path(path)
    if isinstance(content, dict):
        content = json.dumps(content, indent=2) + "\n"
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.")
    try:
        with os.fdopen(fd, "w") as f:
            f.write(content)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def report_path_problem(path: str | Path) -> str:
    """Why a report cannot be written at `path` ("" if it can): checked before any grading, so
    a bad path is a usage error, not results lost at the end."""
    path = Path(path)
    if path.is_dir() or (path.exists() and not path.is_file() and not path.is_symlink()):
        return f"{path} exists and is not a file"
    if not path.parent.is_dir():
        return f"the folder {path.parent} does not exist"
    if not os.access(path.parent, os.W_OK | os.X_OK):
        return f"the folder {path.parent} is not writable"
    return ""


def write_all(
    command: str, reports: Iterable[tuple[str | Path | None, Callable[[], str | dict[str, Any]]]]
) -> bool:
    """Write every report whose path is given, each on its own: one that fails (a full disk, a
    folder removed meanwhile) is said on stderr and the others are still written. True if all
    were written."""
    ok = True
    for path, content in reports:
        if not path:
            continue
        try:
            write_report(path, content())
        except OSError as e:
            print(f"xfmr {command}: could not write {path}: {e.strerror or e}", file=sys.stderr)
            ok = False
    return ok
