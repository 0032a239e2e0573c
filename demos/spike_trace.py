"""Why the old `xfmr train` recipe spiked late: one run traced (results/demos/milestone_spikes.md).

    python -m demos.spike_trace --out runs/spikes/seed0.json                # the old recipe, seed 0
    python -m demos.spike_trace --adam-eps 1e-6 --out runs/spikes/eps.json  # eps 1000x larger

The run is the recipe as it was before issue 25: 1500 updates, no validation split, no early stop
(fit's own training pairs and shuffle, so the losses are those `xfmr train` gave then). After
every update it logs the gradient norm and the norm of the update Adam made; every `--every`
updates the rate, quantiles of Adam's bias-corrected sqrt(v), and teacher-forced exact match on
1000 training pairs the run never reads (the shuffle's tail) and on the held-out test sums. The
optimizer is reached through torch's global step hooks, so impl is run unchanged; `--adam-eps`
and `--no-foreach` change its param groups before the first step (diagnostics only).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

import torch
from torch.optim.optimizer import register_optimizer_step_pre_hook

from demos.train import exact_match, load_split, make_model, teacher_forced


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m demos.spike_trace")
    p.add_argument("--out", required=True, help="JSON file for the trace")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--norm", choices=["post", "pre"], default="post")
    p.add_argument("--steps", type=int, default=1500)
    p.add_argument("--factor", type=float, default=0.4)
    p.add_argument("--every", type=int, default=50, help="updates between the slower measures")
    p.add_argument("--adam-eps", type=float, default=None, help="Adam's eps instead of 1e-9")
    p.add_argument("--no-foreach", action="store_true", help="Adam's per-tensor loop")
    a = p.parse_args(argv)
    torch.set_num_threads(1)
    from impl.transformer import fit

    data, _, _ = load_split(3, 1000, 0, None, a.seed)
    shape = argparse.Namespace(d_model=64, heads=4, d_ff=256, layers=2, dropout=0.0)
    model = make_model(shape, a.norm, a.seed)
    batch = 128
    order = torch.randperm(len(data.train_src), generator=torch.Generator().manual_seed(a.seed))
    unseen = order[a.steps * batch :][:1000]  # fit's shuffle reads these rows after the run
    val = (data.train_src[unseen], data.train_tgt[unseen])

    optimizers: list[torch.optim.Optimizer] = []

    def before_step(optimizer, args, kwargs):
        if not optimizers:
            optimizers.append(optimizer)
            for group in optimizer.param_groups:
                group["eps"] = group["eps"] if a.adam_eps is None else a.adam_eps
                group["foreach"] = group["foreach"] and not a.no_foreach

    hook = register_optimizer_step_pre_hook(before_step)
    params = list(model.parameters())
    previous = [q.detach().clone() for q in params]
    trace: dict[str, Any] = {"args": vars(a), "grad_norm": [], "update_norm": [], "checks": []}

    def callback(step: int, rate: float, loss: float) -> None:
        grad = torch.sqrt(sum((q.grad.double() ** 2).sum() for q in params)).item()
        pairs = list(zip(params, previous, strict=True))
        moved = torch.sqrt(sum(((q.detach() - r).double() ** 2).sum() for q, r in pairs)).item()
        for q, r in pairs:
            r.copy_(q.detach())
        trace["grad_norm"].append(grad)
        trace["update_norm"].append(moved)
        if (step + 1) % a.every:
            return
        state = [optimizers[0].state[q] for q in params]
        t = state[0]["step"].item()
        v = torch.cat([s["exp_avg_sq"].flatten() for s in state]) / (1 - 0.98**t)
        levels = torch.tensor([0.01, 0.1, 0.5, 0.9], dtype=torch.float64)
        quantiles = torch.quantile(v.sqrt().double()[::4], levels).tolist()  # every 4th: speed
        check: dict[str, Any] = {
            "update": step + 1,
            "rate": rate,
            "loss": loss,
            "sqrt_v": quantiles,
        }
        check["val_em"] = teacher_forced(model, *val, 0.1)[0].float().mean().item()
        check["test_em"] = teacher_forced(model, data.test_src, data.test_tgt, 0.1)[0]
        check["test_em"] = check["test_em"].float().mean().item()
        trace["checks"].append(check)
        print(json.dumps(check), file=sys.stderr, flush=True)

    try:
        losses = fit(
            model, data.train_src, data.train_tgt, steps=a.steps, batch=batch, pad_id=data.pad,
            warmup=400, factor=a.factor, smoothing=0.1, seed=a.seed, callback=callback,
        )  # fmt: skip
    finally:
        hook.remove()
    trace["losses"] = losses
    trace["greedy"] = exact_match(model, data.test_src, data.test_tgt, 3, beam=1)
    Path(a.out).parent.mkdir(parents=True, exist_ok=True)
    Path(a.out).write_text(json.dumps(trace) + "\n")
    print(f"greedy exact match {trace['greedy']:.3f}; last loss {losses[-1]:.4f}; wrote {a.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
