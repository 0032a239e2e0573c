"""`xfmr bench-engine`: where the units run and what the incremental cache saves, in one run.

Each measurement runs the real command (`python -m harness ...`) in a child process, timed from
outside, so the figures are what a user waits for, interpreter and cluster start-up included:

1. `xfmr matrix` on the local executor (threads here), on `--scheduler local:1` and `local:2`
   (a Dask LocalCluster, started by the command itself) and on a standing two-worker cluster on
   localhost (`dask scheduler` + two `dask worker` processes, started once beforehand, its
   start-up reported apart);
2. `xfmr grade-batch` of SUBMISSIONS copies of the examples (correct and faulty alternating) on
   the local executor, `local:2` and the standing cluster;
3. the overhead per cell of each executor against the local one: (its wall - local wall) / cells;
4. `xfmr matrix --incremental` in a fresh cache (every cell runs and is stored), then again after
   a one-line change to one mutant's patch (its row runs, the rest is reused), with the warm fork
   server that --incremental keeps (harness.isolation.warm) and with --warm-idle 0 (a fork server
   of the run's own), against the full local run's wall time; the medians of --repeat runs.

Needs the [dist] extra. Prints a Markdown report; --out also writes it.
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

from harness.shared_tests.laws import SHARED_TESTS

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"
LEARNING = "test_learns_reversed_addition"
# The one-line changes, each a mutant's replacement line rewritten with the same meaning: s11's
# is in the beam search, which one test reaches; s07's in the loss, which training reaches (a
# learning run that passes); s04's in the decoder layer, which every test that runs the decoder
# reaches (a learning run of all 600 updates, as it never learns). The cache reruns the cells
# whose key changed, less the cells that impl's coverage shows cannot reach the change
# (harness.engine.coverage).
EDITS = {
    "s11": ("return list(best)  # mutant s11: eos kept", "return [*best]  # mutant s11: eos kept"),
    "s07": ("return per_target.mean()", "return per_target.sum() / per_target.numel()"),
    "s04": ("self._ca_block(y, y, self_mask))", "self._ca_block(y, y, mask=self_mask))"),
}
PARTS = ("executors", "overhead", "incremental")
QUICK = "test_hand_example_noam"  # milliseconds a cell: a matrix of it is all overhead
TARGET = 0.15  # the bar: an incremental run after a one-line change <= 15% of a full run


def _parts(text: str) -> tuple[str, ...]:
    parts = tuple(text.split(","))
    if not parts or not set(parts) <= set(PARTS):
        raise argparse.ArgumentTypeError(f"--parts takes names of {PARTS}, got {text!r}")
    return parts


def configure_bench_engine(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--submissions", type=int, default=20, help="grade-batch's batch size")
    parser.add_argument(
        "--with-learning",
        action="store_true",
        help=f"grade with {LEARNING} too (20 s a submission; left out by default)",
    )
    parser.add_argument("--only", metavar="NAMES", help="matrix subjects (default: all)")
    parser.add_argument("--out", metavar="FILE", help="also write the report here")
    parser.add_argument(
        "--repeat",
        type=int,
        default=3,
        metavar="N",
        help="incremental part: runs of each figure, taken in turn (default 3)",
    )
    parser.add_argument(
        "--parts",
        type=_parts,
        default=PARTS,
        metavar="NAMES",
        help=f"comma-separated, of {','.join(PARTS)} (default: all)",
    )


@dataclass
class Timed:
    label: str
    wall: float  # the command's, from outside
    engine: float | None  # the run's own wall line, where it prints one
    status: int
    output: str


def timed(label: str, argv: list[str], env: dict[str, str] | None = None) -> Timed:
    print(f"  running: {label}", file=sys.stderr, flush=True)
    begun = time.monotonic()
    done = subprocess.run(
        argv, capture_output=True, text=True, env={**os.environ, **(env or {})}, timeout=3600
    )
    wall = time.monotonic() - begun
    found = re.search(r"^wall ([0-9.]+) s", done.stdout, re.M)
    if done.returncode not in (0, 1):
        raise RuntimeError(f"{label} failed ({done.returncode}):\n{done.stderr[-3000:]}")
    engine = float(found.group(1)) if found else None
    return Timed(label, wall, engine, done.returncode, done.stdout + done.stderr)


def xfmr(*args: str) -> list[str]:
    return [sys.executable, "-m", "harness", *args]


def edited_matrix(mutant_id: str, argv: list[str]) -> int:
    """`xfmr matrix ARGV` with EDITS[mutant_id] applied to the mutant catalog (a one-line
    change)."""
    import dataclasses

    from harness.cli import main
    from mutants import catalog
    from mutants.patch import Patch

    old, new = EDITS[mutant_id]
    m = catalog.get(mutant_id)
    patches = tuple(Patch(p.old, p.new.replace(old, new)) for p in m.patches)
    if patches == m.patches:
        raise SystemExit(f"the edit no longer applies to {mutant_id}'s patch")
    catalog._BY_ID[mutant_id] = dataclasses.replace(m, patches=patches)
    return main(["matrix", *argv])


def load() -> str:
    return " ".join(Path("/proc/loadavg").read_text().split()[:3])


def run_bench_engine(args: argparse.Namespace) -> int:
    report = [
        "# Engine benchmark: local threads vs Dask, and the incremental cache",
        "",
        f"Command: `{_command(args)}`",
        f"Machine: {os.cpu_count()} CPUs; load average before: {load()}",
        "",
    ]
    matrix = ["matrix", "--quiet", *(["--only", args.only] if args.only else [])]
    with tempfile.TemporaryDirectory(prefix="xfmr-bench-") as tmp:
        if "executors" in args.parts:
            _executors(args, matrix, Path(tmp), report)
        if "overhead" in args.parts:
            report += _overhead(matrix)
        if "incremental" in args.parts:
            report += _incremental(matrix, Path(tmp), args.repeat)
    report += ["", f"Load average after: {load()}"]
    text = "\n".join(report) + "\n"
    print(text)
    if args.out:
        Path(args.out).write_text(text)
    return 0


def _executors(args: argparse.Namespace, matrix: list[str], tmp: Path, report: list[str]) -> Timed:
    """The matrix and grade-batch on every executor; the report's tables. The local matrix run."""
    from harness.engine.cluster import localhost_cluster  # needs the [dist] extra

    tests = [t for t in SHARED_TESTS if args.with_learning or t.name != LEARNING]
    folder = tmp / "submissions"
    folder.mkdir()
    for i in range(args.submissions):
        kind = ("correct", "faulty")[i % 2]
        shutil.copyfile(EXAMPLES / f"{kind}_submission.py", folder / f"s{i:03d}_{kind}.py")
    begun = time.monotonic()
    with localhost_cluster(workers=2) as address:
        cluster_start = time.monotonic() - begun
        runs = [
            timed("matrix, local (threads, --jobs CPUs)", xfmr(*matrix)),
            timed("matrix, --scheduler local:1", xfmr(*matrix, "--scheduler", "local:1")),
            timed("matrix, --scheduler local:2", xfmr(*matrix, "--scheduler", "local:2")),
            timed("matrix, localhost cluster", xfmr(*matrix, "--scheduler", address)),
        ]
        batch = ["grade-batch", str(folder), "--tests", ",".join(t.name for t in tests)]
        grades = [
            timed(f"grade-batch, {label}", xfmr(*batch, "--out", f"{tmp}/g{i}", *where))
            for i, (label, where) in enumerate(
                [
                    ("local", []),
                    ("--scheduler local:2", ["--scheduler", "local:2"]),
                    ("localhost cluster", ["--scheduler", address]),
                ]
            )
        ]
    n_subjects = _subjects(runs[0].output)
    cells = len(SHARED_TESTS) * n_subjects
    grade_cells = args.submissions * len(tests)
    report += [
        f"Two-worker localhost cluster (`dask scheduler` + 2 x `dask worker --nthreads 1`): "
        f"started in {cluster_start:.1f} s, once, before the runs below.",
        "",
        f"## Matrix: {len(SHARED_TESTS)} tests x {n_subjects} subjects = {cells} cells",
        "",
        *_table(runs, cells),
        "",
        f"## grade-batch: {args.submissions} submissions x {len(tests)} tests = {grade_cells} "
        f"cells{'' if args.with_learning else f' ({LEARNING} left out)'}",
        "",
        *_table(grades, grade_cells),
        "",
    ]
    return runs[0]


