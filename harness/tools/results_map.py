"""The map of results/: each figure's command, the commit it was measured at, and the code it
measures, with a check that flags a figure whose code has changed since.

results/manifest.json is the one home of that map (results/README.md is rendered from it). Each
entry names the code it `depends` on (files or folders) and `code`, a digest of that code as it
was when the figure was measured. The digest reads Python as its syntax tree without docstrings
(comments, formatting, docstrings and type annotations do not change a figure; any other change
may), and every
other file as bytes. A figure whose code digest differs from today's is stale: the check fails
unless the entry says why it still stands or what it waits for (`stale`).

    python -m harness.tools.results_map --check                # what CI's test asserts
    python -m harness.tools.results_map --refresh FILE ...     # after regenerating FILE
    python -m harness.tools.results_map --unchanged FILE ...   # a rename: the figure stands
    python -m harness.tools.results_map --readme               # rewrite results/README.md

`--refresh` records today's digest and the checkout's commit, and drops the `stale` note: run it
only in the commit that regenerates the figure. `--unchanged` records today's digest and keeps
the measured commit: only for a change that cannot move the figure (a name changed everywhere, a
helper moved), said in that commit's message.
"""

from __future__ import annotations

import argparse
import ast
import hashlib
import json
import subprocess
import sys
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
RESULTS = ROOT / "results"
MANIFEST = RESULTS / "manifest.json"
README = RESULTS / "README.md"
OWN = {"README.md", "manifest.json"}  # the map itself, not figures
SKIP_PARTS = {"__pycache__", ".mypy_cache", ".ruff_cache"}

# How a file's text is read: from the working tree, or from a commit (bootstrapping a digest).
Reader = Callable[[str], bytes | None]


@dataclass(frozen=True)
class Entry:
    path: str  # relative to results/
    shows: str
    command: str
    depends: tuple[str, ...]
    measured: str  # the commit whose code the figure was measured on
    code: str  # the digest of `depends` at that commit
    stale: str = ""  # why a figure whose code changed still stands, or what it waits for

    def as_json(self) -> dict[str, object]:
        out: dict[str, object] = {
            "shows": self.shows,
            "command": self.command,
            "depends": list(self.depends),
            "measured": self.measured,
            "code": self.code,
        }
        if self.stale:
            out["stale"] = self.stale
        return out


def load(path: Path = MANIFEST) -> dict[str, Entry]:
    raw = json.loads(path.read_text())
    entries = {}
    for name, fields in raw.items():
        unknown = set(fields) - {"shows", "command", "depends", "measured", "code", "stale"}
        if unknown:
            raise ValueError(f"{path}: {name}: unknown fields {sorted(unknown)}")
        entries[name] = Entry(
            path=name,
            shows=fields["shows"],
            command=fields["command"],
            depends=tuple(fields["depends"]),
            measured=fields["measured"],
            code=fields["code"],
            stale=fields.get("stale", ""),
        )
    return entries


def save(entries: dict[str, Entry], path: Path = MANIFEST) -> None:
    data = {name: entries[name].as_json() for name in sorted(entries)}
    path.write_text(json.dumps(data, indent=2, ensure_ascii=False) + "\n")


def normalized(name: str, data: bytes) -> bytes:
    """What of a file can change a figure: Python's syntax tree without docstrings, else bytes."""
    if not name.endswith(".py"):
        return data
    try:
        tree = ast.parse(data)
    except SyntaxError:
        return data
    for node in ast.walk(tree):
        body = getattr(node, "body", None)
        if (
            isinstance(node, ast.Module | ast.ClassDef | ast.FunctionDef | ast.AsyncFunctionDef)
            and isinstance(body, list)
            and body
            and isinstance(body[0], ast.Expr)
            and isinstance(body[0].value, ast.Constant)
            and isinstance(body[0].value.value, str)
        ):
            node.body = body[1:] or [ast.Pass()]
    return ast.dump(_Unannotated().visit(tree)).encode()


