"""A student suite's mutation score, rendered: the text students read, the JSON report,
Stryker's mutation-testing report (the matrix's, harness.reports.matrix, with the student's own
tests as testFiles) and Gradescope's results.json. The score itself is harness.analysis.Score.

The generated sample (harness.jobs.mutation_score: subjects g01.. whose mutant is a record of
mutants.generated_catalog) is read off the run's subjects: k of N killed, a 90% Wilson score
interval for the rate at which the suite kills a mutant drawn as the sample draws them, and per
contract clause what the suite missed. It never decides the pass.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from harness.analysis import PASS_SCORE, REQUIRED, Score
from harness.isolation.worker import printable
from harness.options import SANDBOX
from harness.outcomes import Outcome
from harness.reports import matrix as reports
from harness.reports.gradescope import staff_tests
from mutants import catalog, generated_catalog

Z90 = 1.6448536269514722  # the standard normal's 95th percentile: a two-sided 90% interval
VISIBILITIES = ("visible", "hidden", "after_due_date", "after_published")  # Gradescope's
# What the student reads (issue 48): their test *failed* or passed on a subject, and a mutant is
# *caught* (some test of theirs failed on it) or *missed*. "killed" and "survived" stay the
# matrix's and the machine-read reports' words (JSON, Stryker's schema).
TEST_WORDS = {
    Outcome.PASSED: "passed",
    Outcome.KILLED: "failed",
    Outcome.ERROR: "error",
    Outcome.TIMEOUT: "timed out",
    Outcome.NOT_APPLICABLE: "not run",
}
CAUGHT, MISSED = "caught", "MISSED"


def wilson(k: int, n: int, z: float = Z90) -> tuple[float, float]:
    """The Wilson score interval for k successes of n (0-1 when n is 0): unlike k/n +- z se, it
    stays inside [0, 1] and is not empty at k = 0 or k = n."""
    if n == 0:
        return 0.0, 1.0
    p = k / n
    centre = (p + z * z / (2 * n)) / (1 + z * z / n)
    half = z / (1 + z * z / n) * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n))
    return max(0.0, centre - half), min(1.0, centre + half)


@dataclass
class Generated:
    """The generated sample's result: subjects by name, their mutant records, what was killed."""

    mutants: dict[str, catalog.Mutant] = field(default_factory=dict)  # g01 -> its record
    killed: list[str] = field(default_factory=list)
    invalid: bool = False

    @property
    def n(self) -> int:
        return len(self.mutants)

    @property
    def k(self) -> int:
        return 0 if self.invalid else len(self.killed)

    @property
    def interval(self) -> tuple[float, float]:
        return wilson(self.k, self.n)

    def per_clause(self) -> dict[str, tuple[int, int]]:
        """clause -> (killed, drawn), in CLAUSES' order."""
        out: dict[str, tuple[int, int]] = {}
        for c in generated_catalog.CLAUSES:
            names = [g for g, m in self.mutants.items() if m.clause == c]
            if names:
                hit = 0 if self.invalid else sum(g in self.killed for g in names)
                out[c] = (hit, len(names))
        return out

    def never_tested(self) -> list[str]:
        """The clauses none of whose drawn mutants the suite killed."""
        return [c for c, (hit, _) in self.per_clause().items() if hit == 0]

    def line(self) -> str:
        lo, hi = self.interval
        return f"generated: {self.k} of {self.n} caught, 90% interval {lo:.2f}-{hi:.2f} (Wilson)"


def generated(s: Score) -> Generated:
    """The run's generated sample, read off its subjects."""
    g = Generated(invalid=bool(s.invalid))
    for sub in s.run.subjects:
        if sub.mutant is not None and sub.mutant not in catalog.PITFALLS:
            g.mutants[sub.name] = catalog.get(sub.mutant)
            if s.summary.status[sub.name].detected:
                g.killed.append(sub.name)
    return g


def generated_text(g: Generated) -> list[str]:
    """The sample's lines: the figure, then per clause what the suite missed (clauses only,
    never a mutant's text)."""
    if not g.n:
        return ["generated: none drawn (--generated 0)"]
    lines = [
        f"Generated mutants: a secret sample of {g.n} of the {len(generated_catalog.load())} "
        "generated faults of impl, stratified by contract clause (not part of the pass):",
        f"  {g.line()}",
    ]
    missed = {c: v for c, v in g.per_clause().items() if v[0] < v[1]}
    if missed:
        lines.append("  missed, per contract clause (missed of drawn):")
        for c, (hit, drawn) in missed.items():
            never = "  NEVER TESTED" if hit == 0 else ""
            lines.append(f"    {drawn - hit} of {drawn}  {generated_catalog.CLAUSES[c]}{never}")
    return lines


