"""harness.reports.check_page: the self-check's page built from plain data (a Grade record and the
pictures' numbers). Fast: no worker, no browser (test_check_pictures.py opens real pages in
Chromium)."""

from __future__ import annotations

import math
import re
from html.parser import HTMLParser

import pytest

from harness.outcomes import Outcome
from harness.records import Grade, TestResult
from harness.reports import check_page
from harness.reports.check_page import Bar, Bars, Grid, Pictures


class Tags(HTMLParser):
    """Every start tag with its attributes, and the text of the page, as a browser parses it."""

    def __init__(self, page: str) -> None:
        super().__init__(convert_charrefs=True)
        self.tags: list[tuple[str, dict[str, str]]] = []
        self.text: list[str] = []
        self.feed(page)

    def handle_starttag(self, tag, attrs):
        self.tags.append((tag, {k: v or "" for k, v in attrs}))

    def handle_data(self, data):
        self.text.append(data)

    def all(self, tag: str, cls: str = "") -> list[dict[str, str]]:
        return [
            a for t, a in self.tags if t == tag and (not cls or cls in a.get("class", "").split())
        ]


def cells(svg: str) -> dict[tuple[int, int], str]:
    """(row, col) -> the cell's kind, read from the SVG's <g class="cell KIND">."""
    found = {}
    for a in Tags(svg).all("g", "cell"):
        kind = a["class"].split()[1]
        found[int(a["data-row"]), int(a["data-col"])] = kind
    return found


def a_grid(**kw) -> Grid:
    # 3 outputs x 4 inputs; the contract allows a causal pattern over inputs 0..2, never input 3
    allowed = [[j <= i and j < 3 for j in range(4)] for i in range(3)]
    reads = [
        [True, False, False, True],  # out 0 reads input 3: forbidden
        [True, True, True, False],  # out 1 reads input 2: forbidden (after it)
        [True, False, True, False],  # out 2 does not read input 1: allowed, unread
    ]
    base = dict(
        key="targets",
        title="t",
        caption="c",
        rows=["out 0", "out 1", "out 2"],
        cols=["in 0", "in 1", "in 2", "in 3 (pad)"],
        reads=reads,
        allowed=allowed,
    )
    return Grid(**{**base, **kw})


def test_the_model_panel_marks_each_cell_by_what_it_reads_and_what_the_contract_allows():
    grid = a_grid()
    got = cells(check_page.grid_svg(grid, "model"))
    want = {
        (0, 0): "read",
        (0, 1): "masked",
        (0, 2): "masked",
        (0, 3): "read-forbidden",
        (1, 0): "read",
        (1, 1): "read",
        (1, 2): "read-forbidden",
        (1, 3): "masked",
        (2, 0): "read",
        (2, 1): "unread",
        (2, 2): "read",
        (2, 3): "masked",
    }
    assert got == want
    assert grid.forbidden_reads == [(0, 3), (1, 2)]
    # a forbidden read is red and marked "!", the others are not
    svg = check_page.grid_svg(grid, "model")
    assert svg.count(">!</text>") == 2
    assert svg.count(f'fill="{check_page.READ_BAD}"') == 2


def test_the_contract_panel_marks_what_is_allowed():
    got = cells(check_page.grid_svg(a_grid(), "contract"))
    assert {k for k, v in got.items() if v == "allowed"} == {(0, 0), (1, 0), (1, 1)} | {
        (2, 0),
        (2, 1),
        (2, 2),
    }
    assert len(got) == 12 and set(got.values()) == {"allowed", "forbidden"}


def test_rows_that_are_not_finite_are_drawn_as_such_and_never_counted_as_reads():
    grid = a_grid(finite=[True, False, True])
    got = cells(check_page.grid_svg(grid, "model"))
    assert [got[1, j] for j in range(4)] == ["not-finite"] * 4
    assert got[0, 3] == "read-forbidden"
    assert grid.forbidden_reads == [(0, 3)]
    figure = Tags(check_page.grid_figure(grid))
    assert figure.all("p", "alarm")[0]["data-not-finite"] == "1"


def test_a_grid_whose_shapes_disagree_is_refused():
    with pytest.raises(ValueError, match="reads is not 3 x 4"):
        a_grid(reads=[[True] * 4] * 2)
    with pytest.raises(ValueError, match="finite has 2 rows"):
        a_grid(finite=[True, True])
    with pytest.raises(ValueError, match="panel"):
        check_page.grid_svg(a_grid(), "both")


def some_bars() -> Bars:
    return Bars(
        "post-LN, one shared table",
        [
            Bar("x0 (source embeddings)", 0.0, False),
            Bar("encoder.0.self_attn", 3e-16, False),
            Bar("decoder.0.cross_attn", 0.47, True, "attention applies no mask"),
            Bar("decoder.1.cross_attn", math.inf, True),
            Bar("logits", 0.6, False, whole=True),
        ],
        tol=6e-14,
    )


def test_the_bars_follow_the_stack_and_mark_the_first_divergence():
    bars = some_bars()
    page = Tags(check_page.bars_svg(bars))
    drawn = page.all("g", "bar")
    assert [a["data-module"] for a in drawn] == [b.where for b in bars.bars]
    assert [a["class"] for a in drawn] == [
        "bar match",
        "bar match",
        "bar depart first",
        "bar depart",
        "bar whole",
    ]
    assert [float(a["data-error"]) for a in drawn] == [b.error for b in bars.bars]
    # log scale: a longer bar for a larger error; inf and the largest error reach the end
    widths = [float(a["width"]) for a in page.all("rect")]
    assert widths[1] < widths[4] < widths[3] and widths[2] < widths[3]
    assert widths[0] == 2.0  # an error of 0: the shortest bar
    assert page.all("line", "tolerance")
    assert "first divergence" in "".join(page.text)
    assert bars.first == 2


