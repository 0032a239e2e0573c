"""`xfmr smoke`: impl in float64 against the oracle, both norms, on small padded batches.

A quick health check of a fresh install: prints the largest logit difference at real target
positions for each norm placement and fails when one exceeds the tolerance.
"""

from __future__ import annotations

import argparse

import numpy as np
import torch

import oracle
from impl import transformer as impl

# Two float64 computations of the same small model differ by rounding only (~1e-14).
DEFAULT_TOL = 1e-12


def configure_smoke(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--seed", type=int, default=0, help="weights and batch seed")
    parser.add_argument("--tol", type=float, default=DEFAULT_TOL, help="max abs logit error")


def _batch(cfg: impl.TransformerConfig, g: torch.Generator, B: int = 4, S: int = 9, T: int = 7):
    """Random ids with a padded tail in half the source and target rows."""
    src = torch.randint(0, cfg.src_vocab, (B, S), generator=g)
    tgt = torch.randint(0, cfg.tgt_vocab, (B, T), generator=g)
    src_mask = torch.ones(B, S, dtype=torch.bool)
    tgt_mask = torch.ones(B, T, dtype=torch.bool)
    src_mask[1::2, S // 2 :] = False
    tgt_mask[::2, T // 2 :] = False
    return src, tgt, src_mask, tgt_mask


def run_smoke(args: argparse.Namespace) -> int:
    worst = 0.0
    for norm in ("post", "pre"):
        torch.manual_seed(args.seed)
        cfg = impl.TransformerConfig(
            src_vocab=17, tgt_vocab=19, d_model=32, n_heads=4, d_ff=64, n_enc=2, n_dec=2, norm=norm
        )
        model = impl.Transformer(cfg).double().eval()
        src, tgt, src_mask, tgt_mask = _batch(cfg, torch.Generator().manual_seed(args.seed))
        with torch.no_grad():
            expected = model(src, tgt, src_mask, tgt_mask).numpy()
        got = oracle.forward(oracle.read_state_dict(model), src, tgt, src_mask, tgt_mask)
        err = float(np.abs(got - expected)[tgt_mask.numpy()].max())
        worst = max(worst, err)
        print(f"{norm}-LN: max |oracle - impl float64| logit error = {err:.3e}")
    ok = worst <= args.tol
    print(f"{'ok' if ok else 'FAIL'}: worst {worst:.3e} {'<=' if ok else '>'} {args.tol:.0e}")
    return 0 if ok else 1
