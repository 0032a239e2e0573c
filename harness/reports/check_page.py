"""`xfmr check --html FILE`: a student's self-check as one page to look at.

The page holds what the self-check's text says (each test's verdict, points and message; the
forward pass's diagnosis, per config) and, where a picture says more than words, inline SVG:

- `Grid`: which output positions depend on which input positions, measured on the student's
  model (an input position changed alone, the outputs that moved), beside what the contract
  allows (a decoder position reads the targets up to itself; no output reads a padded source
  position). A cell the model reads where the contract forbids it is red, marked "!".
- `Bars`: each judged module's divergence from the oracle along the stack, in order of
  computation (encoder.0.self_attn, ..., the logits), one bar per module on a log scale, with
  the walk's tolerance drawn and the first divergent module marked.

The page is self-contained: inline CSS and SVG, no script, no link, no image, no font, no URL of
any kind (a Content-Security-Policy of default-src 'none' says so to the browser too). Every text
that reaches it from a record (the submission's name, a message, a cause) is the student's to
choose, and goes through reports.safe.html_text (harness.isolation.worker.printable, then HTML
escapes), in elements, attributes and SVG text alike.

Like every report it reads plain data only (a Grade record and the pictures' numbers), after
every worker is gone; the pictures are measured by harness.shared_tests.pictures.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field

from harness.outcomes import Outcome
from harness.records import Grade, TestResult
from harness.reports.grades import TestLine
from harness.reports.matrix import OUTCOME_COLORS
from harness.reports.safe import html_text as esc
from harness.shared_tests.pictures import MASKING, Bar, Bars, Grid

__all__ = ["Bar", "Bars", "Grid", "Pictures", "page", "wanted"]


@dataclass
class Pictures:
    """What the page draws beside the text; `notes` says why a picture is missing."""

    grids: list[Grid] = field(default_factory=list)
    bars: list[Bars] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)


def wanted(g: Grade) -> tuple[bool, bool]:
    """(the grids, the bars): whether the self-check `g` calls for them: a masking test failed;
    the diagnosis was made (a value test failed on a wrong value). Neither for a submission
    rejected or a checker error (nothing of it was judged)."""
    if g.rejected or g.error:
        return False, False
    failed = {t.name for t in g.tests if not t.passed}
    return bool(failed & MASKING), bool(g.diagnosis)


# --- colors and words -------------------------------------------------------------------------

_VERDICT = {
    Outcome.PASSED: "passed",
    Outcome.KILLED: "failed",
    Outcome.ERROR: "crashed",
    Outcome.TIMEOUT: "timed out",
    Outcome.NOT_APPLICABLE: "not applicable",
}
READ_OK, READ_BAD, UNREAD, MASKED, ALLOWED = "#3566a8", "#d62728", "#ffffff", "#dddddd", "#a9c4ea"
NOT_FINITE = "#444444"
MATCH, DEPART, WHOLE = "#4c9a5a", "#d62728", "#8c8c8c"

STYLE = f"""body {{ font-family: sans-serif; max-width: 1100px; margin: 1em auto; color: #222;
  line-height: 1.4; }}