class _Unannotated(ast.NodeTransformer):
    """Type annotations change no figure: dropped from arguments, returns and assignments."""

    def visit_arg(self, node: ast.arg) -> ast.arg:
        node.annotation = None
        return node

    def visit_FunctionDef(self, node: ast.FunctionDef) -> ast.FunctionDef:
        node.returns = None
        self.generic_visit(node)
        return node

    def visit_AsyncFunctionDef(self, node: ast.AsyncFunctionDef) -> ast.AsyncFunctionDef:
        node.returns = None
        self.generic_visit(node)
        return node

    def visit_AnnAssign(self, node: ast.AnnAssign) -> ast.AnnAssign:
        # kept (a dataclass field is one), its type made a placeholder
        node.annotation = ast.Constant(None)
        return node


def tracked(root: Path = ROOT, commit: str | None = None) -> list[str]:
    """The files git tracks (at `commit`, or in the index), relative to the checkout."""
    command = ["git", "ls-tree", "-r", "--name-only", commit] if commit else ["git", "ls-files"]
    listed = subprocess.run(command, cwd=root, capture_output=True, text=True, check=True)
    return listed.stdout.splitlines()


def files_of(depends: Iterable[str], names: list[str]) -> list[str]:
    """The tracked files a dependency list names: a file itself, a folder everything under it."""
    chosen = set()
    for dep in depends:
        dep = dep.rstrip("/")
        for name in names:
            if (name == dep or name.startswith(dep + "/")) and not SKIP_PARTS & set(
                name.split("/")
            ):
                chosen.add(name)
    return sorted(chosen)


def digest(depends: Iterable[str], names: list[str], read: Reader) -> str:
    h = hashlib.sha256()
    for name in files_of(depends, names):
        data = read(name)
        if data is None:
            continue
        h.update(name.encode() + b"\0")
        h.update(hashlib.sha256(normalized(name, data)).digest())
    return h.hexdigest()[:16]


def working_tree(root: Path = ROOT) -> Reader:
    def read(name: str) -> bytes | None:
        path = root / name
        return path.read_bytes() if path.is_file() else None

    return read


def at_commit(commit: str, root: Path = ROOT) -> Reader:
    def read(name: str) -> bytes | None:
        shown = subprocess.run(["git", "show", f"{commit}:{name}"], cwd=root, capture_output=True)
        return shown.stdout if shown.returncode == 0 else None

    return read


def missing_dependencies(entries: dict[str, Entry], names: list[str]) -> list[str]:
    """Dependencies that name nothing tracked: a renamed file would otherwise never flag."""
    return [
        f"{e.path}: depends on {dep!r}, which names no tracked file"
        for e in entries.values()
        for dep in e.depends
        if not files_of([dep], names)
    ]


def problems(root: Path = ROOT) -> list[str]:
    """Everything that breaks the map: figures not in it, entries with no figure, dependencies
    that name nothing, a README not rendered from it, and stale figures with no note."""
    entries = load(root / "results" / "manifest.json")
    names = tracked(root)
    found = []
    figures = {
        p.relative_to(root / "results").as_posix()
        for p in (root / "results").rglob("*")
        if p.is_file() and p.name not in OWN
    }
    found += [
        f"results/{f} is not in results/manifest.json" for f in sorted(figures - set(entries))
    ]
    found += [
        f"results/manifest.json lists {e}, which is absent" for e in sorted(set(entries) - figures)
    ]
    found += missing_dependencies(entries, names)
    readme = root / "results" / "README.md"
    if not readme.exists() or readme.read_text() != render(entries):
        found.append("results/README.md is not rendered from manifest.json (--readme rewrites it)")
    read = working_tree(root)
    for e in entries.values():
        if digest(e.depends, names, read) != e.code and not e.stale:
            changed = changed_files(e, root)
            found.append(
                f"results/{e.path} is stale: its code changed since {e.measured}"
                + (f" ({', '.join(changed)})" if changed else "")
                + "; regenerate it and --refresh, or say in its `stale` why it stands"
            )
    return found


