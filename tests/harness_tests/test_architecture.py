"""The layout's own rules, read from the source: no import circle among the project's modules (with
the edges import-linter cannot see: imports inside functions and importlib.import_module by
name), no harness module over 700 lines, every top-level folder of harness/ named by its role,
tests/harness_tests mirroring harness/, each command of `xfmr --help` in its section's folder, and
no dask on the default paths."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PACKAGES = ("harness", "oracle", "impl", "mutants", "tasks", "demos")
MAX_LINES = 700
# harness/'s folders and the role each plays (ARCHITECTURE.md says more)
ROLES = {
    "engine": "running a suite over subjects: executors, cache, coverage",
    "isolation": "the process boundary: sandbox, worker, the worker's own code",
    "jobs": "the views: matrix, grade, mutation score, autograder",
    "reports": "renderers and the atomic writer",
    "shared_tests": "the laws (checks) and what they judge with",
    "tools": "the course's measurements, whose results go under results/",
    "students": "the students' commands on their own code: start, check, pytest --xfmr, diff",
    "oracle_checks": "the oracle put to use on a model: compare, smoke",
    "data": "expectations and derived figures (no code)",
}


def modules() -> dict[str, Path]:
    found = {}
    for package in PACKAGES:
        for path in sorted((ROOT / package).rglob("*.py")):
            parts = path.relative_to(ROOT).with_suffix("").parts
            name = ".".join(parts[:-1] if parts[-1] == "__init__" else parts)
            found[name] = path
    return found


def imported(name: str, path: Path, known: set[str]) -> set[str]:
    """The project's modules `name` imports, anywhere in it (functions included), by statement or
    by importlib.import_module("literal")."""
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    targets: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            targets.update(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                up = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join(up + ([base] if base else []))
            targets.add(base)
            targets.update(f"{base}.{a.name}" for a in node.names)  # a submodule imported by name
        elif (
            isinstance(node, ast.Call)
            and isinstance(node.func, ast.Attribute)
            and node.func.attr == "import_module"
            and node.args
            and isinstance(node.args[0], ast.Constant)
            and isinstance(node.args[0].value, str)
        ):
            targets.add(node.args[0].value)
    return {t for t in targets if t in known and t != name}


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components of more than one module (Tarjan's algorithm)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on: set[str] = set()
    found: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on.add(v)
        for w in sorted(graph[v]):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    sys.setrecursionlimit(max(sys.getrecursionlimit(), 10_000))
    for v in sorted(graph):
        if v not in index:
            visit(v)
    return found


@pytest.mark.slow
def test_no_import_circle_including_lazy_and_by_name_imports():
    found = modules()
    known = set(found)
    # a package's __init__ importing its own submodules is not a circle of the design
    graph = {
        n: {t for t in imported(n, p, known) if not (p.name == "__init__.py" and t.startswith(n))}
        for n, p in found.items()
    }
    assert cycles(graph) == []


def test_the_cycle_finder_finds_a_circle():
    graph = {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}
    assert cycles(graph) == [["a", "b", "c"]]
    assert cycles({"a": {"b"}, "b": set()}) == []


def test_no_harness_module_over_700_lines():
    long = {
        str(p.relative_to(ROOT)): n
        for p in (ROOT / "harness").rglob("*.py")
        if (n := len(p.read_text().splitlines())) > MAX_LINES
    }
    assert long == {}


def test_every_folder_of_harness_is_named_by_its_role():
    folders = {
        p.name for p in (ROOT / "harness").iterdir() if p.is_dir() and p.name != "__pycache__"
    }
    assert folders == set(ROLES)
    for name in folders - {"data"}:
        init = ROOT / "harness" / name / "__init__.py"
        assert ast.get_docstring(ast.parse(init.read_text())), f"harness/{name} says no role"


# folders of tests/harness_tests that hold data or subjects, not the tests of a subpackage
TEST_DATA = {"realworld": "the real-world-style set, read by tests of several subpackages"}


def test_the_tests_of_harness_mirror_its_subpackages():
    # a subpackage's tests live in the folder of its name; top-level modules' tests beside them
    tests = ROOT / "tests" / "harness_tests"
    folders = {p.name for p in tests.iterdir() if p.is_dir() and not p.name.startswith((".", "_"))}
    code = set(ROLES) - {"data"}
    assert folders - set(TEST_DATA) == code, "tests/harness_tests/ must mirror harness/"
    assert all(any((tests / name).glob("test_*.py")) for name in code)
    for path in tests.glob("test_*.py"):  # a top-level test names a top-level module it tests
        stem = path.stem.removeprefix("test_")
        assert (
            stem in {"architecture", "examples_sync"} or (ROOT / "harness" / f"{stem}.py").exists()
        ), path


# `xfmr --help`'s sections (harness/cli.py) and the folders their commands' modules live in: an
# audience's commands in the room that serves it. Operations (the warm fork server) live beside
# what they operate, in isolation/; summarize renders grade-batch's tables, a report.
SECTION_HOMES = {
    "your own code": ("harness.students",),
    "grading": ("harness.jobs", "harness.reports"),
    "the course's measurements (results/)": ("harness.tools",),
    "the oracle": ("harness.oracle_checks",),
    "demos": ("demos",),
    "operations": ("harness.isolation",),
}


def test_each_command_lives_in_its_sections_folder():
    from harness import cli

    assert [title for title, _ in cli.SECTIONS] == list(SECTION_HOMES)
    assert cli.SECTIONS[0][0] == "your own code"  # the students' commands first
    found = modules()
    for title, commands in cli.SECTIONS:
        for c in commands:
            assert c.module.startswith(tuple(f"{h}." for h in SECTION_HOMES[title])), (title, c)
            assert c.module in found, c
    # a command on two lines runs its first line's module, which hands the other's runs on
    for name, (module, _) in cli.COMMANDS.items():
        others = {c.module for _, cs in cli.SECTIONS for c in cs if c.name == name} - {module}
        assert others <= imported(module, found[module], set(found)), (name, others)


def test_the_students_commands_are_the_students_modules():
    # every module of harness/students/ is a students' command (or the pytest plugin); the
    # pytest11 entry point names the plugin there
    from harness import cli

    commands = {c.module for c in cli.SECTIONS[0][1]} | {"harness.students.pytest_plugin"}
    here = {n for n in modules() if n.startswith("harness.students.")}
    assert here == commands
    assert 'xfmr = "harness.students.pytest_plugin"' in (ROOT / "pyproject.toml").read_text()


def test_the_default_paths_never_import_dask():
    code = (
        "import sys\n"
        "import harness.cli, harness.jobs.matrix, harness.jobs.grade, harness.jobs.mutation_score\n"
        "import harness.engine.executors, harness.students.selfcheck\n"
        "from harness.engine.executors import executor\n"
        "executor(None, 1).close()\n"
        "loaded = sorted(m for m in sys.modules if m.split('.')[0] in ('dask', 'distributed'))\n"
        "assert not loaded, loaded\n"
    )
    done = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
