"""`python -m demos.smoke_sweep`: the smoke milestone over correct and faulty subjects and seeds.

The smoke's recipe and bar (demos/own_model.py, `settings(smoke=True)` and SMOKE_BAR) are set from
this sweep: every correct subject must meet the smoke at every seed, every faulty one must fail.
Each subject is written out as a student's transformer.py (its own folder, nothing of the project
imported by it) and each run is `xfmr milestone --submission FILE --smoke --first-seed SEED` in a
process of its own (run_own_milestone, as the student's command calls it), at most --jobs at
once. Seeds are the outer loop, so a sweep cut short holds every subject at its first seeds.

    python -m demos.smoke_sweep --seeds 20 --jobs 2                 # results/demos/smoke_sweep.md
    python -m demos.smoke_sweep --seeds 20 --jobs 2 --reuse         # go on where it stopped
    python -m demos.smoke_sweep --subjects impl,faulty_example --seeds 3
    python -m demos.smoke_sweep --report-only                       # the table of the runs done

The correct subjects: impl (impl/transformer.py), the torch copy (impl/torch_copy.py: the whole
contract, fit and translate included, on torch's own layers), examples/correct_submission.py
and the six bases of the real-world set (tests/harness_tests/realworld/, each a complete correct
contract module with its own fit and translate). The faulty ones: examples/faulty_submission.py
(cross-attention reads source padding), mutant s04 (cross-attention reads the decoder: the model
never sees the sum), mutant s11 (translate keeps eos), a fit that zeroes the gradients after
backward (no update ever moves), and a noam_rate without warmup (post-LN at Noam's peak rate
of update 1, 2.5e-2: it cannot train).
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import resource
import subprocess
import sys
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor, as_completed
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
REALWORLD = ROOT / "tests" / "harness_tests" / "realworld"
REALWORLD_BASES = ("annotated", "fused", "nn_stacks", "functional", "onmt", "fairseq")


def _impl() -> str:
    return (ROOT / "impl" / "transformer.py").read_text()


def _patched(old: str, new: str) -> Callable[[], str]:
    def source() -> str:
        text = _impl()
        if text.count(old) != 1:
            raise RuntimeError(f"the faulty subject's patch no longer matches impl: {old!r}")
        return text.replace(old, new)

    return source


def _mutant(mutant_id: str) -> Callable[[], str]:
    def source() -> str:
        from mutants import catalog

        return catalog.get(mutant_id).apply(_impl())

    return source


def _file(path: Path) -> Callable[[], str]:
    return path.read_text


# impl, the torch copy and the correct example: at every seed of a sweep
MAIN = ("impl", "torch_copy", "correct_example")
# name -> (source, what it is)
CORRECT: dict[str, tuple[Callable[[], str], str]] = {
    "impl": (_impl, "impl/transformer.py"),
    "torch_copy": (_file(ROOT / "impl" / "torch_copy.py"), "impl/torch_copy.py"),
    "correct_example": (
        _file(ROOT / "examples" / "correct_submission.py"),
        "examples/correct_submission.py",
    ),
    **{
        f"realworld_{b}": (_file(REALWORLD / f"{b}.py"), f"tests/harness_tests/realworld/{b}.py")
        for b in REALWORLD_BASES
    },
}
FAULTY: dict[str, tuple[Callable[[], str], str]] = {
    "faulty_example": (
        _file(ROOT / "examples" / "faulty_submission.py"),
        "examples/faulty_submission.py: cross-attention reads source padding",
    ),
    "mutant_s04": (_mutant("s04"), "impl + s04: cross-attention reads the decoder, not the sum"),
    "mutant_s11": (_mutant("s11"), "impl + s11: translate keeps eos"),
    "fit_zero_grad_late": (
        _patched(
            "                optimizer.zero_grad(set_to_none=True)\n"
            "                loss.backward()\n",
            "                loss.backward()\n"
            "                optimizer.zero_grad(set_to_none=True)  # faulty: after backward\n",
        ),
        "impl, fit zeroing the gradients after backward: no update moves",
    ),
    "noam_no_warmup": (
        _patched(
            "return factor * d_model**-0.5 * min(n**-0.5, n * warmup**-1.5)",
            "return factor * d_model**-0.5 * n**-0.5  # faulty: no warmup",
        ),
        "impl, noam_rate without warmup: post-LN at 2.5e-2 from update 1 cannot train",
    ),
}


def run_dir(out: Path, subject: str, seed: int) -> Path:
    return out / "runs" / subject / f"seed{seed}"


def materialize(out: Path, subject: str) -> Path:
    """The subject as a student's transformer.py in a folder of its own."""
    source, _ = {**CORRECT, **FAULTY}[subject]
    path = out / "subjects" / subject / "transformer.py"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(source())
    return path