def changed_files(e: Entry, root: Path = ROOT) -> list[str]:
    """The dependency files whose digest differs between the measured commit and now (empty
    when the measured commit is not in this clone's history)."""
    try:
        then_names = tracked(root, e.measured)
    except subprocess.CalledProcessError:
        return []
    now_names = tracked(root)
    then, now = at_commit(e.measured, root), working_tree(root)
    changed = []
    for name in sorted(set(files_of(e.depends, then_names)) | set(files_of(e.depends, now_names))):
        a, b = then(name), now(name)
        if (a is None) != (b is None) or (
            a is not None and b is not None and normalized(name, a) != normalized(name, b)
        ):
            changed.append(name)
    return changed


def render(entries: dict[str, Entry]) -> str:
    lines = [
        "# results/",
        "",
        "Every figure the project claims, with the command that made it, the commit whose code it",
        "was measured on and the code it measures. Rendered from `manifest.json` by",
        "`python -m harness.tools.results_map --readme`; CI's "
        "`tests/harness_tests/tools/test_results_map.py`",
        "fails when a figure's code changed after it was measured and no note says why it stands.",
        "",
    ]
    folders: dict[str, list[Entry]] = {}
    for e in sorted(entries.values(), key=lambda e: e.path):
        folders.setdefault(e.path.rpartition("/")[0] or ".", []).append(e)
    for folder, group in folders.items():
        lines += [f"## {folder}/", ""]
        for e in group:
            name = e.path.rpartition("/")[2]
            lines.append(f"- **[{name}]({e.path})**: {e.shows}")
            lines.append(f"  - command: `{e.command}`")
            lines.append(
                f"  - measured at {e.measured}, on {', '.join(f'`{d}`' for d in e.depends)}"
            )
            if e.stale:
                lines.append(f"  - **stale**: {e.stale}")
        lines.append("")
    return "\n".join(lines)


def head(root: Path = ROOT) -> str:
    shown = subprocess.run(
        ["git", "rev-parse", "--short", "HEAD"],
        cwd=root,
        capture_output=True,
        text=True,
        check=True,
    )
    return shown.stdout.strip()


def refresh(paths: list[str], root: Path = ROOT, remeasured: bool = True) -> None:
    """Record today's code digest for each figure: remeasured (the figure was regenerated on
    this checkout's code) or not (the code changed in a way that cannot move it)."""
    entries = load(root / "results" / "manifest.json")
    names = tracked(root)
    for raw in paths:
        name = Path(raw).as_posix().removeprefix("results/")
        if name not in entries:
            raise SystemExit(f"results/{name} is not in results/manifest.json")
        e = entries[name]
        code = digest(e.depends, names, working_tree(root))
        if remeasured:
            entries[name] = Entry(e.path, e.shows, e.command, e.depends, head(root), code)
        else:
            entries[name] = Entry(e.path, e.shows, e.command, e.depends, e.measured, code, e.stale)
    save(entries, root / "results" / "manifest.json")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m harness.tools.results_map", description=__doc__.split("\n\n")[0]
    )
    parser.add_argument(
        "--check", action="store_true", help="list what breaks the map; exit 1 if anything does"
    )
    parser.add_argument(
        "--refresh", nargs="+", metavar="FILE", help="record FILE as measured on today's code"
    )
    parser.add_argument(
        "--readme", action="store_true", help="rewrite results/README.md from the manifest"
    )
    parser.add_argument(
        "--unchanged",
        nargs="+",
        metavar="FILE",
        help="record today's code for FILE, measured commit kept (a rename cannot move a figure)",
    )
    args = parser.parse_args(argv)
    if args.refresh:
        refresh(args.refresh)
    if args.unchanged:
        refresh(args.unchanged, remeasured=False)
    if args.readme or args.refresh or args.unchanged:
        README.write_text(render(load()))
    if args.check or not (args.refresh or args.readme or args.unchanged):
        found = problems()
        for line in found:
            print(line)
        print(f"{len(found)} problem(s) in results/'s map")
        return 1 if found else 0
    return 0


if __name__ == "__main__":
    sys.exit(main())
