"""Generic first-order mutants of impl through the shared tests: a standing measure of the suite.

`python -m harness.tools.generic_mutants [--sample N] [--seed S] [--jobs J]` writes
results/generic_mutants.json and results/generic_mutants.md.

Mutants are generated over impl/transformer.py's AST with Cosmic Ray's operator set, implemented
here (cosmic-ray 8.7's operators: number replacement by +1 and -1, binary, comparison and unary
operator replacement, boolean replacement, logical connectors, `not` added to conditions,
break/continue swaps, zero-iteration for loops, decorator removal; not its exception replacer
or variable replacer / inserter; arithmetic operators are not swapped for bitwise ones), plus
statement deletion, constant replacement (string constants in comparisons), argument mutations
(the first two positional arguments swapped, a keyword argument removed) and API-pair swaps
(sin/cos, min/max, tril/triu, zeros/ones, mean/sum, softmax/log_softmax, train/eval, ...). A
mutant is one change, spliced into the source text at the node's span; one that does not
compile is dropped.

Each mutant runs in a trusted worker forked from the fork server (no sandbox: generated from
impl, trusted code), through the shared tests of harness.shared_tests.laws with the engine's
run_test, in the registry's order, stopping at the first test that kills it (killed or timeout,
as the matrix counts); the learning test runs last, so only mutants that survive everything else
pay for it. Survivors are triaged in results/generic_mutants_triage.json (by mutant key): either
equivalent, with the reason, or a gap, named; the score counts killed mutants against all that
are not equivalent.
"""

from __future__ import annotations

import argparse
import ast
import json
import random
import sys
import time
from collections import Counter
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from harness.engine.run import Launch, run_test
from harness.isolation.forkserver import forked
from harness.isolation.worker import SubjectRaised, WorkerDied, WorkerTimeout
from harness.outcomes import Outcome
from harness.shared_tests.laws import SHARED_TESTS
from harness.shared_tests.record import Test
from harness.subjects import module_source

ROOT = Path(__file__).resolve().parents[2]
RESULTS = ROOT / "results"
TRIAGE = RESULTS / "generic_mutants_triage.json"
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
    """One first-order mutant: where, which operator, and the text it puts there."""

    operator: str
    line: int
    col: int
    original: str
    replacement: str
    start: int  # character offsets of the replaced span in the source
    end: int

    @property
    def key(self) -> str:
        """A stable name: operator, place and change (the triage file's key); a hand-made one
        by its name and line."""
        if self.operator.startswith("hand_"):
            return f"{self.operator}@{self.line}"
        return f"{self.operator}@{self.line}:{self.col}:{self.replacement}"

    def apply(self, source: str) -> str:
        return source[: self.start] + self.replacement + source[self.end :]


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


def generate(source: str) -> list[Mutation]:
    """Every first-order mutant of the source that compiles, in source order."""
    tree = ast.parse(source)
    offset = _Offsets(source)
    skip = _in_fstring_or_docstring(tree)
    found: list[Mutation] = []

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
        m = Mutation(operator, span.lineno, span.col_offset + 1, original, replacement, start, end)
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
                    m = Mutation(
                        "remove_decorator", deco.lineno, deco.col_offset, source[start:end],
                        "", start, end,
                    )  # fmt: skip
                    found.append(m)
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


# Hand-made mutants for the README's clause -> test table, where no generated operator breaks
# exactly one clause (a call unwrapped, a constant scaled): (name, text of impl, replacement).
HAND = (
    ("no_embedding_dropout", "        return self.dropout(x)\n", "        return x\n"),
    (
        "no_encoder_self_attention_output_dropout",
        "    def _sa_block(self, x: Tensor, mask: Tensor) -> Tensor:\n"
        "        return self.dropout(self.self_attn(x, x, mask))",
        "    def _sa_block(self, x: Tensor, mask: Tensor) -> Tensor:\n"
        "        return self.self_attn(x, x, mask)",
    ),
    (
        "embedding_std_1.4_percent_off",
        "std=d**-0.5)",
        "std=1.014 * d**-0.5)",
    ),
    (
        "logits_in_float32",
        "        return F.linear(y, self.out_weight())",
        "        return F.linear(y.float(), self.out_weight().float()).to(y.dtype)",
    ),
    (
        "linear2_not_called_as_a_module",
        "return self.dropout(self.linear2(self.dropout(F.relu(self.linear1(x)))))",
        "return self.dropout(F.linear(self.dropout(F.relu(self.linear1(x))), "
        "self.linear2.weight, self.linear2.bias))",
    ),
)


def hand_mutants(source: str) -> list[Mutation]:
    """HAND as mutations of the source (each text occurs exactly once)."""
    out = []
    offset = _Offsets(source)
    for name, old, new in HAND:
        if source.count(old) != 1:
            raise ValueError(f"hand mutant {name}: its text occurs {source.count(old)} times")
        start = source.index(old)
        line = source.count("\n", 0, start) + 1
        col = start - offset(line, 0) + 1
        out.append(Mutation(f"hand_{name}", line, col, old, new, start, start + len(old)))
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


