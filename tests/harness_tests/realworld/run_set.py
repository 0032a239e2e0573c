"""Grade the real-world-style set: each base and each single-fault variant of variants.py.

    python tests/harness_tests/realworld/run_set.py                 # bases and every variant
    python tests/harness_tests/realworld/run_set.py fused-loss-sum  # some ids (or base names)
    python tests/harness_tests/realworld/run_set.py --write-observed  # refresh observed_today.json
    # the table:
    python tests/harness_tests/realworld/run_set.py --write-md results/grading/realworld.md
    python tests/harness_tests/realworld/run_set.py --write-examples  # refresh the two examples/
    python tests/harness_tests/realworld/run_set.py --dtype bfloat16 --no-variants  # the bases

Each submission is materialized into a temporary folder and graded by `python -m harness grade
--json` (a sandboxed worker, as for any student). The table shows, per submission, the score,
the failing tests, the contract's expected failing set, whether they match, and the grader's
diagnosis. The helpers are importable; from a test module in tests/harness_tests (pytest's
default "prepend" import mode puts that folder on sys.path):

    from realworld import run_set
    for record in run_set.load_variants():
        summary, verdict = run_set.check_variant(record)  # grade_source + summarize + judge
        assert verdict["match"] and not verdict["diagnosis_missing"], (record["id"], summary)
"""

from __future__ import annotations

import argparse
import copy
import importlib.util
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[2]  # the repository root: `python -m harness` runs there
OBSERVED = HERE / "observed_today.json"
# the examples/ files that are variants, exactly as variant_source gives them
EXAMPLES = {
    "annotated-norm2-eps-default": ROOT / "examples" / "annotated_submission.py",
    "nn_stacks-pe-float32": ROOT / "examples" / "float32_pe_submission.py",
}


def _data_module() -> Any:
    spec = importlib.util.spec_from_file_location("realworld_variants", HERE / "variants.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def load_variants() -> list[dict[str, Any]]:
    """The variant records of variants.py (copies), each with `observed_today` from
    observed_today.json when that file has it (else None)."""
    observed = json.loads(OBSERVED.read_text()) if OBSERVED.exists() else {}
    records = copy.deepcopy(_data_module().VARIANTS)
    for r in records:
        r["observed_today"] = observed.get(r["id"])
    return records


def bases() -> list[str]:
    """The base files' names (each a complete, correct contract module)."""
    return list(_data_module().BASES)


def base_failing(name: str) -> list[str]:
    """The shared tests a base fails by the contract (a clause its style cannot meet)."""
    return list(_data_module().BASE_FAILING.get(name, []))


def base_source(name: str) -> str:
    return (HERE / name).read_text()


def apply_patch(source: str, patch: list[list[str]], label: str = "patch") -> str:
    """source with each [old, new] replaced in order; each old must occur exactly once."""
    for i, (old, new) in enumerate(patch):
        n = source.count(old)
        if n != 1:
            raise ValueError(f"{label}, replacement {i}: {old!r} occurs {n} times, expected once")
        source = source.replace(old, new)
    return source


def variant_source(record: dict[str, Any]) -> str:
    """The variant's full source: its base with its patch applied."""
    return apply_patch(base_source(record["base"]), record["patch"], record["id"])


def grade_file(
    path: Path, tests: list[str] | None = None, extra: list[str] | None = None
) -> dict[str, Any]:
    """`python -m harness grade PATH --json ...` run at the repository root: the JSON report.

    A grader that exits without a report raises RuntimeError with its output."""
    with tempfile.TemporaryDirectory(prefix="realworld-report-") as tmp:
        out = Path(tmp) / "grade.json"
        cmd = [sys.executable, "-m", "harness", "grade", str(path), "--json", str(out)]
        if tests:
            cmd += ["--tests", ",".join(tests)]
        cmd += extra or []
        run = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True)
        if not out.exists():
            raise RuntimeError(
                f"grade of {path} wrote no report (exit {run.returncode}):\n"
                f"{run.stdout[-3000:]}\n{run.stderr[-3000:]}"
            )
        report = json.loads(out.read_text())
    report["exit_status"] = run.returncode
    report["stdout"] = run.stdout
    return report


