"""`xfmr grade` on correct and faulty submissions: points, reports, diagnosis, static checks."""

import json
import os
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest

from harness import grading
from harness.cli import main
from harness.isolation.static_check import problems as forbidden_imports
from harness.jobs import grade
from harness.outcomes import Outcome
from harness.records import Grade
from harness.reports import grade as grade_report
from harness.reports import grades as tables
from harness.reports.gradescope import gradescope
from harness.shared_tests.inputs import golden_inputs
from harness.shared_tests.laws import BY_NAME, SHARED_TESTS

ROOT = Path(__file__).resolve().parents[3]


@pytest.fixture(scope="module")
def torch_copy_graded(tmp_path_factory):
    """One full grading of the torch copy through the CLI, with every report written."""
    out = tmp_path_factory.mktemp("reports")
    status = main(
        [
            "grade",
            str(ROOT / "impl" / "torch_copy.py"),
            "--json",
            str(out / "grade.json"),
            "--junit",
            str(out / "junit.xml"),
            "--gradescope",
            str(out / "results.json"),
        ]
    )
    return status, out


@pytest.mark.slow
def test_torch_copy_gets_full_marks(torch_copy_graded):
    # a correct subject written differently from impl passes every shared test
    status, out = torch_copy_graded
    data = json.loads((out / "grade.json").read_text())
    assert status == 0
    assert data["passed"] and data["score"] == data["max_score"] > 0
    assert [t["name"] for t in data["tests"]] == [t.name for t in SHARED_TESTS]
    assert data["seconds"] <= 30, "grading one submission must take at most 30 s"


@pytest.mark.slow
def test_gradescope_results_follow_the_format(torch_copy_graded):
    _, out = torch_copy_graded
    data = json.loads((out / "results.json").read_text())
    assert {"score", "execution_time", "output", "tests"} <= set(data)
    for t in data["tests"]:
        assert {"name", "score", "max_score", "status", "output", "visibility"} <= set(t)
        assert t["status"] == "passed" and t["score"] == t["max_score"]
    assert data["score"] == sum(t["max_score"] for t in data["tests"])


@pytest.mark.slow
def test_junit_lists_every_test(torch_copy_graded, junit_schema):
    _, out = torch_copy_graded
    junit_schema.validate(str(out / "junit.xml"))  # Jenkins' junit-10.xsd
    suite = ET.parse(out / "junit.xml").getroot().find("testsuite")
    assert suite.get("tests") == str(len(SHARED_TESTS))
    assert suite.get("failures") == "0" and suite.get("errors") == "0"
    assert len(suite.findall("testcase")) == len(SHARED_TESTS)


# What readable source padding breaks: every value on a padded source, and the decodings of the
# tests that load padded sources with the parent's weights.
FAULTY_FAILS = [
    "test_golden_torch",
    "test_source_padding_is_never_read",
    "test_translate_is_greedy_with_beam_one_and_drops_eos",
    "test_beam_search_matches_oracle",
]


@pytest.mark.slow
def test_faulty_submission_fails_with_its_first_divergence():
    # the example's cross-attention reads source padding (mutant s06's pitfall) and nothing else
    # is wrong; the learning test (4 s, no padding law) is left out to keep this test fast
    tests = [t for t in SHARED_TESTS if t.name != "test_learns_reversed_addition"]
    g = grade.grade(ROOT / "examples" / "faulty_submission.py", tests)
    failed = {t.name: t for t in g.tests if not t.passed}
    assert list(failed) == FAULTY_FAILS
    assert all(t.outcome is Outcome.KILLED for t in failed.values())
    golden = failed["test_golden_torch"].message
    assert "max abs error" in golden
    assert "first divergence: decoder.0.cross_attn" in golden
    # one cause, said once: the other configs, where only the error sizes differ, are named
    assert golden.count("padded keys are read") == 1 and "(the same in: " in golden
    assert set(g.diagnosis) == {name for name, _, _ in golden_inputs()}  # the JSON keeps each
    junit = ET.fromstring(grade_report.junit(g).split("\n", 1)[1])
    assert junit.find("testsuite").get("failures") == str(len(FAULTY_FAILS))


@pytest.mark.slow
def test_correct_example_passes_and_differs_from_the_faulty_one_by_the_fault_only():
    correct = ROOT / "examples" / "correct_submission.py"
    faulty = (ROOT / "examples" / "faulty_submission.py").read_text()
    changed = set(correct.read_text().splitlines()) ^ set(faulty.splitlines())
    code = {line.strip() for line in changed if line.startswith("        ")}  # below docstrings
    assert code == {
        "y = self.sublayer(y, lambda z: self.cross_attn(z, memory, src_allowed), self.norm2)",
        "y = self.sublayer(y, lambda z: self.cross_attn(z, memory), self.norm2)",
        "# FAULT: src_allowed should be passed here; without it the padded source positions of",
        "# memory are read like real tokens.",
    }
    tests = [t for t in SHARED_TESTS if t.name != "test_learns_reversed_addition"]
    g = grade.grade(correct, tests)
    assert [t.name for t in g.tests if not t.passed] == []