# the registry's order (the hand examples and the golden test, which kill most, come first); the
# learning test, by far the dearest, last
_LAST = ("test_learns_reversed_addition",)


def test_order(tests: tuple[Test, ...]) -> list[Test]:
    return [t for t in tests if t.name not in _LAST] + [t for t in tests if t.name in _LAST]


def run_mutant(m: Mutation, source: str, tests: list[Test], every: bool = False) -> dict[str, Any]:
    """The mutant through the tests until one kills it (every: through all of them): its status,
    the first killing test and (every) all of them."""
    launch = Launch(forked, {"source": m.apply(source), "filename": f"{SOURCE_PATH} [{m.key}]"})
    start = time.monotonic()
    worker = None
    result: dict[str, Any] = {"status": "survived", "killed_by": None, "message": ""}
    killers: dict[str, str] = {}
    try:
        for test in tests:
            if worker is None:
                try:
                    worker = launch.worker()
                except (SubjectRaised, WorkerDied, WorkerTimeout) as e:
                    result = {"status": "killed", "killed_by": "(load)", "message": str(e)[:300]}
                    break
            cell = run_test(test, worker)
            if cell.outcome.detected:
                killers[test.name] = cell.message[:300]
                if result["killed_by"] is None:
                    status = "killed" if cell.outcome is Outcome.KILLED else "timeout"
                    result = {
                        "status": status,
                        "killed_by": test.name,
                        "message": killers[test.name],
                    }
                if not every:
                    break
            if cell.outcome is Outcome.ERROR:
                worker.close()
                worker = None
    finally:
        if worker is not None:
            worker.close()
    result["seconds"] = round(time.monotonic() - start, 2)
    if every:
        result["killers"] = killers
    return result


def report(data: dict[str, Any]) -> str:
    """The Markdown summary of a run."""
    t = data["totals"]
    lines = [
        "# Generic mutants of impl through the shared tests",
        "",
        f"Command: `{data['command']}`",
        f"Run: {data['date']}, {data['wall_s']:.0f} s wall, {data['jobs']} workers; "
        f"load average before: {data['load_before']}.",
        *[
            f"Rerun after tests changed: `{r['command']}` ({r['date']})."
            for r in data.get("reruns", [])
        ],
        "",
        f"- generated: {t['generated']} first-order mutants of `{SOURCE_PATH}` (after dropping "
        "those that do not compile and duplicates)",
        f"- run: {t['run']} ({data['sampling']})",
        f"- killed: {t['killed']} (timeouts counted as killed: {t['timeout']})",
        f"- survived: {t['survived']}: equivalent {t['equivalent']}, gaps {t['gaps']}, "
        f"untriaged {t['untriaged']}",
        f"- score against non-equivalent mutants: {t['killed']}/{t['run'] - t['equivalent']} = "
        f"{t['score']:.2%}",
        "",
        "## Per operator",
        "",
        "| operator | run | killed | survived |",
        "| --- | --- | --- | --- |",
    ]
    for op, c in sorted(data["per_operator"].items()):
        lines.append(f"| {op} | {c['run']} | {c.get('killed', 0)} | {c.get('survived', 0)} |")
    lines += ["", "## Killing tests", "", "| test | mutants killed first |", "| --- | --- |"]
    for test, n in sorted(data["first_killers"].items(), key=lambda kv: -kv[1]):
        lines.append(f"| {test} | {n} |")
    lines += ["", "## Survivors, triaged", "", "| mutant | change | verdict | why |"]
    lines.append("| --- | --- | --- | --- |")
    for m in data["mutants"]:
        if m["status"] != "survived":
            continue
        tri = m.get("triage") or {"verdict": "untriaged", "reason": ""}
        change = f"`{m['original'][:60]}` -> `{m['replacement'][:60]}`".replace("|", "\\|")
        reason = tri["reason"].replace("|", "\\|")
        lines.append(
            f"| {m['operator']} line {m['line']} | {change} | {tri['verdict']} | {reason} |"
        )
    return "\n".join(lines) + "\n"


