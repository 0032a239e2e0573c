"""report.html: a class's grades as one page staff open from disk (grade-batch and summarize
write it beside grades.csv), and each student's own page beside it (grade-batch).

The page says what it reports (`About`: a title, the date, the command that wrote it, the
grader's version), then the counts of the entries (graded, rejected, grader errors, not
submissions: they add up to the entries, as grades.csv's rows), the statistics over the
graded submissions only (number of students, mean and median score, each test's passes, the
score histogram as inline SVG), a students x tests grid of the graded submissions colored as
the matrix's HTML report colors its cells (reports.matrix; a test not judged because a
prerequisite failed is "?", not a failure), the first divergences the diagnosis names most
often, the slowest submissions where grading times are recorded, and, listed apart with their
reasons, the rejected submissions, the grader errors and the entries that are not submissions.
Each name links to the student's own page (`student_page`: every test's outcome and points,
its message and the diagnosis collapsed in <details>) where one was written, else to the
student's results file. No script, no external URL: inline CSS and SVG only. Every text of a
record (a submission's name, a test's name, a message, a reason) is student-controlled and goes
through reports.safe.html_text; a link's path is percent-encoded first, so it names a file
beside the page and nothing else.

Totals are written as plain numbers in elements with stable ids (`entries`, `students`,
`rejected`, `grader-errors`, `not-submissions`, `not-counted`, `mean-score`, `median-score`,
`max-score`, `passed-all`; each with `data-value`), each test's passes as `data-passed` and
`data-of` on its row of `#tests` (`data-test`, its name), each histogram bar's count as
`data-count`, and each listed entry as `data-submission` in `#rejected-list`,
`#errors-list` and `#not-submissions-list`: a test reads them back from the rendered page.

It reads records as harness.reports.grades.Graded holds them (described here by protocols:
grades imports this module, not the other way round).
"""

from __future__ import annotations

import math
import os
import statistics
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path
from typing import Protocol
from urllib.parse import quote

from harness.outcomes import Outcome
from harness.reports.matrix import OUTCOME_COLORS, STYLE
from harness.reports.safe import html_text as esc

NOT_JUDGED = "not judged"  # a test missing from a record, or a submission that never ran
NO_CAUSE = "no cause named"
BINS = 10  # the histogram's bars: tenths of the maximum score
SLOWEST = 10  # submissions listed by grading time
# Each cell's class: an outcome (a results file's "failed" is a failure of unsaid kind).
_CLASS = {
    Outcome.PASSED.value: "passed",
    Outcome.KILLED.value: "failed",
    "failed": "failed",
    Outcome.ERROR.value: "error",
    Outcome.TIMEOUT.value: "timeout",
    Outcome.NOT_APPLICABLE.value: "na",
    NOT_JUDGED: "not-judged",
}
_MARK = {
    "passed": "P",
    "failed": "F",
    "error": "E",
    "timeout": "T",
    "na": "-",
    "not-judged": "?",
}
_COLOR = {
    "passed": OUTCOME_COLORS[Outcome.PASSED],
    "failed": OUTCOME_COLORS[Outcome.KILLED],
    "error": OUTCOME_COLORS[Outcome.ERROR],
    "timeout": OUTCOME_COLORS[Outcome.TIMEOUT],
    "na": OUTCOME_COLORS[Outcome.NOT_APPLICABLE],
    "not-judged": "#ffffff",
}
_SAID = {
    "passed": "passed",
    "failed": "failed",
    "error": "crashed",
    "timeout": "timed out",
    "na": "not applicable",
    "not-judged": "not judged",
}


class Line(Protocol):
    """One test of one submission (grades.TestLine)."""

    @property
    def name(self) -> str: ...
    @property
    def passed(self) -> bool: ...
    @property
    def outcome(self) -> str: ...
    @property
    def judged(self) -> bool: ...
    @property
    def message(self) -> str: ...
    @property
    def score(self) -> float | None: ...
    @property
    def max_score(self) -> float | None: ...


