"""Generated first-order mutants of impl: the generator, as records of the catalog's type.

`generate(source)` gives every first-order mutant of impl/transformer.py that compiles, over its
AST with Cosmic Ray's operator set, implemented here (cosmic-ray 8.7's operators: number
replacement by +1 and -1, binary, comparison and unary operator replacement, boolean
replacement, logical connectors, `not` added to conditions, break/continue swaps, zero-iteration
for loops, decorator removal; not its exception replacer or variable replacer / inserter;
arithmetic operators are not swapped for bitwise ones), plus statement deletion, constant
replacement (string constants in comparisons), argument mutations (the first two positional
arguments swapped, a keyword argument removed) and API-pair swaps (sin/cos, min/max, tril/triu,
zeros/ones, mean/sum, softmax/log_softmax, train/eval, ...). A mutation is one change at a
node's span; one that does not compile is dropped, and of several giving the same mutated text
the first in source order is kept.

Each is a `mutants.patch.Mutant`, the one mutant type: one exact-text patch, the changed lines
with as many neighbours as make their text occur exactly once in the source, so that a
generated mutant is applied, checked and reported exactly as a catalog record is (the
generator's own step, `_Site`, never leaves this module). Its `function` is its scope.

A generated mutant's id (its key) is `operator@scope#ordinal:replacement`, named by the code's
structure and never by a line (as mutmut names a mutant by its function and an ordinal):

- scope: the qualified name of the innermost def or class holding the mutated node, by the
  tree, not by lines: `MultiHeadAttention.forward`, `fit`, `TransformerConfig`, and `<module>`
  for top-level code; a def's decorators, defaults and annotations belong to the def (so a
  function added at the top renames no mutant of `<module>`);
- ordinal: the mutant's place, from 1, among that operator's mutants in that scope, in source
  order (offset, then operator, then replacement);
- replacement: the text the mutant puts at the node (`pass` for a deleted statement, empty for
  a removed decorator), for the reader; the first three parts alone are unique.

So lines added, removed or edited anywhere outside a scope rename none of its mutants (tested in
tests/mutants_tests/test_generated_keys.py); an edit inside it renames only its mutants of an
operator that the edit adds or removes before them. The hand-made mutants (HAND) are named by
their record's id, `hand_...`. The committed catalog of the generated mutants the shared laws
kill is mutants.generated_catalog.
"""

from __future__ import annotations

import ast
import os
import random
from collections.abc import Iterator
from dataclasses import dataclass, replace
from typing import Any

from mutants.patch import Mutant, Patch

TARGET = "impl.transformer"
SOURCE_PATH = "impl/transformer.py"

_BINOPS = (ast.Add, ast.Sub, ast.Mult, ast.Div, ast.FloorDiv, ast.Mod, ast.Pow)
_BITOPS = (ast.BitAnd, ast.BitOr, ast.BitXor)
_CMPOPS = (ast.Eq, ast.NotEq, ast.Lt, ast.LtE, ast.Gt, ast.GtE)
_CMP_PAIRS = {ast.Is: ast.IsNot, ast.IsNot: ast.Is, ast.In: ast.NotIn, ast.NotIn: ast.In}
# API pairs: a name (attribute or function) and what a slip turns it into
API_PAIRS = {
    "sin": "cos",
    "cos": "sin",
    "min": "max",
    "max": "min",
    "tril": "triu",
    "triu": "tril",
    "zeros": "ones",
    "ones": "zeros",
    "zeros_like": "ones_like",
    "ones_like": "zeros_like",
    "new_zeros": "new_ones",
    "mean": "sum",
    "sum": "mean",
    "softmax": "log_softmax",
    "log_softmax": "softmax",
    "relu": "gelu",
    "any": "all",
    "all": "any",
    "train": "eval",
    "eval": "train",
    "argmax": "argmin",
    "normal_": "uniform_",
    "sqrt": "log",
    "exp": "log",
    "cat": "stack",
    "tolist": "numpy",
    "item": "detach",
    "is_floating_point": "is_complex",
}


@dataclass(frozen=True)
class _Site:
    """The generator's step (never returned): one change at a node's span, and its patch."""

    operator: str
    scope: str  # the qualified name of the enclosing def or class, or MODULE
    original: str
    replacement: str
    start: int  # character offsets of the replaced span in the source
    end: int
    # the exact-text patch: the changed lines, with neighbours until their text is unique
    old: str
    new: str

    def apply(self, source: str) -> str:
        """The mutated source, through the site's exactly-once patch."""
        return self.record("").apply(source)

    def record(self, key: str) -> Mutant:
        """This site as a catalog record named `key`: one patch that must apply exactly once."""
        return Mutant(
            id=key,
            mutator=self.operator,
            pitfall=f"{self.operator} in {self.scope}: {self.original} -> {self.replacement}",
            killers=(),
            patches=(Patch(self.old, self.new),),
            target=TARGET,
            function=self.scope,
        )