def _overhead(matrix: list[str]) -> list[str]:
    """The matrix of the quickest test only: each unit is a worker start and milliseconds of
    work, so the differences between executors are their own costs per unit."""
    from harness.engine.cluster import localhost_cluster  # needs the [dist] extra

    quick = [*matrix, "--tests", QUICK]
    with localhost_cluster(workers=2) as address:
        runs = [
            timed(f"{QUICK} only, {label}", xfmr(*quick, *where))
            for label, where in [
                ("local", []),
                ("--scheduler local:2", ["--scheduler", "local:2"]),
                ("localhost cluster", ["--scheduler", address]),
            ]
        ]
    units = _subjects(runs[0].output)
    return [
        f"## Overhead: {QUICK} alone on {units} subjects ({units} units, milliseconds of work)",
        "",
        *_table(runs, units),
        "",
        "(per cell here = per unit: one row of one cell)",
        "",
    ]


def _incremental(matrix: list[str], tmp: Path, repeat: int) -> list[str]:
    """The full local matrix (and with --run-every-cell), then matrix --incremental: in an empty
    cache, and after each of EDITS from that cache, with the warm fork server (the default,
    harness.isolation.warm) and with --warm-idle 0 (a fork server of the run's own). Each figure
    is the median of `repeat` runs, taken in turn so that the machine's drift spreads over all."""
    runtime = tmp / "runtime"  # the bench's own warm server, stopped at the end
    runtime.mkdir(mode=0o700)
    env = {"XFMR_RUNTIME_DIR": str(runtime)}
    base = tmp / "cache-base"
    first = timed(
        "matrix --incremental, empty cache (starts the warm fork server)",
        xfmr(*matrix, "--incremental", "--cache-dir", str(base)),
        env,
    )
    code = (
        "import sys; from harness.tools.bench_engine import edited_matrix; "
        "sys.exit(edited_matrix(sys.argv[1], sys.argv[2:]))"
    )
    variants = {"warm fork server": [], "--warm-idle 0": ["--warm-idle", "0"]}
    full: list[Timed] = []
    every: list[Timed] = []
    edits: dict[tuple[str, str], list[Timed]] = {}
    for i in range(repeat):
        full.append(timed("matrix, local (threads, --jobs CPUs)", xfmr(*matrix)))
        every.append(timed("matrix --run-every-cell", xfmr(*matrix, "--run-every-cell")))
        for mutant in EDITS:
            for variant, extra in variants.items():
                cache = tmp / f"cache-{mutant}-{i}-{len(extra)}"
                shutil.copytree(base, cache)  # the cache as it was before the edit
                argv = [*matrix[1:], "--incremental", "--cache-dir", str(cache), *extra]
                label = f"after a one-line change to {mutant}'s patch, {variant}"
                run = timed(label, [sys.executable, "-c", code, mutant, *argv], env)
                edits.setdefault((mutant, variant), []).append(run)
                shutil.rmtree(cache)
    subprocess.run(xfmr("warm-server", "stop"), env={**os.environ, **env}, capture_output=True)
    full_wall = median([t.wall for t in full])
    lines = [
        f"Full local matrix (`xfmr matrix`, a fork server of its own): {_spread(full)}.",
        "",
        f"The same with --run-every-cell (no cell inferred from impl's coverage): "
        f"{_spread(every)}.",
        "",
        "## Incremental matrix",
        "",
        f"Each figure: the median of {repeat} runs (their range in brackets); the share is of the "
        "full local run's median.",
        "",
        "| run | wall (s) | cells reused | cells inferred | cells run | of the full local run |",
        "|---|---|---|---|---|---|",
    ]
    for label, runs in [(first.label, [first]), *((t[0].label, t) for t in edits.values())]:
        reused, total, inferred, ran = _reuse(runs[0].output)
        share = median([t.wall for t in runs]) / full_wall
        lines.append(
            f"| {label} | {_spread(runs)} | {reused} of {total} | {inferred} | {ran} | "
            f"{share:.1%} |"
        )
    lines.append("")
    for (mutant, variant), runs in edits.items():
        ratio = median([t.wall for t in runs]) / full_wall
        verdict = "meets" if ratio <= TARGET else "misses"
        lines.append(
            f"- {mutant}, {variant}: {ratio:.1%} of the full local run's wall time ({verdict} the "
            f"target of {TARGET:.0%})."
        )
    return lines


