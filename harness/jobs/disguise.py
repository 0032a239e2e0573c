"""Semantics-preserving rewrites of a subject's source, drawn afresh for each mutation-score run,
so that a student's suite cannot recognise a subject by its text (a hash of impl's source, the
line a mutant changed) and must tell correct from faulty by behaviour.

Each rewrite keeps the module's behaviour and its public names (the contract's classes,
functions, parameters, attributes and state_dict names):
- comments, docstrings and layout go (an ast round trip);
- local variables of every function get random names (parameters, globals, closures, names
  bound by imports or by `except ... as` kept consistent);
- runs of consecutive function definitions (at module level and in class bodies) are shuffled
  where no definition's decorators or defaults name another of the run and no two bind one
  name (overloads, redefinitions).
"""

from __future__ import annotations

import ast
import builtins
import random
from typing import cast

_SCOPES = (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda, ast.ClassDef)
_Definition = ast.FunctionDef | ast.AsyncFunctionDef


def disguise(source: str, rng: random.Random) -> str:
    """`source` rewritten under draws from `rng` (same rng state, same text)."""
    tree = ast.parse(source)
    for node in ast.walk(tree):
        if isinstance(node, ast.Module | ast.ClassDef | ast.FunctionDef | ast.AsyncFunctionDef):
            _drop_docstring(node)
    reserved = _module_names(tree) | set(dir(builtins))
    for node in ast.walk(tree):
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
            _rename_locals(node, reserved, rng)
    _shuffle_runs(tree.body, rng)
    for node in ast.walk(tree):
        if isinstance(node, ast.ClassDef):
            _shuffle_runs(node.body, rng)
    return ast.unparse(tree) + "\n"


def _drop_docstring(
    node: ast.Module | ast.ClassDef | ast.FunctionDef | ast.AsyncFunctionDef,
) -> None:
    body = node.body
    if body and isinstance(body[0], ast.Expr) and isinstance(body[0].value, ast.Constant):
        if isinstance(body[0].value.value, str):
            body[:1] = [] if len(body) > 1 else [ast.Pass()]


def _module_names(tree: ast.Module) -> set[str]:
    """Every name bound at module level (imports, definitions, assignments)."""
    names: set[str] = set()
    for stmt in tree.body:
        if isinstance(stmt, ast.Import | ast.ImportFrom):
            names |= {(a.asname or a.name).split(".")[0] for a in stmt.names}
        elif isinstance(stmt, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
            names.add(stmt.name)
        else:
            names |= {n.id for n in ast.walk(stmt) if isinstance(n, ast.Name)}
    return names


def _own_nodes(func: ast.AST):
    """The nodes of a function's body that belong to its own scope (not nested functions,
    lambdas or classes, whose names are their own)."""
    todo = list(ast.iter_child_nodes(func))
    while todo:
        node = todo.pop()
        yield node
        if not isinstance(node, _SCOPES):
            todo.extend(ast.iter_child_nodes(node))


def _rename_locals(func: ast.FunctionDef | ast.AsyncFunctionDef, reserved: set[str], rng) -> None:
    args = func.args
    params = {a.arg for a in [*args.posonlyargs, *args.args, *args.kwonlyargs]}
    params |= {a.arg for a in (args.vararg, args.kwarg) if a is not None}
    own = list(_own_nodes(func))
    stored = {n.id for n in own if isinstance(n, ast.Name) and not isinstance(n.ctx, ast.Load)}
    keep = params | reserved
    for node in own:
        if isinstance(node, ast.Global | ast.Nonlocal):
            keep |= set(node.names)
        elif isinstance(node, ast.Import | ast.ImportFrom):
            keep |= {(a.asname or a.name).split(".")[0] for a in node.names}
        elif isinstance(node, _SCOPES):  # a nested scope may read the name as a closure
            keep |= {n.id for n in ast.walk(node) if isinstance(n, ast.Name)}
            keep |= {getattr(node, "name", "")}
    names = sorted(stored - keep)
    fresh = {name: f"_{rng.getrandbits(40):010x}" for name in names}
    for node in own:
        if isinstance(node, ast.Name) and node.id in fresh:
            node.id = fresh[node.id]
        elif isinstance(node, ast.ExceptHandler) and node.name in fresh:
            node.name = fresh[node.name]


def _shuffle_runs(body: list[ast.stmt], rng: random.Random) -> None:
    i = 0
    while i < len(body):
        j = i
        while j < len(body) and isinstance(body[j], ast.FunctionDef | ast.AsyncFunctionDef):
            j += 1
        run = body[i:j]  # definitions only
        if len(run) > 1 and not _linked(cast(list[_Definition], run)):
            rng.shuffle(run)
            body[i:j] = run
        i = max(j, i + 1)


def _linked(run: list[_Definition]) -> bool:
    """Do the decorators or defaults of a definition in the run name another of the run (a
    property's setter names its getter), or do two of them bind one name (typing's overloads
    and their implementation, a redefinition: the last one stands, so their order is meaning)?"""
    names = {f.name for f in run}
    if len(names) < len(run):
        return True
    for f in run:
        evaluated = [*f.decorator_list, *f.args.defaults, *f.args.kw_defaults]
        for expr in filter(None, evaluated):
            if {n.id for n in ast.walk(expr) if isinstance(n, ast.Name)} & names:
                return True
    return False