def _patch_text(source: str, start: int, end: int, replacement: str) -> tuple[str, str]:
    """(old, new): whole lines around [start, end), widened by a line above, then below, ...
    until `old` occurs exactly once in the source."""
    lo = source.rfind("\n", 0, start) + 1
    hi = source.find("\n", end)
    hi = len(source) if hi < 0 else hi + 1
    up = True
    while source.count(source[lo:hi]) != 1:
        if (up and lo > 0) or hi >= len(source):
            lo = source.rfind("\n", 0, lo - 1) + 1
        else:
            nxt = source.find("\n", hi)
            hi = len(source) if nxt < 0 else nxt + 1
        up = not up
    return source[lo:hi], source[lo:start] + replacement + source[end:hi]


MODULE = "<module>"  # the scope of top-level code


def _scopes(tree: ast.AST) -> dict[int, str]:
    """id(node) -> the qualified name of the innermost def or class holding it (`Outer.inner`,
    MODULE at top level), by the tree's structure, not its lines: a def's decorators, arguments,
    defaults and annotations belong to the def (the def node itself to the scope around it)."""
    scope: dict[int, str] = {}

    def visit(node: ast.AST, name: str) -> None:
        scope[id(node)] = name
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
            name = node.name if name == MODULE else f"{name}.{node.name}"
        for child in ast.iter_child_nodes(node):
            visit(child, name)

    visit(tree, MODULE)
    return scope


class _Offsets:
    """(line, col) -> offset in the source text (ast's columns are UTF-8 bytes; impl is ASCII)."""

    def __init__(self, source: str) -> None:
        self.starts = [0]
        for line in source.splitlines(keepends=True):
            self.starts.append(self.starts[-1] + len(line))

    def __call__(self, line: int, col: int) -> int:
        return self.starts[line - 1] + col


def _in_fstring_or_docstring(tree: ast.AST) -> set[int]:
    """ids of nodes inside f-strings (error messages) and docstrings: never mutated."""
    skip: set[int] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.JoinedStr):
            skip.update(id(n) for n in ast.walk(node))
        body = getattr(node, "body", None)
        if isinstance(body, list) and body and isinstance(body[0], ast.Expr):
            if isinstance(body[0].value, ast.Constant) and isinstance(body[0].value.value, str):
                skip.update(id(n) for n in ast.walk(body[0]))
    return skip


def _expr(node: ast.AST) -> str:
    return f"({ast.unparse(node)})"


def _with(node: ast.AST, **changes: Any) -> ast.AST:
    """A shallow copy of node with some fields replaced."""
    fields = {f: getattr(node, f) for f in node._fields}
    fields.update(changes)
    return type(node)(**fields)


def _candidates(node: ast.AST) -> Iterator[tuple[str, str]]:
    """(operator, replacement text) for every mutation of this node."""
    if isinstance(node, ast.BinOp):
        ops: tuple[type[ast.operator], ...] = _BITOPS if isinstance(node.op, _BITOPS) else _BINOPS
        if isinstance(node.op, ast.MatMult):
            ops = (ast.Mult,)
        for op in ops:
            if not isinstance(node.op, op):
                yield "binary_operator_replacement", _expr(_with(node, op=op()))
    elif isinstance(node, ast.Compare) and len(node.ops) == 1:
        cmp = node.ops[0]
        if type(cmp) in _CMP_PAIRS:
            yield (
                "comparison_operator_replacement",
                _expr(_with(node, ops=[_CMP_PAIRS[type(cmp)]()])),
            )
        else:
            for other in _CMPOPS:
                if not isinstance(cmp, other):
                    yield "comparison_operator_replacement", _expr(_with(node, ops=[other()]))
    elif isinstance(node, ast.UnaryOp):
        yield "unary_operator_deletion", _expr(node.operand)
        if isinstance(node.op, ast.USub):
            yield "unary_operator_replacement", _expr(_with(node, op=ast.UAdd()))
    elif isinstance(node, ast.BoolOp):
        connector = ast.Or() if isinstance(node.op, ast.And) else ast.And()
        yield "logical_connector_replacement", _expr(_with(node, op=connector))
    elif isinstance(node, ast.Constant):
        value = node.value
        if isinstance(value, bool):
            yield "boolean_replacer", repr(not value)
        elif isinstance(value, (int, float)) and not isinstance(value, bool):
            yield "number_replacer", repr(value + 1)
            yield "number_replacer", repr(value - 1)
    elif isinstance(node, ast.Call):
        positional = [a for a in node.args if not isinstance(a, ast.Starred)]
        if len(positional) >= 2 and ast.unparse(positional[0]) != ast.unparse(positional[1]):
            args = [node.args[1], node.args[0], *node.args[2:]]
            yield "argument_swap", _expr(_with(node, args=args))
        for i, kw in enumerate(node.keywords):
            if kw.arg is not None:
                rest = node.keywords[:i] + node.keywords[i + 1 :]
                yield "keyword_argument_removal", _expr(_with(node, keywords=rest))
    if isinstance(node, (ast.Attribute, ast.Name)):
        name = node.attr if isinstance(node, ast.Attribute) else node.id
        if name in API_PAIRS and isinstance(getattr(node, "ctx", None), ast.Load):
            swapped = (
                _with(node, attr=API_PAIRS[name])
                if isinstance(node, ast.Attribute)
                else _with(node, id=API_PAIRS[name])
            )
            yield "api_pair_swap", ast.unparse(swapped)


