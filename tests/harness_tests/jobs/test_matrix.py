"""The kill-rate matrix: its findings, its report formats, and the committed expectation."""

from __future__ import annotations

import argparse
import io
import json

import pandas as pd
import pytest

from harness.analysis import summarize
from harness.engine.coverage import run_inferring
from harness.engine.run import run_suite
from harness.jobs.matrix import (
    EXPECTED,
    changed_cells,
    configure_matrix,
    matrix_subjects,
    run_matrix,
)
from harness.outcomes import Outcome
from harness.reports import matrix as reports
from harness.shared_tests.laws import BY_NAME, SHARED_TESTS
from harness.subjects import module_source
from mutants import catalog


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


def test_the_stryker_report_validates_against_the_official_schema(small_run, stryker_schema):
    report = json.loads(json.dumps(reports.stryker(*small_run)))  # JSON-clean
    errors = sorted(stryker_schema.iter_errors(report), key=str)
    assert not errors, [f"{list(e.path)}: {e.message}" for e in errors]
    [(path, file)] = report["files"].items()
    assert path == "impl/transformer.py" and "projectRoot" not in report  # relative paths only
    # the CLI's count: pitfall mutants only (the sanity mutant checks the tests, it is no pitfall)
    assert sorted(m["id"] for m in file["mutants"]) == ["s07", "s08"]
    for m in file["mutants"]:
        assert m["status"] == "Killed" and m["killedBy"] and "coveredBy" not in m
        assert "/work/" not in m["statusReason"] and not m["statusReason"].startswith("/")


def test_with_impls_coverage_the_stryker_report_says_which_tests_cover_each_mutant(
    stryker_schema,
):
    subjects = [s for s in matrix_subjects() if s.name in ("impl", "s07", "s08")]
    tests = [BY_NAME["test_hand_example_label_smoothing"], BY_NAME["test_hand_example_noam"]]
    run = run_inferring(tests, subjects)
    report = json.loads(json.dumps(reports.stryker(run, summarize(run))))
    assert not list(stryker_schema.iter_errors(report))
    [file] = report["files"].values()
    covered = {m["id"]: (m["coveredBy"], m["testsCompleted"]) for m in file["mutants"]}
    # each hand example calls one of the two functions: the other mutant's cell was not run
    assert covered == {
        "s07": (["test_hand_example_label_smoothing"], 1),
        "s08": (["test_hand_example_noam"], 1),
    }


@pytest.mark.parametrize("mutant", [m for m in catalog.MUTANTS if len(m.patches) > 1])
def test_a_multi_patch_mutant_shows_every_patch_in_its_report_region(mutant):
    _, source = module_source("impl.transformer")
    (line, col), (end_line, end_col), replacement = mutant.span(source)
    lines = source.splitlines(keepends=True)
    start = sum(map(len, lines[: line - 1])) + col - 1
    end = sum(map(len, lines[: end_line - 1])) + end_col - 1
    # the region replaced by the replacement is exactly the mutant
    assert source[:start] + replacement + source[end:] == mutant.apply(source)
    assert all(p.new in replacement for p in mutant.patches)


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
    for mutant in catalog.PITFALLS + catalog.CLAUSES:
        assert set(catalog.get(mutant).killers) <= summary.kill_sets[mutant], mutant
    assert summary.healthy and summary.score == 1.0


@pytest.mark.slow
def test_a_forward_fault_is_not_charged_again_by_the_learning_test(full_run):
    # one cause, one charge: where the golden test finds the forward pass wrong, the learning
    # test (which judges the trained weights with the oracle's loss) says it cannot judge
    run, _ = full_run
    learning = "test_learns_reversed_addition"
    charged = []
    for mutant in catalog.PITFALLS + catalog.CLAUSES:
        golden, learned = run.cell("test_golden_torch", mutant), run.cell(learning, mutant)
        if golden.outcome is Outcome.KILLED and learned.outcome is Outcome.KILLED and learned.ran:
            charged.append(mutant)
            assert learned.message.startswith("not judged: test_golden_torch"), (mutant, learned)
    assert charged  # s01, s03, s04, s05 today: the check is not vacuous


def test_every_format_lists_the_findings():
    # a run where s08 survives: the text, Markdown and HTML reports all say so
    subjects = [s for s in matrix_subjects() if s.name in ("impl", "s08")]
    run = run_suite([BY_NAME["test_hand_example_label_smoothing"]], subjects)
    summary = summarize(run)
    finding = "SURVIVED: s08 is killed by no test"
    assert finding in reports.text(run, summary)
    assert f"- {finding}" in reports.markdown(run, summary)
    assert f">{finding}</li>" in reports.html_page(run, summary)