def grade_source(
    source: str, name: str, tests: list[str] | None = None, extra: list[str] | None = None
) -> dict[str, Any]:
    """Grade `source` as a submission file `name`.py in a temporary folder."""
    with tempfile.TemporaryDirectory(prefix="realworld-") as tmp:
        path = Path(tmp) / f"{name.replace('-', '_')}.py"
        path.write_text(source)
        return grade_file(path, tests, extra)


def _text(value: Any) -> str:
    if isinstance(value, dict):
        return "\n".join(f"{k}: {_text(v)}" for k, v in value.items())
    if isinstance(value, list):
        return "\n".join(_text(v) for v in value)
    return "" if value is None else str(value)


def summarize(report: dict[str, Any]) -> dict[str, Any]:
    """score, max_score, the failing tests (in the report's order), each failing test's message,
    and the diagnosis text: the report's diagnosis and every failing test's message."""
    failing = [t["name"] for t in report["tests"] if t["outcome"] != "passed"]
    messages = {t["name"]: t["message"] for t in report["tests"] if t["outcome"] != "passed"}
    lines: list[str] = []  # every failing test's message, then the report's own diagnosis
    for text in [f"{n}: {m}" for n, m in messages.items()] + [_text(report.get("diagnosis"))]:
        for line in text.splitlines():
            if line.strip() and line.strip() not in (seen.strip() for seen in lines):
                lines.append(line)
    return {
        "score": report["score"],
        "max_score": report["max_score"],
        "failing": failing,
        "messages": messages,
        "diagnosis": "\n".join(lines),
        "seconds": report.get("seconds"),
        "grader_error": report.get("grader_error", ""),
        "rejected": report.get("rejected", ""),
    }


def judge(
    record: dict[str, Any], summary: dict[str, Any], ran: set[str] | None = None
) -> dict[str, Any]:
    """The summary against the record's expectation: missing (expected, passed), over (failed,
    neither expected nor a dependent), dependent (failed dependents), whether the failing set is
    exactly the expected one, the diagnosis entries not found, and the `absent` substrings
    found (a false diagnosis). `ran`: the tests that were run, when only some were (the
    expectation is restricted to them)."""
    expected = record["expected"]
    # what the base itself fails by the contract (BASE_FAILING) its variants fail too
    failed = set(summary["failing"])
    want = set(expected["failing"]) | set(base_failing(record["base"]))
    dependent = set(expected.get("dependent", []))
    if ran is not None:
        want, dependent = want & ran, dependent & ran
    text = summary["diagnosis"].lower()

    def found(entry: str | list[str]) -> bool:
        return any(s.lower() in text for s in ([entry] if isinstance(entry, str) else entry))

    return {
        "match": failed == want,
        "missing": sorted(want - failed),
        "over": sorted(failed - want - dependent),
        "dependent": sorted(failed & dependent),
        "diagnosis_missing": [e for e in expected["diagnosis"] if not found(e)],
        "diagnosis_false": [s for s in expected.get("absent", []) if s.lower() in text],
    }


def check_variant(
    record: dict[str, Any], tests: list[str] | None = None
) -> tuple[dict[str, Any], dict[str, Any]]:
    """Grade one variant (all shared tests, or `tests`): its summary and judge's verdict."""
    summary = summarize(grade_source(variant_source(record), record["id"], tests))
    return summary, judge(record, summary, set(tests) if tests else None)


def _short(names: list[str]) -> str:
    return ",".join(n.removeprefix("test_") for n in names) or "-"