def _statement_candidates(node: ast.stmt) -> Iterator[tuple[str, str]]:
    if isinstance(node, (ast.If, ast.While)):
        yield "add_not", _expr(ast.UnaryOp(op=ast.Not(), operand=node.test))
    if isinstance(node, ast.Break):
        yield "replace_break_with_continue", "continue"
    if isinstance(node, ast.Continue):
        yield "replace_continue_with_break", "break"


def _end(node: ast.stmt | ast.expr) -> tuple[int, int]:
    """Where a parsed node ends (line, column): the parser sets both on every node."""
    assert node.end_lineno is not None and node.end_col_offset is not None
    return node.end_lineno, node.end_col_offset


def generate(source: str) -> list[Mutant]:
    """Every first-order mutant of the source that compiles, in source order, as records keyed
    `operator@scope#ordinal:replacement` (the module docstring)."""
    return [site.record(key) for key, site in _keyed(_sites(source))]


def _keyed(sites: list[_Site]) -> list[tuple[str, _Site]]:
    """Each site with its key: the ordinal counts the operator's sites in its scope, from 1, in
    source order."""
    seen: dict[tuple[str, str], int] = {}
    out = []
    for site in sites:
        n = seen[site.operator, site.scope] = seen.get((site.operator, site.scope), 0) + 1
        out.append((f"{site.operator}@{site.scope}#{n}:{site.replacement}", site))
    return out


def _sites(source: str) -> list[_Site]:
    """Every mutation of the source that compiles, one per distinct mutated text, in source
    order (offset, operator, replacement)."""
    tree = ast.parse(source)
    offset = _Offsets(source)
    skip = _in_fstring_or_docstring(tree)
    scope = _scopes(tree)
    found: list[_Site] = []

    def make(operator: str, where: ast.AST, replacement: str, start: int, end: int) -> _Site:
        old, new = _patch_text(source, start, end, replacement)
        return _Site(
            operator, scope[id(where)], source[start:end], replacement, start, end, old, new
        )

    def add(
        operator: str,
        node: ast.stmt | ast.expr,
        replacement: str,
        span: ast.stmt | ast.expr | None = None,
    ) -> None:
        span = span or node
        start = offset(span.lineno, span.col_offset)
        end = offset(*_end(span))
        original = source[start:end]
        if replacement.strip("()") == original.strip("()"):
            return
        m = make(operator, node, replacement, start, end)
        try:
            compile(m.apply(source), "<mutant>", "exec")
        except SyntaxError:
            return
        found.append(m)

    for node in ast.walk(tree):
        # statements and expressions: the nodes mutated (the others with a line yield nothing)
        if id(node) in skip or not isinstance(node, ast.stmt | ast.expr):
            continue
        if isinstance(node, ast.stmt):
            for operator, text in _statement_candidates(node):
                test = node.test if isinstance(node, ast.If | ast.While) else None
                add(operator, node, text, test if operator == "add_not" else None)
            if isinstance(node, (ast.FunctionDef, ast.ClassDef)):
                for deco in node.decorator_list:
                    start = offset(deco.lineno, deco.col_offset - 1)  # the '@'
                    end = offset(*_end(deco))
                    found.append(make("remove_decorator", deco, "", start, end))
            elif isinstance(node, ast.For):
                add("zero_iteration_for_loop", node.iter, "[]")
            if not isinstance(node, (ast.FunctionDef, ast.ClassDef, ast.Import, ast.ImportFrom)):
                if not isinstance(node, ast.Pass) and not (
                    isinstance(node, ast.Expr) and isinstance(node.value, ast.Constant)
                ):
                    add("statement_deletion", node, "pass")
            continue
        for operator, text in _candidates(node):
            add(operator, node, text)
        if (
            isinstance(node, ast.Compare)
            and isinstance(node.comparators[0], ast.Constant)
            and isinstance(node.comparators[0].value, str)
        ):
            add("constant_replacement", node.comparators[0], repr("XX"))
    found.sort(key=lambda m: (m.start, m.operator, m.replacement))
    # one mutant per distinct mutated text
    unique: dict[str, _Site] = {}
    for m in found:
        unique.setdefault(m.apply(source), m)
    return list(unique.values())


