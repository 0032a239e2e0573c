"""`xfmr detection`: the smallest fault of each classic kind that the derived bound still catches.

For each fault kind and each dtype (float64, float32, bfloat16, float16), impl runs with the
fault at decreasing sizes on a few random configurations; a size is detected when some real
logit of the faulty subject lies outside the oracle's bound for an honest subject in that
dtype (oracle/roundoff.py). The table gives, per kind and dtype, the smallest size detected
on every configuration (and on at least one). Nothing is hard-coded: rerun to reproduce.

    xfmr detection --write results/grading/detection.md

The kinds:
- ln-eps: every LayerNorm's eps is eps * (1 - delta) instead of the config's 1e-5 (delta 0.9 is
  1e-5 -> 1e-6); size: delta.
- pe-float32: the positional table computed in float32 arithmetic (angles and sin/cos), then
  cast to the model's dtype (a float32 buffer in a float64 model); size: the sequence length
  (the angle's rounding grows with the position), smaller is a smaller fault.
- attn-scale: scores scaled by (1 + eps) / sqrt(d_k); size: eps.
- mask-one-key: one padding key of the source (the last position of a padded row) is masked
  by a finite penalty -b instead of -inf in every encoder and cross-attention (b = 0: the
  mask is missing); size: its attention weight's factor exp(-b), smaller is a smaller fault.
"""

from __future__ import annotations

import argparse
import datetime
import math
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import torch

from harness.shared_tests.inputs import batch
from harness.tools.bound_check import ROOT, TORCH_DTYPES, Case, draw_case, run_subject
from impl import transformer as impl
from oracle.error_bounds import forward_bounds

Patch = Callable[[torch.nn.Module], None]
CASES = 4  # configurations per (kind, dtype, size)
LENGTH = 12  # source and target length of the batches (pe-float32 sets its own)


def _ln_eps(delta: float) -> Patch:
    def patch(model: torch.nn.Module) -> None:
        for m in model.modules():
            if isinstance(m, torch.nn.LayerNorm):
                m.eps = m.eps * (1 - delta)

    return patch


def _float32_pe(start: int, length: int, d_model: int, dtype: Any, device: Any) -> torch.Tensor:
    """impl's table, but computed in float32 arithmetic and only then cast."""
    p = torch.arange(start, start + length, dtype=torch.float32, device=device)[:, None]
    feature = torch.arange(d_model, device=device)
    two_i = (feature - feature % 2).to(torch.float32)
    angle = p / 10000.0 ** (two_i / d_model)
    return torch.where(feature % 2 == 0, torch.sin(angle), torch.cos(angle)).to(dtype)


def _pe_float32(_length: float) -> Patch:
    def patch(model: Any) -> None:  # impl's Transformer: its cfg and _embed
        def embed(ids: torch.Tensor, table: torch.Tensor, start: int = 0) -> torch.Tensor:
            x = torch.nn.functional.embedding(ids, table) * math.sqrt(model.cfg.d_model)
            return x + _float32_pe(start, ids.size(1), model.cfg.d_model, x.dtype, x.device)

        model._embed = embed

    return patch


def _attend(scale: float, penalty: float | None) -> Callable[..., torch.Tensor]:
    """impl's MultiHeadAttention.attend with the scores scaled by `scale` / sqrt(d_k), and,
    when `penalty` is set, the last key of a one-row (source) mask penalized by it, not -inf."""

    def attend(self: Any, query: torch.Tensor, k: Any, v: Any, mask: Any) -> torch.Tensor:
        B, T, C = query.shape
        q = self._split_heads(self.q_proj(query))
        scores = q @ k.transpose(-2, -1) / (math.sqrt(self.d_k) / scale)
        if mask is not None:
            masked = scores.masked_fill(~mask, float("-inf"))
            if penalty is not None and mask.shape[-2] == 1:
                last = torch.zeros_like(mask)
                last[..., -1] = True
                masked = torch.where(~mask & last, scores - penalty, masked)
            scores = masked
        heads = torch.softmax(scores, dim=-1) @ v
        return self.out_proj(heads.transpose(1, 2).reshape(B, T, C))

    return attend


def _on_attention(attend: Callable[..., torch.Tensor]) -> Patch:
    def patch(model: torch.nn.Module) -> None:
        for m in model.modules():
            if isinstance(m, impl.MultiHeadAttention):
                m.attend = attend.__get__(m)  # type: ignore[method-assign]

    return patch


