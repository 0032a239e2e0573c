"""`xfmr mutation-score TESTS`: a student's pytest suite, scored by the pitfall mutants it kills.

The suite runs on impl, the torch copy and s01-s11, each subject in a sandbox of its own
(harness.isolation.sandbox: its own private /tmp, nothing shared with the other subjects' runs)
with a time limit per test. The subjects run in a secret random order, and every one is handed
over the same way: source rewritten afresh for this run (harness.jobs.disguise: locals renamed,
definitions reordered, comments and docstrings gone) and loaded under one name, so a suite can
tell a mutant neither by its label, nor by its text, nor by when it runs.
Per-test results stream back over the worker's protocol pipe (harness.student_suite) rather than
through a JUnit file: a hang or a crash then loses only the test in progress, and nothing the
suite can guess is ever read back as a result file.

A test that fails on a correct subject is a false alarm and kills nothing. A suite that fails
every test on impl is invalid and scores 0. Score = killed / the number of pitfall mutants; pass =
every mutant whose record is marked `required` killed and score >= 0.80 (the seed's rung R5).

Besides the published mutants, every run draws a secret sample of `--generated N` mutants from
the committed catalog of generated ones (mutants.generated_catalog: faults the shared laws kill),
stratified by contract clause, from the run's secret (XFMR_DRAW_SEED reproduces it), named g01..
in the run, disguised and sandboxed exactly as the others under the same limits. They decide no
pass: the report adds how many the suite killed, with an interval, and per clause what it missed.
A generated mutant's run stops at its first kill by a test that no correct subject failed (its
verdict is then decided; the tests after it are not applicable), which keeps the sample cheap.
"""

from __future__ import annotations

import argparse
import json
import random
import secrets
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from dataclasses import asdict, replace
from pathlib import Path
from typing import Any

from harness.analysis import Score, summarize
from harness.engine import executors, work
from harness.engine.cache import KEPT, Store, default_root, suite_run_key
from harness.engine.run import Launch, unjudgeable
from harness.isolation import sandbox, tiers
from harness.isolation.limits import DEFAULT_LIMITS, Limits
from harness.isolation.staging import UnsafeInput, staged
from harness.isolation.tiers import Tier
from harness.isolation.worker import SubjectRaised, WorkerDied, WorkerTimeout, printable
from harness.jobs.disguise import disguise
from harness.options import (
    add_isolation,
    chosen_tier,
    isolation_problem,
    positive,
    usage_error,
)
from harness.outcomes import Outcome, mutant_outcome
from harness.records import Cell, SubjectRun, SuiteRun
from harness.reports import score as score_report
from harness.reports.writer import report_path_problem, write_all
from harness.shared_tests.inputs import draw_seed
from harness.shared_tests.record import Test
from harness.subjects import Kind, Subject
from mutants import catalog, generated_catalog

MODULE = "tinyllm.xfmr.transformer"  # the seed's module path for the subject
# Importing pytest, Hypothesis, the subject and the suite: a few seconds on a loaded machine.
COLLECT_TIMEOUT = 60.0
# Default per-test limit: a student's test of a tiny model takes well under a second; 30 s
# leaves room for Hypothesis's 100 examples on a loaded machine.
TEST_TIMEOUT = 30.0

# Generated mutants per run by default: each is one more sandboxed subject. 12 keeps a run of
# examples/student_tests_strong within 2x the published mutants' time (measured: README).
GENERATED = 12

_OUTCOMES = {
    "passed": Outcome.PASSED,
    "failed": Outcome.KILLED,
    "skipped": Outcome.NOT_APPLICABLE,
}


def subjects() -> list[Subject]:
    """impl, the torch copy and s01-s11 (the sanity mutant checks the shared tests, not yours)."""
    return [
        Subject("impl", Kind.CORRECT, module="impl.transformer"),
        Subject("torch_copy", Kind.CORRECT, module="impl.torch_copy"),
        *(Subject(m, Kind.MUTANT, module="impl.transformer", mutant=m) for m in catalog.PITFALLS),
    ]


