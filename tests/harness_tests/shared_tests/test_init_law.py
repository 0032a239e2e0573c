"""The init law's per-row check (test_embeddings_scaled_and_tied): honest N(0, 1/d) tables pass,
a zeroed padding row or a constant row fails, whatever the table's overall spread says."""

from __future__ import annotations

import numpy as np
import pytest

from harness.shared_tests.laws.values import row_failure
from harness.shared_tests.record import Failure

D, ROWS = 128, 2048
STD = D**-0.5


@pytest.mark.parametrize("seed", range(20))
def test_honest_tables_pass(seed):
    row_failure("table", np.random.default_rng(seed).normal(0.0, STD, (ROWS, D)), STD)


@pytest.mark.parametrize(
    "row, words",
    [(np.zeros(D), "mean square"), (np.full(D, STD), "mean beyond"), (np.full(D, -STD), "mean")],
)
def test_a_zeroed_or_constant_row_fails(row, words):
    table = np.random.default_rng(1).normal(0.0, STD, (ROWS, D))
    table[7] = row
    with pytest.raises(Failure, match=f"row 7 starts with {words}"):
        row_failure("table", table, STD)
