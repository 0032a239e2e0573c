"""The examples/ files that are generated stay what their generator gives.

Two examples are variants of the real-world set (realworld/run_set.py --write-examples writes
them): each must equal its variant's source, byte for byte, so a change to a base or a patch
shows up here and not as a README walkthrough that silently stopped matching the set. The
faulty example is the correct one with its one fault: the code differs in exactly one statement.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest
from realworld import run_set

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"


@pytest.mark.parametrize("variant", sorted(run_set.EXAMPLES))
def test_a_generated_example_equals_its_variant(variant):
    record = {r["id"]: r for r in run_set.load_variants()}[variant]
    path = run_set.EXAMPLES[variant]
    assert path.read_text() == run_set.variant_source(record), (
        f"{path.name} is not what {variant} gives: run "
        "`python tests/harness_tests/realworld/run_set.py --write-examples`"
    )


def _statements(path: Path) -> list[str]:
    """Every statement of the module, docstrings and comments aside, as normalised source."""
    tree = ast.parse(path.read_text())
    found = []
    for node in ast.walk(tree):
        body = getattr(node, "body", None)
        if isinstance(body, list) and body and isinstance(body[0], ast.Expr):
            if isinstance(body[0].value, ast.Constant) and isinstance(body[0].value.value, str):
                body.pop(0)  # a docstring
    for node in ast.walk(tree):
        if isinstance(node, ast.stmt) and not isinstance(
            node, ast.FunctionDef | ast.ClassDef | ast.If | ast.For | ast.With | ast.Try
        ):
            found.append(ast.unparse(node))
    return found


def test_the_faulty_example_is_the_correct_one_with_one_statement_changed():
    correct = _statements(EXAMPLES / "correct_submission.py")
    faulty = _statements(EXAMPLES / "faulty_submission.py")
    assert len(correct) == len(faulty)
    changed = [(a, b) for a, b in zip(correct, faulty, strict=True) if a != b]
    assert len(changed) == 1, changed
    assert "src_allowed" in changed[0][0] and "src_allowed" not in changed[0][1]
