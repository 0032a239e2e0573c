"""`xfmr summarize`: grade-batch's tables from a folder of collected Gradescope results.json files,
robust to files that are not such results; and mutation-score's check of its own dependencies."""

import csv
import json
from pathlib import Path

import pytest

from harness import grading
from harness.cli import main
from harness.jobs import mutation_score
from harness.outcomes import Outcome
from harness.records import Grade, TestResult
from harness.reports import grades as tables
from harness.reports.gradescope import gradescope
from harness.shared_tests.laws import BY_NAME

ROOT = Path(__file__).resolve().parents[3]
NAMES = ["test_hand_example_label_smoothing", "test_hand_example_noam", "test_golden_torch"]
TESTS = [BY_NAME[n] for n in NAMES]
REASON = {
    "killed": "failed: off by 0.5",
    "error": "crashed: segfault",
    "timeout": "timed out: 30 s",
}


def a_grade(name: str, outcomes: list[str], rejected: str = "", error: str = "") -> Grade:
    """A Grade as grade() returns it, each test with the outcome given."""
    results = []
    for t, outcome in zip(TESTS, outcomes, strict=True):
        passed = outcome == "passed"
        message = rejected or ("" if passed else REASON[outcome])
        score = float(t.points) if passed else 0.0
        results.append(
            TestResult(
                t.name, t.law, Outcome(outcome), score, float(t.points), message, 0.1, t.visibility
            )
        )
    return Grade(name, results, rejected, error=error)


GRADES = {
    "alice": a_grade("alice.py", ["passed", "passed", "passed"]),
    "bob": a_grade("bob.py", ["passed", "killed", "timeout"]),
    "carol": a_grade("carol.py", ["passed", "killed", "killed"]),
    "dave": a_grade("dave.py", ["error"] * 3, rejected="rejected: imports impl.transformer"),
}


@pytest.fixture
def collected(tmp_path):
    """Gradescope's way: a folder per submission, each with the results.json `xfmr grade
    --gradescope` wrote (one a level deeper, one in grade-batch's naming), and broken files."""
    root = tmp_path / "collected"
    for name, g in GRADES.items():
        where = {"carol": root / "carol" / "results", "dave": root}.get(name, root / name)
        where.mkdir(parents=True, exist_ok=True)
        file = "dave.gradescope.json" if name == "dave" else "results.json"
        (where / file).write_text(json.dumps(gradescope(g)))
    bad = {
        "cut/results.json": json.dumps(gradescope(GRADES["bob"]))[:150],  # cut short
        "list/results.json": "[1, 2, 3]",
        "empty/results.json": "",
        "nothing/results.json": '{"output": "hello"}',
        "wrongtype/results.json": '{"tests": [{"name": "t", "score": "ten", "max_score": 1}]}',
        "status/results.json": '{"tests": [{"name": "t", "status": "maybe"}]}',
        "binary/results.json": b"\xff\xfe\x00garbage",
    }
    for relative, content in bad.items():
        (root / relative).parent.mkdir(parents=True)
        path = root / relative
        path.write_bytes(content if isinstance(content, bytes) else content.encode())
    (root / "alice" / "notes.json").write_text("not read: not a results file's name")
    return root, len(bad)


def test_summarize_reads_every_submissions_results_file(collected):
    root, broken = collected
    grades, skipped = tables.summarize_folder(root)
    # a folder per submission (carol's a level deeper, in results/), grade-batch's naming
    assert sorted(g.submission for g in grades) == ["alice", "bob", "carol", "dave"]
    assert len(skipped) == broken  # notes.json is not a results file's name: not read at all


def test_summarize_gives_grade_batchs_tables(collected):
    root, _ = collected
    grades, _ = tables.summarize_folder(root)
    by_name = {g.submission: g for g in grades}
    batch = {Path(g.submission).stem: g for g in GRADES.values()}
    order = sorted(by_name)
    from_files = tables.batch_table([by_name[n] for n in order])
    from_batch = tables.batch_table([tables.Graded.of(batch[n]) for n in order])
    from_batch["submission"] = from_batch["submission"].str.removesuffix(".py")
    assert from_files.equals(from_batch)  # every score, pass and outcome, rejected included
    worst = tables.hardest(grades)
    assert worst.equals(tables.hardest([tables.Graded.of(g) for g in GRADES.values()]))
    assert worst.iloc[0].tolist() == ["test_hand_example_noam", 2, 3, 0.67, "killed"]
    assert worst.set_index("test").loc["test_golden_torch", "failed"] == 2
    assert not by_name["dave"].counted and by_name["dave"].rejected.startswith("rejected:")


