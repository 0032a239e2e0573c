"""report.html, the class report grade-batch and summarize write: its totals, histogram, causes
and links from hand-built records, student text kept as text, and the page as a real browser
(Debian's Chromium, headless) reads it back, against grades.csv."""

import csv
import json
import shutil
import statistics
import subprocess
import time
from html.parser import HTMLParser
from pathlib import Path
from urllib.parse import unquote

import pytest

from harness.cli import main
from harness.grading import said_once
from harness.outcomes import Outcome
from harness.records import Grade, TestResult
from harness.reports import class_report
from harness.reports import grades as tables
from harness.reports.gradescope import gradescope
from harness.shared_tests.laws import BY_NAME
from harness.tools.render_stryker import CHROMIUM_FLAGS

ROOT = Path(__file__).resolve().parents[3]
HOSTILE = "<script>alert(1)</script>"
SCRIPT = '</td></tr><script>alert("x")</script><img src=x onerror=alert(1)>'

# Lines as harness.shared_tests.diagnosis.divergence writes them, one per config.
PADDING = (
    "first divergence: decoder.0.cross_attn, max abs error {e} (relative): attention applies no "
    "mask: padded keys are read; the logits differ by 0.3 (relative) (boundaries other than the "
    "contract's, judged as such: the self_attn and cross_attn modules return x + attention)"
)
EPS = (
    "first divergence: encoder.0.norm2, max abs error 5.23e-06 (relative): a LayerNorm with eps "
    "{eps}, not cfg.ln_eps = {want}: pass eps=cfg.ln_eps to every LayerNorm; largest: "
    "logits, max abs error 0.5 (relative); the logits differ by 3.41e-06 (relative)"
)
DIAGNOSIS = {
    "post-LN, one shared table": PADDING.format(e="0.192"),
    "pre-LN, ln_eps 1e-3": PADDING.format(e="0.15"),  # the same cause, other numbers
    "post-LN, untied": "the forward pass agrees with the oracle",
}


def line(name: str, outcome: str, message: str = "") -> tables.TestLine:
    return tables.TestLine(name, outcome == "passed", outcome, message)


def record(name: str, score: float, outcomes: list[str], **more) -> tables.Graded:
    tests = [line(f"t{i}", o) for i, o in enumerate(outcomes)]
    passed = all(t.passed for t in tests) and not more.get("rejected")
    return tables.Graded(name, score, 10.0, passed, tests, **more)


NOT_JUDGED = "failed: not judged: t0 must pass first (the forward pass differs)"
CLASS = [
    record("alice", 10.0, ["passed", "passed", "passed"], seconds=12.5),
    record(
        "bob",
        4.0,
        ["passed", "killed", "timeout"],
        causes=(("decoder.0.cross_attn", "padded keys are read"),),
        seconds=40.0,
    ),
    record("carol", 7.0, ["passed", "killed", "passed"], seconds=3.0),
    record("dave", 0.0, ["error"] * 3, rejected="rejected: imports impl.transformer"),
    record("erin", 9.9, ["passed", "passed", "failed"], causes=(("x0", ""),)),
    tables.Graded(
        "gus",
        0.0,
        10.0,
        False,
        [
            line("t0", "killed", "failed: off"),
            *[line(f"t{i}", "killed", NOT_JUDGED) for i in (1, 2)],
        ],
    ),
    record("hal", 0.0, ["error"] * 3, error="Traceback (most recent call last):\nKeyError: 'x'"),
    tables.Graded.not_graded("ivy.pdf", "a .pdf file, not a .py file or a folder"),
]
GRADED = [g for g in CLASS if g.status == tables.GRADED]


class Page(HTMLParser):
    """A page's start tags with their attributes, each id'd element's text, every text."""

    def __init__(self, text: str) -> None:
        super().__init__()
        self.tags: list[tuple[str, dict[str, str]]] = []
        self.by_id: dict[str, dict[str, str]] = {}
        self.text_of: dict[str, str] = {}
        self.texts: list[str] = []
        self._open = ""
        self.feed(text)

    def handle_starttag(self, tag, attrs):
        found = {k: v or "" for k, v in attrs}
        self.tags.append((tag, found))
        if "id" in found:
            self.by_id[found["id"]] = found
            self._open = found["id"]

    def handle_endtag(self, tag):
        self._open = ""

    def handle_data(self, data):
        self.texts.append(data)
        if self._open:
            self.text_of[self._open] = self.text_of.get(self._open, "") + data

    def value(self, key: str) -> float:
        return float(self.by_id[key]["data-value"])

    def passes(self) -> dict[str, tuple[int, int]]:
        """Each test's (passed, of), from #tests' rows."""
        found, test = {}, None
        for tag, attrs in self.tags:
            if tag == "tr" and "data-test" in attrs:
                test = attrs["data-test"]
            elif tag == "td" and "data-passed" in attrs and test is not None:
                found[test] = (int(attrs["data-passed"]), int(attrs["data-of"]))
        return found

    def bars(self) -> list[int]:
        return [int(a["data-count"]) for tag, a in self.tags if tag == "rect"]