h1 {{ font-size: 22px; }} h2 {{ font-size: 18px; margin-top: 1.6em; }}
.note {{ color: #555; }}
table {{ border-collapse: collapse; }}
td, th {{ border: 1px solid #999; padding: 3px 6px; font-size: 13px; text-align: left;
  vertical-align: top; }}
td.verdict {{ white-space: nowrap; font-weight: bold; }}
td.time, td.points {{ white-space: nowrap; }}
{"".join(f"td.{o.name.lower()} {{ background: {c}; }}" for o, c in OUTCOME_COLORS.items())}
td.not-judged {{ background: #ffffff; color: #777; }}
pre {{ white-space: pre-wrap; margin: 0; font-size: 12px; }}
details > summary {{ cursor: pointer; }}
.alarm {{ border: 2px solid {READ_BAD}; padding: 6px 10px; background: #fdecec; }}
.pair {{ display: flex; flex-wrap: wrap; gap: 28px; align-items: flex-start; }}
figure {{ margin: 0.5em 0 1.2em 0; }} figcaption {{ font-size: 13px; max-width: 1000px; }}
.key {{ display: inline-block; width: 12px; height: 12px; border: 1px solid #777;
  vertical-align: middle; margin: 0 4px 0 12px; }}
svg text {{ font-family: sans-serif; }}"""


def _number(x: float) -> str:
    return f"{x:g}"


def verdict(t: TestResult) -> tuple[str, str]:
    """(the CSS class, the word) of a test's verdict: a failure whose message says the test was
    not judged (a prerequisite failed) is "not judged", not a failure of its own."""
    if not TestLine(t.name, t.passed, t.outcome.value, t.message).judged:
        return "not-judged", "not judged"
    return t.outcome.name.lower(), _VERDICT[t.outcome]


# --- the dependence grid ----------------------------------------------------------------------

CELL = 22  # px per cell


def _cell(kind: str, i: int, j: int, x: float, y: float, fill: str, tip: str, mark: str) -> str:
    glyph = (
        f'<text x="{x + CELL / 2}" y="{y + CELL / 2 + 5}" text-anchor="middle" '
        f'font-size="14" font-weight="bold" fill="#fff">{mark}</text>'
        if mark
        else ""
    )
    return (
        f'<g class="cell {kind}" data-row="{i}" data-col="{j}">'
        f'<rect x="{x}" y="{y}" width="{CELL - 2}" height="{CELL - 2}" fill="{fill}" '
        f'stroke="#888" stroke-width="0.5"><title>{tip}</title></rect>{glyph}</g>'
    )


def grid_svg(grid: Grid, panel: str) -> str:
    """One panel of a Grid as SVG: "model" (what the model reads, forbidden reads red and
    marked "!") or "contract" (what the contract allows). Each cell is a <g class="cell KIND">
    with data-row and data-col: read, read-forbidden, unread, masked, not-finite (model);
    allowed, forbidden (contract)."""
    if panel not in ("model", "contract"):
        raise ValueError(f"grid_svg: panel is 'model' or 'contract', got {panel!r}")
    longest = max((len(c) for c in grid.cols), default=1)
    left, top = 64, 14 + round(longest * 5.6)  # the column labels, rotated, above the cells
    n_rows, n_cols = len(grid.rows), len(grid.cols)
    width = left + n_cols * CELL + 8 + round(longest * 3.2)  # the last label leans right
    height = top + n_rows * CELL + 8
    out = [
        f'<svg class="grid {panel}" id="grid-{esc(grid.key)}-{panel}" width="{width}" '
        f'height="{height}" viewBox="0 0 {width} {height}" role="img">',
    ]
    for j, label in enumerate(grid.cols):
        x, y = left + j * CELL + CELL / 2, top - 6
        out.append(
            f'<text x="{x}" y="{y}" font-size="11" transform="rotate(-60 {x} {y})">'
            f"{esc(label)}</text>"
        )
    for i, label in enumerate(grid.rows):
        out.append(
            f'<text x="{left - 6}" y="{top + i * CELL + CELL / 2 + 4}" font-size="11" '
            f'text-anchor="end">{esc(label)}</text>'
        )
    for i in range(n_rows):
        for j in range(n_cols):
            x, y = left + j * CELL, top + i * CELL
            read, allowed = grid.reads[i][j], grid.allowed[i][j]
            where = f"{esc(grid.rows[i])} from {esc(grid.cols[j])}"
            if panel == "contract":
                kind, fill = ("allowed", ALLOWED) if allowed else ("forbidden", MASKED)
                tip = f"{where}: {'may read' if allowed else 'must not read'}"
                out.append(_cell(kind, i, j, x, y, fill, tip, ""))
                continue
            if not grid.row_finite(i):
                kind, fill, mark, said = "not-finite", NOT_FINITE, "", "not finite (NaN or inf)"
            elif read and not allowed:
                kind, fill, mark, said = "read-forbidden", READ_BAD, "!", "reads it: forbidden"
            elif read:
                kind, fill, mark, said = "read", READ_OK, "", "reads it"
            else:
                kind, fill, mark = ("unread", UNREAD, "") if allowed else ("masked", MASKED, "")
                said = "does not read it"
            out.append(_cell(kind, i, j, x, y, fill, f"{where}: {said}", mark))
    out.append("</svg>")
    return "".join(out)


def grid_figure(grid: Grid) -> str:
    """A Grid's two panels side by side, with its caption and a key."""
    bad = grid.forbidden_reads
    broken = sum(not grid.row_finite(i) for i in range(len(grid.rows)))
    nan = (
        f'<p class="alarm" data-not-finite="{broken}">Your model\'s logits are not finite (NaN '
        f"or inf) at {broken} of these {len(grid.rows)} output positions (dark rows): what they "
        "read cannot be seen. A row of attention scores that are all masked (-inf) gives NaN: "
        "a mask that hides every key of some query.</p>"
        if broken
        else ""
    )
    found = (
        f'<p class="alarm" data-forbidden="{len(bad)}">Your model reads {len(bad)} '
        f"position{'s' if len(bad) != 1 else ''} the contract forbids (red, marked !).</p>"
        if bad
        else '<p data-forbidden="0">Your model reads nothing the contract forbids here.</p>'
    )
    key = (
        f'<span class="key" style="background:{READ_OK}"></span>reads'
        f'<span class="key" style="background:{READ_BAD}"></span>reads, forbidden'
        f'<span class="key" style="background:{UNREAD}"></span>does not read'
        f'<span class="key" style="background:{MASKED}"></span>does not read, forbidden'
        f'<span class="key" style="background:{ALLOWED}"></span>the contract allows'
    )
    if broken:
        key += f'<span class="key" style="background:{NOT_FINITE}"></span>not finite'
    return (
        f'<figure id="dependence-{esc(grid.key)}"><h3>{esc(grid.title)}</h3>{nan}{found}'
        f'<div class="pair"><div><p><b>Your model</b></p>{grid_svg(grid, "model")}</div>'
        f"<div><p><b>What the contract allows</b></p>{grid_svg(grid, 'contract')}</div></div>"
        f"<figcaption>{esc(grid.caption)}<br>{key}</figcaption></figure>"
    )


# --- the divergence bars ----------------------------------------------------------------------

ROW = 18  # px per bar
FLOOR = 1e-17  # below float64's rounding of O(1) values: the axis's left end


def _decades(bars: Bars) -> tuple[int, int]:
    finite = [b.error for b in bars.bars if math.isfinite(b.error) and b.error > 0]
    lo = math.floor(math.log10(min([*finite, bars.tol or 1.0, 1e-8])))
    hi = math.ceil(math.log10(max([*finite, bars.tol or 1.0, 1.0])))
    return max(lo, round(math.log10(FLOOR))), max(hi, lo + 1)


_FILL = {"depart": DEPART, "match": MATCH, "whole": WHOLE}


def bars_svg(bars: Bars) -> str:
    """One config's judged points as horizontal bars on a log scale: each point's relative
    error against the contract, green where the module returns an accepted form, red where it
    departs, grey for the logits against the whole forward pass; the tolerance as a dashed
    line; the first divergence marked. Each bar is a <g class="bar match|depart|whole [first]">
    with data-module and data-error."""
    label_w, plot_w, value_w, top = 230, 440, 250, 26
    lo, hi = _decades(bars)
    first = bars.first
    height = top + len(bars.bars) * ROW + 30
    width = label_w + plot_w + value_w

    def x_of(error: float) -> float:
        if not math.isfinite(error):
            return label_w + plot_w
        e = min(max(error, 10.0**lo), 10.0**hi)
        return label_w + (math.log10(e) - lo) / (hi - lo) * plot_w

    out = [
        f'<svg class="bars" width="{width}" height="{height}" '
        f'viewBox="0 0 {width} {height}" role="img">'
    ]
    step = 1 if hi - lo <= 8 else 2 if hi - lo <= 16 else 3
    axis_y = top + len(bars.bars) * ROW + 4
    for d in range(lo, hi + 1):
        x = x_of(10.0**d)
        out.append(
            f'<line x1="{x:.1f}" y1="{top - 4}" x2="{x:.1f}" y2="{axis_y}" stroke="#e4e4e4"/>'
        )
        if (d - lo) % step == 0:
            out.append(
                f'<text x="{x:.1f}" y="{axis_y + 14}" font-size="11" text-anchor="middle">'
                f"1e{d}</text>"
            )
    if bars.tol > 0:
        x = x_of(bars.tol)
        out.append(
            f'<line class="tolerance" x1="{x:.1f}" y1="{top - 12}" x2="{x:.1f}" y2="{axis_y}" '
            'stroke="#333" stroke-dasharray="4 3"/>'
            f'<text x="{x + 3:.1f}" y="{top - 14}" font-size="11">tolerance '
            f"{bars.tol:.2g}</text>"
        )
    for i, b in enumerate(bars.bars):
        y = top + i * ROW
        kind = "depart" if b.departs else "whole" if b.whole else "match"
        mark = " first" if i == first else ""
        size = "not comparable" if not math.isfinite(b.error) else f"{b.error:.3g}"
        said = f"{b.where}: {size}" + (f": {b.cause}" if b.cause else "")
        weight = ' font-weight="bold"' if i == first else ""
        value = size + ("  \u2190 first divergence" if i == first else "")
        out.append(
            f'<g class="bar {kind}{mark}" data-module="{esc(b.where)}" '
            f'data-error="{esc(repr(b.error))}"><title>{esc(said)}</title>'
            f'<text x="{label_w - 6}" y="{y + 13}" font-size="12" text-anchor="end"{weight}>'
            f"{esc(b.where)}</text>"
            f'<rect x="{label_w}" y="{y + 2}" width="{max(x_of(b.error) - label_w, 2):.1f}" '
            f'height="{ROW - 5}" fill="{_FILL[kind]}"'
            + (' stroke="#000" stroke-width="2"' if i == first else "")
            + "/>"
            f'<text x="{label_w + plot_w + 6}" y="{y + 13}" font-size="12"{weight}>'
            f"{esc(value)}</text></g>"
        )
    out.append("</svg>")
    return "".join(out)


def bars_figure(bars: Bars) -> str:
    """A config's bars with their caption."""
    return (
        f'<figure class="divergence" data-config="{esc(bars.config)}">{bars_svg(bars)}'
        f"<figcaption>Each module judged by the diagnosis, in order of computation, re-anchored "
        f"at its own input: its largest error against the contract's value, relative to the "
        f"value's scale (log scale). Green: the module returns what the contract accepts there; "
        f"red: it departs (a thick outline: the first divergence); grey: the logits against "
        f"the oracle's whole forward pass.</figcaption></figure>"
    )


# --- the page ---------------------------------------------------------------------------------


def _tests(tests: Sequence[TestResult]) -> str:
    rows = []
    for i, t in enumerate(tests):
        kind, word = verdict(t)
        lines = t.message.splitlines()
        message = ""
        if lines:
            message = f"<pre>{esc(lines[0])}</pre>"
            if len(lines) > 1:
                message += (
                    f"<details><summary>{len(lines) - 1} more line"
                    f"{'s' if len(lines) > 2 else ''}</summary>"
                    f"<pre>{esc(chr(10).join(lines[1:]))}</pre></details>"
                )
        rows.append(
            f'<tr data-test="{esc(t.name)}" data-outcome="{esc(word)}"><td>{i + 1}</td>'
            f'<td class="verdict {kind}">{esc(word)}</td>'
            f"<td><b>{esc(t.name)}</b><br><small>{esc(t.law)}</small></td>"
            f'<td class="points">{_number(t.score)}/{_number(t.max_score)}</td>'
            f'<td class="time">{t.seconds:.2f} s</td><td>{message}</td></tr>'
        )
    return (
        '<table id="tests"><tr><th>#</th><th>verdict</th><th>test</th><th>points</th>'
        f"<th>time</th><th>message</th></tr>{''.join(rows)}</table>"
    )


def _diagnosis(g: Grade, pictures: Pictures) -> str:
    if not g.diagnosis:
        return ""
    drawn = {b.config: b for b in pictures.bars}
    parts = []
    for config, said in g.diagnosis.items():
        parts.append(f'<h3>{esc(config)}</h3><p class="diagnosis">{esc(said)}</p>')
        if config in drawn:
            parts.append(bars_figure(drawn[config]))
    return (
        '<h2 id="diagnosis">Where the forward pass leaves the oracle</h2><p>The diagnosis runs '
        "your model once on the golden test's inputs, hooks every module that carries a "
        "contract name and judges each module's output against the oracle's recomputation "
        "from that module's own input.</p>" + "".join(parts)
    )


def page(g: Grade, pictures: Pictures | None = None) -> str:
    """The self-check `g` as one self-contained HTML page, with `pictures` where measured."""
    pictures = pictures or Pictures()
    passed = sum(t.passed for t in g.tests)
    if g.error:
        score = f"No score: a checker error, nothing was charged ({passed}/{len(g.tests)} passed)"
    else:
        score = (
            f"Score {_number(g.score)}/{_number(g.max_score)}: {passed} of {len(g.tests)} "
            f"tests passed, in {g.seconds:.1f} s"
        )
    banner = ""
    if g.rejected:
        banner += f'<p class="alarm" id="rejected">{esc(g.rejected)}</p>'
    if g.error:
        banner += (
            '<div class="alarm" id="checker-error"><p>The checker itself failed (not your '
            f"code's fault):</p><pre>{esc(g.error)}</pre></div>"
        )
    grids = ""
    if pictures.grids:
        grids = (
            '<h2 id="dependence">Which inputs each output reads</h2><p>Measured on your model: '
            "one input position changed at a time, every output position whose logits moved "
            "(by any amount) reads it.</p>" + "".join(grid_figure(x) for x in pictures.grids)
        )
    notes = "".join(f'<p class="note">{esc(n)}</p>' for n in pictures.notes)
    title = f"Self-check of {g.submission} (not a grade)"
    return f"""<!doctype html>
<html lang="en"><head><meta charset="utf-8">
<meta http-equiv="Content-Security-Policy" content="default-src 'none'; style-src 'unsafe-inline'">
<meta name="viewport" content="width=device-width, initial-scale=1">
<title>{esc(title)}</title>
<style>
{STYLE}
</style></head><body>
<h1>Self-check of <code id="submission">{esc(g.submission)}</code></h1>
<p class="note" id="isolation">{esc(g.isolation)}</p>
<p id="score" data-passed="{passed}" data-tests="{len(g.tests)}"><b>{esc(score)}</b></p>
{banner}
<h2>Tests</h2>
{_tests(g.tests)}
{grids}
{_diagnosis(g, pictures)}
{notes}
</body></html>
"""
