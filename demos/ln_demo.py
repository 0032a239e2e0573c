"""`xfmr ln-demo`: post-LN stalls at a constant rate without warmup where pre-LN trains.

The seed's experiment (section 2.2; Xiong et al. 2020): a 6 + 6 layer model on three-digit reversed
addition, Adam at a constant 3e-3 from the first update, 150 updates. The measure is the fraction of
the first loss a run keeps: the mean loss of its last `--tail` updates over its loss at update 0
(the seed reports about 91% post-LN, 54% pre-LN). Then the same post-LN model under the Noam
schedule, warmed up to the same peak rate, shows that the warmup is what rescues it.
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
import sys
import time
from pathlib import Path
from typing import Any

from demos.args import (
    add_model_args,
    model_args_error,
    nonnegative_int,
    positive_float,
    positive_int,
)
from demos.progress import Progress
from demos.runtime import add_runtime_args, machine_load, torch_threads
from demos.train import make_model
from tasks import addition

# Width 64 keeps the 6 + 6 layers at about 0.6 M parameters: nine runs of 150 updates take a few
# minutes on 2 CPU cores.
LN_DEFAULTS = {"d_model": 64, "n_heads": 4, "d_ff": 256, "layers": 6, "dropout": 0.1}


def configure_ln_demo(parser: argparse.ArgumentParser) -> None:
    parser.formatter_class = argparse.ArgumentDefaultsHelpFormatter
    parser.add_argument("--out", default="ln_demo", help="folder for ln_demo.png and .json")
    parser.add_argument(
        "--seeds", type=positive_int, default=3, help="seeds per setting, from --first-seed on"
    )
    parser.add_argument("--steps", type=positive_int, default=150, help="updates per run")
    parser.add_argument("--lr", type=positive_float, default=3e-3, help="the constant rate")
    parser.add_argument(
        "--warmup",
        type=positive_int,
        default=50,
        help="Noam warmup of the rescue run (its peak rate equals --lr)",
    )
    parser.add_argument("--batch", type=positive_int, default=64, help="batch size")
    parser.add_argument("--digits", type=positive_int, default=3, help="operand digits n")
    parser.add_argument(
        "--tail", type=positive_int, default=10, help="final updates averaged for the kept loss"
    )
    parser.add_argument("--first-seed", type=nonnegative_int, default=0, help="lowest seed")
    add_runtime_args(parser)
    add_model_args(parser, LN_DEFAULTS)


def kept_fraction(losses: list[float], tail: int) -> float:
    """Mean loss of the last `tail` updates over the loss of update 0."""
    return statistics.fmean(losses[-tail:]) / losses[0]


def run_ln_demo(args: argparse.Namespace) -> int:
    if error := model_args_error(args):
        print(f"xfmr ln-demo: error: {error}", file=sys.stderr)
        return 2
    if args.tail > args.steps:
        print(
            f"xfmr ln-demo: error: --tail {args.tail} exceeds --steps {args.steps}", file=sys.stderr
        )
        return 2
    with torch_threads(args.threads):
        return ln_demo(args)


def settings_of(args: argparse.Namespace) -> tuple[dict[str, tuple[str, float | None]], float]:
    """The demo's three settings (norm, constant rate or None for Noam) and the Noam factor that
    puts the warmup's peak, at n = warmup, at the constant rate."""
    factor = args.lr * math.sqrt(args.d_model) * math.sqrt(args.warmup)
    return {
        "post-LN, constant rate": ("post", args.lr),
        "pre-LN, constant rate": ("pre", args.lr),
        f"post-LN, Noam warmup {args.warmup}": ("post", None),
    }, factor


def curves_of(args: argparse.Namespace, module: Any = None) -> dict[str, list[list[float]]]:
    """Every setting's loss curve for each seed: impl's model and fit, or `module`'s (a
    student's transformer.py: its Transformer, fit and with them its noam_rate and optimizer)."""
    if module is None:
        from impl import transformer as module
    data = addition.load(args.digits, n_test=1, seed=0)
    src, tgt = data.train_src.to(args.device), data.train_tgt.to(args.device)
    settings, factor = settings_of(args)
    seeds = range(args.first_seed, args.first_seed + args.seeds)
    curves: dict[str, list[list[float]]] = {name: [] for name in settings}
    for seed in seeds:
        for name, (norm, lr) in settings.items():
            model = make_model(args, norm, seed, module).to(args.device)
            losses = module.fit(
                model,
                src,
                tgt,
                steps=args.steps,
                batch=args.batch,
                pad_id=data.pad,
                warmup=args.warmup,
                factor=factor,
                lr=lr,
                seed=seed,
                callback=Progress(args.steps, label=f"seed {seed} {name:<26} "),
            )
            curves[name].append([float(x) for x in losses])
    return curves


def summary_of(curves: dict[str, list[list[float]]], tail: int) -> dict[str, dict[str, Any]]:
    """Each setting's kept fraction per seed, its mean and spread."""
    out = {}
    for name, runs in curves.items():
        kept = [kept_fraction(r, tail) for r in runs]
        spread = statistics.stdev(kept) if len(kept) > 1 else 0.0
        out[name] = {"kept": kept, "mean": statistics.fmean(kept), "stdev": spread}
    return out


def ln_demo(args: argparse.Namespace) -> int:
    """Post-LN and pre-LN at a constant rate, then post-LN warmed up, over several seeds."""
    _, factor = settings_of(args)
    seeds = range(args.first_seed, args.first_seed + args.seeds)
    t0 = time.perf_counter()
    load_before = machine_load()
    curves = curves_of(args)
    wall_s = time.perf_counter() - t0

    summary = summary_of(curves, args.tail)
    print(
        f"\nfraction of the first loss kept after {args.steps} updates "
        f"(mean of the last {args.tail} over update 0), seeds {list(seeds)}:"
    )
    for name, said in summary.items():
        kept = said["kept"]
        per_seed = " ".join(f"{k:.3f}" for k in kept)
        print(
            f"  {name:<28} {said['mean']:6.1%} +- {said['stdev']:.1%}  "
            f"(min {min(kept):.1%}, max {max(kept):.1%}; per seed {per_seed})"
        )
    print(
        f"{len(curves) * args.seeds} runs in {wall_s:.0f} s, load {load_before} -> "
        f"{machine_load()}; the seed reports about 91% post-LN and 54% pre-LN"
    )
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    record = {
        "args": vars(args),
        "noam_factor": factor,
        "wall_s": round(wall_s, 1),
        "load_before": load_before,
        "load_after": machine_load(),
        "summary": summary,
        "losses": curves,
    }
    (out / "ln_demo.json").write_text(json.dumps(record, indent=1) + "\n")
    try:
        from demos import plots

        png = plots.loss_curves(
            curves,
            out / "ln_demo.png",
            f"{args.layers}+{args.layers} layers, d={args.d_model}, Adam {args.lr:g}, "
            f"{args.seeds} seeds",
        )
        print(f"wrote {out / 'ln_demo.json'} and {png}")
    except RuntimeError as err:
        print(f"wrote {out / 'ln_demo.json'}; no PNG: {err}", file=sys.stderr)
    return 0
