"""The learning guard in CI: the reduced MS-L5 recipe (demos/guard.py) still learns as recorded.

A change of numerics that breaks learning (model, loss, schedule, Adam, data) moves the loss curve
or the exact match past the record's tolerances and fails here. After an intended change:
`python -m demos.guard --record`, and look at the difference before committing it.
"""

import copy
import json

import pytest

from demos import guard


def _record():
    return json.loads(guard.RECORD.read_text())


@pytest.mark.slow
def test_the_reduced_recipe_learns_as_recorded():
    record = _record()
    result = guard.run(guard.RECIPE)
    found = guard.problems(result, record)
    assert not found, "the reduced recipe no longer learns as recorded:\n" + "\n".join(found)
    # and the record itself is of a run that learned (a record re-made from a broken run is not)
    assert record["float32"]["exact_match"] >= 0.98 and record["float64"]["exact_match"] >= 0.98
    assert result["dtype"] == guard.GUARD_DTYPE == "float64"


def test_the_guard_names_a_moved_window_and_a_lower_exact_match():
    record = _record()
    loss_tol, em_tol = guard.tolerances(record)
    moved = copy.deepcopy(record["float32"])
    assert guard.problems(moved, record) == []
    moved["curve"][5] += 2 * loss_tol
    moved["exact_match"] -= 2 * em_tol
    found = guard.problems(moved, record)
    assert len(found) == 2
    assert found[0].startswith(f"updates {5 * guard.WINDOW}-") and "exact match" in found[1]