def median(values: list[float]) -> float:
    ordered = sorted(values)
    mid = len(ordered) // 2
    return ordered[mid] if len(ordered) % 2 else (ordered[mid - 1] + ordered[mid]) / 2


def _spread(runs: list[Timed]) -> str:
    walls = [t.wall for t in runs]
    if len(walls) == 1:
        return f"{walls[0]:.1f} s"
    return f"{median(walls):.1f} s [{min(walls):.1f}-{max(walls):.1f}]"


def _command(args: argparse.Namespace) -> str:
    words = ["xfmr", "bench-engine", "--submissions", str(args.submissions)]
    words += ["--only", args.only] if args.only else []
    words += ["--with-learning"] if args.with_learning else []
    words += ["--parts", ",".join(args.parts)] if args.parts != PARTS else []
    words += ["--repeat", str(args.repeat)] if args.repeat != 3 else []
    return " ".join(words + (["--out", args.out] if args.out else []))


def _table(runs: list[Timed], cells: int) -> list[str]:
    local = runs[0].wall
    rows = [
        "| executor | wall (s) | engine wall (s) | vs local | overhead per cell (ms) |",
        "|---|---|---|---|---|",
    ]
    for t in runs:
        engine = f"{t.engine:.1f}" if t.engine is not None else "-"
        overhead = 1000 * (t.wall - local) / cells
        rows.append(
            f"| {t.label} | {t.wall:.1f} | {engine} | {t.wall / local:.2f}x | {overhead:+.0f} |"
        )
    return rows


def _subjects(output: str) -> int:
    found = re.search(r"Kill-rate matrix: \d+ shared tests x (\d+) subjects", output)
    if not found:
        raise RuntimeError(f"no matrix header in:\n{output[-2000:]}")
    return int(found.group(1))


def _reuse(output: str) -> tuple[int, int, int, int]:
    """(reused, total, inferred, run) from the incremental line."""
    found = re.search(
        r"incremental: (\d+) of (\d+) cells reused(?:, (\d+) inferred[^,]*)?, (\d+) run", output
    )
    if not found:
        raise RuntimeError(f"no incremental line in:\n{output[-2000:]}")
    reused, total, inferred, ran = found.groups()
    return int(reused), int(total), int(inferred or 0), int(ran)


if __name__ == "__main__":
    parser = argparse.ArgumentParser(prog="python -m harness.tools.bench_engine")
    configure_bench_engine(parser)
    sys.exit(run_bench_engine(parser.parse_args()))
