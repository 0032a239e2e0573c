"""Is coverage inference sound on mutants it was not built around? A standing measure.

`python -m harness.tools.coverage_check [--sample N] [--seed S]` writes
results/mutants/coverage_check.json and results/mutants/coverage_check.md.

harness.engine.coverage infers a mutant's cell from impl's when impl's traced run of the test calls
none of the functions the mutant changes. This tool tries that claim on generic first-order mutants
of impl (harness.tools.generic_mutants: Cosmic Ray's operators and more, a sample stratified by
operator), which nobody wrote with the inference in mind: impl's row runs once, traced; for each
sampled mutant, every cell the matrix would infer is run instead, and its outcome must be impl's
(passed). A disagreement is a cell the matrix would get wrong; the tool exits 1 on any.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections import Counter
from pathlib import Path
from typing import Any

from harness.engine.coverage import BASELINE, changed_functions, inferred_cell, shape
from harness.engine.run import Launch, run_subject, run_test
from harness.isolation.forkserver import forked
from harness.isolation.worker import SubjectRaised, WorkerDied, WorkerTimeout
from harness.shared_tests.laws import SHARED_TESTS
from harness.subjects import Kind, Subject, module_source
from harness.tools.generic_mutants import SOURCE_PATH, TARGET, generate, sample

RESULTS = Path(__file__).resolve().parents[2] / "results" / "mutants"


def check(n: int, seed: int) -> dict[str, Any]:
    path, source = module_source(TARGET)
    tests = list(SHARED_TESTS)
    started = time.monotonic()
    base, _ = run_subject(
        Subject(BASELINE, Kind.CORRECT, module=TARGET), tests, lambda t, c: None, trace=True
    )
    base_seconds = time.monotonic() - started
    base_shape = shape(source)
    mutants = sample(generate(source), n, seed)
    records = []
    for m in mutants:
        mutated = m.apply(source)
        changed = changed_functions(base_shape, mutated)
        record: dict[str, Any] = {
            "key": m.id,
            "operator": m.mutator,
            "changed": None if changed is None else sorted(changed),
            "inferable": [],
            "disagree": {},
        }
        if changed is not None:
            record["inferable"] = [
                t.name for t in tests if inferred_cell(base[t.name], changed, m.id) is not None
            ]
        launch = Launch(forked, {"source": mutated, "filename": f"{SOURCE_PATH} [{m.id}]"})
        t0 = time.monotonic()
        worker = None
        try:
            for test in (t for t in tests if t.name in record["inferable"]):
                if worker is None:
                    try:
                        worker = launch.worker()
                    except (SubjectRaised, WorkerDied, WorkerTimeout) as e:
                        record["disagree"][test.name] = f"(load) {e}"[:300]
                        break
                cell = run_test(test, worker)
                if cell.outcome is not base[test.name].outcome:
                    record["disagree"][test.name] = f"{cell.outcome.value}: {cell.message[:300]}"
                if cell.outcome.value in ("timeout", "error"):
                    worker.close()
                    worker = None
        finally:
            if worker is not None:
                worker.close()
        record["seconds"] = round(time.monotonic() - t0, 2)
        records.append(record)
        print(
            f"{m.id}: {len(record['inferable'])} inferable cells run, "
            f"{len(record['disagree'])} disagree",
            file=sys.stderr,
            flush=True,
        )
    cells = sum(len(r["inferable"]) for r in records)
    return {
        "command": f"python -m harness.tools.coverage_check --sample {n} --seed {seed}",
        "generated": len(generate(source)),
        "sampled": len(records),
        "skeleton_changes": sum(r["changed"] is None for r in records),
        "inferable_cells": cells,
        "of_cells": len(records) * len(tests),
        "disagreements": sum(len(r["disagree"]) for r in records),
        "by_operator": dict(Counter(r["operator"] for r in records)),
        "impl_traced_row_s": round(base_seconds, 1),
        "seconds": round(time.monotonic() - started, 1),
        "mutants": records,
    }


def report(data: dict[str, Any]) -> str:
    lines = [
        "# Coverage inference, checked on generic mutants",
        "",
        f"Command: `{data['command']}` (harness/tools/coverage_check.py).",
        "",
        f"- generic first-order mutants of impl: {data['generated']}; sampled (stratified by "
        f"operator): {data['sampled']}",
        f"- of those, changed outside function bodies (never inferred, run everywhere): "
        f"{data['skeleton_changes']}",
        f"- cells the matrix would infer from impl's coverage: {data['inferable_cells']} of "
        f"{data['of_cells']}; each was run here instead",
        f"- cells whose run disagrees with impl's outcome: **{data['disagreements']}**",
        f"- impl's traced row: {data['impl_traced_row_s']} s; the whole check: {data['seconds']} s",
        "",
    ]
    bad = [r for r in data["mutants"] if r["disagree"]]
    if bad:
        lines += ["## Disagreements", ""]
        for r in bad:
            for test, why in r["disagree"].items():
                lines.append(f"- `{r['key']}` on {test}: {why}")
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sample", type=int, default=60, help="generic mutants to check")
    parser.add_argument("--seed", type=int, default=0, help="the sample's seed")
    parser.add_argument("--out", type=Path, default=RESULTS / "coverage_check.json")
    args = parser.parse_args(argv)
    data = check(args.sample, args.seed)
    args.out.write_text(json.dumps(data, indent=2) + "\n")
    args.out.with_suffix(".md").write_text(report(data))
    print(report(data))
    return 1 if data["disagreements"] else 0


if __name__ == "__main__":
    sys.exit(main())