@pytest.mark.slow
def test_a_grade_takes_points_and_visibility_from_the_test_records(torch_copy_graded):
    _, out = torch_copy_graded
    data = json.loads((out / "results.json").read_text())
    for t, test in zip(data["tests"], SHARED_TESTS, strict=True):
        assert (t["name"], t["max_score"], t["visibility"]) == (
            test.name,
            test.points,
            test.visibility,
        )


@pytest.mark.parametrize(
    "source, found",
    [
        ("import impl.transformer", ["line 1: imports impl.transformer"]),
        ("from oracle.model import forward", ["line 1: imports oracle.model"]),
        (
            "x = 1\nimport importlib\nimportlib.import_module('harness')",
            ["line 3: imports harness"],
        ),
        ("__import__('mutants.catalog')", ["line 1: imports mutants.catalog"]),
        ("import torch\nfrom . import impl", []),  # a relative import is the package's own
        ("import implement, oracles", []),
    ],
)
def test_static_check_finds_protected_imports(source, found):
    assert forbidden_imports(source) == found


@pytest.mark.parametrize(
    "make, reason",
    [
        (lambda d: d / "nothing.py", "does not exist"),
        (lambda d: (d / "pkg").mkdir() or d / "pkg", "a folder without __init__.py"),
        (lambda d: (d / "notes.txt").write_text("x") and d / "notes.txt", "is not a .py file"),
        (lambda d: (d / "bad.py").write_text("def f(:\n") and d / "bad.py", "does not parse"),
        (
            lambda d: (d / "deep.py").write_text("x = " + "-" * 20000 + "1\n") and d / "deep.py",
            "does not parse",
        ),
        (
            lambda d: (d / "imp.py").write_text("import impl\n") and d / "imp.py",
            "imports the grader's own packages",
        ),
    ],
)
def test_a_submission_that_cannot_run_is_rejected_with_its_true_reason(tmp_path, make, reason):
    g = grade.grade(make(tmp_path), [BY_NAME["test_hand_example_noam"]])
    assert not g.passed and reason in g.rejected, g.rejected


def grade_impl_variant(tmp_path, old: str, new: str, test: str, extra: str = ""):
    """impl with every `old` replaced by `new` (and `extra` appended), graded by one shared test:
    that test's result."""
    source = (ROOT / "impl" / "transformer.py").read_text()
    assert old in source, f"impl no longer holds {old!r}"
    submission = tmp_path / "transformer.py"
    submission.write_text(source.replace(old, new) + extra)
    [result] = grade.grade(submission, [BY_NAME[test]]).tests
    return result


ALWAYS_DROPOUT = """

class AlwaysDropout(nn.Module):
    def __init__(self, p):
        super().__init__()
        self.p = p

    def forward(self, x):
        return F.dropout(x, self.p, training=True)
"""


@pytest.mark.parametrize(
    "fault,new",
    [
        ("no dropout at all", "nn.Identity()"),
        ("dropout even in eval mode", "AlwaysDropout(cfg.dropout)"),
    ],
)
def test_the_dropout_law_catches_missing_and_ever_present_dropout(tmp_path, fault, new):
    # impl with its dropout modules replaced: golden (dropout off in eval) tells the second fault
    # too, but only the dropout law tells the first
    result = grade_impl_variant(
        tmp_path, "nn.Dropout(cfg.dropout)", new, "test_dropout_only_in_training", ALWAYS_DROPOUT
    )
    assert result.outcome is Outcome.KILLED, fault


@pytest.mark.parametrize(
    "old, new, words",
    [
        ("d_ff: int = 2048", "d_ff: int = 1024", "d_ff defaults to 1024, expected 2048"),
        ("length_penalty: float = 1.0", "length_penalty: float = 0.6", "length_penalty defaults"),
    ],
)
def test_a_changed_default_is_caught_by_the_defaults_law(tmp_path, old, new, words):
    # every other test passes every field; the laws calling translate anyway leave its defaults
    # out only at secret points (harness.shared_tests.omitted): this law judges every default
    result = grade_impl_variant(tmp_path, old, new, "test_defaults_are_the_contracts")
    assert result.outcome is Outcome.KILLED and words in result.message, result.message


