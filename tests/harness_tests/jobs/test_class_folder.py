"""A class folder as grade-batch reads it: every entry a submission or not one with its reason,
output names unique by construction over adversarial names, and the counts adding up in the
terminal, grades.csv, report.html and the per-submission files (rejections only: no sandbox)."""

import csv
import json
import os
import unicodedata
from pathlib import Path
from urllib.parse import unquote

from hypothesis import given, settings
from hypothesis import strategies as st

from harness.cli import main
from harness.jobs import class_folder, grade
from harness.reports import grades as tables

SUFFIXES = (grade.RESULTS, grade.PAGE)
NAME_MAX = 255

ADVERSARIAL = [
    "f.py",
    "f",
    "f.py.d",
    "F.py",
    "F",
    "f.PY",
    "f.py.gradescope.json",
    "f.gradescope",
    "report",
    "report.html",
    "grades.csv",
    "hardest_tests",
    "%66.py",  # what "f.py" would be if f were escaped
    "%2e",
    "%%0",
    "a%%1",
    "é.py",  # NFC
    "e\u0301.py",  # NFD: the same letter to a normalising file system
    "É.py",
    "ﬁ.py",  # NFKC folds it to "fi.py"
    "fi.py",
    "ß",
    "SS",
    "ss",
    "İ",
    "i\u0307",
    "a b",
    "a_b",
    "a-b",
    "a..b",
    "a.",
    "...",
    "~",
    "\u202eyp.txt",
    "\u2066a\u200b.py",  # an isolate and a zero-width space
    "x\udcff",  # an undecodable byte, as os.listdir gives it
    "x\xff",
    "日本語" * 28,  # 252 bytes of UTF-8: a long stem
    "日本語" * 27 + "日本",
    "a" * 255,
    "a" * 254 + "b",
    "%41" * 85,
]


def outputs(stems):
    return [stem + suffix for stem in stems for suffix in SUFFIXES]


def assert_unique_by_construction(names):
    stems = class_folder.output_stems(names)
    files = outputs(stems)
    forms = [str.casefold] + [
        lambda s, f=f: unicodedata.normalize(f, s).casefold() for f in ("NFC", "NFD", "NFKC")
    ]
    for form in forms:  # what a case-insensitive or normalising file system compares
        assert len({form(f) for f in files}) == len(files) == 2 * len(names)
    for name, stem in zip(names, stems, strict=True):
        assert stem.isascii() and stem == stem.lower() and "/" not in stem and stem, stem
        assert not stem.startswith(".")
        assert all(len(stem + s) <= NAME_MAX for s in SUFFIXES)
        if "%%" not in stem:  # a plain stem gives its name back
            assert unquote(stem, errors="surrogateescape") == name
    assert not set(files) & set(grade.CLASS_FILES)
    assert not any(f.endswith(c) for f in files for c in grade.CLASS_FILES)


def test_adversarial_names_give_distinct_files_on_any_file_system():
    assert len(set(ADVERSARIAL)) == len(ADVERSARIAL)
    assert_unique_by_construction(ADVERSARIAL)
    stems = dict(zip(ADVERSARIAL, class_folder.output_stems(ADVERSARIAL), strict=True))
    assert stems["f.py"] == "f.py" and stems["f.py.d"] == "f.py.d" and stems["f"] == "f"
    assert stems["F.py"] == "%46.py" and stems["é.py"] != stems["e\u0301.py"]
    assert "%%" in stems["日本語" * 28] and "%%" in stems["a" * 255]  # cut, then the index
    assert stems["a" * 255] != stems["a" * 254 + "b"]


@settings(max_examples=300, deadline=None)
@given(st.lists(st.text(min_size=1, max_size=120), min_size=1, max_size=12, unique=True))
def test_any_names_give_distinct_files(names):
    assert_unique_by_construction(names)


def test_the_outputs_of_a_real_folder_never_overwrite_each_other(tmp_path):
    # every adversarial name the file system holds, each output written: as many files as names
    folder, out = tmp_path / "class", tmp_path / "out"
    folder.mkdir()
    out.mkdir()
    made = []
    for name in ADVERSARIAL:
        try:
            (folder / name).write_text("x")
            made.append(name)
        except (OSError, UnicodeEncodeError):
            pass  # not a name this file system holds
    found = [p.name for p in sorted(folder.iterdir(), key=lambda p: p.name)]
    assert len(found) == len(made) >= len(ADVERSARIAL) - 2
    for file in outputs(class_folder.output_stems(found)):
        (out / file).write_text(file)
    assert len(os.listdir(out)) == 2 * len(found)


