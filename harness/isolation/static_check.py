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
import threading
from pathlib import Path

from harness.isolation.sandbox import PROJECT_PACKAGES as PROTECTED

# CPython 3.11's parser keeps its recursion depth per interpreter, not per thread: two threads
# parsing at once (grade-batch) fail with "AST constructor recursion depth mismatch".
_AST_LOCK = threading.Lock()


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
    """The problems of a .py file, or of every .py file in a package directory (links are not
    followed: staging refuses them)."""
    if path.is_dir():
        files = []
        for folder, dirs, names in os.walk(path, followlinks=False):
            dirs[:] = sorted(d for d in dirs if d != "__pycache__")
            files += [Path(folder) / n for n in sorted(names) if n.endswith(".py")]
    else:
        files = [path]
    found = []
    for file in files:
        if file.is_symlink():
            continue
        text = file.read_bytes().decode("utf-8", errors="replace")
        where = file.relative_to(path) if path.is_dir() else file.name
        found += [f"{where} {p}" for p in problems(text, str(where))]
    return found