def text(s: Score, tests_dir: str) -> str:
    lines = [
        f"Mutation score of {printable(tests_dir)} ({len(s.tests)} tests, subject imported as "
        f"{s.module_name} or the fixture `transformer`)",
    ]
    if s.isolation and s.isolation != SANDBOX:  # UNSAFE, a self-check, LIMITS MISSING
        lines.append(s.isolation)
    lines.append("")
    for name in ("impl", "torch_copy"):
        row = [s.run.cell(t, name).outcome for t in s.tests]
        counts = ", ".join(f"{row.count(o)} {TEST_WORDS[o]}" for o in Outcome if row.count(o))
        lines.append(f"  {name:<11} correct  {counts or 'no tests'}")
    for m in catalog.PITFALLS:
        status = s.summary.status[m]
        killers = sorted(s.summary.kill_sets[m])
        verdict = CAUGHT if status.detected else MISSED
        required = "*" if m in REQUIRED else " "
        lines.append(f"  {m}{required}        {verdict:<8} {catalog.get(m).pitfall}")
        if killers:
            names = ", ".join(_short(k) for k in killers)
            cut = names if len(names) <= 80 else names[:77] + "..."
            lines.append(f"      caught by {len(killers)}: {cut}")
    if s.false_alarms:
        lines += ["", "False alarms (fail on a correct subject, so they catch nothing):"]
        for test, where in s.false_alarms.items():
            lines.append(f"  {test}")
            lines += [f"    {w}" for w in where]
    for subject, error in s.errors.items():
        lines.append(f"the suite did not run on {subject}: {error.splitlines()[0][:300]}")
    if s.invalid:
        lines += ["", f"INVALID: {s.invalid}"]
    missing = [m for m in REQUIRED if m not in s.killed]
    lines += ["", *generated_text(generated(s))]
    lines += [
        "",
        f"Score: {len(s.killed) if not s.invalid else 0}/{len(catalog.PITFALLS)} = {s.score:.2f} "
        f"(* = must be caught: {_ids(REQUIRED)}"
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
        "isolation": s.isolation,
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
        "generated": generated_json(generated(s)),
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


def generated_json(g: Generated) -> dict[str, Any]:
    lo, hi = g.interval
    return {
        "drawn": g.n,
        "killed": g.k,
        "rate": g.k / g.n if g.n else None,
        "interval_90": [lo, hi],
        "interval_method": "Wilson score",
        "catalog_size": len(generated_catalog.load()),
        "per_clause": {
            c: {"statement": generated_catalog.CLAUSES[c], "drawn": drawn, "killed": hit}
            for c, (hit, drawn) in g.per_clause().items()
        },
        "never_tested": g.never_tested(),
        "mutants": {
            name: {
                "id": m.id,
                "clause": m.clause,
                "operator": m.mutator,
                "status": "killed" if name in g.killed and not g.invalid else "survived",
            }
            for name, m in g.mutants.items()
        },
    }


def gradescope(s: Score, generated_visibility: str = "visible") -> dict[str, Any]:
    """results.json of a mutation score: one test a published pitfall (a point each, killed or
    not; the required ones say so), and the generated sample as a test of 0 points whose
    visibility is the course's policy; a survivor is named by its clause, never its text."""
    tests = []
    for m in catalog.PITFALLS:
        killed = m in s.killed
        tests.append(
            {
                "name": f"{m}{' (required)' if m in REQUIRED else ''}: {catalog.get(m).pitfall}",
                "score": 1.0 if killed else 0.0,
                "max_score": 1.0,
                "status": "passed" if killed else "failed",
                "output": f"{CAUGHT}: a test of yours failed on it"
                if killed
                else "missed: no test of yours failed on it",
                "output_format": "text",
                "visibility": "visible",
            }
        )
    g = generated(s)
    if g.n:
        tests.append(
            {
                "name": "Generated mutants (a secret sample; 0 points)",
                "score": 0.0,
                "max_score": 0.0,
                "status": "passed" if g.k == g.n else "failed",
                "output": "\n".join(generated_text(g)),
                "output_format": "text",
                "visibility": generated_visibility,
            }
        )
    verdict = "PASS" if s.passed else "FAIL"
    summary = (
        f"Mutation score {s.score:.2f} ({len(s.killed)}/{len(catalog.PITFALLS)}): {verdict}"
        + (f"; INVALID: {s.invalid}" if s.invalid else "")
    )
    # the isolation when it is not plainly the sandbox's (LIMITS MISSING, UNSAFE) is staff's:
    # in a hidden test only (harness.reports.gradescope)
    if s.isolation and s.isolation != SANDBOX:
        tests += staff_tests([f"Course staff: isolation: {s.isolation}"])
    return {
        "score": float(len(s.killed)) if not s.invalid else 0.0,
        "execution_time": round(s.run.wall_seconds, 2),
        "output": summary,
        "output_format": "text",
        "visibility": "visible",
        "stdout_visibility": "hidden",
        "tests": tests,
    }


def stryker(s: Score, tests_dir: str) -> dict[str, Any]:
    """The matrix's Stryker report (harness.reports.matrix), the student's tests as testFiles."""
    data = reports.stryker(s.run, s.summary)
    files: dict[str, list[dict[str, str]]] = {}
    for t in s.tests:
        files.setdefault(t.split("::")[0], []).append({"id": t, "name": t})
    folder = printable(Path(tests_dir).name)  # relative paths only: the suite's own folder name
    data["testFiles"] = {f"{folder}/{f}": {"tests": ts} for f, ts in files.items()}
    data["framework"] = {"name": "xfmr mutation-score (pytest)"}
    if s.isolation:
        data["config"] = {"isolation": s.isolation}  # the schema's free-format object
    return data