def test_the_outcome_is_read_back_from_the_graders_reasons():
    # a failed test's Gradescope output begins with grade's reason for its outcome
    assert {
        f"{grading._REASON[o]}:" for o in grading._REASON if o is not Outcome.NOT_APPLICABLE
    } <= {r for r in tables._OUTCOME_OF_REASON}
    assert tables._OUTCOME_OF_REASON[grading._REASON[Outcome.NOT_APPLICABLE]] == "not applicable"


def test_the_command_prints_the_tables_names_each_skipped_file_and_writes_csvs(
    collected, tmp_path, capsys
):
    root, broken = collected
    out = tmp_path / "summary"
    status = main(["summarize", str(root), "--out", str(out), "--markdown", str(tmp_path / "s.md")])
    said = capsys.readouterr().out
    assert status == 1  # some files skipped
    assert "Tests students fail most (of the submissions that ran):" in said
    assert "not counted: dave: rejected: imports impl.transformer" in said
    skipped = [line for line in said.splitlines() if line.startswith("skipped ")]
    assert len(skipped) == broken
    for name in ("cut", "list", "empty", "nothing", "wrongtype", "status", "binary"):
        assert any(f"/{name}/results.json: " in line for line in skipped), name
    assert f"read 4 results files, skipped {broken}" in said
    rows = list(csv.DictReader((out / "grades.csv").open()))
    assert {r["submission"]: r["score"] for r in rows} == {
        "alice": "25.0",
        "bob": "5.0",
        "carol": "5.0",
        "dave": "0.0",
    }
    hardest = list(csv.DictReader((out / "hardest_tests.csv").open()))
    assert [r["test"] for r in hardest][0] == "test_hand_example_noam"
    assert "| test_hand_example_noam | 2 | 3 | 0.67 | killed |" in (tmp_path / "s.md").read_text()


def test_a_folder_with_nothing_readable_is_a_usage_error(tmp_path, capsys):
    (tmp_path / "results.json").write_text("{")
    assert main(["summarize", str(tmp_path)]) == 2
    assert "no results file to summarize" in capsys.readouterr().err
    assert main(["summarize", str(tmp_path / "missing")]) == 2


def test_other_autograders_results_without_status_or_top_score(tmp_path):
    # Gradescope's spec: status and the top-level score are optional (scores decide)
    (tmp_path / "x").mkdir()
    (tmp_path / "x" / "results.json").write_text(
        json.dumps(
            {
                "tests": [
                    {"name": "a", "score": 1, "max_score": 1},
                    {"name": "b", "score": 0, "max_score": 2, "output": "wrong"},
                    {"name": "info", "output": "only a message"},
                ]
            }
        )
    )
    (g,), skipped = tables.summarize_folder(tmp_path)
    assert not skipped and (g.score, g.max_score, g.passed) == (1.0, 3.0, False)
    assert [(t.name, t.passed, t.outcome) for t in g.tests] == [
        ("a", True, "passed"),
        ("b", False, "failed"),
    ]


def test_a_grader_error_is_not_counted(tmp_path):
    g = a_grade("erin.py", ["error"] * 3)
    g.error = "Traceback ..."
    (tmp_path / "erin.gradescope.json").write_text(json.dumps(gradescope(g)))
    (read,), _ = tables.summarize_folder(tmp_path)
    assert read.error and not read.counted and tables.hardest([read]).empty


# --- mutation-score: its own dependencies, checked before anything runs ---------------------------


def test_the_workers_interpreter_imports_what_a_suite_needs_here():
    assert mutation_score.missing_modules() == {}  # this venv has the [test] extra
    missing = mutation_score.missing_modules(("pytest", "xfmr_no_such_module"))
    assert list(missing) == ["xfmr_no_such_module"]
    assert "No module named 'xfmr_no_such_module'" in missing["xfmr_no_such_module"]


def test_a_missing_hypothesis_exits_2_naming_the_extra_before_any_suite_runs(
    tmp_path, monkeypatch, capsys
):
    # hypothesis made unimportable in the interpreter the workers use: a package first on their
    # import path that fails as a missing one does (a main install without the [test] extra)
    shadow = tmp_path / "shadow" / "hypothesis"
    shadow.mkdir(parents=True)
    (shadow / "__init__.py").write_text(
        "raise ModuleNotFoundError(\"No module named 'hypothesis'\")"
    )
    paths = mutation_score.sandbox.python_paths()
    monkeypatch.setattr(
        mutation_score.sandbox, "python_paths", lambda: [str(tmp_path / "shadow"), *paths]
    )

    def never(*args, **kwargs):
        raise AssertionError("no suite may run")

    monkeypatch.setattr(mutation_score, "mutation_score", never)
    monkeypatch.setattr(mutation_score, "isolation_problem", never)
    status = main(["mutation-score", str(ROOT / "examples" / "student_tests_strong")])
    err = capsys.readouterr().err
    assert status == 2
    assert "No module named 'hypothesis'" in err and "pip install -e '.[test]'" in err
    assert "pytest (" not in err  # only what is missing is named