# Every escape sequence and XML-forbidden control character a student's exception can carry.
NOISY = "".join(chr(c) for c in range(32) if chr(c) not in "\t\n") + "\x7f\x1b[31mred\x1b[0m"


def test_student_text_with_control_characters_keeps_the_junit_file_valid(tmp_path, junit_schema):
    submission = tmp_path / "noisy.py"
    raising = f"def noam_rate(step, d_model, warmup, factor=1.0):\n    raise ValueError({NOISY!r})"
    submission.write_text((ROOT / "impl" / "torch_copy.py").read_text() + "\n\n" + raising)
    tests = [BY_NAME["test_hand_example_noam"], BY_NAME["test_defaults_are_the_contracts"]]
    g = grade.grade(submission, tests)
    xml = grade_report.junit(g)
    junit_schema.validate(xml.split("\n", 1)[1])  # Jenkins' junit-10.xsd, xmlschema's parser
    suite = ET.fromstring(xml.split("\n", 1)[1]).find("testsuite")
    assert (suite.get("tests"), suite.get("failures"), suite.get("errors")) == ("2", "1", "0")
    message = suite.find("testcase/failure").get("message")
    assert "red" in message and "\\x07" in message and "\x1b" not in message
    assert "\x1b" not in grade_report.text(g) and "\x00" not in json.dumps(gradescope(g))


@pytest.mark.parametrize(
    "argv, words",
    [
        (["grade", "impl/torch_copy.py", "--tests", "nope"], "--tests: unknown ['nope']"),
        (["grade", "impl/torch_copy.py", "--time-limit", "0"], "must be above 0"),
        (["grade", "impl/torch_copy.py", "--memory-mb", "-5"], "must be above 0"),
        (["grade", "impl/torch_copy.py", "--json", "/nonexistent/x.json"], "does not exist"),
        (["grade-batch", "examples", "--out", "/proc/xfmr"], "cannot create"),
        (["matrix", "--only", "s99"], "--only: unknown ['s99']"),
        (["matrix", "--tests", "nope"], "--tests: unknown ['nope']"),
        (["mutation-score", "examples/student_tests_weak", "--jobs", "0"], "must be above 0"),
        ([], "usage: xfmr COMMAND"),
    ],
)
def test_a_bad_option_or_path_is_a_usage_error_before_anything_runs(capsys, argv, words):
    try:
        status = main(argv)
    except SystemExit as e:  # argparse's own usage errors
        status = e.code
    assert status == 2
    assert words in capsys.readouterr().err


def test_python_dash_m_harness_is_the_xfmr_command():
    import subprocess
    import sys

    done = subprocess.run(
        [sys.executable, "-m", "harness", "--version"], capture_output=True, text=True, cwd=ROOT
    )
    assert done.returncode == 0 and done.stdout.startswith("xfmr ")


def test_gradescope_visibility_is_the_staffs_choice(tmp_path):
    # --visibility and --stdout-visibility for the whole result, each test's own from its record
    g = grade.grade(tmp_path / "missing.py", [BY_NAME["test_hand_example_noam"]])
    data = gradescope(g, "after_due_date", "visible")
    assert (data["visibility"], data["stdout_visibility"]) == ("after_due_date", "visible")
    noam = BY_NAME["test_hand_example_noam"]
    assert [t["visibility"] for t in data["tests"]] == [noam.visibility]
    assert "does not exist" in data["output"] and data["output_format"] == "text"


def test_gradescopes_submission_folder_is_graded_as_its_transformer_py(tmp_path):
    # /autograder/submission holds the student's files without __init__.py
    folder = tmp_path / "submission"
    folder.mkdir()
    (folder / "transformer.py").write_text((ROOT / "impl" / "torch_copy.py").read_text())
    (folder / "notes.txt").write_text("my notes")
    g = grade.grade(folder, [BY_NAME["test_hand_example_noam"]])
    assert g.passed and g.submission == str(folder)


def test_a_report_that_cannot_be_written_does_not_cost_the_others(tmp_path, capsys):
    from harness.reports.writer import write_all

    gone = tmp_path / "gone" / "a.json"  # its folder vanished after the up-front check
    kept = tmp_path / "b.json"
    assert not write_all("grade", [(gone, lambda: {"a": 1}), (kept, lambda: {"b": 2})])
    assert json.loads(kept.read_text()) == {"b": 2}
    assert f"could not write {gone}" in capsys.readouterr().err