def generated_subjects(n: int, seed: int | None = None) -> list[Subject]:
    """The run's sample of n generated mutants (mutants.generated_catalog.draw, stratified by
    clause) as subjects g01, g02, ...; the seed defaults to one drawn from the run's secret."""
    if n <= 0:
        return []
    seed = draw_seed("mutation-score", "generated sample") if seed is None else seed
    drawn = generated_catalog.draw(n, seed)
    return [
        Subject(f"g{i:02d}", Kind.MUTANT, module="impl.transformer", mutant=m.id)
        for i, m in enumerate(drawn, 1)
    ]


def is_generated(subject: Subject) -> bool:
    return subject.mutant is not None and subject.mutant not in catalog.PITFALLS


def first_kill_tests(runs: dict[str, SubjectRun], correct: list[Subject]) -> frozenset[str]:
    """The tests whose failure decides a mutant killed: collected on impl and no false alarm on
    any correct subject (a generated mutant's run stops at the first of them that fails)."""
    tests = runs["impl"].collected
    return frozenset(
        t
        for t in tests
        if all(
            t in runs[c.name].cells and not runs[c.name].cells[t].outcome.false_alarm
            for c in correct
        )
    )


def subject_source(subject: Subject, rng: random.Random) -> str:
    """The subject's source, patched for a mutant, disguised under draws from `rng`."""
    return disguise(subject.payload()["source"], rng)


def run_on(
    source: str,
    tests_dir: Path,
    module_name: str,
    limits: Limits,
    time_limit: float,
    tier: Tier = tiers.SANDBOX,
    stop: frozenset[str] = frozenset(),
) -> SubjectRun:
    """The suite on one subject's source, restarting after a test that hangs or crashes (and
    stopping at the first test of `stop` that kills it). The subject and a copy of the suite are
    staged privately for this subject alone."""
    start = time.monotonic()
    out = SubjectRun()
    with staged({"tests": tests_dir}, {"subject.py": source}) as stage:
        start_worker, inside = tier.start(stage, limits)
        launch = Launch(
            start_worker,
            {"path": str(inside / "subject.py")},
            ("probes", "student_suite"),
            limits.confine(),
            COLLECT_TIMEOUT,
        )
        suite_in(launch, inside, module_name, time_limit, out, stop)
    out.seconds = time.monotonic() - start
    return out


def suite_in(
    launch: Launch,
    inside: Path,
    module_name: str,
    time_limit: float,
    out: SubjectRun,
    stop: frozenset[str] = frozenset(),
) -> None:
    """Run the staged suite (at `inside`/tests) on the subject `launch` loads, into `out`: a
    fresh worker after each test that hangs or crashes, the tests already judged skipped; done
    at the first test of `stop` whose cell detects the subject (killed or timeout)."""
    while True:
        out.workers += 1
        events = _Events(out, time_limit, stop)
        begun = time.monotonic()
        try:
            worker = launch.worker()
        except (WorkerDied, WorkerTimeout, SubjectRaised) as e:
            out.error = f"the subject did not load: {e}"
            break
        finally:
            out.start_seconds.append(round(time.monotonic() - begun, 3))
        try:
            inputs = {
                "tests_dir": str(inside / "tests"),
                "module_name": module_name,
                "skip": list(out.cells),
            }
            request = {"op": "call", "probe": "student_suite", "inputs": inputs}
            reply = worker.stream(request, events.due, events.on_event)
            code = reply.get("exit") if isinstance(reply, dict) else None
            if code not in (0, 1) and not out.cells:  # 1: some tests failed
                said = printable(worker.output_tail(3000))
                out.error = f"pytest exited with status {code} and ran no test:\n{said}"
            break
        except _FirstKill:
            break
        except WorkerTimeout:
            if events.current is None:
                out.error = f"no test started within {COLLECT_TIMEOUT:g} s (collecting)"
                break
            out.cells[events.current] = Cell(Outcome.TIMEOUT, f"no result within {time_limit:g} s")
            if events.current in stop:
                break
        except (WorkerDied, SubjectRaised) as e:
            if events.current is None:
                out.error = str(e)
                break
            out.cells[events.current] = Cell(Outcome.ERROR, f"the test killed its process: {e}")
        except Exception as e:  # a malformed event from the suite: the suite's error
            out.error = unjudgeable(e)
            break
        finally:
            worker.close()