# --- the renderer, on hand-built records ---------------------------------------------------------


def test_the_totals_are_the_records_numbers():
    page = Page(class_report.html_report(CLASS))
    scores = [g.score for g in GRADED]
    assert [g.submission for g in GRADED] == ["alice", "bob", "carol", "erin", "gus"]
    assert page.value("entries") == 8 and page.text_of["entries"] == "8"
    assert page.value("students") == 5 and page.text_of["students"] == "5"
    assert page.value("rejected") == page.value("grader-errors") == 1
    assert page.value("not-submissions") == 1 and page.value("not-counted") == 3
    assert page.value("mean-score") == pytest.approx(statistics.fmean(scores))
    assert page.value("median-score") == 7.0 and page.text_of["median-score"] == "7"
    assert page.value("max-score") == 10.0
    assert page.value("passed-all") == 1
    assert page.passes() == {"t0": (4, 5), "t1": (2, 5), "t2": (2, 5)}
    grid = [a for tag, a in page.tags if tag == "td" and "data-outcome" in a]
    assert len(grid) == 5 * 3  # the graded only
    said = [a["data-outcome"] for a in grid]
    assert said[3:6] == ["passed", "failed", "timed out"]  # bob's
    assert said[12:15] == ["failed", "not judged", "not judged"]  # gus's: one charge, two "?"
    marks = [t for t in page.texts if t in "PFETN?-" and t]
    assert marks[-3:] == ["F", "?", "?"]


def test_the_entries_not_counted_are_listed_apart_with_their_reasons():
    page = Page(class_report.html_report(CLASS))
    listed = {}
    for key in ("rejected-list", "errors-list", "not-submissions-list"):
        assert key in page.by_id, key
    current = None
    for tag, attrs in page.tags:
        if tag == "ul":
            current = attrs.get("id")
        elif tag == "li":
            listed[attrs["data-submission"]] = current
    assert listed == {
        "dave": "rejected-list",
        "hal": "errors-list",
        "ivy.pdf": "not-submissions-list",
    }
    text = "".join(page.texts)
    assert "rejected: imports impl.transformer" in text
    assert "grader error: KeyError: 'x'" in text  # the traceback's last line, not its first
    assert "a .pdf file, not a .py file or a folder" in text
    rows = [a["data-submission"] for tag, a in page.tags if tag == "tr" and "data-submission" in a]
    assert rows == ["alice", "bob", "carol", "erin", "gus"]  # the grid: graded only


def test_the_page_says_what_it_reports():
    about = class_report.About("subs", "xfmr grade-batch subs --out g", "2030-01-02 03:04", "9.9")
    page = Page(class_report.html_report(CLASS, ".", about))
    assert page.text_of["command"] == "xfmr grade-batch subs --out g"
    assert page.text_of["date"] == "2030-01-02 03:04"
    assert page.text_of["version"] == "xfmr 9.9"
    assert "Class report: subs" in page.texts
    now = class_report.About.now("t", "c")
    assert now.version not in ("", "unknown (not installed)") and now.date[:2] == "20"


def test_a_students_page_holds_every_message_and_the_diagnosis(tmp_path):
    g = tables.Graded.of(a_grade("faulty.py", ["killed", "passed", "killed"], DIAGNOSIS))
    g.report = str(tmp_path / "faulty.py.gradescope.json")
    text = class_report.student_page(g, tmp_path, tmp_path / "report.html", None)
    page = Page(text)
    assert page.text_of["status"] == "graded"
    assert [tag for tag, _ in page.tags].count("details") == 2 + len(DIAGNOSIS)
    joined = "".join(page.texts)
    for t in g.tests:
        assert t.message in joined or t.passed
    for config, said in g.diagnosis:
        assert config in page.texts and said in joined
    hrefs = [a["href"] for tag, a in page.tags if tag == "a"]
    assert hrefs == ["./report.html", "./faulty.py.gradescope.json"]
    assert "<script" not in text.lower() and "http" not in text.lower()
    gus = Page(class_report.student_page(CLASS[5], tmp_path, tmp_path / "report.html", None))
    outcomes = [a["data-outcome"] for tag, a in gus.tags if "data-outcome" in a]
    assert outcomes == ["failed", "not judged", "not judged"]


