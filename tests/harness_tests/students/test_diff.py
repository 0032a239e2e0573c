"""`xfmr diff`: the reference only after every shared test passes; definitions matched by name,
then by what they implement; the Gradescope switch off by default, the reference never in a
results.json without it."""

import json
import re
import zipfile
from pathlib import Path

import pytest

from harness.cli import main
from harness.outcomes import Outcome
from harness.records import Grade, TestResult
from harness.reports import grade as grade_report
from harness.reports.gradescope import REFERENCE_DIFF, gradescope, with_reference
from harness.shared_tests.laws import SHARED_TESTS
from harness.students import diff

ROOT = Path(__file__).resolve().parents[3]
IMPL = ROOT / "impl" / "transformer.py"
CORRECT = ROOT / "examples" / "correct_submission.py"
ANNOTATED = ROOT / "examples" / "annotated_submission.py"
FAULTY = ROOT / "examples" / "faulty_submission.py"
# lines of impl's source no student file shares (its docstrings' own wording)
IMPL_LINES = [
    "The encoder-decoder Transformer of Vaswani et al. 2017 in torch: the contract's reference.",
    "Built in float64 for positions start .. start + length - 1 at every call, then cast",
]


def _grade(path: Path, failing: set[str] = frozenset()) -> Grade:  # type: ignore[assignment]
    """A grade of `path` (as `xfmr grade` records one) where the tests in `failing` failed."""
    tests = [
        TestResult(
            t.name,
            t.law,
            Outcome.KILLED if t.name in failing else Outcome.PASSED,
            0.0 if t.name in failing else float(t.points),
            float(t.points),
            "failed: x" if t.name in failing else "",
            0.1,
        )
        for t in SHARED_TESTS
    ]
    return Grade(str(path), tests)


def _grade_json(tmp_path: Path, path: Path, failing: set[str] = frozenset()) -> Path:  # type: ignore[assignment]
    out = tmp_path / "grade.json"
    out.write_text(json.dumps(grade_report.to_json(_grade(path, failing))))
    return out


def test_the_grade_json_carries_the_files_sha256(tmp_path):
    report = json.loads(_grade_json(tmp_path, CORRECT).read_text())
    assert report["sha256"] == grade_report.sha256_of(CORRECT)
    assert len(report["sha256"]) == 64


def test_diff_refuses_before_a_full_pass_naming_the_failing_tests(tmp_path, capsys):
    failing = {"test_golden_torch", "test_beam_search_matches_oracle"}
    grade = _grade_json(tmp_path, FAULTY, failing)
    assert main(["diff", str(FAULTY), "--grade", str(grade)]) == 1
    captured = capsys.readouterr()
    assert (
        f"2 of {len(SHARED_TESTS)} still fail: test_golden_torch, test_beam_search_matches_oracle"
        in captured.err
    )
    assert captured.out == ""  # nothing of the reference
    assert not any(line in captured.err for line in IMPL_LINES)


def test_diff_refuses_a_grade_of_another_file(tmp_path, capsys):
    grade = _grade_json(tmp_path, CORRECT)
    assert main(["diff", str(FAULTY), "--grade", str(grade)]) == 2
    assert "the grade of another file" in capsys.readouterr().err


def test_no_grade_vouches_for_a_submission_that_cannot_be_hashed(tmp_path, capsys):
    # a link is never hashed (its sha256 is ""): a report whose sha256 is "" must not match it
    grade = _grade_json(tmp_path, CORRECT)
    data = json.loads(grade.read_text())
    grade.write_text(json.dumps({**data, "sha256": ""}))
    link = tmp_path / "transformer.py"
    link.symlink_to(CORRECT)
    assert grade_report.sha256_of(link) == ""
    assert main(["diff", str(link), "--grade", str(grade)]) == 2
    assert "cannot be hashed" in capsys.readouterr().err


@pytest.mark.slow
def test_diff_refuses_the_faulty_example_after_running_the_shared_tests(capsys):
    assert main(["diff", str(FAULTY)]) == 1
    captured = capsys.readouterr()
    assert captured.out == ""
    for name in ("test_golden_torch", "test_source_padding_is_never_read"):
        assert name in captured.err