class Record(Protocol):
    """One submission's grade (grades.Graded)."""

    @property
    def submission(self) -> str: ...
    @property
    def score(self) -> float: ...
    @property
    def max_score(self) -> float: ...
    @property
    def passed(self) -> bool: ...
    @property
    def tests(self) -> Sequence[Line]: ...
    @property
    def rejected(self) -> str: ...
    @property
    def error(self) -> str: ...
    @property
    def causes(self) -> Sequence[tuple[str, str]]: ...
    @property
    def seconds(self) -> float | None: ...
    @property
    def report(self) -> str: ...
    @property
    def counted(self) -> bool: ...
    @property
    def status(self) -> str: ...
    @property
    def reason(self) -> str: ...
    @property
    def page(self) -> str: ...
    @property
    def diagnosis(self) -> Sequence[tuple[str, str]]: ...


# The statuses of grades.STATUSES, as the page lists them apart: (status, list id, heading).
LISTED = (
    ("rejected", "rejected-list", "Rejected (not counted)"),
    ("grader error", "errors-list", "Grader errors (not counted: regrade them)"),
    ("not a submission", "not-submissions-list", "Not submissions (not counted, not graded)"),
)


@dataclass(frozen=True)
class About:
    """What a page reports: its title, when and by which command it was written, the grader's
    version."""

    title: str
    command: str
    date: str
    version: str

    @classmethod
    def now(cls, title: str, command: str) -> About:
        try:
            grader = version("xfmr-oracle")
        except PackageNotFoundError:  # run from a source tree that was never installed
            grader = "unknown (not installed)"
        when = datetime.now().astimezone().strftime("%Y-%m-%d %H:%M:%S %Z")
        return cls(title, command, when, grader)


def _about(about: About | None) -> str:
    if about is None:
        return ""
    rows = "".join(
        f'<tr><th>{key}</th><td id="{key}">{esc(value)}</td></tr>'
        for key, value in (
            ("date", about.date),
            ("command", about.command),
            ("version", f"xfmr {about.version}"),
        )
    )
    return f'<table id="about">{rows}</table>'


def number(x: float) -> str:
    """A score as shown: at most 4 significant digits, no trailing zeros."""
    return f"{x:.4g}"


def histogram_bins(grades: Sequence[Record]) -> list[int]:
    """How many submissions score in each tenth of their maximum (the last tenth holds the
    full score; a record of no maximum is in the first)."""
    bins = [0] * BINS
    for g in grades:
        share = g.score / g.max_score if g.max_score > 0 else 0.0
        share = min(max(share, 0.0), 1.0) if math.isfinite(share) else 0.0
        bins[min(int(share * BINS), BINS - 1)] += 1
    return bins


def names_of_tests(grades: Sequence[Record]) -> list[str]:
    """Every test any record holds, in the order first met."""
    return list(dict.fromkeys(t.name for g in grades for t in g.tests))


def pass_counts(grades: Sequence[Record]) -> dict[str, tuple[int, int]]:
    """Each test's (passes, graded submissions holding it): rejected ones, grader errors and
    entries that are not submissions are not counted."""
    counted = [g for g in grades if g.counted]
    counts = {name: [0, 0] for name in names_of_tests(counted)}
    for g in counted:
        for t in g.tests:
            counts[t.name][0] += bool(t.passed)
            counts[t.name][1] += 1
    return {name: (p, n) for name, (p, n) in counts.items()}


def cause_counts(grades: Sequence[Record]) -> tuple[list[tuple[tuple[str, str], int]], int]:
    """The first divergences named, most students first ((where, cause), students), and how
    many submissions that ran and failed a test had none named."""
    named: Counter[tuple[str, str]] = Counter()
    unnamed = 0
    for g in grades:
        if g.counted and g.causes:
            named.update(set(g.causes))
        elif g.counted and not g.passed:
            unnamed += 1
    return sorted(named.items(), key=lambda kv: (-kv[1], kv[0])), unnamed


def _href(report: str, folder: str | Path) -> str:
    """The link to a report file from the page in `folder`: relative, percent-encoded (a name's
    `:` or `#` stays part of the path), escaped for the attribute."""
    relative = quote(Path(os.path.relpath(report, folder)).as_posix(), safe="/")
    return esc(relative if relative.startswith("../") else "./" + relative)


