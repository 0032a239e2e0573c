"""Call coverage: the cells of impl's mutants that a test cannot tell from impl, not run.

PIT and Stryker run a mutant only against the tests that reach its change ("coverage analysis"):
a test that never executes the mutated code sees the original program and cannot kill the
mutant. The matrix does the same, per cell, and sound by construction rather than by heuristics:

1. impl's row is run traced: each cell records which of impl's functions loading impl and the
   test's probes called (harness.isolation.child.calls; every call, raising ones included), each
   test in a fresh worker, so that nothing an earlier test ran (a memoized function, a table
   filled once) hides a call the test would make from a fresh load.
2. A mutant's change is read structurally (`changed_functions`): impl's source and the mutant's
   are parsed, and each function's body is compared with the function of the same qualified
   name. Everything that is not a function body (module and class statements, each `def` line
   with its decorators, defaults and annotations, an appended block) is the module's skeleton;
   a mutant whose skeleton differs from impl's is run in every cell.
3. A cell is inferred when impl passed the test and the test called none of the functions the
   mutant changed: loading the mutant and running the test's probes then executes exactly impl's
   code (each probe starts from the same random state: harness.isolation.child.serve.reseed), so
   the worker sends back what impl's sent and the verdict, a function of that data, is impl's.

The cell is then impl's outcome with `ran=False` and a message that says so; `xfmr matrix
--run-every-cell` runs them instead (tests/harness_tests/engine/test_coverage.py checks, cell
for cell, that both ways give the same matrix).
"""

from __future__ import annotations

import ast
import time
from collections.abc import Sequence
from dataclasses import dataclass

from harness.engine.run import Progress, run_suite
from harness.engine.work import Executor, LocalExecutor
from harness.isolation import forkserver
from harness.outcomes import Outcome
from harness.records import Cell, SuiteRun
from harness.shared_tests.record import Test
from harness.subjects import Kind, Subject

BASELINE = "impl"  # the subject whose traced row decides what every mutant's cell can reach


@dataclass(frozen=True)
class Shape:
    """A module's source split into its skeleton and its function bodies (by qualified name;
    a name defined twice, as a property's getter and setter, keeps both bodies)."""

    skeleton: str
    bodies: dict[str, tuple[str, ...]]


def shape(source: str) -> Shape:
    """`source`'s skeleton (every function body replaced by `pass`) and function bodies, as AST
    dumps: formatting, comments and line numbers do not count, any change of code does."""
    tree = ast.parse(source)
    bodies: dict[str, list[str]] = {}

    def visit(node: ast.AST, prefix: str) -> None:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, ast.FunctionDef | ast.AsyncFunctionDef):
                name = f"{prefix}{child.name}"
                body = ast.Module(body=child.body, type_ignores=[])
                bodies.setdefault(name, []).append(ast.dump(body))
                visit(child, f"{name}.<locals>.")
            elif isinstance(child, ast.ClassDef):
                visit(child, f"{prefix}{child.name}.")
            elif isinstance(child, ast.stmt | ast.excepthandler | ast.match_case):
                visit(child, prefix)  # a def inside an if, a try, a with, ...

    visit(tree, "")

    class Hollow(ast.NodeTransformer):
        def visit_FunctionDef(self, node: ast.FunctionDef) -> ast.AST:  # noqa: N802 (ast's)
            return replace_body(node)

        def visit_AsyncFunctionDef(self, node: ast.AsyncFunctionDef) -> ast.AST:  # noqa: N802
            return replace_body(node)

    def replace_body(node: ast.FunctionDef | ast.AsyncFunctionDef) -> ast.AST:
        node.body = [ast.Pass()]
        return node

    skeleton = ast.dump(Hollow().visit(tree))
    return Shape(skeleton, {name: tuple(dumps) for name, dumps in bodies.items()})


def changed_functions(base: str | Shape, mutant: str) -> frozenset[str] | None:
    """The qualified names of the functions whose bodies differ between the two sources (or
    exist in one only), or None when the skeletons differ: then the change runs as the module is
    loaded, and every test reaches it."""
    a, b = base if isinstance(base, Shape) else shape(base), shape(mutant)
    if a.skeleton != b.skeleton:
        return None
    return frozenset(
        n for n in a.bodies.keys() | b.bodies.keys() if a.bodies.get(n) != b.bodies.get(n)
    )


def inferred_cell(base: Cell, changed: frozenset[str], mutant: str) -> Cell | None:
    """The mutant's cell without running it, when impl's traced cell shows the test cannot reach
    the change (see the module's docstring); None when it must run."""
    if base.outcome is not Outcome.PASSED or not base.ran or base.covered is None:
        return None
    if changed & base.covered:
        return None
    what = ", ".join(sorted(changed)) or "no function"
    message = (
        f"not run: {mutant} changes {what}, which {BASELINE}'s run of this test never calls; "
        f"the cell is {BASELINE}'s"
    )
    return Cell(base.outcome, message, 0.0, ran=False)


def changes(subjects: Sequence[Subject]) -> dict[str, frozenset[str] | None]:
    """For each mutant of the baseline's module, the functions it changes (None: its skeleton)."""
    base = next((s for s in subjects if _is_baseline(s)), None)
    if base is None:
        return {}
    source = shape(base.payload()["source"])
    return {
        s.name: changed_functions(source, s.payload()["source"])
        for s in subjects
        if s.kind is Kind.MUTANT and s.module == base.module and s.mutant is not None
    }


