"""The forward bound before and after oracle/ kept one rounding model: the hand-written perturbed
forward pass (perturbed_forward.py, the code error_bounds.forward_bounds ran until 2026-12-04,
same seeds, so the same bits) against forward_bounds now (oracle.bounded over the traced forward,
rows folded), over random configurations in every dtype. Both estimate one spread from 32 runs
each, so per value their ratio scatters around 1 (two independent RMS estimates of 32 samples:
about +-20% at one sigma); what must hold is a median near 1 and no systematic drift.

    python tests/oracle_tests/rounding_models.py --configs 40 \
        --write results/oracle/rounding_model.md
"""

from __future__ import annotations

import argparse
import datetime
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[2]
sys.path[:0] = [str(ROOT), str(Path(__file__).parent)]

from perturbed_forward import perturbed_forward_bound  # noqa: E402

from harness.tools.bound_check import draw_case, run_subject  # noqa: E402
from impl import transformer as impl  # noqa: E402
from oracle.error_bounds import forward_bounds  # noqa: E402

DTYPES = ("float64", "float32", "bfloat16", "float16")


def ratios(seed: int, dtype: str) -> np.ndarray:
    """new / old bound over every real logit and traced value of one configuration."""
    case = draw_case(np.random.default_rng(seed), seed, (8, 16, 32))
    params, _, _ = run_subject(impl.Transformer, case, "float32")
    b = case.batch
    args = (params, b["src"], b["tgt_in"], b["src_mask"], b["tgt_mask"], dtype)
    new = forward_bounds(*args)
    old_logits, old_trace = perturbed_forward_bound(*args)
    S = b["src"].shape[1]
    out = []
    for name, n, o in [("logits", new.bound, old_logits)] + [
        (k, new.trace_bound[k], old_trace[k]) for k in old_trace
    ]:
        rows = b["src_mask"] if name.startswith("enc") and n.shape[1] == S else b["tgt_mask"]
        keep = np.broadcast_to(rows[..., None], n.shape) & (o > 0)
        out.append((n / np.where(o > 0, o, 1.0))[keep])
    return np.concatenate(out)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--configs", type=int, default=40)
    parser.add_argument("--write", type=Path)
    args = parser.parse_args()
    started = time.process_time()
    rows = []
    for dtype in DTYPES:
        r = np.concatenate([ratios(seed, dtype) for seed in range(args.configs)])
        q = np.quantile(r, [0.0, 0.05, 0.5, 0.95, 1.0])
        cells = " | ".join(f"{v:.2f}" for v in q)
        rows.append(f"| {dtype} | {args.configs} | {r.size} | {cells} |")
        print(rows[-1], flush=True)
    # the same two estimates if they differed by sampling alone: each value's bound is the RMS of
    # 32 runs, so new / old = sqrt(chi2_32 / chi2'_32) for one normal error per value
    chi = np.random.default_rng(0).chisquare(32, size=(2, 200_000))
    q = np.quantile(np.sqrt(chi[0] / chi[1]), [0.0, 0.05, 0.5, 0.95, 1.0])
    rows.append("| sampling alone (chi2) | | 200000 | " + " | ".join(f"{v:.2f}" for v in q) + " |")
    commit = subprocess.run(
        ["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True, text=True
    ).stdout.strip()
    text = "\n".join(
        [
            "# One rounding model: the forward bound before and after",
            "",
            f"Command: `python {' '.join(sys.argv)}`  ",
            f"Date: {datetime.date.today()}, commit {commit}, "
            f"{time.process_time() - started:.0f} s on the CPU.",
            "",
            (__doc__ or "").split("\n\n")[0].replace("\n", " "),
            "",
            "Per value (every real logit and traced boundary), the ratio new bound / old bound:",
            "",
            "| dtype | configurations | values | min | 5% | median | 95% | max |",
            "| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: |",
            *rows,
            "",
        ]
    )
    if args.write:
        args.write.write_text(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