class _FirstKill(Exception):
    """A test of the stop set killed the subject: its verdict is decided, the run ends here."""


class _Events:
    """The suite's streamed events on one worker: results, the test in progress, its deadline."""

    def __init__(self, out: SubjectRun, time_limit: float, stop: frozenset[str]) -> None:
        self.out, self.time_limit, self.stop = out, time_limit, stop
        self.current: str | None = None
        self.deadline = time.monotonic() + COLLECT_TIMEOUT

    def due(self) -> float:
        """When the next event must have come (time.monotonic)."""
        return self.deadline

    def on_event(self, event: Any) -> None:
        if not isinstance(event, dict):
            raise TypeError(f"an event must be an object, got {type(event).__name__}")
        kind = event.get("event")
        if kind == "collected" and not self.out.collected:
            self.out.collected = [printable(n) for n in event["nodeids"]]
        elif kind == "start":
            self.current = printable(event["nodeid"])
            self.deadline = time.monotonic() + self.time_limit
        elif kind == "result":
            outcome = _OUTCOMES.get(event["outcome"], Outcome.ERROR)
            cell = Cell(outcome, printable(event["message"]), float(event["seconds"]))
            self.out.cells[printable(event["nodeid"])] = cell
            self.current = None
            self.deadline = time.monotonic() + self.time_limit
            if outcome.detected and printable(event["nodeid"]) in self.stop:
                raise _FirstKill