def run_one(out: Path, subject: str, seed: int, reuse: bool) -> dict[str, Any]:
    """One smoke run in its own process; its record (milestone.json plus the process's wall)."""
    where = run_dir(out, subject, seed)
    record_path = where / "record.json"
    if reuse and record_path.is_file():
        return json.loads(record_path.read_text())
    where.mkdir(parents=True, exist_ok=True)
    submission = out / "subjects" / subject / "transformer.py"
    argv = [sys.executable, "-m", "demos.smoke_sweep", "--one", str(submission), str(seed)]
    argv += ["--results", str(where)]
    t0 = time.perf_counter()
    with open(where / "log.txt", "w") as log:
        done = subprocess.run(argv, stdout=log, stderr=subprocess.STDOUT, cwd=ROOT, check=False)
    wall = time.perf_counter() - t0
    try:
        m = json.loads((where / "milestone.json").read_text())
    except (OSError, ValueError):
        m = {"met": False, "why": [f"no milestone.json: exit {done.returncode}"], "run": {}}
    run = m.get("run") or {}
    demo = (m.get("ln_demo") or {}).get("summary") or {}
    record = {
        "subject": subject,
        "seed": seed,
        "met": bool(m.get("met")),
        "exit": done.returncode,
        "why": m.get("why", []),
        "exact_match": run.get("greedy"),
        "changed_by_padding": run.get("changed_by_padding"),
        "updates": run.get("updates"),
        "stopped": run.get("stopped"),
        "fit_s": run.get("fit_s"),
        "total_s": m.get("total_s"),
        "wall_s": round(wall, 1),
        "post_kept": (demo.get("post-LN, constant rate") or {}).get("mean"),
        "pre_kept": (demo.get("pre-LN, constant rate") or {}).get("mean"),
        "load_before": m.get("load_before"),
        "load_after": m.get("load_after"),
    }
    record_path.write_text(json.dumps(record, indent=1) + "\n")
    return _with_cpu(record, where)


def _with_cpu(record: dict[str, Any], where: Path) -> dict[str, Any]:
    """The record with the run's CPU seconds (cpu.json, written by the run itself)."""
    cpu = where / "cpu.json"
    return record | (json.loads(cpu.read_text()) if cpu.is_file() else {"cpu_s": None})


def one(submission: str, seed: int, results: str) -> int:
    """--one: the student's smoke run itself, as `xfmr milestone --smoke` calls it."""
    from demos.own_model import run_own_milestone
    from demos.runtime import THREADS

    args = argparse.Namespace(
        submission=submission, smoke=True, first_seed=seed, results=results, threads=THREADS
    )
    code = run_own_milestone(args)
    # the CPU the whole run took (torch's import included): what a quiet machine's wall would be
    usage = resource.getrusage(resource.RUSAGE_SELF)
    cpu = {"cpu_s": round(usage.ru_utime + usage.ru_stime, 1)}
    (Path(results) / "cpu.json").write_text(json.dumps(cpu) + "\n")
    return code


def git_commit() -> str:
    try:
        head = subprocess.run(
            ["git", "rev-parse", "--short", "HEAD"],
            capture_output=True,
            text=True,
            check=True,
            cwd=ROOT,
        ).stdout.strip()
        dirty = subprocess.run(
            ["git", "status", "--porcelain", "--", "demos/own_model.py", "demos/train.py", "impl"],
            capture_output=True,
            text=True,
            check=True,
            cwd=ROOT,
        ).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return "unknown (no git)"
    return f"{head} (demos/own_model.py, demos/train.py or impl/ modified)" if dirty else head


def _f(x: float | None, spec: str = ".3f") -> str:
    return "-" if x is None else format(x, spec)