def test_after_a_pass_each_definition_in_the_contracts_order(tmp_path, capsys):
    grade = _grade_json(tmp_path, IMPL)
    page = tmp_path / "diff.html"
    assert main(["diff", str(IMPL), "--grade", str(grade), "--html", str(page)]) == 0
    out = capsys.readouterr().out
    order = [line.split()[1] for line in out.splitlines() if line.startswith("== ")]
    assert order[:3] == ["TransformerConfig", "Transformer.__init__", "Transformer.encode"]
    assert order.index("noam_rate") < order.index("fit") < order.index("load_transformer")
    assert "identical" in out
    assert out.rstrip().endswith(
        "identical to the reference (comments, docstrings and blank lines aside)"
    )
    said = out.rstrip().splitlines()[-1].split()
    assert said[0] == said[2]  # impl against itself: every definition identical
    assert "<table" in page.read_text()


def test_the_reference_in_a_students_own_words_is_no_difference(tmp_path, capsys):
    # impl's code with its comments and docstrings rewritten, blank lines added: the code is
    # the same, so is every definition; as written, they differ
    mine = tmp_path / "transformer.py"
    text = IMPL.read_text().replace("  # ", "  # my note: ")
    text = re.sub(r'"""(?=[A-Z])', '"""Mine: ', text)
    mine.write_text(text.replace("\n    def ", "\n\n    # a method\n    def "))
    grade = _grade_json(tmp_path, mine)
    assert main(["diff", str(mine), "--grade", str(grade)]) == 0
    said = capsys.readouterr().out.rstrip().splitlines()
    assert all(line.endswith(": identical") for line in said if line.startswith("== ")), said
    assert main(["diff", str(mine), "--grade", str(grade), "--as-written"]) == 0
    as_written = capsys.readouterr().out.rstrip().splitlines()[-1].split()
    assert int(as_written[0]) < int(as_written[2])
    assert as_written[-1] == "reference"  # no "aside" when written as is


def _flat_signature(text: str, start: str) -> str:
    """`text` with the signature that begins with `start` written on one line."""
    a = text.index(start)
    b = text.index(":\n", text.index(") -> ", a))
    flat = re.sub(r"\s*\n\s*", " ", text[a:b]).replace("( ", "(").replace(", )", ")")
    return text[:a] + flat + text[b:]


def test_a_signature_in_another_layout_is_no_difference(tmp_path, capsys):
    # fit's signature on one line and decode_step's one parameter a line with a trailing
    # comma: the same parameters and defaults, so every definition is the reference's
    text = _flat_signature(IMPL.read_text(), "def fit(\n")
    text = text.replace(
        "        self, y_prev: Tensor, memory: Tensor, state: DecodeState\n",
        "        self,\n        y_prev:Tensor,\n        memory: Tensor,\n"
        "        state: DecodeState,\n",
    )
    mine = tmp_path / "transformer.py"
    mine.write_text(text)
    assert text != IMPL.read_text()
    grade = _grade_json(tmp_path, mine)
    assert main(["diff", str(mine), "--grade", str(grade)]) == 0
    said = capsys.readouterr().out.rstrip().splitlines()
    assert all(line.endswith(": identical") for line in said if line.startswith("== ")), said
    # as written, the layout is what differs
    assert main(["diff", str(mine), "--grade", str(grade), "--as-written"]) == 0
    assert "== fit (contract)" in capsys.readouterr().out


def test_a_signature_that_differs_in_a_default_still_differs(tmp_path, capsys):
    # the flat layout aside, warmup's default differs: the diff shows both signatures
    text = _flat_signature(IMPL.read_text(), "def fit(\n").replace(
        "pad_id: int, warmup: int = 4000,", "pad_id: int, warmup: int = 400,"
    )
    mine = tmp_path / "transformer.py"
    mine.write_text(text)
    grade = _grade_json(tmp_path, mine)
    assert main(["diff", str(mine), "--grade", str(grade)]) == 0
    out = capsys.readouterr().out
    assert "== fit (contract)\n" in out
    assert "+def fit(model: Transformer, src: Tensor" in out and "warmup: int = 400," in out
    assert "-    warmup: int = 4000," in out


def test_headers_compare_by_ast():
    one = "def f(a, b=1, *, c: int = 2) -> int:\n    return a\n"
    spread = "def f(\n    a,\n    b = 1,\n    *,\n    c:int=2,\n)->int:\n    return a\n"
    other = "def f(a, b=2, *, c: int = 2) -> int:\n    return a\n"
    assert diff.header(one)[0] == diff.header(spread)[0] != diff.header(other)[0]
    assert diff.header(spread)[1:] == (1, 6)
    assert diff.header("def f(x): return x\n") is None  # no line of its own
    assert (
        diff.header("class A(B, metaclass=M):\n    x = 1\n")[0]
        == diff.header("class A(\n    B,\n    metaclass = M,\n):\n    x = 1\n")[0]
    )