@pytest.mark.parametrize(
    "scores",
    [
        [10.0, 4.0, 7.0, 0.0, 9.9],
        [0.0] * 7,
        [10.0] * 3,
        [9.99, 10.0, 0.01, 5.0, 5.0, 4.999],
        [12.0, -1.0, float("nan")],  # out of range or not a number: clamped, never lost
    ],
)
def test_the_histograms_bars_add_up_to_the_students(scores):
    grades = [record(f"s{i}", s, ["passed"]) for i, s in enumerate(scores)]
    bins = class_report.histogram_bins(grades)
    assert sum(bins) == len(scores) == sum(Page(class_report.html_report(grades)).bars())
    assert len(bins) == class_report.BINS
    others = [CLASS[3], CLASS[6], CLASS[7]]  # rejected, grader error, not a submission
    assert sum(Page(class_report.html_report(grades + others)).bars()) == len(scores)


def test_a_full_score_is_the_last_bar_and_no_maximum_the_first():
    grades = [record("a", 10.0, ["passed"]), record("b", 0.0, [])]
    grades[1].max_score = 0.0
    assert class_report.histogram_bins(grades) == [1] + [0] * 8 + [1]


def test_student_text_is_text():
    odd = [
        tables.Graded(
            HOSTILE,
            1.0,
            2.0,
            False,
            [line(SCRIPT, "killed"), line("t", "passed")],
            causes=((SCRIPT, HOSTILE),),
            seconds=1.0,
            report=f"out/{HOSTILE}.json",
        ),
        tables.Graded(SCRIPT, 0.0, 2.0, False, [line(SCRIPT, "error")], rejected=SCRIPT),
    ]
    text = class_report.html_report(odd, "out")
    page = Page(text)
    tags = {tag for tag, _ in page.tags}
    assert not tags & {"script", "img", "iframe", "object", "embed", "link"}
    assert not any(k.startswith("on") for _, attrs in page.tags for k in attrs)
    assert sum(HOSTILE in t for t in page.texts) >= 3  # the grid, the slowest, the cause
    assert any(SCRIPT in t for t in page.texts)
    assert page.passes()[SCRIPT] == (0, 1)  # a test's name, read back whole from its attribute
    assert page.by_id["rejected-list"]  # the rejected one is listed apart, its reason as text
    assert sum(SCRIPT in t for t in page.texts) >= 2
    hostile = tables.Graded(
        HOSTILE,
        0.0,
        2.0,
        False,
        [line(SCRIPT, "killed", SCRIPT + "\n" + HOSTILE)],
        diagnosis=((SCRIPT, HOSTILE),),
        report=f"out/{HOSTILE}.json",
    )
    own = Page(class_report.student_page(hostile, "out", "out/report.html", None))
    assert not {tag for tag, _ in own.tags} & {"script", "img", "iframe", "object", "embed"}
    assert not any(k.startswith("on") for _, attrs in own.tags for k in attrs)
    assert sum(SCRIPT in t for t in own.texts) >= 3 and sum(HOSTILE in t for t in own.texts) >= 2


def test_the_page_loads_nothing_and_runs_nothing():
    text = class_report.html_report(CLASS).lower()
    for needle in ("<script", "http:", "https:", "src=", "url(", "@import", "<link", "javascript"):
        assert needle not in text, needle


@pytest.mark.parametrize(
    "name",
    ["javascript:alert(1)", "a#b?c=d", "x y%20z", "../../etc/passwd", "émile", '"quoted"'],
)
def test_a_link_names_the_students_file_beside_the_page_and_nothing_else(tmp_path, name):
    out = tmp_path / "out"
    out.mkdir()
    report = out / f"{name}.gradescope.json"
    g = tables.Graded(name, 1.0, 1.0, True, [line("t", "passed")], report=str(report))
    (href,) = [a["href"] for tag, a in Page(class_report.html_report([g], out)).tags if tag == "a"]
    assert href.startswith(("./", "../")) and ":" not in href and "#" not in href
    assert (out / unquote(href)).resolve() == report.resolve()


