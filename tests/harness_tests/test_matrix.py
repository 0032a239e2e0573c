"""The kill-rate matrix: its findings, its report formats, and the committed expectation."""

from __future__ import annotations

import argparse
import io
import json
import re

import pandas as pd
import pytest

from harness.analysis import summarize
from harness.engine import run_suite
from harness.jobs.matrix import (
    EXPECTED,
    changed_cells,
    configure_matrix,
    matrix_subjects,
    run_matrix,
)
from harness.outcomes import Outcome
from harness.reports import matrix as reports
from harness.shared_tests.inputs import DATA
from harness.shared_tests.laws import BY_NAME, SHARED_TESTS
from mutants import catalog

SCHEMA = json.loads((DATA / "stryker_schema_required.json").read_text())


@pytest.fixture(scope="module")
def small_run():
    """The two hand-example tests on impl, the sanity mutant and the two mutants they target."""
    subjects = [s for s in matrix_subjects() if s.name in ("impl", "sanity", "s07", "s08")]
    tests = [BY_NAME["test_hand_example_label_smoothing"], BY_NAME["test_hand_example_noam"]]
    run = run_suite(tests, subjects)
    return run, summarize(run)


def test_the_small_matrix_finds_each_hand_example_killer(small_run):
    run, summary = small_run
    assert run.row("impl") == [Outcome.PASSED, Outcome.PASSED]
    assert summary.kill_sets["s07"] == {"test_hand_example_label_smoothing"}
    assert summary.kill_sets["s08"] == {"test_hand_example_noam"}
    assert summary.kill_sets["sanity"] == {t.name for t in run.tests}
    assert summary.score == 1.0 and summary.healthy and not summary.redundant


def require(obj: dict, kind: str, where: str) -> None:
    missing = [k for k in SCHEMA["required"][kind] if k not in obj]
    assert not missing, f"{where}: missing required {kind} fields {missing}"


def test_the_stryker_report_has_the_schemas_required_fields(small_run):
    report = json.loads(json.dumps(reports.stryker(*small_run)))  # JSON-clean
    require(report, "report", "report")
    assert re.fullmatch(r"([1-2]\d*|0)(\.(([1-9]\d*)|0)){0,2}", report["schemaVersion"])
    require(report["thresholds"], "thresholds", "thresholds")
    assert all(isinstance(v, int) and 0 <= v <= 100 for v in report["thresholds"].values())
    for path, file in report["files"].items():
        require(file, "file", path)
        ids = [m["id"] for m in file["mutants"]]
        assert sorted(ids) == ["s07", "s08", "sanity"] and len(set(ids)) == len(ids)
        for m in file["mutants"]:
            require(m, "mutant", m["id"])
            assert m["status"] in SCHEMA["mutant_status"]
            require(m["location"], "location", m["id"])
            for end in ("start", "end"):
                require(m["location"][end], "position", m["id"])
                assert min(m["location"][end].values()) >= 1
            assert all(isinstance(t, str) for t in m["killedBy"] + m["coveredBy"])
    for path, test_file in report["testFiles"].items():
        require(test_file, "testFile", path)
        for t in test_file["tests"]:
            require(t, "test", path)
    require(report["framework"], "framework", "framework")
    require(report["system"], "system", "system")
    require(report["system"]["os"], "os", "system.os")
    require(report["system"]["cpu"], "cpu", "system.cpu")
    statuses = {m["id"]: m["status"] for m in report["files"]["impl/transformer.py"]["mutants"]}
    assert statuses == {"s07": "Killed", "s08": "Killed", "sanity": "Killed"}


def test_every_format_says_the_same(small_run, tmp_path):
    run, summary = small_run
    table = pd.read_csv(io.StringIO(reports.frame(run).to_csv(index=False)))
    assert len(table) == 2 * 4 and set(table["outcome"]) == {"passed", "killed"}
    data = json.loads(json.dumps(reports.to_json(run, summary)))
    assert data["mutants"]["s07"]["killed_by"] == ["test_hand_example_label_smoothing"]
    assert set(data["timing"]["per_subject_s"]) == {"impl", "sanity", "s07", "s08"}
    page = reports.html_page(run, summary)
    assert page.count("<tr>") == 1 + 2 and "#f4b6b6" in page  # header, two tests; killed color
    assert "| test_hand_example_noam | passed | killed |" in reports.markdown(run, summary)
    text = reports.text(run, summary)
    assert "mutation score: 2/2 = 1.00" in text and max(map(len, text.splitlines())) <= 100


def test_check_names_every_changed_cell(small_run):
    run, _ = small_run
    expected = {
        "outcomes": {
            s.name: {t.name: run.cell(t.name, s.name).outcome.value for t in run.tests}
            for s in run.subjects
        }
    }
    assert changed_cells(expected, run) == []
    expected["outcomes"]["s08"]["test_hand_example_noam"] = "passed"
    del expected["outcomes"]["s07"]
    changes = changed_cells(expected, run)
    assert changes[0] == "subject s07: new"
    assert changes[1].startswith("test_hand_example_noam on s08: expected passed, got killed: ")


def test_a_partial_run_refuses_to_check(capsys):
    parser = argparse.ArgumentParser()
    configure_matrix(parser)
    assert run_matrix(parser.parse_args(["--only", "impl", "--check"])) == 2


@pytest.fixture(scope="module")
def full_run():
    """The whole matrix, once per session (about a minute on two loaded cores)."""
    run = run_suite(SHARED_TESTS, matrix_subjects())
    return run, summarize(run)


@pytest.mark.slow
def test_the_whole_matrix_equals_the_committed_expectation(full_run):
    run, summary = full_run
    expected = json.loads(EXPECTED.read_text())
    assert expected["tests"] == [t.name for t in SHARED_TESTS]
    assert changed_cells(expected, run) == []
    # the bar: impl and the copy pass everything; each pitfall dies by the seed's test
    for correct in ("impl", "torch_copy"):
        assert set(run.row(correct)) == {Outcome.PASSED}, correct
    for mutant in catalog.PITFALLS:
        assert set(catalog.get(mutant).killers) <= summary.kill_sets[mutant], mutant
    assert summary.healthy and summary.score == 1.0