def test_code_lines_keep_code_and_strings_that_look_like_comments():
    source = (
        'def f(x):\n    """Doc\n    more."""\n\n'
        '    y = "# not a comment"  # a comment\n    return y\n'
    )
    assert diff.code_lines(source) == ["def f(x):", '    y = "# not a comment"', "    return y"]


def test_helpers_are_matched_by_what_they_implement():
    m = diff.matching(ANNOTATED)
    paired = {(r.name, y.name) for r, y, _ in m.pairs if r and y}
    assert ("noam_rate", "noam_rate") in paired  # the contract's name
    assert ("_beam_search", "beam_search") in paired  # renamed
    assert ("MultiHeadAttention", "MultiHeadedAttention") in paired
    yours_only = {y.name for r, y, how in m.pairs if y and not r}
    assert {"clones", "attention", "residual"} <= yours_only
    assert all(how == "yours only" for r, y, how in m.pairs if y and not r)


def test_the_html_page_escapes_the_students_code_and_names(tmp_path):
    hostile = tmp_path / "transformer.py"
    hostile.write_text(
        CORRECT.read_text()
        + '\n\ndef evil_helper():\n    return "</td><script>alert(1)</script>"\n'
        + "\n\nclass Transformer2:  # <img src=x onerror=alert(2)>\n    pass\n"
    )
    page = diff.page(diff.matching(hostile), "<b>x</b>.py", as_written=True)
    assert "<script>" not in page and "<img" not in page and "<b>x" not in page
    assert "&lt;script&gt;" in page


def test_gradescope_results_carry_the_diff_only_at_full_score():
    full = gradescope(_grade(CORRECT))
    added = with_reference(full, "== noam_rate: identical\n")
    assert added["tests"][-1]["name"] == REFERENCE_DIFF
    assert added["tests"][-1]["max_score"] == 0.0 and added["score"] == full["score"]
    partial = gradescope(_grade(FAULTY, {"test_golden_torch"}))
    assert with_reference(partial, "secret") is partial


def test_diff_into_gradescope_results(tmp_path):
    grade = _grade_json(tmp_path, IMPL)
    results = tmp_path / "results.json"
    results.write_text(json.dumps(gradescope(_grade(IMPL))))
    argv = ["diff", str(IMPL), "--grade", str(grade), "--gradescope", str(results)]
    assert main(argv) == 0
    written = json.loads(results.read_text())
    assert written["tests"][-1]["name"] == REFERENCE_DIFF
    assert "== noam_rate (contract): identical" in written["tests"][-1]["output"]
    # a partial score: the results are left as they were
    grade = _grade_json(tmp_path, FAULTY, {"test_golden_torch"})
    results.write_text(json.dumps(gradescope(_grade(FAULTY, {"test_golden_torch"}))))
    before = results.read_text()
    assert main(["diff", str(FAULTY), "--grade", str(grade), "--gradescope", str(results)]) == 1
    assert results.read_text() == before


def _zip(tmp_path: Path, *extra: str) -> zipfile.ZipFile:
    out = tmp_path / "autograder.zip"
    assert main(["autograder", "gradescope", "--out", str(out), *extra]) == 0
    return zipfile.ZipFile(out)


def test_the_autograder_reveals_nothing_by_default(tmp_path):
    z = _zip(tmp_path)
    run = z.read("run_autograder").decode()
    assert "diff" not in run.replace("different", "")  # no xfmr diff step
    about = json.loads(z.read("assignment.json"))
    assert about["reveal_reference_after_pass"] is False
    # what reaches a student is results.json: a full-score grade's holds none of impl's lines
    results = json.dumps(gradescope(_grade(IMPL)))
    assert not any(line in results for line in IMPL_LINES)


def test_the_switch_adds_the_diff_step_after_a_full_pass(tmp_path):
    z = _zip(tmp_path, "--reveal-reference-after-pass")
    run = z.read("run_autograder").decode()
    assert "diff /autograder/submission --grade" in run
    assert "--json" in run  # the grade JSON the diff step reads, matched by its sha256
    assert json.loads(z.read("assignment.json"))["reveal_reference_after_pass"] is True


@pytest.mark.parametrize("bad", [["--grade", "/nonexistent.json"], ["--gradescope", "r.json"]])
def test_bad_options_exit_2(bad, capsys):
    assert main(["diff", str(IMPL), *bad]) == 2