def summarize(records: list[dict[str, Any]], triage: dict[str, Any]) -> dict[str, Any]:
    per_op: dict[str, Counter] = {}
    killers: Counter = Counter()
    for r in records:
        c = per_op.setdefault(r["operator"], Counter())
        c["run"] += 1
        c["killed" if r["status"] != "survived" else "survived"] += 1
        if r["status"] != "survived":
            killers[r["killed_by"]] += 1
        if r["status"] == "survived" and r["key"] in triage:
            r["triage"] = triage[r["key"]]
    survivors = [r for r in records if r["status"] == "survived"]
    equivalent = sum(r.get("triage", {}).get("verdict") == "equivalent" for r in survivors)
    gaps = sum(r.get("triage", {}).get("verdict") == "gap" for r in survivors)
    killed = len(records) - len(survivors)
    denominator = len(records) - equivalent
    return {
        "totals": {
            "run": len(records),
            "killed": killed,
            "timeout": sum(r["status"] == "timeout" for r in records),
            "survived": len(survivors),
            "equivalent": equivalent,
            "gaps": gaps,
            "untriaged": len(survivors) - equivalent - gaps,
            "score": killed / denominator if denominator else 1.0,
        },
        "per_operator": {op: dict(c) for op, c in per_op.items()},
        "first_killers": dict(killers),
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sample", type=int, default=None, help="run a stratified sample of N")
    parser.add_argument("--seed", type=int, default=0, help="the sample's seed")
    parser.add_argument("--jobs", type=int, default=2, help="mutants at once")
    parser.add_argument(
        "--only",
        metavar="KEYS",
        help="comma-separated mutant keys, or @FILE of one a line (a rerun)",
    )
    parser.add_argument("--list", action="store_true", help="print the mutants; run nothing")
    parser.add_argument(
        "--every-test", action="store_true", help="run every test on each mutant (all killers)"
    )
    parser.add_argument("--out", type=Path, default=RESULTS / "generic_mutants.json")
    parser.add_argument(
        "--retriage", action="store_true", help="re-read the triage file into --out; run nothing"
    )
    args = parser.parse_args(argv)
    _, source = module_source(TARGET)
    triage = json.loads(TRIAGE.read_text()) if TRIAGE.exists() else {}
    if args.retriage:
        data = json.loads(args.out.read_text())
        for r in data["mutants"]:
            r.pop("triage", None)
        data.update(summarize(data["mutants"], triage))
        data["totals"]["generated"] = data["generated"]
        args.out.write_text(json.dumps(data, indent=1) + "\n")
        args.out.with_suffix(".md").write_text(report(data))
        print(report(data).split("## Per operator")[0])
        return 0
    mutants = generate(source)
    chosen = sample(mutants, args.sample, args.seed)
    if args.only:
        if args.only.startswith("@"):  # a file of keys, one a line (keys may hold commas)
            keys = set(Path(args.only[1:]).read_text().splitlines()) - {""}
        else:
            keys = set(args.only.split(","))
        chosen = [m for m in mutants + hand_mutants(source) if m.key in keys]
        missing = keys - {m.key for m in chosen}
        if missing:
            print(f"no such mutants: {sorted(missing)}", file=sys.stderr)
            return 2
    if args.list:
        for m in chosen:
            print(f"{m.key}\t{m.original!r}")
        for m in hand_mutants(source):
            print(f"{m.key}\t{m.original!r}")
        print(
            f"{len(chosen)} of {len(mutants)} mutants (and {len(HAND)} hand-made)", file=sys.stderr
        )
        return 0
    tests = test_order(SHARED_TESTS)
    load_before = " ".join(Path("/proc/loadavg").read_text().split()[:3])
    started = time.monotonic()
    records: list[dict[str, Any]] = []

    def one(m: Mutation) -> dict[str, Any]:
        r = {"key": m.key, **{k: v for k, v in asdict(m).items() if k not in ("start", "end")}}
        r.update(run_mutant(m, source, tests, every=args.every_test))
        print(f"{r['status']:<8} {r['seconds']:6.1f} s  {m.key}  {r['killed_by']}", flush=True)
        return r

    with ThreadPoolExecutor(max_workers=args.jobs) as pool:
        records = list(pool.map(one, chosen))
    if args.only and args.out.exists():
        # a rerun of some mutants (after a test changed): their records replace the earlier ones
        data = json.loads(args.out.read_text())
        fresh = {r["key"]: r for r in records}
        data["mutants"] = [fresh.pop(r["key"], r) for r in data["mutants"]] + list(fresh.values())
        for r in data["mutants"]:
            r.pop("triage", None)
        command = "python -m harness.tools.generic_mutants " + " ".join(
            argv if argv is not None else sys.argv[1:]
        )
        data.setdefault("reruns", []).append(
            {"command": command, "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())}
        )
        data.update(summarize(data["mutants"], triage))
        data["totals"]["generated"] = data["generated"]
        args.out.write_text(json.dumps(data, indent=1) + "\n")
        args.out.with_suffix(".md").write_text(report(data))
        print(report(data).split("## Per operator")[0])
        return 0
    data = {
        "command": "python -m harness.tools.generic_mutants "
        + " ".join(argv if argv is not None else sys.argv[1:]),
        "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
        "wall_s": time.monotonic() - started,
        "jobs": args.jobs,
        "load_before": load_before,
        "generated": len(mutants),
        "sampling": (
            "the mutants --only names"
            if args.only
            else f"a stratified sample of {args.sample} by operator, seed {args.seed}"
            if args.sample is not None and args.sample < len(mutants)
            else "every generated mutant"
        ),
        "tests": [t.name for t in tests],
        "mutants": records,
    }
    data.update(summarize(records, triage))
    data["totals"]["generated"] = len(mutants)
    args.out.write_text(json.dumps(data, indent=1) + "\n")
    args.out.with_suffix(".md").write_text(report(data))
    print(report(data).split("## Per operator")[0])
    return 0


if __name__ == "__main__":
    sys.exit(main())