def mutation_score(
    tests_dir: str | Path,
    module_name: str = MODULE,
    limits: Limits = DEFAULT_LIMITS,
    time_limit: float = TEST_TIMEOUT,
    jobs: int | None = None,
    progress: Callable[[str, SubjectRun], None] | None = None,
    tier: Tier = tiers.SANDBOX,
    executor: work.Executor | None = None,
    store: Store | None = None,
    generated: int = GENERATED,
    seed: int | None = None,
    sample: list[Subject] | None = None,
) -> Score:
    """Run the suite on every subject, each subject's run a unit of `executor` (default: up to
    `jobs` at once here), and score it. With a `store`, a subject's run whose key it holds is
    taken from it (harness.engine.cache.suite_run_key), and each clean run is stored.
    `generated` mutants of the catalog are drawn as generated_subjects(generated, seed) draws
    (`sample`: these generated subjects instead, for a measurement over several draws)."""
    tests_dir = Path(tests_dir).resolve()
    if not tests_dir.is_dir():
        raise FileNotFoundError(f"TESTS must be a folder of pytest files, got {tests_dir}")
    started = time.monotonic()
    subs = subjects() + (generated_subjects(generated, seed) if sample is None else sample)
    secret = random.Random(secrets.randbits(64))  # this run's order and rewrites, never shown
    sources = {s.name: subject_source(s, secret) for s in subs}
    correct = [s for s in subs if s.is_correct]
    mutants = [s for s in subs if not s.is_correct]
    lock = threading.Lock()
    ex = executor or work.LocalExecutor(jobs)
    shipped: dict[str, Any] = {}  # the suite as plain data, packed once if a unit is shipped
    stops: dict[str, frozenset[str]] = {}  # a generated mutant's first-kill tests

    def unit(s: Subject) -> work.Unit[SubjectRun]:
        stop = stops.get(s.name, frozenset())

        def payload() -> dict[str, Any]:
            if not shipped:
                with staged({"tests": tests_dir}):  # refused here as a local run refuses it
                    shipped["tests"] = work.pack(tests_dir)
            return {
                "source": sources[s.name],
                "tests": shipped["tests"],
                "module_name": module_name,
                "limits": asdict(limits),
                "time_limit": time_limit,
                "tier": tier.name,
                "stop": sorted(stop),
            }

        return work.Unit(
            s.name,
            lambda: run_on(sources[s.name], tests_dir, module_name, limits, time_limit, tier, stop),
            run_shipped,
            payload,
            SubjectRun.from_json,
            lambda why: SubjectRun(error=why),
            sandboxed=tier.isolated,
        )

    kept: dict[str, SubjectRun] = {}
    keys: dict[str, str] = {}
    if store is not None:
        with staged({"tests": tests_dir}):  # refused here as a run would refuse it
            suite = work.pack(tests_dir)
        settings = {"module": module_name, "limits": asdict(limits), "time_limit": time_limit}
        for s in subs:
            first_kill = {"first_kill": True} if is_generated(s) else {}
            keys[s.name] = suite_run_key(
                s.payload(), suite, settings | {"unsafe": not tier.isolated} | first_kill
            )
            if (value := store.get(keys[s.name])) is not None:
                kept[s.name] = SubjectRun.from_json(value)
    runs: dict[str, SubjectRun] = {}
    # the correct subjects first: a suite that does not even collect on impl is broken, and
    # running it on the mutants would only repeat pytest's own error eleven times
    for wave in (secret.sample(correct, len(correct)), secret.sample(mutants, len(mutants))):
        todo = [s for s in wave if s.name not in kept]

        def done(i: int, r: SubjectRun, todo: list[Subject] = todo) -> None:
            if progress is not None:
                with lock:
                    progress(todo[i].name, r)

        runs.update(zip([s.name for s in todo], ex.run([unit(s) for s in todo], done), strict=True))
        runs.update({s.name: kept[s.name] for s in wave if s.name in kept})
        for s in todo:
            r = runs[s.name]
            clean = not r.error and all(c.outcome in KEPT for c in r.cells.values())
            if store is not None and clean:
                store.put(keys[s.name], SubjectRun.to_json(r))
        impl = runs["impl"]
        if not impl.collected or (impl.error and not impl.cells):
            raise SuiteBroken(impl.error or "pytest collected no test on impl")
        if not stops:
            honest = first_kill_tests(runs, correct)
            stops.update({s.name: honest for s in mutants if is_generated(s)})
    score = scored(subs, runs, module_name, time_limit, time.monotonic() - started)
    score.isolation = tier.described  # said in every report, as a grade's
    if missing := tier.limits_problem():
        score.isolation = f"{tier.described}; {missing}"
    if store is not None:
        score.reuse = f"incremental: {len(kept)} of {len(subs)} subjects' runs reused"
    return score


def run_shipped(payload: dict[str, Any]) -> dict[str, Any]:
    """One subject's run as a remote unit (on a Dask worker): the shipped suite recreated in a
    private folder, run by run_on() exactly as here (sandboxed on this machine), the result
    returned as plain data."""
    with tempfile.TemporaryDirectory(prefix="xfmr-shipped-") as folder:
        tests_dir = Path(folder) / "tests"
        work.unpack(payload["tests"], tests_dir)
        r = run_on(
            payload["source"],
            tests_dir,
            payload["module_name"],
            Limits(**payload["limits"]),
            payload["time_limit"],
            tiers.NAMED[payload["tier"]],
            frozenset(payload.get("stop", ())),
        )
    return SubjectRun.to_json(r)


class SuiteBroken(Exception):
    """The suite does not collect (or collects nothing) on impl: nothing to score."""


def _never(call: Any) -> None:
    raise AssertionError("a student's test runs in pytest, not through the engine")


