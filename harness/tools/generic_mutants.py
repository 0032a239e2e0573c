"""Generic first-order mutants of impl through the shared tests: a standing measure of the suite.

`python -m harness.tools.generic_mutants [--sample N] [--seed S] [--jobs J]` writes
results/mutants/generic_mutants.json and results/mutants/generic_mutants.md;
`python -m harness.tools.generic_mutants --catalog` rewrites mutants/generated_catalog.json (the
killed ones, each with its killers, operator and clause: mutants.generated_catalog) from it.

The mutants come from mutants.generated (Cosmic Ray's operator set over impl's AST, plus
statement deletion, constants, argument and API-pair swaps; each one exact-text patch of the
catalog's Mutant type).

Each mutant runs in a trusted worker forked from the fork server (no sandbox: generated from
impl, trusted code), through the shared tests of harness.shared_tests.laws with the engine's
run_test, in the registry's order, stopping at the first test that kills it (killed or timeout,
as the matrix counts); the learning test runs last, so only mutants that survive everything else
pay for it. Survivors are triaged in results/mutants/generic_mutants_triage.json (by mutant
key): either equivalent, with the reason, or a gap, named; the score counts killed mutants
against all that are not equivalent.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

from harness.engine.run import Launch, run_test
from harness.isolation.forkserver import forked
from harness.isolation.worker import SubjectRaised, WorkerDied, WorkerTimeout
from harness.outcomes import Outcome
from harness.shared_tests.laws import SHARED_TESTS
from harness.shared_tests.record import Test
from harness.subjects import module_source
from mutants import generated_catalog
from mutants.generated import (  # noqa: F401 (the generator, re-exported for its callers)
    API_PAIRS,
    HAND,
    SOURCE_PATH,
    TARGET,
    generate,
    hand_mutants,
    sample,
)
from mutants.patch import Mutant

ROOT = Path(__file__).resolve().parents[2]
RESULTS = ROOT / "results" / "mutants"
TRIAGE = RESULTS / "generic_mutants_triage.json"

# the registry's order (the hand examples and the golden test, which kill most, come first); the
# learning test, by far the dearest, last
_LAST = ("test_learns_reversed_addition",)


def test_order(tests: tuple[Test, ...]) -> list[Test]:
    return [t for t in tests if t.name not in _LAST] + [t for t in tests if t.name in _LAST]


def run_mutant(m: Mutant, source: str, tests: list[Test], every: bool = False) -> dict[str, Any]:
    """The mutant through the tests until one kills it (every: through all of them): its status,
    the first killing test and (every) all of them."""
    launch = Launch(forked, {"source": m.apply(source), "filename": f"{SOURCE_PATH} [{m.id}]"})
    start = time.monotonic()
    worker = None
    result: dict[str, Any] = {"status": "survived", "killed_by": None, "message": ""}
    killers: dict[str, str] = {}
    try:
        for test in tests:
            if worker is None:
                try:
                    worker = launch.worker()
                except (SubjectRaised, WorkerDied, WorkerTimeout) as e:
                    result = {"status": "killed", "killed_by": "(load)", "message": str(e)[:300]}
                    break
            cell = run_test(test, worker)
            if cell.outcome.detected:
                killers[test.name] = cell.message[:300]
                if result["killed_by"] is None:
                    status = "killed" if cell.outcome is Outcome.KILLED else "timeout"
                    result = {
                        "status": status,
                        "killed_by": test.name,
                        "message": killers[test.name],
                    }
                if not every:
                    break
            if cell.outcome is Outcome.ERROR:
                worker.close()
                worker = None
    finally:
        if worker is not None:
            worker.close()
    result["seconds"] = round(time.monotonic() - start, 2)
    if every:
        result["killers"] = killers
    return result


def describe(m: Mutant, source: str) -> dict[str, Any]:
    """A run's record of a mutant before it runs: its key, operator, scope, and what it changes
    where in the source of this run (the line is the run's, never part of the key)."""
    original, replacement = m.change()
    (patch,) = m.patches
    at = source.index(patch.old) + len(os.path.commonprefix([patch.old, patch.new]))
    return {
        "key": m.id,
        "operator": m.mutator,
        "line": source.count("\n", 0, at) + 1,
        "original": original,
        "replacement": replacement,
        "function": m.function,
    }


def report(data: dict[str, Any]) -> str:
    """The Markdown summary of a run."""
    t = data["totals"]
    lines = [
        "# Generic mutants of impl through the shared tests",
        "",
        f"Command: `{data['command']}`",
        f"Run: {data['date']}, {data['wall_s']:.0f} s wall, {data['jobs']} workers; "
        f"load average before: {data['load_before']}.",
        *[
            f"Rerun after tests changed: `{r['command']}` ({r['date']})."
            for r in data.get("reruns", [])
        ],
        "",
        f"- generated: {t['generated']} first-order mutants of `{SOURCE_PATH}` (after dropping "
        "those that do not compile and duplicates)",
        f"- run: {t['run']} ({data['sampling']})",
        f"- killed: {t['killed']} (timeouts counted as killed: {t['timeout']})",
        f"- survived: {t['survived']}: equivalent {t['equivalent']}, gaps {t['gaps']}, "
        f"untriaged {t['untriaged']}",
        f"- score against non-equivalent mutants: {t['killed']}/{t['run'] - t['equivalent']} = "
        f"{t['score']:.2%}",
        "",
        "## Per operator",
        "",
        "| operator | run | killed | survived |",
        "| --- | --- | --- | --- |",
    ]
    for op, c in sorted(data["per_operator"].items()):
        lines.append(f"| {op} | {c['run']} | {c.get('killed', 0)} | {c.get('survived', 0)} |")
    lines += ["", "## Killing tests", "", "| test | mutants killed first |", "| --- | --- |"]
    for test, n in sorted(data["first_killers"].items(), key=lambda kv: -kv[1]):
        lines.append(f"| {test} | {n} |")
    lines += ["", "## Survivors, triaged", "", "| mutant | change | verdict | why |"]
    lines.append("| --- | --- | --- | --- |")
    for m in data["mutants"]:
        if m["status"] != "survived":
            continue
        tri = m.get("triage") or {"verdict": "untriaged", "reason": ""}
        change = f"`{m['original'][:60]}` -> `{m['replacement'][:60]}`".replace("|", "\\|")
        reason = tri["reason"].replace("|", "\\|")
        lines.append(
            f"| {m['operator']} line {m['line']} | {change} | {tri['verdict']} | {reason} |"
        )
    return "\n".join(lines) + "\n"


def summarize(records: list[dict[str, Any]], triage: dict[str, Any]) -> dict[str, Any]:
    per_op: dict[str, Counter] = {}
    killers: Counter = Counter()
    for r in records:
        c = per_op.setdefault(r["operator"], Counter())
        c["run"] += 1
        c["killed" if r["status"] != "survived" else "survived"] += 1
        if r["status"] != "survived":
            killers[r["killed_by"]] += 1
        if r["status"] == "survived" and r["key"] in triage:
            r["triage"] = triage[r["key"]]
    survivors = [r for r in records if r["status"] == "survived"]
    equivalent = sum(r.get("triage", {}).get("verdict") == "equivalent" for r in survivors)
    gaps = sum(r.get("triage", {}).get("verdict") == "gap" for r in survivors)
    killed = len(records) - len(survivors)
    denominator = len(records) - equivalent
    return {
        "totals": {
            "run": len(records),
            "killed": killed,
            "timeout": sum(r["status"] == "timeout" for r in records),
            "survived": len(survivors),
            "equivalent": equivalent,
            "gaps": gaps,
            "untriaged": len(survivors) - equivalent - gaps,
            "score": killed / denominator if denominator else 1.0,
        },
        "per_operator": {op: dict(c) for op, c in per_op.items()},
        "first_killers": dict(killers),
    }


def write_catalog(source: str, run: Path, out: Path = generated_catalog.PATH) -> int:
    """The catalog of the run's killed mutants (mutants.generated_catalog.build), written."""
    try:
        committed = generated_catalog.PATH
        order = (
            tuple(r["id"] for r in json.loads(committed.read_text())["mutants"])
            if committed.exists()
            else ()
        )
        data = generated_catalog.build(generate(source), json.loads(run.read_text()), order)
    except ValueError as e:
        print(f"generic_mutants --catalog: {e}", file=sys.stderr)
        return 1
    out.write_text(json.dumps(data, indent=1) + "\n")
    clauses = Counter(m["clause"] for m in data["mutants"])
    print(f"{len(data['mutants'])} mutants in {out.name}: " + ", ".join(
        f"{c} {n}" for c, n in sorted(clauses.items())))  # fmt: skip
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sample", type=int, default=None, help="run a stratified sample of N")
    parser.add_argument("--seed", type=int, default=0, help="the sample's seed")
    parser.add_argument("--jobs", type=int, default=2, help="mutants at once")
    parser.add_argument(
        "--only",
        metavar="KEYS",
        help="comma-separated mutant keys, or @FILE of one a line (a rerun)",
    )
    parser.add_argument("--list", action="store_true", help="print the mutants; run nothing")
    parser.add_argument(
        "--every-test", action="store_true", help="run every test on each mutant (all killers)"
    )
    parser.add_argument("--out", type=Path, default=RESULTS / "generic_mutants.json")
    parser.add_argument(
        "--retriage", action="store_true", help="re-read the triage file into --out; run nothing"
    )
    parser.add_argument(
        "--catalog",
        action="store_true",
        help=f"rewrite {generated_catalog.PATH.relative_to(ROOT)} from --out's killed mutants",
    )
    args = parser.parse_args(argv)
    _, source = module_source(TARGET)
    if args.catalog:
        return write_catalog(source, args.out)
    triage = json.loads(TRIAGE.read_text()) if TRIAGE.exists() else {}
    if args.retriage:
        data = json.loads(args.out.read_text())
        for r in data["mutants"]:
            r.pop("triage", None)
        data.update(summarize(data["mutants"], triage))
        data["totals"]["generated"] = data["generated"]
        args.out.write_text(json.dumps(data, indent=1) + "\n")
        args.out.with_suffix(".md").write_text(report(data))
        print(report(data).split("## Per operator")[0])
        return 0
    mutants = generate(source)
    chosen = sample(mutants, args.sample, args.seed)
    if args.only:
        if args.only.startswith("@"):  # a file of keys, one a line (keys may hold commas)
            keys = set(Path(args.only[1:]).read_text().splitlines()) - {""}
        else:
            keys = set(args.only.split(","))
        chosen = [m for m in mutants + hand_mutants(source) if m.id in keys]
        missing = keys - {m.id for m in chosen}
        if missing:
            print(f"no such mutants: {sorted(missing)}", file=sys.stderr)
            return 2
    if args.list:
        for m in chosen + hand_mutants(source):
            print(f"{m.id}\t{m.change()[0]!r}")
        print(
            f"{len(chosen)} of {len(mutants)} mutants (and {len(HAND)} hand-made)", file=sys.stderr
        )
        return 0
    tests = test_order(SHARED_TESTS)
    load_before = " ".join(Path("/proc/loadavg").read_text().split()[:3])
    started = time.monotonic()
    records: list[dict[str, Any]] = []

    def one(m: Mutant) -> dict[str, Any]:
        r = describe(m, source)
        r.update(run_mutant(m, source, tests, every=args.every_test))
        print(f"{r['status']:<8} {r['seconds']:6.1f} s  {m.id}  {r['killed_by']}", flush=True)
        return r

    with ThreadPoolExecutor(max_workers=args.jobs) as pool:
        records = list(pool.map(one, chosen))
    if args.only and args.out.exists():
        # a rerun of some mutants (after a test changed): their records replace the earlier ones
        data = json.loads(args.out.read_text())
        fresh = {r["key"]: r for r in records}
        data["mutants"] = [fresh.pop(r["key"], r) for r in data["mutants"]] + list(fresh.values())
        for r in data["mutants"]:
            r.pop("triage", None)
        command = "python -m harness.tools.generic_mutants " + " ".join(
            argv if argv is not None else sys.argv[1:]
        )
        data.setdefault("reruns", []).append(
            {"command": command, "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())}
        )
        data.update(summarize(data["mutants"], triage))
        data["totals"]["generated"] = data["generated"]
        args.out.write_text(json.dumps(data, indent=1) + "\n")
        args.out.with_suffix(".md").write_text(report(data))
        print(report(data).split("## Per operator")[0])
        return 0
    data = {
        "command": "python -m harness.tools.generic_mutants "
        + " ".join(argv if argv is not None else sys.argv[1:]),
        "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
        "wall_s": time.monotonic() - started,
        "jobs": args.jobs,
        "load_before": load_before,
        "generated": len(mutants),
        "sampling": (
            "the mutants --only names"
            if args.only
            else f"a stratified sample of {args.sample} by operator, seed {args.seed}"
            if args.sample is not None and args.sample < len(mutants)
            else "every generated mutant"
        ),
        "tests": [t.name for t in tests],
        "mutants": records,
    }
    data.update(summarize(records, triage))
    data["totals"]["generated"] = len(mutants)
    args.out.write_text(json.dumps(data, indent=1) + "\n")
    args.out.with_suffix(".md").write_text(report(data))
    print(report(data).split("## Per operator")[0])
    return 0


if __name__ == "__main__":
    sys.exit(main())