def test_a_grader_fault_exits_3_and_its_results_json_says_so_with_score_0(tmp_path, monkeypatch):
    def broken(*args, **kwargs):
        raise RuntimeError("a bug of the grader's own")

    monkeypatch.setattr(grading, "run_subject_apart", broken)
    report = tmp_path / "results.json"
    argv = ["grade", str(ROOT / "impl" / "torch_copy.py"), "--gradescope", str(report)]
    assert main([*argv, "--tests", "test_hand_example_noam"]) == 3
    data = json.loads(report.read_text())
    # Gradescope's specification wants a score: 0; what staff must do is in a hidden test only
    assert "GRADER ERROR" in data["output"] and data["score"] == 0
    *tests, staff = data["tests"]
    assert "Course staff" not in data["output"] and staff["visibility"] == "hidden"
    assert "Course staff" in staff["output"] and "regrade" in staff["output"]
    assert all(t["score"] == 0 for t in tests)


@pytest.mark.parametrize(
    "old, new",
    [
        (
            "self.enc_norm = nn.LayerNorm(d, eps=cfg.ln_eps) if pre else None",
            "self.enc_norm = nn.LayerNorm(d) if pre else None",
        ),
        (
            "self.norm3 = nn.LayerNorm(cfg.d_model, eps=cfg.ln_eps)",
            "self.norm3 = nn.LayerNorm(cfg.d_model)",
        ),
    ],
)
@pytest.mark.slow
def test_a_layer_norm_that_ignores_ln_eps_fails_the_golden_test(tmp_path, old, new):
    # one golden config uses ln_eps 1e-3: torch's default 1e-5 there moves the logits by ~5e-4
    result = grade_impl_variant(tmp_path, old, new, "test_golden_torch")
    assert result.outcome is Outcome.KILLED and "ln_eps 1e-3" in result.message, result.message


def test_a_batch_whose_every_submission_is_rejected_has_no_hardest_test():
    rejected = [Grade(f"s{i}.py", [], rejected="imports harness") for i in range(2)]
    table = tables.hardest([tables.Graded.of(g) for g in rejected])
    assert table.empty and list(table.columns) == ["test", "failed", "of", "share", "usual outcome"]


def test_the_learning_test_runs_apart_except_in_the_container_tier():
    # the container tier's workers are one user, and ending a worker ends every process of that
    # user: a second worker beside the first would die when the first is closed
    assert grading.tests_apart(cpus=2) == grading.APART == ("test_learns_reversed_addition",)
    assert grading.tests_apart(cpus=1) == ()
    assert grading.tests_apart(one_user=True, cpus=16) == ()


def test_a_grade_takes_the_cores_it_is_given(monkeypatch, capsys):
    monkeypatch.setenv(grading.GRADER_CPUS, "1")  # graders sharing a machine: one core each
    assert grading.grader_cpus() == 1 and grading.tests_apart() == ()
    monkeypatch.setenv(grading.GRADER_CPUS, " 4 ")
    assert grading.grader_cpus() == 4 and grading.tests_apart() == grading.APART
    monkeypatch.delenv(grading.GRADER_CPUS)
    assert grading.grader_cpus() == (os.cpu_count() or 1)
    for bad in ("0", "-2", "two", "1.5"):
        monkeypatch.setenv(grading.GRADER_CPUS, bad)
        with pytest.raises(ValueError, match="XFMR_GRADER_CPUS must be a positive integer"):
            grading.tests_apart()
    # grade and check say so before anything runs
    assert main(["grade", "examples/correct_submission.py"]) == 2
    assert main(["check", "examples/correct_submission.py"]) == 2
    err = capsys.readouterr().err.splitlines()
    assert err == [
        f"xfmr {c}: XFMR_GRADER_CPUS must be a positive integer of cores, got '1.5'"
        for c in ("grade", "check")
    ]


def test_two_submissions_of_one_stem_get_a_report_each(tmp_path, capsys):
    # a.py and a folder a/: neither report overwrites the other (both are rejected, so no
    # sandbox runs: what is checked is where the reports go)
    folder = tmp_path / "class"
    (folder / "a").mkdir(parents=True)
    (folder / "a" / "notes.txt").write_text("a folder holding neither module")
    (folder / "a.py").write_text("import harness\n")
    (folder / "b.py").write_text("import harness\n")
    names = grade.gradescope_names(grade.submissions(folder))
    assert sorted(names.values()) == [
        "a.gradescope.json",
        "a.py.gradescope.json",
        "b.py.gradescope.json",
    ]
    out = tmp_path / "out"
    main(["grade-batch", str(folder), "--out", str(out), "--jobs", "1"])
    capsys.readouterr()
    folder_report = json.loads((out / "a.gradescope.json").read_text())
    file_report = json.loads((out / "a.py.gradescope.json").read_text())
    assert folder_report != file_report
    assert "harness" in json.dumps(file_report) and (out / "b.py.gradescope.json").exists()
    assert "neither transformer.py" in json.dumps(folder_report)