def make_class(folder: Path) -> dict[str, str]:
    """A class folder of every kind of entry; each name's expected status."""
    folder.mkdir()
    rejected = "import harness\n"
    (folder / "f.py").write_text(rejected)
    (folder / "F.py").write_text(rejected)
    (folder / "f").mkdir()
    (folder / "f" / "notes.txt").write_text("no module")
    (folder / "f.py.d").mkdir()
    (folder / "f.py.d" / "transformer.py").write_text("def f(:\n")  # does not parse
    (folder / "dave.pdf").write_bytes(b"%PDF-1.4\n")
    (folder / "empty").mkdir()
    (folder / "hw.zip").write_bytes(b"PK\x05\x06" + bytes(18))
    (folder / "hw.tar.gz").write_bytes(b"\x1f\x8b")
    (folder / "nb.ipynb").write_text("{}")
    (folder / "README").write_text("notes")
    (folder / "shout.PY").write_text(rejected)
    (folder / "link.py").symlink_to(folder / "f.py")
    (folder / "linked").symlink_to(folder / "f")
    (folder / ".DS_Store").write_bytes(b"\0")
    (folder / "__pycache__").mkdir()
    (folder / "__pycache__" / "x.pyc").write_bytes(b"\0")
    os.mkfifo(folder / "pipe")
    submission, other = tables.REJECTED, tables.NOT_A_SUBMISSION
    expected = {name: other for name in os.listdir(folder)}
    expected |= {name: submission for name in ("f.py", "F.py", "f", "f.py.d")}
    return expected


def test_every_entry_is_a_submission_or_not_one_with_its_reason(tmp_path):
    expected = make_class(tmp_path / "class")
    found = class_folder.entries(tmp_path / "class")
    assert [e.name for e in found] == sorted(expected)
    reasons = {e.name: e.reason for e in found}
    assert {n for n, why in reasons.items() if not why} == {"f.py", "F.py", "f", "f.py.d"}
    assert reasons["dave.pdf"] == "a .pdf file, not a .py file or a folder"
    assert reasons["README"] == "a file without a suffix, not a .py file or a folder"
    assert reasons["empty"] == "an empty folder"
    assert reasons["hw.zip"].startswith("an archive") and reasons["hw.tar.gz"].startswith("an ar")
    assert reasons["nb.ipynb"].startswith("a notebook")
    assert reasons["shout.PY"].startswith("a .py file by another case")
    assert (
        reasons["link.py"].startswith("a symbolic link") and reasons["linked"] == reasons["link.py"]
    )
    assert reasons[".DS_Store"].startswith("hidden")
    assert reasons["__pycache__"].startswith("its name starts with __")
    assert reasons["pipe"].startswith("not a regular file or a folder")
    assert grade.submissions(tmp_path / "class") == [
        tmp_path / "class" / n for n in ("F.py", "f", "f.py", "f.py.d")
    ]


def test_grade_batch_accounts_for_every_entry_everywhere(tmp_path, capsys):
    # every submission here is rejected before it runs: no sandbox starts, the accounting is
    # what is checked (the slow test of report.html grades real ones)
    expected = make_class(tmp_path / "class")
    out = tmp_path / "out"
    status = main(["grade-batch", str(tmp_path / "class"), "--out", str(out), "--jobs", "2"])
    said = capsys.readouterr()
    assert status == 1  # rejected submissions
    rows = list(csv.DictReader((out / "grades.csv").open()))
    assert {r["submission"]: r["status"] for r in rows} == expected
    assert all(r["reason"] for r in rows)  # every one not graded says why
    n = len(expected)
    assert f"{n} entries in " in said.err and "4 to grade" in said.err and "4/4" in said.err
    assert (
        f"{n} entries: 0 graded, 4 rejected, 0 grader errors, {n - 4} not submissions" in said.out
    )
    for name in expected:  # every entry named in the terminal's table
        assert any(line.strip().startswith(name + " ") for line in said.out.splitlines()), name
    written = sorted(os.listdir(out))
    results = [f for f in written if f.endswith(grade.RESULTS)]
    pages = [f for f in written if f.endswith(grade.PAGE)]
    assert len(results) == len(pages) == 4  # one each per submission, none overwritten
    stems = {"f.py": "f.py", "F.py": "%46.py", "f": "f", "f.py.d": "f.py.d"}
    for name, stem in stems.items():
        data = json.loads((out / (stem + grade.RESULTS)).read_text())
        assert data["score"] == 0
        own = {"f.py": "f.py", "F.py": "F.py", "f": "notes.txt", "f.py.d": "parse"}[name]
        assert own in data["output"], (name, data["output"])  # its own rejection
        page = (out / (stem + grade.PAGE)).read_text()
        assert ">rejected<" in page and "./report.html" in page
    report = (out / "report.html").read_text()
    for name in expected:
        assert f'data-submission="{name}"' in report, name
    assert 'id="students" data-value="0"' in report and 'id="entries" data-value="' in report