def write_examples() -> list[Path]:
    """Write the examples/ files that are variants (EXAMPLES) from variant_source."""
    by_id = {r["id"]: r for r in load_variants()}
    for vid, path in EXAMPLES.items():
        path.write_text(variant_source(by_id[vid]))
    return list(EXAMPLES.values())


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("ids", nargs="*", help="variant ids or base file names (default: all)")
    p.add_argument("--tests", help="comma-separated shared tests to run (default: all)")
    p.add_argument("--no-bases", action="store_true", help="grade the variants only")
    p.add_argument("--no-variants", action="store_true", help="grade the bases only")
    p.add_argument("--write-observed", action="store_true", help="update observed_today.json")
    p.add_argument("--write-examples", action="store_true", help="rewrite the examples/ files")
    p.add_argument("--json", type=Path, help="write every summary and verdict here")
    p.add_argument("--write-md", type=Path, help="write the table of this run here (markdown)")
    p.add_argument("--dtype", help="grade in this dtype (xfmr grade --dtype)")
    args = p.parse_args(argv)
    extra = ["--dtype", args.dtype] if args.dtype else None
    if args.write_examples:
        for path in write_examples():
            print(f"wrote {path.relative_to(ROOT)}")
        if not args.ids and not args.write_observed:
            return 0
    tests = args.tests.split(",") if args.tests else None
    records = load_variants()
    jobs: list[tuple[str, str, dict[str, Any] | None]] = []
    if not args.no_bases:
        jobs += [(b, base_source(b), None) for b in bases() if not args.ids or b in args.ids]
    chosen = [r for r in records if (not args.ids or r["id"] in args.ids) and not args.no_variants]
    jobs += [(r["id"], variant_source(r), r) for r in chosen]
    results, all_ok = {}, True
    before = json.loads(OBSERVED.read_text()) if OBSERVED.exists() else {}
    begun = time.monotonic()
    for name, source, record in jobs:
        summary = summarize(grade_source(source, Path(name).stem, tests, extra))
        if record is None:
            want = base_failing(name)
            verdict = {"match": summary["failing"] == want, "over": summary["failing"]}
        else:
            verdict = judge(record, summary, set(tests) if tests else None)
            want = [t for t in record["expected"]["failing"] if not tests or t in tests]
        # a fault's charge: no required failure missing, nothing over-charged, the diagnosis
        # right (a documented dependent may fail too, as test_realworld accepts)
        if record is None:
            all_ok &= verdict["match"]
        else:
            all_ok &= not any(
                verdict[k] for k in ("missing", "over", "diagnosis_missing", "diagnosis_false")
            )
        results[name] = {"summary": summary, "verdict": verdict}
        score = f"{summary['score']:g}/{summary['max_score']:g}"
        took = f"{summary['seconds']:.1f} s" if summary["seconds"] is not None else ""
        print(f"{name:32} {score:>8}  failing={_short(summary['failing'])}  ({took})")
        match = "yes" if verdict["match"] else "no"
        print(f"{'':32} {'':8}  expected={_short(want)}  match={match}")
        if record is not None and not verdict["match"]:
            print(
                f"{'':32} {'':8}  missing={_short(verdict['missing'])}  "
                f"over={_short(verdict['over'])}  dependent={_short(verdict['dependent'])}"
            )
        if record is not None:
            bad = verdict["diagnosis_missing"], verdict["diagnosis_false"]
            ok = "yes" if not any(bad) else f"no (not found {bad[0]}, false {bad[1]})"
            print(f"{'':32} {'':8}  diagnosis as expected: {ok}")
        diag = summary["diagnosis"].replace("\n", "\n" + " " * 44)
        print(f"{'':32} {'':8}  diagnosis: {diag or '-'}\n", flush=True)
    if args.write_observed:
        observed = json.loads(OBSERVED.read_text()) if OBSERVED.exists() else {}
        for name, res in results.items():
            s = res["summary"]
            observed[name] = {
                "failing": s["failing"],
                "score": s["score"],
                "max_score": s["max_score"],
                "diagnosis": s["diagnosis"],
            }
        OBSERVED.write_text(json.dumps(observed, indent=1, sort_keys=True) + "\n")
        print(f"wrote {OBSERVED.relative_to(ROOT)}")
    if args.json:
        args.json.write_text(json.dumps(results, indent=1) + "\n")
    if args.write_md:
        command = " ".join(
            ["python tests/harness_tests/realworld/run_set.py", *(argv or sys.argv[1:])]
        )
        minutes = (time.monotonic() - begun) / 60
        args.write_md.write_text(markdown(results, records, before, command, minutes))
        print(f"wrote {args.write_md}")
    return 0 if all_ok else 1