def _is_baseline(subject: Subject) -> bool:
    return (
        subject.name == BASELINE
        and subject.kind is Kind.CORRECT
        and subject.module is not None
        and subject.mutant is None
    )


def run_inferring(
    tests: Sequence[Test],
    subjects: Sequence[Subject],
    known: dict[tuple[str, str], Cell] | None = None,
    jobs: int | None = None,
    progress: Progress | None = None,
    executor: Executor | None = None,
    weight: dict[str, float] | None = None,
    infer: bool = True,
) -> SuiteRun:
    """Every cell of tests x subjects not in `known` (cells had already, by (test, subject)):
    run, or inferred from the baseline's coverage where that is sound.

    When the baseline's cells must run first, a first round runs its row (traced) beside the
    other correct subjects (rows of about its length) and, while units are free, rows that cannot
    be inferred; then the mutants' cells are inferred where they can be and the rest run in a
    last round, longest rows first. weight (test -> expected seconds; default: the baseline's
    measured seconds, else the test's timeout) orders the rows, and in a round with fewer rows
    than the executor runs at once each row is split into that many units of near-equal weight
    (each its own worker): one changed mutant's row then takes its slowest test's time, not the
    sum. infer=False: every missing cell runs, in one round."""
    started = time.monotonic()
    cells = dict(known or {})
    ex = executor or LocalExecutor(jobs)
    width = max(1, getattr(ex, "width", 1))
    missing = {s.name: [t.name for t in tests if (t.name, s.name) not in cells] for s in subjects}
    total = sum(map(len, missing.values()))
    if total and isinstance(ex, LocalExecutor):
        forkserver.warm()  # its preloading overlaps reading the mutants' changes
    change = changes([s for s in subjects if missing[s.name] or _is_baseline(s)]) if infer else {}
    done = [0]
    rounds: list[SuiteRun] = []
    by_name = {t.name: t for t in tests}

    def counted(subject: Subject, test: Test, cell: Cell, _: int, __: int) -> None:
        done[0] += 1
        if progress is not None:
            progress(subject, test, cell, done[0], total)

    def cost(test: str) -> float:
        if weight is not None and test in weight:
            return weight[test]
        base = cells.get((test, BASELINE))
        return base.seconds if base is not None and base.ran else by_name[test].timeout

    def run_round(rows: list[Subject], traced: tuple[str, ...] = ()) -> None:
        rows = sorted(rows, key=lambda s: -sum(map(cost, missing[s.name])))
        parts = max(1, width // max(1, len(rows)))
        costs = {t.name: cost(t.name) for t in tests}
        groups = {s.name: split(missing[s.name], parts, costs) for s in rows}
        run = run_suite(tests, rows, progress=counted, executor=ex, groups=groups, traced=traced)
        rounds.append(run)
        cells.update(run.cells)

    waiting = [s for s in subjects if change.get(s.name) is not None and missing[s.name]]
    free = [s for s in subjects if missing[s.name] and s not in waiting]
    if waiting and missing.get(BASELINE):
        correct = [s for s in free if s.kind is Kind.CORRECT]
        others = [s for s in free if s.kind is not Kind.CORRECT]
        spare = max(0, width - len(correct))
        run_round(correct + others[:spare], traced=(BASELINE,))
        free = others[spare:]
    last = list(free)
    for subject in waiting:
        left = []
        changed = change[subject.name]  # not None: waiting holds only subjects read
        for test in missing[subject.name]:
            base = cells.get((test, BASELINE))
            cell = (
                None
                if base is None or changed is None
                else inferred_cell(base, changed, subject.name)
            )
            if cell is None:
                left.append(test)
            else:
                cells[(test, subject.name)] = cell
                counted(subject, by_name[test], cell, 0, 0)
        missing[subject.name] = left
        if left:
            last.append(subject)
    if last:
        run_round(last, traced=(BASELINE,) if infer else ())
    whole = SuiteRun(list(tests), list(subjects), cells)
    for name in (s.name for s in subjects):
        whole.subject_seconds[name] = sum(r.subject_seconds.get(name, 0.0) for r in rounds)
        whole.worker_starts[name] = sum(r.worker_starts.get(name, 0) for r in rounds)
        whole.start_seconds[name] = [x for r in rounds for x in r.start_seconds.get(name, [])]
    whole.wall_seconds = time.monotonic() - started
    return whole


def split(names: list[str], parts: int, weight: dict[str, float]) -> list[list[str]]:
    """`names` in at most `parts` groups of near-equal total weight (heaviest first into the
    lightest group; a name without a weight weighs 1), each group in the given order."""
    if parts <= 1:
        return [list(names)] if names else []
    bins: list[list[str]] = [[] for _ in range(min(parts, len(names)) or 1)]
    load = [0.0] * len(bins)
    for name in sorted(names, key=lambda n: -weight.get(n, 1.0)):
        i = load.index(min(load))
        bins[i].append(name)
        load[i] += weight.get(name, 1.0)
    order = {n: i for i, n in enumerate(names)}
    return [sorted(b, key=order.__getitem__) for b in bins if b]


def inferred_line(run: SuiteRun) -> str:
    """How many cells were inferred from impl's coverage instead of run."""
    n = sum(not c.ran for c in run.cells.values())
    return (
        f"coverage: {n} of {len(run.cells)} cells not run (mutants' cells whose test never "
        f"calls what the mutant changes: {BASELINE}'s outcome; --run-every-cell runs them)"
    )
