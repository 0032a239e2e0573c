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
node's span; one that does not compile is dropped.

Each mutation is also a `mutants.patch.Mutant` (`Mutation.mutant()`): one exact-text patch, the
changed lines with as many neighbours as make their text occur exactly once in the source, so
that a generated mutant is applied, checked and reported exactly as a catalog record is. The
committed catalog of the generated mutants the shared laws kill is mutants.generated_catalog.
"""

from __future__ import annotations

import ast
import random
from collections.abc import Iterator
from dataclasses import dataclass, field
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
class Mutation:
    """One first-order mutant: where, which operator, the text it puts there, and its patch."""

    operator: str
    line: int
    col: int
    original: str
    replacement: str
    start: int  # character offsets of the replaced span in the source
    end: int
    # the exact-text patch: the changed lines, with neighbours until their text is unique
    old: str = field(default="", compare=False, repr=False)
    new: str = field(default="", compare=False, repr=False)
    function: str = field(default="", compare=False)  # the enclosing def or class ("" at top)

    @property
    def key(self) -> str:
        """A stable name: operator, place and change (the triage file's key); a hand-made one
        by its name and line."""
        if self.operator.startswith("hand_"):
            return f"{self.operator}@{self.line}"
        return f"{self.operator}@{self.line}:{self.col}:{self.replacement}"

    def mutant(self, clause: str = "", killers: tuple[str, ...] = ()) -> Mutant:
        """This mutation as a catalog record: one patch that must apply exactly once."""
        return Mutant(
            id=self.key,
            mutator=self.operator,
            pitfall=f"{self.operator} at line {self.line}" + (clause and f": breaks {clause}"),
            killers=killers,
            patches=(Patch(self.old, self.new),),
            target=TARGET,
            clause=clause,
        )

    def apply(self, source: str) -> str:
        """The mutated source, through the record's exactly-once patch."""
        return self.mutant().apply(source)


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


def _scopes(tree: ast.AST) -> list[tuple[int, int, str]]:
    """(first line, last line, name) of every def and class."""
    return [
        (n.lineno, n.end_lineno or n.lineno, n.name)
        for n in ast.walk(tree)
        if isinstance(n, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef)
    ]


def _enclosing(scopes: list[tuple[int, int, str]], line: int) -> str:
    """The innermost def or class holding the line ("" at module level)."""
    inside = [(a, name) for a, b, name in scopes if a <= line <= b]
    return max(inside)[1] if inside else ""


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


def _maker(source: str, tree: ast.AST) -> Any:
    """A maker of the source's mutations: each with its exact-text patch and enclosing scope."""
    scopes = _scopes(tree)

    def make(operator: str, line: int, col: int, replacement: str, start: int, end: int):
        old, new = _patch_text(source, start, end, replacement)
        original = source[start:end]
        where = _enclosing(scopes, line)
        return Mutation(operator, line, col, original, replacement, start, end, old, new, where)

    return make


def generate(source: str) -> list[Mutation]:
    """Every first-order mutant of the source that compiles, in source order."""
    tree = ast.parse(source)
    offset = _Offsets(source)
    skip = _in_fstring_or_docstring(tree)
    found: list[Mutation] = []
    make = _maker(source, tree)

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
        m = make(operator, span.lineno, span.col_offset + 1, replacement, start, end)
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
                    found.append(
                        make("remove_decorator", deco.lineno, deco.col_offset, "", start, end)
                    )
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
    unique: dict[str, Mutation] = {}
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


def hand_mutants(source: str) -> list[Mutation]:
    """HAND as mutations of the source, placed where each record's one patch applies (a patch
    that no longer applies exactly once raises PatchError, naming the mutant)."""
    out = []
    offset = _Offsets(source)
    make = _maker(source, ast.parse(source))
    for record in HAND:
        record.apply(source)  # the record's own exactly-once check
        (patch,) = record.patches
        start = source.index(patch.old)
        line = source.count("\n", 0, start) + 1
        col = start - offset(line, 0) + 1
        out.append(make(record.mutator, line, col, patch.new, start, start + len(patch.old)))
    return out


def sample(mutants: list[Mutation], n: int | None, seed: int) -> list[Mutation]:
    """A seeded sample of n mutants, stratified by operator (each operator's share kept, at least
    one of each); all of them when n is None or not smaller."""
    if n is None or n >= len(mutants):
        return list(mutants)
    rng = random.Random(seed)
    by_op: dict[str, list[Mutation]] = {}
    for m in mutants:
        by_op.setdefault(m.operator, []).append(m)
    chosen: list[Mutation] = []
    for _, group in sorted(by_op.items()):
        k = max(1, round(n * len(group) / len(mutants)))
        chosen += rng.sample(group, min(k, len(group)))
    return sorted(chosen, key=lambda m: (m.start, m.operator, m.replacement))