def markdown(
    results: dict[str, Any],
    records: list[dict[str, Any]],
    before: dict[str, Any],
    command: str,
    minutes: float,
) -> str:
    """The run's table with what it was made by: per submission the score, the score
    observed_today.json held before the run, the required failures missing, the tests failed
    that are neither required nor a documented dependent, the dependents that failed, whether
    the diagnosis said what the record expects, and the grade's seconds."""
    by_id = {r["id"]: r for r in records}
    commit = subprocess.run(
        ["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True, text=True
    ).stdout.strip()
    load = os.getloadavg()
    rows, required = [], 0
    missing = over = diagnosed = variants = 0
    for name, res in results.items():
        s, v = res["summary"], res["verdict"]
        was = before.get(name)
        old = f"{was['score']:g}/{was['max_score']:g}" if was else "-"
        seconds = f"{s['seconds']:.1f}" if s["seconds"] is not None else "-"
        score = f"{s['score']:g}/{s['max_score']:g}"
        if name in by_id:
            variants += 1
            required += len(by_id[name]["expected"]["failing"])
            missing += len(v["missing"])
            over += len(v["over"])
            ok = not v["diagnosis_missing"] and not v["diagnosis_false"]
            diagnosed += ok
            dependents = ", ".join(t.removeprefix("test_") for t in v["dependent"]) or "none"
            cells = [len(v["missing"]), len(v["over"]), dependents, "yes" if ok else "no"]
        else:
            over += len(set(v["over"]) - set(base_failing(name)))
            cells = ["-", len(set(v["over"]) - set(base_failing(name))), "none", "-"]
        rows.append(
            f"| {name} | {score} | {old} | " + " | ".join(map(str, cells)) + f" | {seconds} |"
        )
    draw = os.environ.get("XFMR_DRAW_SEED", "a fresh secret")
    head = [
        "# The real-world-style set, graded",
        "",
        f"Made by `{command}` at commit {commit} on {time.strftime('%Y-%m-%d')}, under draw "
        f"{draw} (XFMR_DRAW_SEED), in {minutes:.1f} minutes on this 2-core machine (load average "
        f"{load[0]:.1f} at the end); one grade at a time, each in its own sandbox. "
        "`tests/harness_tests/shared_tests/test_realworld.py` checks the same verdicts in CI.",
        "",
        f"{len(results) - variants} bases and {variants} single-fault variants. Of {required} "
        f"required failures {required - missing} are present; {over} tests fail that are neither "
        f"required nor a documented dependent; {diagnosed} of {variants} diagnoses say what the "
        'record expects. "before" is the score observed_today.json held before this run. '
        + "".join(
            f"{b} fails {', '.join(base_failing(b))} by the contract (variants.BASE_FAILING), "
            "counted in none of the columns. "
            for b in results
            if b not in by_id and base_failing(b)
        ),
        "",
        "| submission | score | before | required missing | over-charged | dependents failed "
        "| diagnosis as expected | seconds |",
        "| --- | --- | --- | --- | --- | --- | --- | --- |",
    ]
    return "\n".join(head + rows) + "\n"


if __name__ == "__main__":
    sys.exit(main())