# kind -> (the fault at a size, the sizes from largest to smallest, how a size is written)
KINDS: dict[str, tuple[Callable[[float], Patch], list[float], str]] = {
    "ln-eps": (_ln_eps, [0.9, 0.5, 0.2, 0.1, 0.05, 0.02, 0.01, 3e-3, 1e-3, 3e-4, 1e-4], "delta"),
    "pe-float32": (_pe_float32, [256, 128, 64, 32, 16, 8, 4, 2], "length"),
    "attn-scale": (
        lambda eps: _on_attention(_attend(1 + eps, None)),
        [1e-1, 1e-2, 3e-3, 1e-3, 3e-4, 1e-4, 3e-5, 1e-5, 3e-6, 1e-6, 1e-7, 1e-8, 1e-9],
        "eps",
    ),
    "mask-one-key": (
        lambda leak: _on_attention(_attend(1.0, -math.log(leak))),
        [1.0, 1e-2, 1e-4, 1e-6, 1e-8, 1e-10, 1e-12, 1e-14, 1e-16, 1e-20],
        "exp(-b)",
    ),
}


def cases(kind: str, size: float, seed: int) -> list[Case]:
    """CASES random configurations (d 16-32, ln_eps 1e-5) with batches whose second source row
    is padded; pe-float32's batches are `size` long."""
    rng = np.random.default_rng(seed)
    out = []
    for i in range(CASES):
        case = draw_case(rng, seed * 1000 + i, (16, 32))
        case.cfg["ln_eps"] = 1e-5
        length = int(size) if kind == "pe-float32" else LENGTH
        case.cfg["max_len"] = max(case.cfg["max_len"], length)
        lens = [length, max(1, length - 3)]
        out.append(Case(case.cfg, case.seed, batch(rng, case.cfg, lens, lens)))
    return out


def detected(case: Case, dtype: str, patch: Patch, bounds: dict) -> bool:
    """Some real logit of the faulty subject lies outside the honest subject's bound."""
    params, logits, _ = run_subject(impl.Transformer, case, dtype, patch=patch)
    key = (case.seed, str(case.batch["src"].shape), dtype)
    if key not in bounds:
        b = case.batch
        bounds[key] = forward_bounds(
            params, b["src"], b["tgt_in"], b["src_mask"], b["tgt_mask"], dtype
        )
    fb = bounds[key]
    keep = np.broadcast_to(case.batch["tgt_mask"][..., None], fb.logits.shape)
    return bool(np.any(((np.abs(logits - fb.logits) > fb.bound) | ~np.isfinite(logits))[keep]))


def configure_detection(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--seed", type=int, default=0, help="the configurations' seed")
    parser.add_argument("--kinds", default=",".join(KINDS), help="comma-separated fault kinds")
    parser.add_argument("--write", type=Path, help="write the markdown table here")


def run_detection(args: argparse.Namespace) -> int:
    torch.set_num_threads(1)
    start = time.time()
    bounds: dict = {}
    rows = []
    for kind in args.kinds.split(","):
        if kind not in KINDS:
            print(f"xfmr detection: unknown fault kind {kind!r} (one of {', '.join(KINDS)})")
            return 2
        fault, sizes, unit = KINDS[kind]
        for dtype in TORCH_DTYPES:
            every = any_ = None
            streak = True  # 'on every configuration' holds at every larger size too
            for size in sizes:
                hits = [
                    detected(c, dtype, fault(size), bounds) for c in cases(kind, size, args.seed)
                ]
                streak = streak and all(hits)
                if streak:
                    every = size
                if any(hits):
                    any_ = size
            rows.append((kind, unit, dtype, every, any_, sizes[-1]))
            print(
                f"{kind} {dtype}: every {every} any {any_} ({time.time() - start:.0f}s)", flush=True
            )
    text = _report(rows, time.time() - start)
    print(text)
    if args.write:
        args.write.write_text(text)
    return 0


def _report(rows: list, secs: float) -> str:
    commit = subprocess.run(
        ["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True, text=True
    ).stdout.strip()
    argv = sys.argv[2:] if sys.argv[1:2] == ["detection"] else sys.argv[1:]
    lines = [
        "# Smallest faults the derived bound detects",
        "",
        f"Command: `{' '.join(['xfmr detection', *argv])}`  ",
        f"Date: {datetime.date.today()}, commit {commit or 'unknown'}, {secs:.0f} s on the CPU.",
        "",
        "impl with one fault, in each dtype, on "
        f"{CASES} random configurations (d 16-32, 1-2 layers, both norms, ln_eps 1e-5, "
        f"batches of length {LENGTH} with a padded row); detected = some real logit outside the "
        "bound of an honest subject in that dtype (harness/tools/detection.py says each kind).",
        "",
        "| fault | size | dtype | smallest detected on every configuration | on at least one "
        "| smallest tried |",
        "| --- | --- | --- | ---: | ---: | ---: |",
    ]
    for kind, unit, dtype, every, any_, last in rows:
        lines.append(f"| {kind} | {unit} | {dtype} | {_fmt(every)} | {_fmt(any_)} | {last:g} |")
    return "\n".join(lines) + "\n"


def _fmt(size: float | None) -> str:
    return "not detected" if size is None else f"{size:g}"