def test_the_most_named_cause_comes_first_and_none_named_is_said():
    named, unnamed = class_report.cause_counts(
        [*CLASS, record("fay", 4.0, ["killed"], causes=CLASS[1].causes)]
    )
    assert named[0] == (("decoder.0.cross_attn", "padded keys are read"), 2)
    assert named[1] == (("x0", ""), 1)  # a first divergence located, its cause not named
    assert unnamed == 2  # carol and gus failed a test and their grades name no first divergence
    page = Page(class_report.html_report(CLASS))
    causes = [t for t in page.texts if t.startswith(class_report.NO_CAUSE)]
    assert len(causes) == 2


def test_without_recorded_times_the_slowest_are_left_out_with_a_note():
    untimed = [record("a", 1.0, ["passed"]), record("b", 2.0, ["killed"])]
    page = Page(class_report.html_report(untimed))
    assert "No grading time is recorded" in page.text_of["slowest"]
    timed = Page(class_report.html_report(CLASS))
    shown = [float(a["data-seconds"]) for tag, a in timed.tags if "data-seconds" in a]
    assert shown == [40.0, 12.5, 3.0]
    late = record("late", 0.0, ["error"], rejected="rejected: x", seconds=99.0)
    shown = Page(class_report.html_report([*CLASS, late])).tags
    assert [float(a["data-seconds"]) for _, a in shown if "data-seconds" in a][0] == 40.0


# --- the causes, from a grade's diagnosis and from its results.json ------------------------------


def test_first_causes_reads_the_diagnosis_lines():
    lines = [
        *DIAGNOSIS.values(),
        EPS.format(eps="1e-06", want="1e-05"),
        EPS.format(eps="1e-06", want="0.001"),  # another config's numbers: the same cause
        "first divergence: logits",  # located, no size, no cause
        "no diagnosis: TypeError: nope",
        "the logits differ by 0.2 (relative): every hooked module computes the contract's "
        "function of its own input",
    ]
    assert tables.first_causes(lines) == (
        ("decoder.0.cross_attn", "attention applies no mask: padded keys are read"),
        (
            "encoder.0.norm2",
            "a LayerNorm with eps 1e-06, not cfg.ln_eps = 1e-05: pass eps=cfg.ln_eps to every "
            "LayerNorm",
        ),
        ("logits", ""),
    )
    assert tables.first_causes(["", "first divergence: ", 3]) == ()  # nothing named, no type


def a_grade(name: str, outcomes: list[str], diagnosis: dict[str, str] | None = None) -> Grade:
    """A Grade as grade() returns it: golden_torch carries the diagnosis, as result_line says."""
    names = ["test_golden_torch", "test_hand_example_noam", "test_source_padding_is_never_read"]
    results = []
    for test, outcome in zip([BY_NAME[n] for n in names], outcomes, strict=True):
        passed = outcome == "passed"
        message = "" if passed else f"failed: off by {len(name)}"
        if test.name == "test_golden_torch" and diagnosis and not passed:
            message += "\n" + said_once(diagnosis)
        points = float(test.points)
        results.append(
            TestResult(
                test.name,
                test.law,
                Outcome(outcome),
                points if passed else 0.0,
                points,
                message,
                0.5,
                test.visibility,
            )
        )
    return Grade(name, results, diagnosis=diagnosis or {}, seconds=2.0 + len(name))


def test_a_results_file_gives_the_causes_and_time_grade_batch_has():
    g = a_grade("faulty.py", ["killed", "passed", "killed"], DIAGNOSIS)
    from_batch = tables.Graded.of(g)
    assert from_batch.causes == (
        ("decoder.0.cross_attn", "attention applies no mask: padded keys are read"),
    )
    assert "(the same in: pre-LN, ln_eps 1e-3)" in g.tests[0].message  # said once, as graded
    with_numbers = tables.first_causes(g.tests[0].message.splitlines())
    assert with_numbers == from_batch.causes


