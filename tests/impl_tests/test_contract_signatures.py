"""impl/contract.pyi is the contract's signatures: both implementations match it exactly, name for
name, parameter for parameter (kind, order, default), and the config's fields with their
defaults. A drift between the stub and either implementation fails here by name."""

import ast
import dataclasses
import inspect
from pathlib import Path

import pytest

from impl import torch_copy, transformer

STUB = ast.parse((Path(__file__).resolve().parents[2] / "impl" / "contract.pyi").read_text())


def _stub_functions(body) -> dict[str, ast.FunctionDef]:
    return {node.name: node for node in body if isinstance(node, ast.FunctionDef)}


def _params(node: ast.FunctionDef) -> list[tuple[str, str, object]]:
    """(name, kind, default) of each parameter in the stub, self excluded."""
    args = node.args
    positional = [*args.posonlyargs, *args.args]
    defaults = [inspect.Parameter.empty] * (len(positional) - len(args.defaults))
    defaults += [ast.literal_eval(d) for d in args.defaults]
    out = [(a.arg, "positional", d) for a, d in zip(positional, defaults, strict=True)]
    out += [
        (a.arg, "keyword", inspect.Parameter.empty if d is None else ast.literal_eval(d))
        for a, d in zip(args.kwonlyargs, args.kw_defaults, strict=True)
    ]
    return [p for p in out if p[0] != "self"]


def _signature(fn) -> list[tuple[str, str, object]]:
    kinds = {inspect.Parameter.KEYWORD_ONLY: "keyword"}
    return [
        (p.name, kinds.get(p.kind, "positional"), p.default)
        for p in inspect.signature(fn).parameters.values()
        if p.name != "self"
    ]


FUNCTIONS = _stub_functions(STUB.body)
CLASSES = {node.name: node for node in STUB.body if isinstance(node, ast.ClassDef)}
METHODS = _stub_functions(CLASSES["Transformer"].body)


@pytest.mark.parametrize("module", [transformer, torch_copy], ids=["impl", "torch_copy"])
@pytest.mark.parametrize("name", sorted(FUNCTIONS))
def test_module_functions_match_the_stub(module, name):
    assert _signature(getattr(module, name)) == _params(FUNCTIONS[name])


@pytest.mark.parametrize("module", [transformer, torch_copy], ids=["impl", "torch_copy"])
@pytest.mark.parametrize("name", sorted(METHODS))
def test_transformer_methods_match_the_stub(module, name):
    assert _signature(getattr(module.Transformer, name)) == _params(METHODS[name])


@pytest.mark.parametrize("module", [transformer, torch_copy], ids=["impl", "torch_copy"])
def test_config_fields_and_defaults_match_the_stub(module):
    stub = [
        (n.target.id, ast.literal_eval(n.value) if n.value is not None else None)
        for n in CLASSES["TransformerConfig"].body
        if isinstance(n, ast.AnnAssign)
    ]
    fields = [
        (f.name, None if f.default is dataclasses.MISSING else f.default)
        for f in dataclasses.fields(module.TransformerConfig)
    ]
    assert fields == stub