def markdown(records: list[dict[str, Any]], header: dict[str, Any]) -> str:
    """The sweep's table: per subject the minimum, then every run."""
    from demos.own_model import SMOKE_BAR, settings

    s = settings(True)["train"]
    lines = [
        "# The smoke milestone over correct and faulty subjects",
        "",
        f"`xfmr milestone --submission FILE --smoke --first-seed SEED` on each subject (a "
        f"student's transformer.py) at each seed: {s['digits']}-digit reversed addition, at most "
        f"{s['steps']} updates of batch {s['batch']} (Noam warmup {s['warmup']}, factor "
        f"{s['factor']}), stopped once the {s['n_val']} validation sums are solved (checked every "
        f"{s['val_every']} updates), greedy exact match on {s['n_test']} held-out sums against "
        f"the bar {SMOKE_BAR}, the padding check and the LayerNorm demo. A correct subject must "
        "meet it at every seed, a faulty one must fail it.",
        "",
        "## Command",
        "",
        "```",
        header["command"],
        "```",
        "",
        f"- date: {header['date']}; commit {header['commit']}",
        f"- machine: {header['machine']}; load 1/5/15 min {header['load_before']} before, "
        f"{header['load_after']} after; {header['jobs']} runs at once, 1 torch thread each",
        f"- runs: {len(records)} ({header['seeds_done']})",
        "",
        "## Per subject",
        "",
        "| subject | kind | seeds run | met | min exact match | max updates | max CPU (s) | "
        "max wall (s) |",
        "| --- | --- | --- | --- | --- | --- | --- | --- |",
    ]
    by: dict[str, list[dict[str, Any]]] = {}
    for r in records:
        by.setdefault(r["subject"], []).append(r)
    for name in [*CORRECT, *FAULTY]:
        rs = by.get(name)
        if not rs:
            continue
        kind = "correct" if name in CORRECT else "faulty"
        ems = [r["exact_match"] for r in rs if r["exact_match"] is not None]
        upd = [r["updates"] for r in rs if r["updates"] is not None]
        walls = [r["wall_s"] for r in rs]
        cpus = [r["cpu_s"] for r in rs if r.get("cpu_s") is not None]
        lines.append(
            f"| {name} | {kind} | {len(rs)} | {sum(r['met'] for r in rs)}/{len(rs)} | "
            f"{_f(min(ems) if ems else None)} | {max(upd) if upd else '-'} | "
            f"{_f(max(cpus) if cpus else None, '.0f')} | {max(walls):.0f} |"
        )
    lines += ["", "What each subject is:", ""]
    lines += [f"- {n}: {what}" for n, (_, what) in {**CORRECT, **FAULTY}.items() if n in by]
    lines += [
        "",
        "## Every run",
        "",
        "CPU and wall: the whole process (torch's import, training, evaluation, the LayerNorm "
        "demo), one torch thread: on a quiet machine the wall is about the CPU; on a loaded one "
        "the wall is what the load left. The LN columns: the fraction of its first loss post-LN "
        "and pre-LN keep without warmup.",
        "",
        "| subject | seed | met | exact match | padding changed | updates | stopped | fit (s) | "
        "CPU (s) | wall (s) | post-LN kept | pre-LN kept | why not met |",
        "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |",
    ]
    order = {n: i for i, n in enumerate([*CORRECT, *FAULTY])}
    for r in sorted(records, key=lambda r: (order.get(r["subject"], 99), r["seed"])):
        failed = "; ".join(w for w in r["why"] if w.startswith("FAILED"))[:160]
        lines.append(
            f"| {r['subject']} | {r['seed']} | {'yes' if r['met'] else 'no'} | "
            f"{_f(r['exact_match'])} | {_f(r['changed_by_padding'], '.1%')} | "
            f"{r['updates'] if r['updates'] is not None else '-'} | {r['stopped'] or '-'} | "
            f"{r['fit_s'] if r['fit_s'] is not None else '-'} | "
            f"{_f(r.get('cpu_s'), '.0f')} | {r['wall_s']:.0f} | "
            f"{_f(r['post_kept'], '.0%')} | {_f(r['pre_kept'], '.0%')} | "
            f"{failed.replace('|', '/')} |"
        )
    return "\n".join(lines) + "\n"


