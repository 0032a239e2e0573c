"""What an outcome matrix says: kill sets, the mutation score, redundancy, false alarms.

Generic over the suite and the subjects: the kill-rate matrix, grading and mutation-scoring a
student's suite all summarize a SuiteRun the same way, by each subject's kind.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from harness.outcomes import Outcome, mutant_outcome
from harness.records import SuiteRun
from harness.subjects import Kind
from mutants import catalog


@dataclass
class Summary:
    """The findings of one run."""

    kill_sets: dict[str, frozenset[str]]  # mutant -> tests whose cell detects it
    status: dict[str, Outcome]  # mutant -> its overall outcome (outcomes.mutant_outcome)
    score: float  # detected pitfall mutants / pitfall mutants (the sanity mutant is a check)
    kills_per_test: dict[str, int]  # test -> pitfall mutants it detects
    redundant: list[list[str]]  # groups of pitfall mutants with the same non-empty kill set
    subsumed: list[tuple[str, str]]  # (a, b): every test that kills a also kills b, not back
    false_alarms: list[tuple[str, str, Outcome, str]] = field(default_factory=list)
    missed_expected: list[tuple[str, str]] = field(default_factory=list)  # (mutant, test)
    sanity_survivors: list[tuple[str, str]] = field(default_factory=list)  # (subject, test)

    @property
    def healthy(self) -> bool:
        """No false alarm, every seed-named killer kills, every test kills the sanity mutant."""
        return not (self.false_alarms or self.missed_expected or self.sanity_survivors)


def summarize(run: SuiteRun) -> Summary:
    tests = [t.name for t in run.tests]
    mutants = [s for s in run.subjects if s.kind in (Kind.MUTANT, Kind.SANITY)]
    kill_sets = {
        m.name: frozenset(t for t in tests if run.cell(t, m.name).outcome.detected) for m in mutants
    }
    status = {m.name: mutant_outcome(run.row(m.name)) for m in mutants}
    pitfalls = [m.name for m in mutants if m.kind is Kind.MUTANT]
    detected = sum(status[m].detected for m in pitfalls)
    groups: dict[frozenset[str], list[str]] = {}
    for m in pitfalls:
        if kill_sets[m]:
            groups.setdefault(kill_sets[m], []).append(m)
    subsumed = [
        (a, b)
        for a in pitfalls
        for b in pitfalls
        if a != b and kill_sets[a] and kill_sets[a] < kill_sets[b]
    ]
    false_alarms = [
        (t, s.name, run.cell(t, s.name).outcome, run.cell(t, s.name).message)
        for s in run.subjects
        if s.is_correct
        for t in tests
        if run.cell(t, s.name).outcome.false_alarm
    ]
    missed = [
        (m.name, test)
        for m in mutants
        if m.mutant is not None
        for test in catalog.get(m.mutant).killers
        if test in tests and test not in kill_sets[m.name]
    ]
    survivors = [
        (m.name, t)
        for m in mutants
        if m.kind is Kind.SANITY
        for t in tests
        if t not in kill_sets[m.name]
    ]
    return Summary(
        kill_sets=kill_sets,
        status=status,
        score=detected / len(pitfalls) if pitfalls else float("nan"),
        kills_per_test={t: sum(t in kill_sets[m] for m in pitfalls) for t in tests},
        redundant=[g for g in groups.values() if len(g) > 1],
        subsumed=subsumed,
        false_alarms=false_alarms,
        missed_expected=missed,
        sanity_survivors=survivors,
    )


# --- a student suite's mutation score ----------------------------------------------------------

REQUIRED = catalog.REQUIRED  # the records marked required (the seed's rung R5)
PASS_SCORE = 0.80


@dataclass
class Score:
    """What the suite earned."""

    tests: list[str]
    run: SuiteRun
    summary: Summary  # kills by tests that are not false alarms
    false_alarms: dict[str, list[str]]  # test -> "subject: outcome: message" lines
    errors: dict[str, str]  # subject -> why the suite did not run on it
    invalid: str  # why the suite scores nothing, if it does
    module_name: str
    reuse: str = ""  # with --incremental: how many subjects' runs came from the cache
    isolation: str = ""  # how the subjects' workers ran, and which limit is missing (every report)

    @property
    def killed(self) -> list[str]:
        return [m for m in catalog.PITFALLS if self.summary.status[m].detected]

    @property
    def score(self) -> float:
        return 0.0 if self.invalid else len(self.killed) / len(catalog.PITFALLS)

    @property
    def passed(self) -> bool:
        required = all(m in self.killed for m in REQUIRED)
        return not self.invalid and required and self.score >= PASS_SCORE
