"""An outcome matrix written out: text grid, CSV, JSON, Markdown, HTML and Stryker's schema.

Every writer reads the same SuiteRun and Summary, so the formats always agree.
"""

from __future__ import annotations

import inspect
import os
import platform
from pathlib import Path
from typing import TYPE_CHECKING, Any

from harness.analysis import Summary
from harness.outcomes import STRYKER_STATUS, Outcome
from harness.records import SuiteRun
from harness.reports.safe import html_text, markdown_cell
from harness.subjects import Kind, module_source
from mutants import catalog

if TYPE_CHECKING:
    import pandas as pd

LEGEND = "  ".join(f"{o.symbol} {o.value}" for o in Outcome)


def frame(run: SuiteRun) -> pd.DataFrame:
    """One row per cell: test, subject, kind, outcome, seconds, message, and whether it ran
    (False: inferred from impl's coverage, harness.engine.coverage)."""
    import pandas as pd  # here, not at the top: only --csv needs it (0.3 s of every run's start)

    kinds = {s.name: s.kind.value for s in run.subjects}
    rows = [
        {
            "test": t.name,
            "subject": s.name,
            "kind": kinds[s.name],
            "outcome": run.cell(t.name, s.name).outcome.value,
            "seconds": round(run.cell(t.name, s.name).seconds, 3),
            "message": run.cell(t.name, s.name).message,
            "ran": run.cell(t.name, s.name).ran,
        }
        for t in run.tests
        for s in run.subjects
    ]
    return pd.DataFrame(rows)


def text(run: SuiteRun, summary: Summary) -> str:
    """The grid (subjects down, tests across by number) and the findings, within 100 columns."""
    width = max(len(s.name) for s in run.subjects)
    numbers = " ".join(f"{i + 1:>2}" for i in range(len(run.tests)))
    lines = [
        f"Kill-rate matrix: {len(run.tests)} shared tests x {len(run.subjects)} subjects",
        f"({LEGEND})",
        "",
        f"{'subject':<{width}}  {'kind':<8} {numbers}  killed by (* = the seed's)",
    ]
    index = {t.name: i + 1 for i, t in enumerate(run.tests)}
    for s in run.subjects:
        cells = " ".join(f"{run.cell(t.name, s.name).outcome.symbol:>2}" for t in run.tests)
        note = ""
        if s.name in summary.kill_sets:
            expected = catalog.get(s.mutant).killers if s.mutant else ()
            killers = [
                f"{index[t]}{'*' if t in expected else ''}"
                for t in sorted(summary.kill_sets[s.name], key=index.__getitem__)
            ]
            note = ",".join(killers) if s.kind is Kind.MUTANT else f"{len(killers)} tests"
        lines.append(f"{s.name:<{width}}  {s.kind.value:<8} {cells}  {note}".rstrip())
    lines += ["", "tests (pitfall mutants each detects):"]
    for t in run.tests:
        lines.append(f"  {index[t.name]:>2} {t.name:<54} {summary.kills_per_test[t.name]:>2}")
    pitfalls = [s.name for s in run.subjects if s.kind is Kind.MUTANT]
    detected = [m for m in pitfalls if summary.status[m].detected]
    lines += [
        "",
        f"mutation score: {len(detected)}/{len(pitfalls)} = {summary.score:.2f} "
        "(a mutant counts when some test kills it or times out; errors do not)",
        "redundant (same kill set): "
        + ("; ".join(" = ".join(g) for g in summary.redundant) or "none"),
        "subsumed (a < b: every test that kills a kills b): "
        + (", ".join(f"{a} < {b}" for a, b in summary.subsumed) or "none"),
    ]
    for finding, detail in findings(run, summary):
        lines.append(finding)
        lines += [f"    {line}" for line in detail.splitlines()[:6]]
    return "\n".join(lines)


def findings(run: SuiteRun, summary: Summary) -> list[tuple[str, str]]:
    """What needs a look, each as (one line, its detail): survivors, killers the seed designates
    that do not kill, tests the sanity mutant survives, false alarms. Every format shows them."""
    pitfalls = [s.name for s in run.subjects if s.kind is Kind.MUTANT]
    found = [(f"SURVIVED: {m} is killed by no test", "") for m in pitfalls]
    found = [f for f, m in zip(found, pitfalls, strict=True) if not summary.status[m].detected]
    found += [
        (f"MISSED: the seed says {test} kills {mutant}; it does not", "")
        for mutant, test in summary.missed_expected
    ]
    found += [
        (f"SANITY: {test} does not fail on {subject}: it cannot fail at all", "")
        for subject, test in summary.sanity_survivors
    ]
    found += [
        (f"FALSE ALARM: {test} on correct subject {subject}: {outcome.value}", message)
        for test, subject, outcome, message in summary.false_alarms
    ]
    return found