def _cell_class(t: Line | None) -> str:
    if t is None:
        return "not-judged"
    if not t.passed and not t.judged:
        return "not-judged"
    return _CLASS.get(t.outcome, "passed" if t.passed else "failed")


def totals(grades: Sequence[Record]) -> dict[str, float | None]:
    """The page's totals by element id: the entries, each status's count (they add up to the
    entries), how many were not counted; then over the graded submissions only: the students,
    mean and median score, the maximum score (None when their maxima differ), how many passed
    every test."""
    counted = [g for g in grades if g.counted]
    scores = [g.score for g in counted]
    maxima = {g.max_score for g in counted}
    by_status = Counter(g.status for g in grades)
    return {
        "entries": len(grades),
        "students": len(counted),
        "rejected": by_status["rejected"],
        "grader-errors": by_status["grader error"],
        "not-submissions": by_status["not a submission"],
        "not-counted": len(grades) - len(counted),
        "mean-score": statistics.fmean(scores) if scores else None,
        "median-score": statistics.median(scores) if scores else None,
        "max-score": maxima.pop() if len(maxima) == 1 else None,
        "passed-all": sum(g.passed for g in counted),
    }


_TOTALS = {
    "entries": "entries of the folder",
    "students": "graded (the students below)",
    "rejected": "rejected",
    "grader-errors": "grader errors",
    "not-submissions": "not submissions",
    "not-counted": "not counted (rejected, grader errors, not submissions)",
    "mean-score": "mean score (graded only)",
    "median-score": "median score (graded only)",
    "max-score": "maximum score",
    "passed-all": "passed every test",
}


def _totals(grades: Sequence[Record]) -> str:
    rows = []
    for key, value in totals(grades).items():
        data = "" if value is None else repr(value)
        shown = "none" if value is None else number(value)
        rows.append(
            f'<tr><th>{_TOTALS[key]}</th><td id="{key}" data-value="{data}">{shown}</td></tr>'
        )
    return f'<table id="totals">{"".join(rows)}</table>'


def _histogram(grades: Sequence[Record]) -> str:
    bins = histogram_bins([g for g in grades if g.counted])
    top = max(bins, default=0) or 1
    width, height, bar = 40, 160, 32
    bars = []
    for i, count in enumerate(bins):
        low, high = 100 * i // BINS, 100 * (i + 1) // BINS
        h = round(height * count / top)
        x = 30 + i * width
        label = f"{low}-{high}%"
        bars.append(
            f'<rect x="{x}" y="{20 + height - h}" width="{bar}" height="{h}" fill="#7aa6d6" '
            f'data-bin="{i}" data-from="{low}" data-to="{high}" data-count="{count}">'
            f"<title>{label}: {count}</title></rect>"
            f'<text x="{x + bar / 2}" y="{14 + height - h}" text-anchor="middle">{count}</text>'
            f'<text x="{x + bar / 2}" y="{height + 36}" text-anchor="middle">{low}</text>'
        )
    full = 30 + BINS * width
    return (
        f'<svg id="histogram" width="{full + 20}" '
        f'height="{height + 64}" font-size="11" role="img">'
        f"<title>Scores, in tenths of the maximum</title>"
        f'<line x1="26" y1="{20 + height}" x2="{full}" y2="{20 + height}" stroke="#333"/>'
        f"{''.join(bars)}"
        f'<text x="{full / 2}" y="{height + 56}" text-anchor="middle">'
        "score, % of the maximum (the last bar holds 100%)</text></svg>"
    )


def _link(g: Record, folder: str | Path) -> str:
    """The record's name, linked to its own page, else its report file, where it has one."""
    name = esc(g.submission)
    target = g.page or g.report
    return f'<a href="{_href(target, folder)}">{name}</a>' if target else name


