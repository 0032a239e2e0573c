"""A real Dask cluster on localhost: `dask scheduler` and two `dask worker` processes, started and
torn down by harness.engine.cluster.localhost_cluster. grade-batch over the examples and a small
matrix run through it must give what the local executor gives, cell for cell (about a minute)."""

from __future__ import annotations

import csv
import io
import json
import os
from pathlib import Path

import pytest

from harness.cli import main
from harness.shared_tests.laws import SHARED_TESTS

if os.environ.get("CI"):
    import distributed  # noqa: F401  (CI installs the [dist] extra: never skipped there)
else:
    pytest.importorskip("distributed", reason="needs the [dist] extra")

pytestmark = [pytest.mark.slow, pytest.mark.cluster]

EXAMPLES = Path(__file__).resolve().parents[3] / "examples"
# the quick shared tests (the learning run alone takes 20 s a submission, nothing new for the
# engine); the faulty example fails some of them
QUICK = (
    "test_hand_example_label_smoothing", "test_hand_example_noam", "test_golden_torch",
    "test_decoder_is_causal", "test_source_padding_is_never_read",
    "test_decode_step_equals_forward", "test_validation", "test_defaults_are_the_contracts",
)  # fmt: skip
KEPT = [t for t in SHARED_TESTS if t.name in QUICK]
GRADED, FULL = ",".join(t.name for t in KEPT), sum(t.points for t in KEPT)
MATRIX = [
    "--only", "impl,sanity,s07,s08,s10",
    "--tests", "test_hand_example_label_smoothing,test_hand_example_noam,"
    "test_decode_step_equals_forward,test_validation",
]  # fmt: skip


@pytest.fixture(scope="module")
def address():
    from harness.engine.cluster import localhost_cluster

    with localhost_cluster(workers=2, timeout=90) as address:
        yield address


def grades(folder: Path) -> dict[str, dict]:
    """Each submission's Gradescope JSON, its timings left out."""
    found = {}
    for path in sorted(folder.glob("*.gradescope.json")):
        data = json.loads(path.read_text())
        del data["execution_time"]
        found[path.name] = data
    return found


def test_grade_batch_on_the_cluster_equals_the_local_grades(address, tmp_path, capsys):
    common = ["grade-batch", str(EXAMPLES), "--tests", GRADED]
    local = main([*common, "--out", str(tmp_path / "local"), "--jobs", "2"])
    remote = main([*common, "--out", str(tmp_path / "remote"), "--scheduler", address])
    assert local == remote == 1  # the faulty one fails
    here, there = grades(tmp_path / "local"), grades(tmp_path / "remote")
    # correct, faulty, annotated, float32 table, conftest.py and the three suite folders
    assert len(here) == 8 and here == there
    table = (tmp_path / "local" / "grades.csv").read_text()
    assert table == (tmp_path / "remote" / "grades.csv").read_text()
    rows = {r["submission"]: r for r in csv.DictReader(io.StringIO(table))}  # not vacuous:
    assert (
        float(rows["correct_submission.py"]["score"])
        == FULL
        == float(rows["correct_submission.py"]["max_score"])
    )
    assert float(rows["faulty_submission.py"]["score"]) < FULL


def test_a_matrix_on_the_cluster_equals_the_local_matrix(address, tmp_path, capsys):
    local = main(["matrix", *MATRIX, "--quiet", "--json", str(tmp_path / "local.json")])
    argv = ["matrix", *MATRIX, "--quiet", "--scheduler", address]
    remote = main([*argv, "--json", str(tmp_path / "remote.json")])
    assert local == remote == 0

    def cells(name: str) -> list[tuple]:
        data = json.loads((tmp_path / name).read_text())
        return [(c["test"], c["subject"], c["outcome"], c["message"]) for c in data["cells"]]

    here, there = cells("local.json"), cells("remote.json")
    assert here == there and len(here) == 5 * 4
    assert {c[2] for c in here} == {"passed", "killed"}
    worker_starts = json.loads((tmp_path / "remote.json").read_text())["timing"]["worker_starts"]
    # each row ran, on the cluster; impl's traced, each of its 4 tests from a fresh load
    assert worker_starts.pop("impl") == 4 and set(worker_starts.values()) == {1}


# A unit's task whose first run kills the Dask worker process running it. A builtin (eval) on an
# expression: the workers import nothing of the tests.
DIES_ONCE = (
    "(open(MARKER, 'w').write(str(os.getpid())) and os._exit(1)) if not os.path.exists(MARKER) "
    "else f'done in {os.getpid()}'"
)


def test_a_worker_that_dies_mid_unit_is_replaced_and_the_unit_runs_again(address, tmp_path):
    from harness.engine import work
    from harness.engine.cluster import DaskExecutor

    marker = tmp_path / "died"
    code = "(lambda os: " + DIES_ONCE.replace("MARKER", repr(str(marker))) + ")(__import__('os'))"
    unit = work.Unit("dies-once", str, eval, lambda: code, str, lambda why: f"lost: {why}")
    executor = DaskExecutor.connect(work.Scheduler(address=address))
    try:
        [result] = executor.run([unit])
    finally:
        executor.close()
    died = marker.read_text()
    assert result.startswith("done in ") and result != f"done in {died}", result