def scored(
    subs: list[Subject], runs: dict[str, SubjectRun], module_name: str, limit: float, wall: float
) -> Score:
    """The suite's Score from each subject's run (mutation_score's, and `xfmr check --suite`'s):
    the cells a run did not give filled in as their cause says, its false alarms set aside."""
    tests = runs["impl"].collected or next((r.collected for r in runs.values() if r.collected), [])
    run = SuiteRun([Test(t, "", _never, limit) for t in tests], subs, wall_seconds=wall)
    for s in subs:
        r = runs[s.name]
        run.subject_seconds[s.name] = r.seconds
        run.worker_starts[s.name] = r.workers
        run.start_seconds[s.name] = r.start_seconds
        decided = is_generated(s) and any(c.outcome.detected for c in r.cells.values())
        for t in tests:
            if t in r.cells:
                run.cells[(t, s.name)] = r.cells[t]
            elif decided:  # a generated mutant's run stops at its first kill
                run.cells[(t, s.name)] = Cell(Outcome.NOT_APPLICABLE, "not run: already killed")
            elif r.error:  # the suite did not even load on this subject: every test fails
                run.cells[(t, s.name)] = Cell(Outcome.KILLED, f"the suite did not run: {r.error}")
            else:
                run.cells[(t, s.name)] = Cell(Outcome.ERROR, "never reported")
    raw = summarize(run)
    false_alarms: dict[str, list[str]] = {}
    for test, subject, outcome, message in raw.false_alarms:
        first = message.strip().splitlines()[-1] if message.strip() else ""
        said = score_report.TEST_WORDS[outcome]  # the student's test failed there, not "killed"
        false_alarms.setdefault(test, []).append(f"{subject}: {said}: {first}"[:300])
    honest = [t for t in tests if t not in false_alarms]
    kill_sets = {m: frozenset(k & set(honest)) for m, k in raw.kill_sets.items()}
    status = {m: mutant_outcome([run.cell(t, m).outcome for t in honest]) for m in kill_sets}
    summary = replace(
        raw,
        kill_sets=kill_sets,
        status=status,
        score=sum(status[m].detected for m in catalog.PITFALLS) / len(catalog.PITFALLS),
        kills_per_test={t: sum(t in kill_sets[m] for m in catalog.PITFALLS) for t in tests},
    )
    invalid = ""
    if not tests:
        invalid = "no test was collected on impl" + (
            f": {runs['impl'].error}" if runs["impl"].error else ""
        )
    elif all(run.cell(t, "impl").outcome is not Outcome.PASSED for t in tests):
        invalid = "every test fails on impl, a correct subject: the suite is invalid"
    errors = {s: r.error for s, r in runs.items() if r.error}
    return Score(tests, run, summary, false_alarms, errors, invalid, module_name)


