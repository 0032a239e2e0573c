"""The learning test's split leaves a subject nothing to narrow the test sums by (issue 49).

A fit can read the secret relabelling off its training rows and list every two-digit sum it was
not given (tests/harness_tests/isolation/hostile/verdict_lists_test_sums.py does). Here the
parent's own instance of the task is read back through its relabelling, and the sums a subject
can list are counted from what the worker receives: fit's training rows (the first update's rows
are some of them) and the validation sums its checkpoints show. That list must hold every test
sum and be at least CANDIDATES_PER_TEST_SUM times as long as the test sums.
"""

from __future__ import annotations

import numpy as np
import pytest

from harness.shared_tests.inputs import learning_instance, learning_setup, set_draw_secret
from harness.shared_tests.laws.training import CHECKPOINT_ROWS
from tasks import addition

CANDIDATES_PER_TEST_SUM = 10


def sums_of(src: np.ndarray, relabel: np.ndarray, digits: int) -> set[tuple[int, int]]:
    """The unordered sums {a, b} of instance source rows, read through the inverse relabelling."""
    tokens = np.argsort(relabel)[np.asarray(src)]  # the task's own token ids
    assert (tokens[:, digits] == addition.PLUS).all()
    values = tokens - addition.DIGIT0
    assert ((values[:, :digits] >= 0) & (values[:, :digits] <= 9)).all()
    place = 10 ** np.arange(digits - 1, -1, -1)
    a = values[:, :digits] @ place
    b = values[:, digits + 1 :] @ place
    return {(int(min(x, y)), int(max(x, y))) for x, y in zip(a, b, strict=True)}


def every_sum(digits: int) -> set[tuple[int, int]]:
    ops = addition.operand_range(digits)
    return {(a, b) for a in ops for b in ops if a <= b}


@pytest.fixture(scope="module")
def setup():
    return learning_setup()


@pytest.mark.parametrize("secret", [0, 1, 7, 12345])
def test_the_sums_a_subject_can_list_are_ten_times_the_test_sums(setup, secret):
    set_draw_secret(secret)
    try:
        task = learning_instance(setup, setup["seeds"][0])
    finally:
        set_draw_secret(None)
    digits, relabel = setup["task"]["digits"], task["relabel"]
    trained = sums_of(task["data"]["src"], relabel, digits)
    shown = sums_of(task["val_src"][:CHECKPOINT_ROWS], relabel, digits)
    tested = sums_of(task["test_src"], relabel, digits)
    candidates = every_sum(digits) - trained - shown
    assert len(tested) == len(task["test_src"]) == setup["task"]["n_test"]  # distinct sums
    assert tested <= candidates  # no test sum is among the rows the worker sees
    assert len(candidates) >= CANDIDATES_PER_TEST_SUM * len(tested), (
        f"{len(candidates)} sums a subject can list for {len(tested)} test sums"
    )
    # fit is given both orders of every sum it trains on, and nothing else
    ordered = {(a, b) for a, b in trained} | {(b, a) for a, b in trained}
    assert len(task["data"]["src"]) == len(ordered)


def test_the_secret_instance_reads_back_as_reversed_addition(setup):
    # the reading above is the task's: the targets of the training rows are the sums' answers
    set_draw_secret(3)
    try:
        task = learning_instance(setup, 0)
    finally:
        set_draw_secret(None)
    inverse = np.argsort(task["relabel"])
    src, tgt = inverse[task["data"]["src"]], inverse[task["data"]["tgt"]]
    digits = setup["task"]["digits"]
    place = 10 ** np.arange(digits - 1, -1, -1)
    pairs = np.stack(
        [
            (src[:, :digits] - addition.DIGIT0) @ place,
            (src[:, digits + 1 :] - addition.DIGIT0) @ place,
        ],
        axis=1,
    )
    assert (addition.target_array(pairs, digits) == tgt).all()


def test_the_bar_lies_below_what_a_model_blind_to_the_source_reaches(setup):
    # learning_bar.py refuses a bar above the blind model's loss on any derivation instance;
    # the recorded figures are that model's on the recorded instances
    from harness.tools.learning_bar import DRAW_SECRET, blind_loss

    assert setup["bar"] < min(setup["blind_losses"])
    set_draw_secret(DRAW_SECRET)
    try:
        again = [blind_loss(learning_instance(setup, s), 2) for s in setup["seeds"][:2]]
    finally:
        set_draw_secret(None)
    assert again == pytest.approx(setup["blind_losses"][:2], rel=1e-12)
    assert max(setup["impl_losses"]) < setup["bar"]
