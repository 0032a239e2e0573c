"""report.html, the class report grade-batch and summarize write: its totals, histogram, causes
and links from hand-built records, student text kept as text, and the page as a real browser
(Debian's Chromium, headless) reads it back, against grades.csv."""

import csv
import json
import os
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
CHROMIUM = Path("/usr/bin/chromium")
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


def line(name: str, outcome: str) -> tables.TestLine:
    return tables.TestLine(name, outcome == "passed", outcome)


def record(name: str, score: float, outcomes: list[str], **more) -> tables.Graded:
    tests = [line(f"t{i}", o) for i, o in enumerate(outcomes)]
    passed = all(t.passed for t in tests) and not more.get("rejected")
    return tables.Graded(name, score, 10.0, passed, tests, **more)


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
]


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
    scores = [g.score for g in CLASS]
    assert page.value("students") == 5 and page.text_of["students"] == "5"
    assert page.value("mean-score") == pytest.approx(statistics.fmean(scores))
    assert page.value("median-score") == 7.0 and page.text_of["median-score"] == "7"
    assert page.value("max-score") == 10.0
    assert page.value("passed-all") == 1 and page.value("not-counted") == 1
    assert page.passes() == {"t0": (4, 5), "t1": (2, 5), "t2": (2, 5)}
    grid = [a for tag, a in page.tags if tag == "td" and "data-outcome" in a]
    assert len(grid) == 5 * 3
    said = [a["data-outcome"] for a in grid]
    assert said[3:6] == ["passed", "failed", "timed out"]  # bob's
    assert said[9:12] == ["not judged"] * 3  # dave never ran: nothing of his was judged


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
    assert page.passes()[SCRIPT] == (0, 2)  # a test's name, read back whole from its attribute


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
    assert unnamed == 1  # carol failed a test and her grade names no first divergence
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


@pytest.fixture(scope="module")
def chromium():
    """Debian's Chromium (.ci/run installs it); its absence fails CI and skips elsewhere."""
    if not CHROMIUM.exists():
        why = f"{CHROMIUM} is absent: Debian's Chromium reads the page (apt-get install chromium)"
        if os.environ.get("CI"):
            pytest.fail(f"{why}; CI must install it (.ci/run)")
        pytest.skip(why)
    return CHROMIUM


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
    """The totals Chromium shows are grades.csv's: students, mean, median, each test's passes;
    the histogram's bars add up to the students."""
    rows = list(csv.DictReader((out / "grades.csv").open()))
    scores = [float(r["score"]) for r in rows]
    fixed = {"submission", "score", "max_score", "passed", "rejected"}
    tests = [c for c in rows[0] if c not in fixed]
    page = Page(dom)
    assert page.value("students") == len(rows) == sum(page.bars())
    assert page.value("mean-score") == pytest.approx(statistics.fmean(scores))
    assert page.value("median-score") == pytest.approx(statistics.median(scores))
    assert page.value("passed-all") == sum(r["passed"] == "True" for r in rows)
    assert page.passes() == {
        t: (sum(r[t] == Outcome.PASSED.value for r in rows), len(rows)) for t in tests
    }
    assert not any(tag == "script" for tag, _ in page.tags)
    return page


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


@pytest.mark.slow
def test_grade_batch_report_read_back_in_chromium(chromium, tmp_path):
    # the real grade-batch, sandboxed, on the two examples (~35 s on 2 cores)
    subs, out = tmp_path / "subs", tmp_path / "grades"
    subs.mkdir()
    for name in ("correct_submission.py", "faulty_submission.py"):
        shutil.copy(ROOT / "examples" / name, subs / name)
    assert main(["grade-batch", str(subs), "--out", str(out), "--jobs", "2"]) == 1
    page = assert_the_page_agrees_with_grades_csv(
        dump_dom(chromium, out / "report.html", tmp_path / "profile"), out
    )
    assert page.value("passed-all") == 1 and page.value("students") == 2
    assert "attention applies no mask: padded keys are read" in page.texts
    links = {a["href"] for tag, a in page.tags if tag == "a"}
    assert links == {"./correct_submission.gradescope.json", "./faulty_submission.gradescope.json"}
    assert all((out / href).is_file() for href in links)
    timed = [float(a["data-seconds"]) for tag, a in page.tags if "data-seconds" in a]
    assert len(timed) == 2 and all(s > 0 for s in timed)
