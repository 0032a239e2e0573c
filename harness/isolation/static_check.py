"""The static check of a submission's source, before anything of it runs: a file that does not
parse, or that imports the grader's own packages, is rejected with that reason.

Only a courtesy now: the project's packages are not in the sandbox at all, so an import that
slips past this check (a computed name) fails there with ProtectedImport or ModuleNotFoundError.
Every failure of the check itself on hostile source (a parser's recursion limit, a null byte)
is a rejection of that source, never the grader's exception.
"""

from __future__ import annotations

import ast
import os
import stat
import threading
from pathlib import Path

from harness.isolation.limits import PROJECT_PACKAGES as PROTECTED
from harness.isolation.staging import (
    MAX_ENTRIES,
    UnsafeInput,
    kind_problem,
    open_regular,
    read_capped,
    size_problem,
)

# CPython 3.11's parser keeps its recursion depth per interpreter, not per thread: two threads
# parsing at once (grade-batch) fail with "AST constructor recursion depth mismatch".
_AST_LOCK = threading.Lock()
# The largest source file the check parses. The parser's tree costs ~100x a file's bytes in the
# grader's own memory (a list of a million literals), so a file past this is rejected unparsed:
# impl/transformer.py is ~40 kB, the largest real-world base ~0.1 MB; 1 MiB is 10x that.
MAX_SOURCE = 1 << 20


def problems(source: str, filename: str = "<submission>") -> list[str]:
    """Why `source` is rejected: ["line 3, column 9: does not parse (invalid syntax)"] or ["line 3:
    imports impl.transformer"] (import statements, and __import__ / importlib.import_module
    called with a literal name); [] if it is accepted."""
    try:
        with _AST_LOCK:
            tree = ast.parse(source, filename)
    except SyntaxError as e:
        return [f"line {e.lineno}, column {e.offset}: does not parse ({e.msg})"]
    except (ValueError, RecursionError, MemoryError) as e:  # null bytes, too deep a nesting
        return [f"does not parse ({type(e).__name__}: {str(e)[:100] or 'too deeply nested'})"]
    found = []
    try:
        for node in ast.walk(tree):
            if not isinstance(node, ast.stmt | ast.expr):
                continue  # imports are statements or calls, which carry their line
            for name in _imported(node):
                if name.split(".")[0] in PROTECTED:
                    found.append(f"line {node.lineno}: imports {name}")
    except RecursionError:
        return ["does not parse (RecursionError: too deeply nested)"]
    return found


def _imported(node: ast.AST) -> list[str]:
    if isinstance(node, ast.Import):
        return [alias.name for alias in node.names]
    if isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
        return [node.module]
    if isinstance(node, ast.Call) and node.args:
        func = node.func
        callee = func.attr if isinstance(func, ast.Attribute) else getattr(func, "id", "")
        arg = node.args[0]
        if callee in ("__import__", "import_module") and isinstance(arg, ast.Constant):
            return [str(arg.value)]
    return []


def check_submission(path: Path) -> list[str]:
    """The problems of a .py file, or of every .py file in a package directory. Nothing but a
    regular file is ever opened (lstat first, then O_NOFOLLOW | O_NONBLOCK and fstat): a link,
    a named pipe, a socket, a device or a file past the staging cap is not read here but left
    to staging (harness.isolation.staging), which refuses it with its name; a folder of more
    entries than staging allows is read no further for the same reason."""
    folder_given = stat.S_ISDIR(os.lstat(path).st_mode)
    if folder_given:
        files, seen = [], 0
        for folder, dirs, names in os.walk(path, followlinks=False):
            seen += len(dirs) + len(names)
            if seen > MAX_ENTRIES:
                break
            dirs[:] = sorted(d for d in dirs if d != "__pycache__")
            files += [Path(folder) / n for n in sorted(names) if n.endswith(".py")]
    else:
        files = [path]
    found = []
    for file in files:
        where = file.relative_to(path) if folder_given else Path(file.name)
        size = os.lstat(file).st_size
        if stat.S_ISREG(os.lstat(file).st_mode) and size > MAX_SOURCE:
            found.append(
                f"{where} does not parse (it is {size} bytes; the check parses a source file "
                f"of at most {MAX_SOURCE >> 20} MiB)"
            )
            continue
        text = _read(file, str(where))
        if text is not None:
            found += [f"{where} {p}" for p in problems(text, str(where))]
    return found


def _read(file: Path, where: str) -> str | None:
    """The text of a regular file within the staging cap; None for anything staging refuses."""
    info = os.lstat(file)
    if kind_problem(info.st_mode, where) or size_problem(info.st_size, where):
        return None
    try:
        fd = open_regular(file, where, info)
    except UnsafeInput:
        return None
    try:
        return read_capped(fd, MAX_SOURCE, where).decode("utf-8", errors="replace")
    except UnsafeInput:
        return None
    finally:
        os.close(fd)
