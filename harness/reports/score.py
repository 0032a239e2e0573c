"""A student suite's mutation score, rendered: the text students read, the JSON report and
Stryker's mutation-testing report (the matrix's, harness.reports.matrix, with the student's own
tests as testFiles). The score itself is harness.analysis.Score."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from harness.analysis import PASS_SCORE, REQUIRED, Score
from harness.outcomes import Outcome
from harness.reports import matrix as reports
from mutants import catalog


def text(s: Score, tests_dir: str) -> str:
    lines = [
        f"Mutation score of {tests_dir} ({len(s.tests)} tests, subject imported as "
        f"{s.module_name} or the fixture `transformer`)",
        "",
    ]
    for name in ("impl", "torch_copy"):
        row = [s.run.cell(t, name).outcome for t in s.tests]
        counts = ", ".join(f"{row.count(o)} {o.value}" for o in Outcome if row.count(o))
        lines.append(f"  {name:<11} correct  {counts or 'no tests'}")
    for m in catalog.PITFALLS:
        status = s.summary.status[m]
        killers = sorted(s.summary.kill_sets[m])
        verdict = "killed" if status.detected else "SURVIVED"
        required = "*" if m in REQUIRED else " "
        lines.append(f"  {m}{required}        {verdict:<8} {catalog.get(m).pitfall}")
        if killers:
            names = ", ".join(_short(k) for k in killers)
            cut = names if len(names) <= 80 else names[:77] + "..."
            lines.append(f"      by {len(killers)}: {cut}")
    if s.false_alarms:
        lines += ["", "False alarms (fail on a correct subject, so they kill nothing):"]
        for test, where in s.false_alarms.items():
            lines.append(f"  {test}")
            lines += [f"    {w}" for w in where]
    for subject, error in s.errors.items():
        lines.append(f"the suite did not run on {subject}: {error.splitlines()[0][:300]}")
    if s.invalid:
        lines += ["", f"INVALID: {s.invalid}"]
    missing = [m for m in REQUIRED if m not in s.killed]
    lines += [
        "",
        f"Score: {len(s.killed) if not s.invalid else 0}/{len(catalog.PITFALLS)} = {s.score:.2f} "
        f"(* = must be killed: {_ids(REQUIRED)}"
        f"{'; missing ' + ', '.join(missing) if missing else ''}); "
        f"pass needs those and >= {PASS_SCORE:.2f}: {'PASS' if s.passed else 'FAIL'}",
        f"wall {s.run.wall_seconds:.1f} s; worker start-up (process, interpreter, torch, the "
        f"subject) {_spread(s.run.start_seconds)}",
    ]
    return "\n".join(lines)


def _ids(ids: tuple[str, ...]) -> str:
    """s01-s08 for a run of consecutive ids, else the list."""
    numbers = [int(i[1:]) for i in ids]
    if numbers == list(range(numbers[0], numbers[0] + len(numbers))) and len(numbers) > 2:
        return f"{ids[0]}-{ids[-1]}"
    return ", ".join(ids)


def _spread(seconds: dict[str, list[float]]) -> str:
    every = sorted(x for xs in seconds.values() for x in xs)
    if not every:
        return "not measured"
    return f"median {every[len(every) // 2]:.1f} s, max {every[-1]:.1f} s over {len(every)} workers"


def _short(nodeid: str) -> str:
    return nodeid.split("::", 1)[-1]


def to_json(s: Score) -> dict[str, Any]:
    return {
        "module": s.module_name,
        "tests": s.tests,
        "score": s.score,
        "passed": s.passed,
        "invalid": s.invalid,
        "killed": s.killed,
        "mutants": {
            m: {
                "status": s.summary.status[m].value,
                "killed_by": sorted(s.summary.kill_sets[m]),
                "pitfall": catalog.get(m).pitfall,
                "required": m in REQUIRED,
            }
            for m in catalog.PITFALLS
        },
        "false_alarms": s.false_alarms,
        "errors": s.errors,
        "cells": reports.frame(s.run).to_dict(orient="records"),
        "timing": {
            "wall_s": round(s.run.wall_seconds, 2),
            "per_subject_s": {k: round(v, 2) for k, v in s.run.subject_seconds.items()},
            "worker_starts": s.run.worker_starts,
            "start_seconds": s.run.start_seconds,
        },
    }


def stryker(s: Score, tests_dir: str) -> dict[str, Any]:
    """The matrix's Stryker report (harness.reports.matrix), the student's tests as testFiles."""
    data = reports.stryker(s.run, s.summary)
    files: dict[str, list[dict[str, str]]] = {}
    for t in s.tests:
        files.setdefault(t.split("::")[0], []).append({"id": t, "name": t})
    folder = Path(tests_dir).name  # relative paths only: the suite's own folder name
    data["testFiles"] = {f"{folder}/{f}": {"tests": ts} for f, ts in files.items()}
    data["framework"] = {"name": "xfmr mutation-score (pytest)"}
    return data