def _grid(grades: Sequence[Record], names: list[str], folder: str | Path) -> str:
    head = "".join(f'<th title="{esc(n)}">{i + 1}</th>' for i, n in enumerate(names))
    rows = []
    for g in grades:
        lines = {t.name: t for t in g.tests}
        cells = []
        for n in names:
            t = lines.get(n)
            kind = _cell_class(t)
            said = (t.message.splitlines() or [""])[0] if t is not None else ""
            tip = f"{n}: {_SAID[kind]}" + (f" ({said})" if said and kind != "passed" else "")
            cells.append(
                f'<td class="{kind}" data-outcome="{_SAID[kind]}" title="{esc(tip[:500])}">'
                f"{_MARK[kind]}</td>"
            )
        rows.append(
            f'<tr data-submission="{esc(g.submission)}"><th>{_link(g, folder)}</th>'
            f'<td data-score="{g.score!r}">{number(g.score)}/{number(g.max_score)}</td>'
            f"{''.join(cells)}</tr>"
        )
    return (
        f'<table id="grid"><tr><th>submission</th><th>score</th>{head}</tr>{"".join(rows)}</table>'
    )


def _tests(grades: Sequence[Record], names: list[str]) -> str:
    counts = pass_counts(grades)
    rows = "".join(
        f'<tr data-test="{esc(n)}"><td>{i + 1}</td><th>{esc(n)}</th>'
        f'<td data-passed="{counts[n][0]}" data-of="{counts[n][1]}">'
        f"{counts[n][0]}/{counts[n][1]}</td></tr>"
        for i, n in enumerate(names)
    )
    return f'<table id="tests"><tr><th>#</th><th>test</th><th>passed</th></tr>{rows}</table>'


def _causes(grades: Sequence[Record]) -> str:
    named, unnamed = cause_counts(grades)
    rows = "".join(
        f'<tr data-students="{n}"><td>{n}</td><td>{esc(where)}</td>'
        f'<td class="cause">{esc(cause or NO_CAUSE)}</td></tr>'
        for (where, cause), n in named
    )
    if unnamed:
        rows += (
            f'<tr data-students="{unnamed}"><td>{unnamed}</td><td></td>'
            f'<td class="cause">{NO_CAUSE} (failed a test; the grade names no first '
            "divergence)</td></tr>"
        )
    if not rows:
        return '<p id="causes">No submission that ran failed a test.</p>'
    return (
        '<table id="causes"><tr><th>students</th><th>first divergence</th><th>cause</th></tr>'
        f"{rows}</table>"
    )


def _slowest(grades: Sequence[Record]) -> str:
    timed = [g for g in grades if g.seconds is not None]
    if not timed:
        return (
            '<p id="slowest">No grading time is recorded for these submissions (a results '
            "file's execution_time is optional), so none is listed.</p>"
        )
    ranked = sorted(timed, key=lambda g: -(g.seconds or 0.0))[:SLOWEST]
    rows = "".join(
        f'<tr><th>{esc(g.submission)}</th><td data-seconds="{g.seconds!r}">'
        f"{g.seconds or 0.0:.1f} s</td></tr>"
        for g in ranked
    )
    untimed = len(grades) - len(timed)
    note = f"<p>Submissions with no recorded time: {untimed}.</p>" if untimed else ""
    return (
        f'<table id="slowest"><tr><th>submission</th><th>grading time</th></tr>{rows}</table>{note}'
    )


def _listed(grades: Sequence[Record], folder: str | Path) -> str:
    """The entries not counted, each status apart, each with its reason."""
    parts = []
    for status, key, heading in LISTED:
        items = "".join(
            f'<li data-submission="{esc(g.submission)}">{_link(g, folder)}: '
            f'<span class="reason">{esc(g.reason)}</span></li>'
            for g in grades
            if g.status == status
        )
        body = f'<ul id="{key}">{items}</ul>' if items else f'<p id="{key}">None.</p>'
        parts.append(f"<h2>{heading}</h2>\n{body}")
    return "\n".join(parts)


_CELL_STYLE = "\n".join(f"td.{k} {{ background: {c}; }}" for k, c in _COLOR.items())
_PAGE_STYLE = f"""{STYLE}
{_CELL_STYLE}
td.not-judged {{ color: #777; }}
td.cause, td.message {{ text-align: left; }}
#totals td {{ text-align: right; }}
#about th, #about td {{ text-align: left; }}
#grid th:first-child, #slowest th, #tests th {{ text-align: left; }}
.key {{ border: 1px solid #999; }}
pre {{ white-space: pre-wrap; margin: 0; }}"""