def timing(run: SuiteRun) -> str:
    """Wall time, and each subject's time and worker starts."""
    lines = [f"wall {run.wall_seconds:.1f} s; per subject (s, worker starts):"]
    parts = [
        f"{s.name} {run.subject_seconds[s.name]:.1f} ({run.worker_starts[s.name]})"
        for s in run.subjects
    ]
    for i in range(0, len(parts), 5):
        lines.append("  " + ", ".join(parts[i : i + 5]))
    return "\n".join(lines)


def to_json(run: SuiteRun, summary: Summary) -> dict[str, Any]:
    """Cells, findings, each mutant's diff, and timings."""
    _, source = module_source("impl.transformer")
    return {
        "legend": {o.value: o.symbol for o in Outcome},
        "tests": [{"name": t.name, "law": t.law, "timeout_s": t.timeout} for t in run.tests],
        "subjects": [s.to_json() for s in run.subjects],
        "cells": frame(run).to_dict(orient="records"),
        "mutants": {
            s.name: {
                "status": summary.status[s.name].value,
                "killed_by": sorted(summary.kill_sets[s.name]),
                "expected_killers": list(catalog.get(s.mutant).killers) if s.mutant else [],
                "diff": catalog.get(s.mutant).diff(source) if s.mutant else "",
            }
            for s in run.subjects
            if s.name in summary.kill_sets
        },
        "mutation_score": summary.score,
        "kills_per_test": summary.kills_per_test,
        "redundant": summary.redundant,
        "subsumed": summary.subsumed,
        "false_alarms": [
            {"test": t, "subject": s, "outcome": o.value, "message": m}
            for t, s, o, m in summary.false_alarms
        ],
        "missed_expected": summary.missed_expected,
        "sanity_survivors": summary.sanity_survivors,
        "timing": {
            "wall_s": round(run.wall_seconds, 2),
            "per_subject_s": {k: round(v, 2) for k, v in run.subject_seconds.items()},
            "worker_starts": run.worker_starts,
            "cpu_count": os.cpu_count(),
        },
    }


def markdown(run: SuiteRun, summary: Summary) -> str:
    """A Markdown table: tests down, subjects across. Every name, outcome and finding goes
    through reports.safe.markdown_cell (a subject may be a student's file)."""
    cell = markdown_cell
    names = [s.name for s in run.subjects]
    lines = [
        "| test | " + " | ".join(cell(n) for n in names) + " | kills |",
        "| --- | " + " | ".join(":---:" for _ in names) + " | ---: |",
    ]
    for t in run.tests:
        cells = [cell(run.cell(t.name, n).outcome.value) for n in names]
        kills = summary.kills_per_test[t.name]
        lines.append(f"| {cell(t.name)} | " + " | ".join(cells) + f" | {kills} |")
    lines += ["", f"Mutation score: {summary.score:.2f}.", ""]
    listed = findings(run, summary)
    lines += [f"- {cell(finding)}" for finding, _ in listed] or ["No findings."]
    return "\n".join(lines) + "\n"


# Each outcome's cell color, and the pages' style: the class report (reports.class_report) uses
# both, so a grid reads the same in either page.
OUTCOME_COLORS = {
    Outcome.PASSED: "#d9f2d9",
    Outcome.KILLED: "#f4b6b6",
    Outcome.ERROR: "#f7d08a",
    Outcome.TIMEOUT: "#c9b6f4",
    Outcome.NOT_APPLICABLE: "#e6e6e6",
}
STYLE = """body { font-family: sans-serif; }
table { border-collapse: collapse; }
td, th { border: 1px solid #999; padding: 3px 6px; font-size: 13px; text-align: center; }
th:first-child { text-align: left; }"""


