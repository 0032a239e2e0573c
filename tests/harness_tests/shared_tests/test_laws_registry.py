"""The laws and their probes: one family per module on each side of the boundary, every probe a
check names registered in the worker, and the matrix's columns one explicit ORDER."""

from __future__ import annotations

import ast
import inspect
from pathlib import Path

import harness.shared_tests.laws as laws_package
from harness.isolation.child import probes
from harness.shared_tests.laws import ORDER, SHARED_TESTS

LAWS = Path(laws_package.__file__).parent
PROBES = Path(probes.__file__).parent
# Who else asks a worker for a probe by name: the diagnosis (through harness.grading).
OTHER_CALLERS = [Path("harness/shared_tests/diagnosis.py"), Path("harness/grading.py")]


def probes_named(path: Path) -> set[str]:
    """Every probe a module asks for: the string literal first argument of a call to `call`."""
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if (
            isinstance(node, ast.Call)
            and isinstance(node.func, ast.Name)
            and node.func.id == "call"
            and node.args
            and isinstance(node.args[0], ast.Constant)
            and isinstance(node.args[0].value, str)
        ):
            found.add(node.args[0].value)
    return found


def test_every_probe_a_check_names_is_registered_in_the_worker():
    root = Path(__file__).resolve().parents[3]
    callers = sorted(LAWS.glob("*.py")) + [root / p for p in OTHER_CALLERS]
    named = {p: probes_named(p) for p in callers}
    missing = {
        p.name: sorted(n - set(probes.PROBES)) for p, n in named.items() if n - set(probes.PROBES)
    }
    assert not missing, f"checks name probes the worker does not have: {missing}"
    # and the finder finds something: every family module of laws asks for at least one probe
    assert all(named[p] for p in callers if p.parent == LAWS and p.name != "__init__.py")


def test_each_family_of_laws_has_its_probe_module_and_calls_its_own_probes_first():
    families = {p.stem for p in LAWS.glob("*.py")} - {"__init__"}
    assert families <= {p.stem for p in PROBES.glob("*.py")}
    for family in sorted(families):
        own = {
            name
            for name, fn in probes.PROBES.items()
            if Path(inspect.getsourcefile(fn)).stem == family
        }
        # a family's probes are called by that family's checks (shared ones may be called by
        # others too: the decoding tests read the interface's parameter_shapes)
        assert own <= probes_named(LAWS / f"{family}.py") | probes_named_elsewhere(), family


def probes_named_elsewhere() -> set[str]:
    root = Path(__file__).resolve().parents[3]
    return set().union(*(probes_named(root / p) for p in OTHER_CALLERS))


def test_order_is_the_registry_and_each_test_lives_in_its_family():
    assert tuple(t.name for t in SHARED_TESTS) == ORDER
    for t in SHARED_TESTS:
        assert Path(inspect.getsourcefile(t.check)).parent == LAWS