def html_report(
    grades: Sequence[Record], folder: str | Path = ".", about: About | None = None
) -> str:
    """The class report of `grades`, to be written in `folder` (its links to each submission's
    page or report file are relative to it)."""
    counted = [g for g in grades if g.counted]
    names = names_of_tests(counted)
    legend = " ".join(
        f'<span class="key {k}" style="background:{c};padding:2px 6px">{_MARK[k]} {_SAID[k]}</span>'
        for k, c in _COLOR.items()
    )
    title = "Class report" + (f": {about.title}" if about else "")
    return f"""<!doctype html>
<html><head><meta charset="utf-8"><title>{esc(title)}</title>
<style>
{_PAGE_STYLE}
</style></head><body>
<h1>{esc(title)}</h1>
{_about(about)}
<h2>Totals</h2>
{_totals(grades)}
<p>Statistics (students, mean, median, the histogram, the grid, each test's passes) are over
the graded submissions only; the others are listed apart below, each with its reason.</p>
<h2>Scores</h2>
{_histogram(grades)}
<h2>Students x tests</h2>
<p>{legend}</p>
<p>Columns are the tests by number (below); hover a cell for its test, outcome and message. A
test not judged (a test it depends on failed, and is charged there) is "?". Each name opens
the student's own page: every test's message and the diagnosis.</p>
{_grid(counted, names, folder)}
<h2>Tests</h2>
{_tests(counted, names)}
<h2>First divergences the diagnosis names most</h2>
<p>Each counted once per student; causes that differ only in their numbers are one.</p>
{_causes(grades)}
<h2>Slowest submissions</h2>
{_slowest(counted)}
{_listed(grades, folder)}
</body></html>
"""


def _detail(summary: str, text: str) -> str:
    return f"<details><summary>{summary}</summary><pre>{esc(text)}</pre></details>"


def student_page(g: Record, folder: str | Path, report: str | Path, about: About | None) -> str:
    """One submission's own page, to be written in `folder` beside the class report at
    `report`: its status and reason, score, every test's outcome, points and message, and the
    forward pass's diagnosis, the long texts collapsed (<details>)."""
    rows = []
    for i, t in enumerate(g.tests):
        kind = _cell_class(t)
        points = (
            f"{number(t.score)}/{number(t.max_score)}"
            if t.score is not None and t.max_score is not None
            else ""
        )
        first = (t.message.splitlines() or [""])[0][:300]
        said = _detail(esc(first), t.message) if t.message else ""
        rows.append(
            f'<tr data-test="{esc(t.name)}"><td>{i + 1}</td><th>{esc(t.name)}</th>'
            f'<td class="{kind}" data-outcome="{_SAID[kind]}">{_MARK[kind]} {_SAID[kind]}</td>'
            f'<td>{points}</td><td class="message">{said}</td></tr>'
        )
    tests = (
        '<table id="tests"><tr><th>#</th><th>test</th><th>outcome</th><th>points</th>'
        f"<th>message</th></tr>{''.join(rows)}</table>"
        if rows
        else "<p>No test ran.</p>"
    )
    diagnosis = "".join(_detail(esc(config), said) for config, said in g.diagnosis)
    diagnosis = diagnosis or "<p>No diagnosis (it is made when a value test fails).</p>"
    score = f"{number(g.score)}/{number(g.max_score)}" if g.status != "not a submission" else "-"
    reason = f'<p>Why: <span id="reason">{esc(g.reason)}</span></p>' if g.reason else ""
    links = f'<a href="{_href(str(report), folder)}">the class report</a>'
    if g.report:
        links += f', <a href="{_href(g.report, folder)}">its results file (JSON)</a>'
    title = f"{g.submission}" + (f" ({about.title})" if about else "")
    return f"""<!doctype html>
<html><head><meta charset="utf-8"><title>{esc(title)}</title>
<style>
{_PAGE_STYLE}
</style></head><body>
<h1>{esc(g.submission)}</h1>
<p>Back to {links}.</p>
{_about(about)}
<table id="summary"><tr><th>status</th><td id="status">{esc(g.status)}</td></tr>
<tr><th>score</th><td id="score">{score}</td></tr></table>
{reason}
<h2>Tests</h2>
{tests}
<h2>Diagnosis</h2>
{diagnosis}
</body></html>
"""