def html_page(run: SuiteRun, summary: Summary) -> str:
    """A colored grid (tests down, subjects across); each cell's message shows on hover. Every
    text goes through reports.safe.html_text (a subject may be a student's file, a message
    anything it printed or raised)."""
    esc = html_text
    head = "".join(
        f"<th>{esc(s.name)}<br><small>{esc(s.kind.value)}</small></th>" for s in run.subjects
    )
    rows = []
    for t in run.tests:
        cells = []
        for s in run.subjects:
            c = run.cell(t.name, s.name)
            alarm = s.is_correct and c.outcome.false_alarm
            style = f"background:{OUTCOME_COLORS[c.outcome]}" + (
                ";outline:3px solid red" if alarm else ""
            )
            tip = esc(c.message or c.outcome.value)
            cells.append(f'<td style="{style}" title="{tip}">{esc(c.outcome.value)}</td>')
        rows.append(
            f'<tr><th title="{esc(t.law)}">{esc(t.name)}</th>{"".join(cells)}'
            f"<td>{summary.kills_per_test[t.name]}</td></tr>"
        )
    legend = " ".join(
        f'<span style="background:{OUTCOME_COLORS[o]};padding:2px 6px">{esc(o.value)}</span>'
        for o in Outcome
    )
    alarms = "".join(
        f'<li title="{esc(detail)}">{esc(finding)}</li>'
        for finding, detail in findings(run, summary)
    )
    return f"""<!doctype html>
<html><head><meta charset="utf-8"><title>xfmr kill-rate matrix</title>
<style>
{STYLE}
</style></head><body>
<h1>Kill-rate matrix</h1>
<p>{legend}</p>
<p>Mutation score {summary.score:.2f}; wall time {run.wall_seconds:.1f} s.
Hover a cell for its message, a test for its law.</p>
<ul style="color:red">{alarms}</ul>
<table><tr><th>test</th>{head}<th>kills</th></tr>
{"".join(rows)}
</table></body></html>
"""


def test_files(tests: Any) -> dict[str, Any]:
    """Stryker's testFiles: each test under the file its check is defined in (its family module
    of harness.shared_tests.laws), relative to the project's root, in the matrix's order."""
    root = Path(__file__).resolve().parents[2]
    files: dict[str, Any] = {}
    for t in tests:
        where = Path(inspect.getsourcefile(t.check) or "").resolve()
        name = where.relative_to(root).as_posix() if where.is_relative_to(root) else where.name
        files.setdefault(name, {"tests": []})["tests"].append(
            {"id": t.name, "name": f"{t.name}: {t.law}"}
        )
    return files


def stryker(run: SuiteRun, summary: Summary) -> dict[str, Any]:
    """The mutation-testing-report-schema (version 2) JSON that Stryker's viewers render: impl's
    source and each pitfall mutant with the region its patches change, the replacement, status,
    reason and killers. The sanity mutant is left out (it checks the tests, not a pitfall).
    coveredBy: when impl's row ran traced (harness.engine.coverage), the tests that reach the
    mutant's change, which are the tests its cells ran for (the others were inferred, not run);
    without that coverage it is left out, as no test is then known to cover or miss."""
    path, source = module_source("impl.transformer")
    root = str(Path(path).parents[1]) + "/"
    tests = [t.name for t in run.tests]
    traced = any(s.name == "impl" for s in run.subjects) and all(
        run.cell(t, "impl").covered is not None for t in tests
    )
    mutants = []
    for s in run.subjects:
        if s.mutant is None or s.kind is Kind.SANITY:
            continue
        m = catalog.get(s.mutant)
        start, end, replacement = m.span(source)
        ran = [
            t
            for t in tests
            if run.cell(t, s.name).outcome is not Outcome.NOT_APPLICABLE and run.cell(t, s.name).ran
        ]
        reason = next(
            (run.cell(t, s.name).message for t in tests if run.cell(t, s.name).message), ""
        )
        mutants.append(
            {
                "id": m.id,
                "mutatorName": m.mutator,
                "description": m.pitfall,
                "location": {
                    "start": {"line": start[0], "column": start[1]},
                    "end": {"line": end[0], "column": end[1]},
                },
                "replacement": replacement,
                "status": STRYKER_STATUS[summary.status[s.name]],
                "statusReason": reason.replace(root, "")[:2000],  # paths relative to the project
                "killedBy": sorted(summary.kill_sets[s.name]),
                **({"coveredBy": ran} if traced else {}),
                "testsCompleted": len(ran),
            }
        )
    return {
        "schemaVersion": "2",
        "thresholds": {"high": 80, "low": 60},
        "files": {
            "impl/transformer.py": {"language": "python", "source": source, "mutants": mutants}
        },
        "testFiles": test_files(run.tests),
        "framework": {"name": "xfmr-oracle harness"},
        "system": {
            "ci": bool(os.environ.get("CI")),
            "os": {"platform": platform.system().lower()},
            "cpu": {"logicalCores": os.cpu_count() or 1},
        },
    }
