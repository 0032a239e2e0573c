"""Call coverage (harness.engine.coverage): which functions a mutant changes, what impl's traced run
of a test calls, and that a matrix with cells inferred from it equals the matrix with every cell
run."""

from __future__ import annotations

import textwrap

import pytest

from harness.engine.coverage import changed_functions, inferred_cell, run_inferring
from harness.engine.run import run_suite
from harness.isolation.child.calls import recorded
from harness.jobs.matrix import matrix_subjects
from harness.outcomes import Outcome
from harness.records import Cell
from harness.shared_tests.laws import BY_NAME

BASE = textwrap.dedent(
    '''
    import math

    SCALE = 2.0


    def helper(x):
        """Doubles."""
        return x * SCALE


    class Model:
        def forward(self, x):
            def inner(y):
                return y + 1

            return inner(helper(x))

        def unused(self, x):
            return math.sqrt(x)


    if SCALE > 1:
        def branch():
            return 1
    '''
)


def edit(old: str, new: str) -> str:
    assert BASE.count(old) == 1, old
    return BASE.replace(old, new)


@pytest.mark.parametrize(
    "old, new, want",
    [
        ("return x * SCALE", "return x * SCALE * 1", {"helper"}),
        ("return math.sqrt(x)", "return math.sqrt(x + 1)", {"Model.unused"}),
        # a nested function's change is its own and its enclosing function's
        ("return y + 1", "return y - 1", {"Model.forward", "Model.forward.<locals>.inner"}),
        ("return 1\n", "return 2\n", {"branch"}),  # a def inside an if
        # formatting, comments and line numbers are not code
        ("return x * SCALE", "return (x *\n            SCALE)  # same", set()),
        ('"""Doubles."""', '"""Doubles x."""', {"helper"}),  # a docstring is in the body: run
    ],
)
def test_a_change_inside_function_bodies_names_those_functions(old, new, want):
    assert changed_functions(BASE, edit(old, new)) == frozenset(want)


@pytest.mark.parametrize(
    "old, new",
    [
        ("SCALE = 2.0", "SCALE = 3.0"),  # module level: runs as the module loads
        ("def helper(x):", "def helper(x=1):"),  # a default is evaluated at the def
        ("def unused(self, x):", "@staticmethod\n    def unused(self, x):"),  # a decorator
        ("class Model:", "class Model(object):"),
        ("    def unused(", "    def added(self):\n        pass\n\n    def unused("),  # new
        ("if SCALE > 1:", "if SCALE > 2:"),
    ],
)
def test_a_change_outside_function_bodies_leaves_nothing_to_infer(old, new):
    assert changed_functions(BASE, edit(old, new)) is None


def test_an_appended_block_leaves_nothing_to_infer():
    assert changed_functions(BASE, BASE + "\nhelper = print\n") is None


def test_the_recorder_names_every_function_of_the_file_called_raising_ones_too(tmp_path):
    path = tmp_path / "subject.py"
    source = BASE + textwrap.dedent(
        """
        def fails():
            raise ValueError("on purpose")


        def comprehension(xs):
            return [helper(x) for x in xs]
        """
    )
    path.write_text(source)
    namespace: dict = {}
    exec(compile(source, str(path), "exec"), namespace)
    with recorded(str(path)) as called:
        namespace["Model"]().forward(1.0)
        namespace["comprehension"]([1.0])
        with pytest.raises(ValueError):
            namespace["fails"]()
        sorted([3, 1])  # a builtin, and code of other files: not recorded
    assert {"Model.forward", "Model.forward.<locals>.inner", "helper", "fails"} <= called
    assert "comprehension" in called and "Model.unused" not in called
    assert all(not name.startswith("sorted") for name in called)


def test_a_cell_is_inferred_only_from_a_passed_traced_run_that_misses_the_change():
    covered = frozenset({"Transformer.forward", "fit"})
    passed = Cell(Outcome.PASSED, "", 1.0, covered)
    assert inferred_cell(passed, frozenset({"translate"}), "sX").outcome is Outcome.PASSED
    assert not inferred_cell(passed, frozenset({"translate"}), "sX").ran
    assert inferred_cell(passed, frozenset({"fit"}), "sX") is None  # reached
    assert inferred_cell(Cell(Outcome.PASSED, "", 1.0), frozenset({"x"}), "sX") is None  # untraced
    killed = Cell(Outcome.KILLED, "no", 1.0, covered)
    assert inferred_cell(killed, frozenset({"translate"}), "sX") is None


# Fast tests of every kind of probe: the loss alone, a forward pass, decoding, beam search, and
# bad input (whose calls raise on purpose: the validation helpers they reach must count).
TESTS = [
    BY_NAME[n]
    for n in (
        "test_hand_example_label_smoothing",
        "test_golden_torch",
        "test_decode_step_equals_forward",
        "test_beam_search_matches_oracle",
        "test_validation",
    )
]
NAMES = ("impl", "s07", "s10", "s11", "c04", "sanity")
SUBJECTS = [s for s in matrix_subjects() if s.name in NAMES]


@pytest.mark.slow
def test_the_inferred_matrix_equals_the_matrix_with_every_cell_run():
    inferred = run_inferring(TESTS, SUBJECTS, jobs=2)
    every = run_suite(TESTS, SUBJECTS, jobs=2)
    for subject in SUBJECTS:
        assert inferred.row(subject.name) == every.row(subject.name), subject.name
    not_run = {k for k, c in inferred.cells.items() if not c.ran}
    # s11 changes the beam search alone; s10 and c04 decode_step; s07 the loss; the sanity
    # mutant appends a block to the module (its skeleton): every test reaches it
    assert ("test_beam_search_matches_oracle", "s11") not in not_run
    assert ("test_golden_torch", "s11") in not_run
    assert ("test_decode_step_equals_forward", "s10") not in not_run
    assert ("test_golden_torch", "s10") in not_run
    assert ("test_hand_example_label_smoothing", "s07") not in not_run
    assert ("test_decode_step_equals_forward", "c04") not in not_run
    assert ("test_golden_torch", "c04") in not_run
    assert not any(s == "sanity" for _, s in not_run)
    assert not any(s == "impl" for _, s in not_run)
    assert inferred.worker_starts["impl"] == len(TESTS)  # traced: each test from a fresh load
    message = inferred.cell("test_golden_torch", "s11").message
    assert message.startswith("not run: s11 changes _beam_search")


def test_impls_traced_validation_run_reaches_the_checks_its_calls_raise_in():
    run = run_suite([BY_NAME["test_validation"]], SUBJECTS[:1], traced=("impl",))
    covered = run.cell("test_validation", "impl").covered
    assert covered is not None
    assert {"_check_batches", "_check_rows_have_tokens", "fit", "translate"} <= covered