# Hand-made mutants for docs/matrix.md's clause -> test table, where no generated operator breaks
# exactly one clause (a call unwrapped, a constant scaled): catalog records, one patch each.


def _hand(name: str, old: str, new: str) -> Mutant:
    return Mutant(
        id=f"hand_{name}",
        mutator=f"hand_{name}",
        pitfall=name.replace("_", " "),
        killers=(),
        patches=(Patch(old, new),),
        target=TARGET,
    )


HAND = (
    _hand("no_embedding_dropout", "        return self.dropout(x)\n", "        return x\n"),
    _hand(
        "no_encoder_self_attention_output_dropout",
        "    def _sa_block(self, x: Tensor, mask: Tensor) -> Tensor:\n"
        "        return self.dropout(self.self_attn(x, x, mask))",
        "    def _sa_block(self, x: Tensor, mask: Tensor) -> Tensor:\n"
        "        return self.self_attn(x, x, mask)",
    ),
    _hand("embedding_std_1.4_percent_off", "std=d**-0.5)", "std=1.014 * d**-0.5)"),
    _hand(
        "logits_in_float32",
        "        return F.linear(y, self.out_weight())",
        "        return F.linear(y.float(), self.out_weight().float()).to(y.dtype)",
    ),
    _hand(
        "linear2_not_called_as_a_module",
        "return self.dropout(self.linear2(self.dropout(F.relu(self.linear1(x)))))",
        "return self.dropout(F.linear(self.dropout(F.relu(self.linear1(x))), "
        "self.linear2.weight, self.linear2.bias))",
    ),
)


def hand_mutants(source: str) -> list[Mutant]:
    """HAND's records, each with the scope its one patch lies in (a patch that no longer
    applies exactly once raises PatchError, naming the mutant)."""
    tree = ast.parse(source)
    scope = _scopes(tree)
    nodes = [n for n in ast.walk(tree) if isinstance(n, ast.stmt | ast.expr)]
    offset = _Offsets(source)
    out = []
    for record in HAND:
        record.apply(source)  # the record's own exactly-once check
        (patch,) = record.patches
        at = source.index(patch.old) + len(os.path.commonprefix([patch.old, patch.new]))
        out.append(replace(record, function=_scope_at(nodes, scope, offset, at)))
    return out


def _scope_at(
    nodes: list[ast.stmt | ast.expr], scope: dict[int, str], offset: _Offsets, at: int
) -> str:
    """The scope of the innermost statement or expression starting at or around offset `at`."""
    holding = [
        (offset(n.lineno, n.col_offset), -offset(*_end(n)), scope[id(n)])
        for n in nodes
        if offset(n.lineno, n.col_offset) <= at < offset(*_end(n))
    ]
    return max(holding)[2] if holding else MODULE


def sample(mutants: list[Mutant], n: int | None, seed: int) -> list[Mutant]:
    """A seeded sample of n mutants, stratified by operator (each operator's share kept, at least
    one of each), in the order given; all of them when n is None or not smaller."""
    if n is None or n >= len(mutants):
        return list(mutants)
    rng = random.Random(seed)
    by_op: dict[str, list[Mutant]] = {}
    for m in mutants:
        by_op.setdefault(m.mutator, []).append(m)
    chosen: list[Mutant] = []
    for _, group in sorted(by_op.items()):
        k = max(1, round(n * len(group) / len(mutants)))
        chosen += rng.sample(group, min(k, len(group)))
    order = {m.id: i for i, m in enumerate(mutants)}
    return sorted(chosen, key=lambda m: order[m.id])