def test_no_first_divergence_when_every_module_matches():
    bars = Bars("c", [Bar("encoder.0", 1e-16, False), Bar("logits", 2e-16, False)], 1e-13)
    assert bars.first is None
    assert "first" not in check_page.bars_svg(bars)


def result_of(name, outcome, message="", law="a law") -> TestResult:
    score = 5.0 if outcome is Outcome.PASSED else 0.0
    return TestResult(name, law, outcome, score, 5.0, message, 0.25)


def a_grade(**kw) -> Grade:
    tests = [
        result_of("test_golden_torch", Outcome.KILLED, "failed: logits differ\nsecond line"),
        result_of("test_decoder_is_causal", Outcome.PASSED),
        result_of(
            "test_translate", Outcome.KILLED, "failed: not judged: test_golden_torch must pass"
        ),
        result_of("test_learns", Outcome.TIMEOUT, "timed out after 60 s"),
    ]
    base = dict(
        submission="transformer.py",
        tests=tests,
        diagnosis={"post-LN, one shared table": "first divergence: decoder.0.cross_attn"},
        seconds=3.5,
        isolation="SELF-CHECK, not a grade",
    )
    return Grade(**{**base, **kw})


def test_the_page_holds_every_tests_verdict_points_and_message():
    page = check_page.page(a_grade(), Pictures(bars=[some_bars()], grids=[a_grid()]))
    tags = Tags(page)
    rows = {a["data-test"]: a["data-outcome"] for a in tags.all("tr") if "data-test" in a}
    assert rows == {
        "test_golden_torch": "failed",
        "test_decoder_is_causal": "passed",
        "test_translate": "not judged",
        "test_learns": "timed out",
    }
    text = "".join(tags.text)
    assert "second line" in text and "timed out after 60 s" in text
    assert "Score 5/20: 1 of 4 tests passed" in text
    assert len(tags.all("svg", "grid")) == 2 and len(tags.all("svg", "bars")) == 1
    assert tags.all("figure", "divergence")[0]["data-config"] == "post-LN, one shared table"


def test_a_passing_self_check_has_no_pictures():
    tests = [result_of("test_a", Outcome.PASSED), result_of("test_b", Outcome.PASSED)]
    page = check_page.page(a_grade(tests=tests, diagnosis={}))
    assert "<svg" not in page and 'id="diagnosis"' not in page and 'id="dependence"' not in page
    assert "2 of 2 tests passed" in page


def test_a_checker_error_and_a_rejection_are_said():
    page = check_page.page(a_grade(error="Traceback: boom", rejected="rejected: too big"))
    tags = Tags(page)
    assert [a["id"] for a in tags.all("p", "alarm")] == ["rejected"]
    assert tags.all("div", "alarm")[0]["id"] == "checker-error"
    assert "No score: a checker error" in "".join(tags.text)


HOSTILE = "<script>alert(\"x\")</script>' onload='x' \u202ebad\u202c\x1b[31mred"


def test_hostile_text_is_escaped_everywhere_it_reaches_the_page():
    tests = [result_of(HOSTILE, Outcome.KILLED, HOSTILE, law=HOSTILE)]
    grid = a_grid(title=HOSTILE, caption=HOSTILE, rows=[HOSTILE] * 3, key=HOSTILE)
    bars = Bars(HOSTILE, [Bar(HOSTILE, 0.5, True, HOSTILE)], 1e-13)
    g = a_grade(submission=HOSTILE, tests=tests, diagnosis={HOSTILE: HOSTILE}, error=HOSTILE)
    page = check_page.page(g, Pictures([grid], [bars], [HOSTILE]))
    assert "<script" not in page.lower()
    assert "\x1b" not in page
    tags = Tags(page)
    assert not any(t == "script" for t, _ in tags.tags)
    # every attribute stays one attribute: none named by the student's text
    names = {k for _, a in tags.tags for k in a}
    assert names <= {
        "lang", "charset", "http-equiv", "content", "name", "class", "id", "data-passed",
        "data-tests", "data-test", "data-outcome", "data-config", "data-module", "data-error",
        "data-row", "data-col", "data-forbidden", "width", "height", "viewbox", "role", "x",
        "y", "x1", "x2", "y1", "y2", "transform", "font-size", "font-weight", "text-anchor",
        "fill", "stroke", "stroke-width", "stroke-dasharray", "style",
    }  # fmt: skip
    # the text reads back as written, control characters shown as \xNN
    assert '<script>alert("x")</script>' in "".join(tags.text)
    # a right-to-left override never reaches the page raw (it would reorder what follows)
    assert "\u202e" not in page and "\u202c" not in page


def test_the_page_reaches_for_nothing_outside_itself():
    page = check_page.page(a_grade(), Pictures(bars=[some_bars()], grids=[a_grid()]))
    lowered = page.lower()
    for needle in ("http:", "https:", "//", "src=", "href", "url(", "@import", "<script", "<link"):
        assert needle not in lowered.replace("<!doctype html>", ""), needle
    assert re.search(r"content-security-policy\" content=\"default-src 'none'", lowered)