def configure_mutation_score(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("tests", help="the folder holding the student's pytest suite")
    parser.add_argument("--module", default=MODULE, help=f"the subject's module path ({MODULE})")
    parser.add_argument("--json", metavar="FILE", help="the score as JSON")
    parser.add_argument("--stryker", metavar="FILE", help="mutation-testing-report-schema JSON")
    parser.add_argument("--gradescope", metavar="FILE", help="Gradescope's results.json")
    parser.add_argument(
        "--generated",
        type=int,
        default=GENERATED,
        metavar="N",
        help=f"generated mutants drawn per run, stratified by clause ({GENERATED}; 0: none)",
    )
    parser.add_argument(
        "--generated-visibility",
        choices=score_report.VISIBILITIES,
        default="visible",
        help="Gradescope: who sees the generated sample's result (the course's policy)",
    )
    parser.add_argument(
        "--time-limit",
        type=positive(float),
        default=TEST_TIMEOUT,
        metavar="S",
        help="per test (seconds)",
    )
    add_isolation(parser)
    parser.add_argument(
        "--jobs", type=positive(int), default=None, help="subjects at once (default: CPUs)"
    )
    work.add_scheduler(parser)
    parser.add_argument(
        "--incremental", action="store_true", help="rerun only subjects whose inputs changed"
    )
    parser.add_argument(
        "--cache-dir", metavar="DIR", help=f"the incremental cache (default {default_root()})"
    )


# What the worker's half (harness.isolation.child.student_suite) imports to run a suite: the
# [test] extra, which the README's main install (`pip install -e .`) leaves out.
NEEDS = ("pytest", "hypothesis")
EXTRA = "pip install -e '.[test]'"
_IMPORTS = """
import importlib, json, sys
failed = {}
for name in sys.argv[1:]:
    try:
        importlib.import_module(name)
    except BaseException as e:
        failed[name] = f"{type(e).__name__}: {e}"
print(json.dumps(failed))
"""


def missing_modules(modules: tuple[str, ...] = NEEDS, tier: Tier = tiers.SANDBOX) -> dict[str, str]:
    """Each of `modules` the workers' interpreter cannot import, with why. Asked of that
    interpreter as the workers start it: isolated, the same executable with -I -S and the
    sandbox's import paths (harness.isolation.sandbox); tiers.UNSAFE, this interpreter as the
    fork server runs it. A check that cannot run at all is said as a failure of every module."""
    if not tier.isolated:
        command = [sys.executable, "-c", _IMPORTS]
    else:
        boot = f"import sys; sys.path[:0] = {sandbox.python_paths()!r}\n{_IMPORTS}"
        command = [sandbox.interpreter(), "-I", "-S", "-B", "-c", boot]
    try:
        done = subprocess.run(
            [*command, *modules], capture_output=True, text=True, timeout=120, cwd="/"
        )
        found = json.loads(done.stdout.strip().splitlines()[-1])
        if not isinstance(found, dict):
            raise ValueError(found)
        return {str(k): str(v) for k, v in found.items()}
    except (OSError, subprocess.TimeoutExpired, ValueError, IndexError) as e:
        return {name: f"the import check did not run: {type(e).__name__}: {e}" for name in modules}


def dependency_problem(tier: Tier = tiers.SANDBOX) -> str:
    """Why this install cannot run a student's suite ("" if it can): the grader's own missing
    dependency, said before anything runs, never charged to the suite."""
    missing = missing_modules(NEEDS, tier)
    if not missing:
        return ""
    said = "; ".join(f"{name} ({why})" for name, why in missing.items())
    return (
        f"the grader cannot run a student's suite: its workers' Python ({sys.executable}) "
        f"cannot import {said}. Install the test extra: {EXTRA} (from the project's root; "
        "the main install `pip install -e .` leaves it out). No suite was run."
    )


def run_mutation_score(args: argparse.Namespace) -> int:
    def progress(name: str, r: SubjectRun) -> None:
        print(f"  {name:<11} {len(r.cells)} tests, {r.seconds:5.1f} s", file=sys.stderr)

    if args.generated < 0:
        return usage_error("mutation-score", "--generated must be 0 or more")
    for path in [p for p in (args.json, args.stryker, args.gradescope) if p]:
        if problem := report_path_problem(path):
            return usage_error("mutation-score", f"cannot write a report: {problem}")
    # here or on a LocalCluster the workers are this install's; a remote cluster's are not
    remote = args.scheduler is not None and args.scheduler.address is not None
    if not remote and (problem := dependency_problem(chosen_tier(args))):
        return usage_error("mutation-score", problem)
    if problem := isolation_problem(args):
        return usage_error("mutation-score", problem)
    try:
        executor = executors.executor(args.scheduler, args.jobs)
        try:
            s = mutation_score(
                args.tests,
                args.module,
                Limits(memory_mb=args.memory_mb),
                args.time_limit,
                args.jobs,
                progress,
                chosen_tier(args),
                executor,
                Store(args.cache_dir or default_root()) if args.incremental else None,
                args.generated,
            )
        finally:
            executor.close()
    except (FileNotFoundError, UnsafeInput, work.ClusterProblem, work.TooLarge) as e:
        return usage_error("mutation-score", str(e))
    except SuiteBroken as e:
        return usage_error("mutation-score", f"the suite is broken, no mutant was run: {e}")
    print(score_report.text(s, args.tests))
    if s.reuse:
        print(s.reuse)
    written = write_all(
        "mutation-score",
        [
            (args.json, lambda: score_report.to_json(s)),
            (args.stryker, lambda: score_report.stryker(s, args.tests)),
            (
                args.gradescope,
                lambda: score_report.gradescope(s, args.generated_visibility),
            ),
        ],
    )
    return 2 if not written else 0 if s.passed else 1