def test_read_results_keeps_the_causes_time_and_file(tmp_path):
    g = a_grade("faulty.py", ["killed", "passed", "killed"], DIAGNOSIS)
    path = tmp_path / "faulty.gradescope.json"
    path.write_text(json.dumps(gradescope(g)))
    read = tables.read_results(path, "faulty")
    assert read.causes == tables.Graded.of(g).causes
    assert read.seconds == round(g.seconds, 2) and read.report == str(path)
    data = gradescope(g)
    for odd in ("12", None, True, -1, float("inf")):  # optional: a bad one is no time, no skip
        data["execution_time"] = odd
        path.write_text(json.dumps(data))
        assert tables.read_results(path, "faulty").seconds is None


# --- in a real browser ---------------------------------------------------------------------------


def dump_dom(browser: Path, page: Path, profile: Path) -> str:
    """The page's DOM as headless Chromium builds it from the file (no network, no profile)."""
    done = subprocess.run(
        [
            str(browser),
            *CHROMIUM_FLAGS,  # as the Stryker screenshots run it
            f"--user-data-dir={profile}",
            "--dump-dom",
            page.resolve().as_uri(),
        ],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0 and "</html>" in done.stdout, done.stderr[-2000:]
    return done.stdout


def assert_the_page_agrees_with_grades_csv(dom: str, out: Path) -> Page:
    """The totals Chromium shows are grades.csv's: the entries and each status's count, and over
    the graded rows only the students, mean, median, each test's passes; the histogram's bars
    add up to the students; every row of grades.csv is named on the page, once."""
    rows = list(csv.DictReader((out / "grades.csv").open()))
    graded = [r for r in rows if r["status"] == tables.GRADED]
    scores = [float(r["score"]) for r in graded]
    tests = [c for c in rows[0] if c not in tables.COLUMNS]
    page = Page(dom)
    assert page.value("entries") == len(rows)
    assert page.value("students") == len(graded) == sum(page.bars())
    for key, status in [
        ("rejected", tables.REJECTED),
        ("grader-errors", tables.GRADER_ERROR),
        ("not-submissions", tables.NOT_A_SUBMISSION),
    ]:
        assert page.value(key) == sum(r["status"] == status for r in rows), key
    assert page.value("not-counted") == len(rows) - len(graded)
    assert page.value("mean-score") == pytest.approx(statistics.fmean(scores))
    assert page.value("median-score") == pytest.approx(statistics.median(scores))
    assert page.value("passed-all") == sum(r["passed"] == "True" for r in graded)
    assert page.passes() == {
        t: (sum(r[t] == Outcome.PASSED.value for r in graded), len(graded)) for t in tests
    }
    named = [a["data-submission"] for tag, a in page.tags if "data-submission" in a]
    assert sorted(named) == sorted(r["submission"] for r in rows)
    assert not any(tag == "script" for tag, _ in page.tags)
    return page


def assert_every_link_resolves(page: Page, out: Path) -> list[str]:
    links = [a["href"] for tag, a in page.tags if tag == "a"]
    for href in links:
        assert href.startswith("./") and (out / unquote(href)).resolve().is_file(), href
    return links


def test_summarize_report_read_back_in_chromium(chromium, tmp_path):
    # collected results files, one in a folder named like an attack (its submission's name)
    root, out = tmp_path / "collected", tmp_path / "summary"
    grades = {
        "alice": a_grade("alice.py", ["passed"] * 3),
        "bob": a_grade("bob.py", ["killed", "passed", "killed"], DIAGNOSIS),
        HOSTILE: a_grade("x.py", ["passed", "killed", "passed"]),
        "carol": a_grade("carol.py", ["killed", "killed", "passed"], DIAGNOSIS),
    }
    for name, g in grades.items():
        (root / name).mkdir(parents=True)
        (root / name / "results.json").write_text(json.dumps(gradescope(g)))
    assert main(["summarize", str(root), "--out", str(out)]) == 0
    started = time.monotonic()
    dom = dump_dom(chromium, out / "report.html", tmp_path / "profile")
    assert time.monotonic() - started < 60
    page = assert_the_page_agrees_with_grades_csv(dom, out)
    assert HOSTILE in page.texts  # the folder's name, shown as text
    links = [a["href"] for tag, a in page.tags if tag == "a"]
    assert len(links) == 4
    for href in links:  # each to its own results.json, the attack's too
        assert (out / unquote(href)).resolve().is_file(), href
    causes = [a for tag, a in page.tags if tag == "tr" and "data-students" in a]
    assert [c["data-students"] for c in causes] == ["2", "1"]  # the padding; x.py: none named
    assert "attention applies no mask: padded keys are read" in page.texts


MIXED_TESTS = "test_hand_example_noam,test_golden_torch,test_beam_search_matches_oracle"


def mixed_class(folder: Path) -> None:
    """issue 47's class folder: the two examples, a student's folder, a PDF, f.py (correct),
    f/ (faulty) and f.py.d/ (notes only: rejected)."""
    folder.mkdir()
    correct, faulty = (
        ROOT / "examples" / "correct_submission.py",
        ROOT / "examples" / "faulty_submission.py",
    )
    shutil.copy(correct, folder / correct.name)
    shutil.copy(faulty, folder / faulty.name)
    shutil.copy(correct, folder / "f.py")
    for name, source in (("erin", correct), ("f", faulty)):
        (folder / name).mkdir()
        shutil.copy(source, folder / name / "transformer.py")
    (folder / "f.py.d").mkdir()
    (folder / "f.py.d" / "notes.txt").write_text("my notes")
    (folder / "dave.pdf").write_bytes(b"%PDF-1.4\n")


@pytest.mark.slow
def test_grade_batch_over_a_mixed_folder_read_back_in_chromium(chromium, tmp_path, capsys):
    # the real grade-batch, sandboxed, three tests each (~60 s on 2 cores): every entry named,
    # each JSON its own submission's, the statistics over the graded ones, every link resolving
    subs, out = tmp_path / "subs", tmp_path / "grades"
    mixed_class(subs)
    argv = ["grade-batch", str(subs), "--out", str(out), "--jobs", "2", "--tests", MIXED_TESTS]
    assert main(argv) == 1
    said = capsys.readouterr()
    assert "7 entries: 5 graded, 1 rejected, 0 grader errors, 1 not a submission" in said.out
    assert "6/6" in said.err and "7 entries in " in said.err
    rows = {r["submission"]: r for r in csv.DictReader((out / "grades.csv").open())}
    assert sorted(rows) == sorted(p.name for p in subs.iterdir())
    assert {n: r["status"] for n, r in rows.items() if r["status"] != "graded"} == {
        "dave.pdf": "not a submission",
        "f.py.d": "rejected",
    }
    full = float(rows["correct_submission.py"]["max_score"])
    faulty = float(rows["faulty_submission.py"]["score"])
    assert float(rows["correct_submission.py"]["score"]) == full and faulty < full
    results = {"correct_submission.py": full, "faulty_submission.py": faulty, "erin": full}
    results |= {"f.py": full, "f": faulty, "f.py.d": 0.0}
    for name, score in results.items():  # one JSON per submission, holding its own score
        data = json.loads((out / f"{name}.gradescope.json").read_text())
        assert data["score"] == score == float(rows[name]["score"]), name
    assert "notes.txt" in json.loads((out / "f.py.d.gradescope.json").read_text())["output"]
    assert len(list(out.glob("*.gradescope.json"))) == len(list(out.glob("*.student.html"))) == 6

    dom = dump_dom(chromium, out / "report.html", tmp_path / "profile")
    page = assert_the_page_agrees_with_grades_csv(dom, out)
    assert page.value("students") == 5 and page.value("passed-all") == 3
    assert page.value("median-score") == full and page.value("not-submissions") == 1
    assert page.text_of["command"].startswith("xfmr grade-batch ") and page.text_of["version"]
    assert "attention applies no mask: padded keys are read" in page.texts
    links = assert_every_link_resolves(page, out)
    assert len(links) == 6  # each graded or rejected submission's own page
    assert all(href.endswith(".student.html") for href in links)
    faulty_row = [
        a["data-outcome"] for tag, a in Page(dom).tags if tag == "td" and "data-outcome" in a
    ]
    assert faulty_row.count("not judged") == 2  # f and faulty: the beam test, after golden
    own = Page(dump_dom(chromium, out / "f.student.html", tmp_path / "profile"))
    assert own.text_of["status"] == "graded"
    assert [a["data-outcome"] for _, a in own.tags if "data-outcome" in a] == [
        "passed",
        "failed",
        "not judged",
    ]
    assert [tag for tag, _ in own.tags].count("details") >= 3  # messages and the diagnosis
    assert "attention applies no mask" in "".join(own.texts)
    assert_every_link_resolves(own, out)
    for other in out.glob("*.student.html"):
        assert_every_link_resolves(Page(other.read_text()), out)
