"""harness/shared_tests/layout.py: a hooked value put in the batch-first layout, or why not."""

from __future__ import annotations

import numpy as np

from harness.shared_tests.layout import BATCH_FIRST, TIME_FIRST, batch_first


def values(shape: tuple[int, ...], seed: int = 0) -> np.ndarray:
    return np.random.default_rng(seed).normal(size=shape)


def test_batch_first_is_kept():
    x = values((2, 6, 4))
    array, layout, reason = batch_first(x, (2, 6, 4))
    assert layout == BATCH_FIRST and reason == "" and np.array_equal(array, x)


def test_time_first_is_turned_by_its_shape():
    x = values((2, 6, 4))
    array, layout, reason = batch_first(np.swapaxes(x, 0, 1).copy(), (2, 6, 4))
    assert layout == TIME_FIRST and reason == "" and np.array_equal(array, x)


def test_as_many_positions_as_rows_is_decided_by_the_values_not_guessed():
    x = values((3, 3, 4))
    turned = np.swapaxes(x, 0, 1).copy()
    assert batch_first(turned, (3, 3, 4), expected=x).layout == TIME_FIRST
    assert np.array_equal(batch_first(turned, (3, 3, 4), expected=x).array, x)
    assert batch_first(x, (3, 3, 4), expected=x).layout == BATCH_FIRST
    # a wrong value is still put in the closer layout: judging it is the caller's
    near = turned + 0.01
    assert batch_first(near, (3, 3, 4), expected=x).layout == TIME_FIRST
    unknown = batch_first(turned, (3, 3, 4))
    assert unknown.array is None and "no expected values" in unknown.reason


def test_padded_positions_do_not_decide():
    x = values((3, 3, 4))
    mask = np.array([[True, True, False], [True, False, False], [True, True, True]])
    turned = np.swapaxes(x, 0, 1).copy()
    turned[2, 0] = 1e6  # row 0, position 2: padding, whatever it holds
    assert batch_first(turned, (3, 3, 4), expected=x, mask=mask).layout == TIME_FIRST


def test_what_cannot_be_arranged_says_why():
    for hooked, shape, words in (
        (None, (2, 6, 4), "nothing was recorded"),
        (values((6, 4)), (2, 6, 4), "shape (6, 4), expected (2, 6, 4) batch-first or (6, 2, 4)"),
        (values((2, 6, 5)), (2, 6, 4), "shape (2, 6, 5)"),
        (np.array(["a", "b"]), (2,), "not numeric"),
        (values((3,)), (2,), "shape (3,), expected (2,)"),
    ):
        array, layout, reason = batch_first(hooked, shape)
        assert array is None and layout == "" and words in reason, reason
    assert "expected values have shape" in batch_first(values((3, 3)), (3, 3), values((2, 2)))[2]
