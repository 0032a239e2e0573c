"""The layout's own rules, read from the source: no import circle among the project's modules (with
the edges import-linter cannot see: imports inside functions and importlib.import_module by
name), the records and the limits at the bottom of the imports, no module over 700 lines (the
packages' and the tests', test data apart), every top-level folder of harness/ named by its role,
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
# Files of tests/ that are data read by tests, not code: exempt from MAX_LINES, each with why.
LONG_TEST_DATA = {
    "tests/harness_tests/realworld/variants.py": "the real-world set's single-fault variants, one "
    "record each (patch, expected verdicts, diagnosis): a table, read by run_set.py",
}
# The floor: plain-data modules that import the standard library and each other only, so that
# a record, an outcome or a worker's limits never load the sandbox, torch or the judge
# (pyproject.toml's "at the bottom" contract names the rooms above them).
FLOOR = (
    "harness.records",
    "harness.outcomes",
    "harness.subjects",
    "harness.shared_tests.record",
    "harness.isolation.limits",
    "harness.isolation.tier_names",
)
# What the floor may reach besides itself: the mutants' records, which a subject's payload reads
# (mutants.catalog: patches as data), and the student kit's sealed texts (harness.sealed: where a
# module's source is not on the student's disk), both of the standard library alone.
FLOOR_PACKAGES = ("mutants",)
FLOOR_READS = ("harness.sealed",)
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


def external(path: Path) -> set[str]:
    """The top-level names of what `path` imports from outside the project (functions included)."""
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            found.update(a.name.partition(".")[0] for a in node.names)
        elif isinstance(node, ast.ImportFrom) and not node.level and node.module:
            found.add(node.module.partition(".")[0])
    return found - set(PACKAGES)


def closure(start: str, found: dict[str, Path]) -> set[str]:
    """Every project module that importing `start` may run: what it imports, anywhere in it, and
    what those import, with each one's enclosing packages (their __init__ runs first)."""
    known, seen, todo = set(found), set(), [start]
    while todo:
        name = todo.pop()
        if name in seen:
            continue
        seen.add(name)
        parts = name.split(".")
        todo += [".".join(parts[:i]) for i in range(1, len(parts))]
        todo += sorted(imported(name, found[name], known))
    return seen


def test_the_records_and_the_limits_are_at_the_bottom():
    found = modules()
    allowed = {*FLOOR, *FLOOR_READS} | {n for n in found if n.split(".")[0] in FLOOR_PACKAGES}
    stdlib = set(sys.stdlib_module_names) | {"__future__"}
    for name in FLOOR:
        reached = closure(name, found)
        packages = {n for n in reached if found[n].name == "__init__.py"}
        assert reached - packages <= allowed, (name, sorted(reached - packages - allowed))
        for n in reached:
            assert external(found[n]) <= stdlib, (name, n, sorted(external(found[n]) - stdlib))
        for n in packages - allowed:  # a package on the way runs its __init__: nothing in it
            assert not imported(n, found[n], set(found)), (name, n)


def test_the_floor_check_sees_a_module_above_it(tmp_path):
    path = tmp_path / "records.py"
    path.write_text("def f():\n    from harness.options import SANDBOX\n")
    found = modules() | {"harness.records": path}
    assert "harness.options" in closure("harness.records", found)
    assert "harness.isolation.sandbox" in closure("harness.records", found)


def test_no_module_over_700_lines():
    # every package's modules and the tests' (their data files apart, LONG_TEST_DATA)
    paths = [p for folder in (*PACKAGES, "tests") for p in sorted((ROOT / folder).rglob("*.py"))]
    long = {
        rel: n
        for p in paths
        if (n := len(p.read_text().splitlines())) > MAX_LINES
        and (rel := str(p.relative_to(ROOT))) not in LONG_TEST_DATA
    }
    assert long == {}
    assert all((ROOT / rel).is_file() for rel in LONG_TEST_DATA)  # no stale exemption


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
            stem in {"architecture", "examples_sync", "docs"}
            or (ROOT / "harness" / f"{stem}.py").exists()
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
    # a part of one command, imported by that command alone
    parts = {"harness.students.draws_ahead": "harness.students.selfcheck"}
    here = {n for n in modules() if n.startswith("harness.students.")}
    assert here == commands | set(parts)
    for part, command in parts.items():
        users = [p for p in (ROOT / "harness").rglob("*.py") if part in imported_by(p)]
        assert [ROOT / (command.replace(".", "/") + ".py")] == users, (part, users)


def imported_by(path: Path) -> set[str]:
    """The modules a file imports, anywhere in it (`from a.b import c` counts a.b and a.b.c)."""
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            found |= {a.name for a in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
            found |= {node.module} | {f"{node.module}.{a.name}" for a in node.names}
    return found
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