def configure(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--seeds", type=int, default=20, help="seeds 0 .. N-1 (with --first-seed)")
    parser.add_argument("--first-seed", type=int, default=0)
    parser.add_argument(
        "--other-seeds",
        type=int,
        default=None,
        help="the real-world bases at the first N seeds only (default: --seeds)",
    )
    parser.add_argument(
        "--faulty-seeds",
        type=int,
        default=5,
        help="the faulty subjects at the first N seeds only (they fail whatever the seed)",
    )
    parser.add_argument("--jobs", type=int, default=2, help="runs at once (1 torch thread each)")
    parser.add_argument(
        "--subjects", default="", help="comma-separated names (default: every subject)"
    )
    parser.add_argument("--out", default="smoke_sweep_runs", help="the runs' folder")
    parser.add_argument("--md", default="results/demos/smoke_sweep.md", help="the table")
    parser.add_argument("--reuse", action="store_true", help="keep runs that have a record")
    parser.add_argument("--report-only", action="store_true", help="run nothing: the table")
    parser.add_argument("--one", nargs=2, metavar=("FILE", "SEED"), help=argparse.SUPPRESS)
    parser.add_argument("--results", help=argparse.SUPPRESS)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m demos.smoke_sweep", description=__doc__)
    configure(parser)
    args = parser.parse_args(argv)
    if args.one:
        return one(args.one[0], int(args.one[1]), args.results)
    names = [n for n in args.subjects.split(",") if n] or [*CORRECT, *FAULTY]
    unknown = [n for n in names if n not in CORRECT and n not in FAULTY]
    if unknown:
        parser.error(f"unknown subjects {unknown}; known: {[*CORRECT, *FAULTY]}")
    out = Path(args.out)
    seeds = list(range(args.first_seed, args.first_seed + args.seeds))
    per = {n: len(seeds) if n in MAIN else args.faulty_seeds for n in names}
    per |= {n: args.other_seeds for n in names if n in CORRECT and n not in MAIN}
    jobs = [(n, s) for i, s in enumerate(seeds) for n in names if per[n] is None or i < per[n]]
    started = datetime.datetime.now().astimezone()
    header: dict[str, Any] = {
        "command": " ".join(
            ["python -m demos.smoke_sweep", *(sys.argv[1:] if argv is None else argv)]
        ),
        "date": started.isoformat(timespec="seconds"),
        "commit": git_commit(),
        "machine": f"{platform.machine()}, {os.cpu_count()} cores, {platform.python_version()}",
        "load_before": " / ".join(f"{x:.2f}" for x in os.getloadavg()),
        "jobs": args.jobs,
    }
    records: list[dict[str, Any]] = []
    if args.report_only:
        for n, s in jobs:
            p = run_dir(out, n, s) / "record.json"
            if p.is_file():
                records.append(_with_cpu(json.loads(p.read_text()), p.parent))
        if (out / "header.json").is_file():  # the sweep's own command, date and load
            header |= json.loads((out / "header.json").read_text())
    else:
        (out / "header.json").parent.mkdir(parents=True, exist_ok=True)
        (out / "header.json").write_text(json.dumps(header, indent=1) + "\n")
        for n in names:
            materialize(out, n)
        t0 = time.perf_counter()
        with ThreadPoolExecutor(max_workers=max(1, args.jobs)) as pool:
            futures = {pool.submit(run_one, out, n, s, args.reuse): (n, s) for n, s in jobs}
            for i, f in enumerate(as_completed(futures), 1):
                r = f.result()
                records.append(r)
                print(
                    f"[{i}/{len(jobs)} {time.perf_counter() - t0:.0f} s] {r['subject']} seed "
                    f"{r['seed']}: {'met' if r['met'] else 'NOT met'}, exact match "
                    f"{_f(r['exact_match'])}, {r['updates']} updates, {r['wall_s']:.0f} s",
                    flush=True,
                )
                _write(args.md, records, header, seeds)
    _write(args.md, records, header, seeds)
    bad = [r for r in records if (r["subject"] in CORRECT) != r["met"]]
    for r in bad:
        print(f"WRONG VERDICT: {r['subject']} seed {r['seed']}: {r['why']}", file=sys.stderr)
    print(f"wrote {args.md}: {len(records)} runs, {len(bad)} wrong verdicts")
    return 1 if bad else 0


def _write(md: str, records: list[dict[str, Any]], header: dict[str, Any], seeds: list[int]):
    done = sorted({r["seed"] for r in records})
    header |= {
        "load_after": " / ".join(f"{x:.2f}" for x in os.getloadavg()),
        "seeds_done": f"seeds {done[0]}..{done[-1]} of {len(seeds)} asked; each subject's below"
        if done
        else "none",
    }
    Path(md).parent.mkdir(parents=True, exist_ok=True)
    Path(md).write_text(markdown(records, header))


if __name__ == "__main__":
    sys.exit(main())
