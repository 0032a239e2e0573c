"""`xfmr bound-check`: honest implementations never leave the oracle's derived error bound.

Runs impl, the torch copy, impl with torch's fused attention (F.scaled_dot_product_attention) and
the real-world styles (tests/harness_tests/realworld/, where present) in float32, bfloat16 and
float16 on the CPU over random configurations, weights and padded batches, and records the worst
|subject - oracle| / bound over every real logit (and, for subjects with the contract's module
names, every traced boundary at real positions) per dtype. Any ratio >= 1 is a false alarm.
--dtypes float64 checks the default grading dtype; --grads adds the label-smoothed loss and
every parameter's gradient of the subjects with the contract's names (oracle.bounded).

    xfmr bound-check --configs 120 --write results/oracle/bound_false_alarms.md

The pieces (`draw_case`, `run_subject`, `SUBJECTS`) are the Hypothesis test's too
(tests/oracle_tests/test_error_bounds.py).
"""

from __future__ import annotations

import argparse
import datetime
import importlib.util
import math
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F

import oracle
from harness.shared_tests.inputs import batch, config, draw_weights
from harness.shared_tests.verdicts import readable
from impl import torch_copy
from impl import transformer as impl
from oracle.error_bounds import forward_bounds
from oracle.model import embed

ROOT = Path(__file__).resolve().parents[2]
REALWORLD = ROOT / "tests" / "harness_tests" / "realworld"
REALWORLD_BASES = ("annotated", "fused", "nn_stacks", "functional", "onmt", "fairseq")
DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}
TORCH_DTYPES = {"float64": torch.float64, **DTYPES}


@dataclass(frozen=True)
class Case:
    """One configuration with its weights (under the contract's names) and padded batch."""

    cfg: dict[str, Any]
    seed: int
    batch: dict[str, np.ndarray]


def draw_case(
    rng: np.random.Generator, seed: int, widths: tuple[int, ...] = (8, 16, 32, 64)
) -> Case:
    """A random small config (both norms, every tying, 1-2 layers, d from `widths`, h 1-4), and
    a batch of 1-3 rows with random padding."""
    d = int(rng.choice(widths))
    h = int(rng.choice([h for h in (1, 2, 4) if d % h == 0]))
    tie = str(rng.choice(["all", "tgt_out", "none"]))
    src_vocab = int(rng.integers(6, 40))
    tgt_vocab = src_vocab if tie == "all" else int(rng.integers(6, 40))
    if tie == "tgt_out" and tgt_vocab == src_vocab:
        tgt_vocab += 1
    cfg = config(
        src_vocab=src_vocab,
        tgt_vocab=tgt_vocab,
        d_model=d,
        n_heads=h,
        d_ff=int(rng.choice([d, 2 * d, 4 * d])),
        n_enc=int(rng.integers(1, 3)),
        n_dec=int(rng.integers(1, 3)),
        norm=str(rng.choice(["post", "pre"])),
        tie_embeddings=tie != "none",
        ln_eps=float(rng.choice([1e-5, 1e-6, 1e-3])),
        dropout=0.0,
    )
    rows = int(rng.integers(1, 4))
    src_lens = [int(n) for n in rng.integers(1, 12, rows)]
    tgt_lens = [int(n) for n in rng.integers(1, 10, rows)]
    return Case(cfg, seed, batch(rng, cfg, src_lens, tgt_lens))


# --- the subjects: contract modules built in a dtype, weights pushed by their own names ---------


def _sdpa_attend(self: Any, query: torch.Tensor, k: Any, v: Any, mask: Any) -> torch.Tensor:
    """impl's MultiHeadAttention.attend through torch's fused scaled_dot_product_attention."""
    B, T, C = query.shape
    q = self._split_heads(self.q_proj(query))
    heads = F.scaled_dot_product_attention(q, k, v, attn_mask=mask)
    return self.out_proj(heads.transpose(1, 2).reshape(B, T, C))


def _impl_sdpa(cfg: dict) -> torch.nn.Module:
    model = impl.Transformer(cfg)
    for m in model.modules():
        if isinstance(m, impl.MultiHeadAttention):
            m.attend = _sdpa_attend.__get__(m)  # type: ignore[method-assign]
    return model


def _realworld(name: str) -> Callable[[dict], torch.nn.Module] | None:
    path = REALWORLD / f"{name}.py"
    if not path.exists():
        return None
    spec = importlib.util.spec_from_file_location(f"realworld_{name}", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)

    def build(cfg: dict) -> torch.nn.Module:
        fields = module.TransformerConfig.__dataclass_fields__
        return module.Transformer(module.TransformerConfig(**{k: cfg[k] for k in fields}))

    return build


def subjects(realworld: bool = True) -> dict[str, Callable[[dict], torch.nn.Module]]:
    """name -> a builder of the subject's model from a contract config."""
    found: dict[str, Callable[[dict], torch.nn.Module]] = {
        "impl": impl.Transformer,
        "torch_copy": torch_copy.Transformer,
        "impl+sdpa": _impl_sdpa,
    }
    for name in REALWORLD_BASES if realworld else ():
        build = _realworld(name)
        if build is not None:
            found[f"realworld/{name}"] = build
    return found


def run_subject(
    build: Callable[[dict], torch.nn.Module],
    case: Case,
    dtype: str,
    trace: bool = False,
    patch: Callable[[torch.nn.Module], None] | None = None,
) -> tuple[Any, np.ndarray, dict[str, np.ndarray]]:
    """(the oracle's Params of the weights pushed, the subject's logits in `dtype` as float64,
    the outputs of its modules named like the oracle's trace, when `trace`); `patch` changes the
    model (a fault) after it is built."""
    torch.manual_seed(case.seed)
    model = build(case.cfg).eval()
    if patch is not None:
        patch(model)
    state = model.state_dict()
    shapes = {k: list(v.shape) for k, v in state.items()}
    first: dict[int, str] = {}
    aliases = {k: first.setdefault(v.data_ptr(), k) for k, v in state.items()}
    weights = draw_weights(shapes, case.cfg, case.seed, aliases)
    model.load_state_dict({k: torch.tensor(v) for k, v in weights.items()})
    params, _ = readable(weights, case.cfg)
    model.to(TORCH_DTYPES[dtype])
    seen: dict[str, np.ndarray] = {}
    if trace:
        for name, module in model.named_modules():
            if name and (name.split(".")[0] in ("encoder", "decoder", "enc_norm", "dec_norm")):

                def hook(_m: Any, _i: Any, out: Any, name: str = name) -> None:
                    if isinstance(out, torch.Tensor):
                        seen[name] = out.double().numpy()

                module.register_forward_hook(hook)
            if name in X0_INPUTS:  # x0, the first layer's input: where a sum of two terms cancels

                def pre_hook(_m: Any, args: Any, name: str = name) -> None:
                    if args and isinstance(args[0], torch.Tensor):
                        seen[X0_INPUTS[name]] = args[0].double().numpy()

                module.register_forward_pre_hook(pre_hook)
    b = case.batch
    with torch.no_grad():
        logits = model(*(torch.tensor(b[k]) for k in ("src", "tgt_in", "src_mask", "tgt_mask")))
    return params, logits.double().numpy(), seen


# Subjects whose parameters carry the contract's names, so that their gradients are compared
# name by name with the oracle's (the real-world styles fuse and rename theirs).
GRADIENT_SUBJECTS = ("impl", "torch_copy", "impl+sdpa")


def run_gradients(
    build: Callable[[dict], torch.nn.Module], case: Case, dtype: str, cfg: dict | None = None
) -> tuple[Any, float, dict[str, np.ndarray]]:
    """(the oracle's Params of the weights pushed, the subject's label-smoothed loss (eps 0.1,
    impl's loss function) and its gradient by parameter name, computed in `dtype`), the model
    built from `cfg` (the case's, unless a fault's) in training mode without dropout."""
    params, _, _ = run_subject(build, case, dtype)
    torch.manual_seed(case.seed)
    model = build(cfg or case.cfg).eval()
    state = model.state_dict()
    state.update({k: torch.tensor(v) for k, v in params.arrays.items() if k in state})
    model.load_state_dict(state)
    model.to(TORCH_DTYPES[dtype])
    b = case.batch
    inputs = (torch.tensor(b[k]) for k in ("src", "tgt_in", "src_mask", "tgt_mask"))
    loss = impl.label_smoothed_loss(model(*inputs), torch.tensor(b["tgt_out"]), 0.1, 0)
    loss.backward()
    grads = {
        name: p.grad.double().numpy() for name, p in model.named_parameters() if p.grad is not None
    }
    return params, float(loss.detach()), grads


def oracle_gradients(params: Any, case: Case) -> tuple:
    """oracle.logits_loss_and_grads on the case's batch (eps 0.1, pad 0)."""
    b = case.batch
    args = (b["src"], b["tgt_in"], b["tgt_out"], b["src_mask"], b["tgt_mask"], 0.1, 0)
    return oracle.logits_loss_and_grads(params, *args)


def gradient_ratios(
    case: Case, params: Any, loss: float, grads: dict[str, np.ndarray], dtype: str
) -> dict[str, float]:
    """The worst |subject - oracle| / bound of the loss ('loss') and of each parameter's
    gradient ('grad of NAME'), the bounds by oracle.bounded (32 runs of the forward and
    backward passes under the dtype's roundings)."""
    (_, want_loss, want), (_, loss_bound, bound) = oracle.bounded(
        oracle_gradients, params, case, dtype=dtype
    )
    out = {"loss": abs(loss - want_loss) / loss_bound if loss != want_loss else 0.0}
    for name in sorted(set(grads) & set(want)):
        err = np.abs(grads[name] - want[name])
        r = np.where(err > 0, err / np.where(bound[name] > 0, bound[name], math.inf), 0.0)
        out[f"grad of {name}"] = float(np.where(np.isfinite(grads[name]), r, math.inf).max())
    return out


# x0 = E[ids] sqrt(d) + PE as the first layer of each stack receives it, traced under these names
X0_INPUTS = {"encoder.0": "x0 (source)", "decoder.0": "x0 (target)"}


def ratios(case: Case, params: Any, logits: np.ndarray, seen: dict, dtype: str) -> dict[str, float]:
    """The worst |subject - oracle| / bound over the real logits ('logits'), over each traced
    boundary the subject exposes at real positions and over x0 of each stack (oracle.bounded on
    the oracle's embed, where the subject's first layers take it as their first argument)."""
    b = case.batch
    fb = forward_bounds(params, b["src"], b["tgt_in"], b["src_mask"], b["tgt_mask"], dtype)
    out = {"logits": _worst(logits, fb.logits, fb.bound, b["tgt_mask"])}
    for name, table, ids, rows in (
        ("x0 (source)", params.src_table, b["src"], b["src_mask"]),
        ("x0 (target)", params.tgt_table, b["tgt_in"], b["tgt_mask"]),
    ):
        want, bound = oracle.bounded(embed, params, table, ids, dtype=dtype, rows=True)
        if name in seen and seen[name].shape == want.shape:
            out[name] = _worst(seen[name], want, bound, rows)
    S = b["src"].shape[1]
    for name, value in fb.trace.items():
        if name in seen and seen[name].shape == value.shape:
            rows = (
                b["src_mask"] if name.startswith("enc") and value.shape[1] == S else b["tgt_mask"]
            )
            out[name] = _worst(seen[name], value, fb.trace_bound[name], rows)
    return out


def _worst(got: np.ndarray, want: np.ndarray, bound: np.ndarray, rows: np.ndarray) -> float:
    keep = np.broadcast_to(rows[..., None], want.shape)
    err = np.abs(got - want)
    r = np.where(keep, np.where(err > 0, err / np.where(bound > 0, bound, math.inf), 0.0), 0.0)
    r = np.where(keep & ~np.isfinite(got), math.inf, r)
    return float(r.max(initial=0.0))


# --- the command -------------------------------------------------------------------------------


def configure_bound_check(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--configs", type=int, default=120, help="random configurations")
    parser.add_argument("--seed", type=int, default=0, help="the configurations' seed")
    parser.add_argument("--no-realworld", action="store_true", help="only impl, copy, sdpa")
    parser.add_argument(
        "--dtypes",
        default=",".join(DTYPES),
        help=f"comma-separated, of {', '.join(TORCH_DTYPES)} (default: {', '.join(DTYPES)})",
    )
    parser.add_argument(
        "--grads",
        action="store_true",
        help="also the loss and every gradient of impl, the copy and sdpa (oracle.bounded)",
    )
    parser.add_argument("--write", type=Path, help="write the markdown report here")


def run_bound_check(args: argparse.Namespace) -> int:
    dtypes = args.dtypes.split(",")
    unknown = sorted(set(dtypes) - set(TORCH_DTYPES))
    if unknown:
        print(f"xfmr bound-check: --dtypes: unknown {unknown}", file=sys.stderr)
        return 2
    torch.set_num_threads(1)
    start = time.time()
    found = subjects(not args.no_realworld)
    worst: dict[tuple[str, str], tuple[float, str, str]] = {}
    runs: dict[tuple[str, str], int] = {}
    skipped: dict[tuple[str, str], str] = {}
    rng = np.random.default_rng(args.seed)
    for i in range(args.configs):
        case = draw_case(rng, args.seed * 100_000 + i)
        for dtype in dtypes:
            for name, build in found.items():
                try:
                    params, logits, seen = run_subject(build, case, dtype, trace=True)
                except (RuntimeError, ValueError, TypeError, KeyError) as e:
                    skipped.setdefault((name, dtype), f"{type(e).__name__}: {str(e)[:90]}")
                    continue
                found_ratios = ratios(case, params, logits, seen, dtype)
                if args.grads and name in GRADIENT_SUBJECTS:
                    params, loss, grads = run_gradients(build, case, dtype)
                    found_ratios.update(gradient_ratios(case, params, loss, grads, dtype))
                for where, r in found_ratios.items():
                    key = (dtype, name)
                    if r >= worst.get(key, (-1.0, "", ""))[0]:
                        worst[key] = (r, where, _describe(case))
                runs[(dtype, name)] = runs.get((dtype, name), 0) + 1
        if (i + 1) % 10 == 0:
            print(f"{i + 1}/{args.configs} configurations, {time.time() - start:.0f}s", flush=True)
    text = _report(args, worst, runs, skipped, time.time() - start)
    print(text)
    if args.write:
        args.write.write_text(text)
    return 1 if any(r >= 1 for r, _, _ in worst.values()) else 0


def _describe(case: Case) -> str:
    c = case.cfg
    tie = (
        "none"
        if not c["tie_embeddings"]
        else "all"
        if c["src_vocab"] == c["tgt_vocab"]
        else "tgt_out"
    )
    return (
        f"{c['norm']}-LN d={c['d_model']} h={c['n_heads']} d_ff={c['d_ff']} "
        f"{c['n_enc']}+{c['n_dec']} tie={tie} eps={c['ln_eps']:g} seed={case.seed}"
    )


def _report(args: argparse.Namespace, worst: dict, runs: dict, skipped: dict, secs: float) -> str:
    commit = subprocess.run(
        ["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True, text=True
    ).stdout.strip()
    command = "xfmr bound-check " + " ".join(
        sys.argv[2:] if sys.argv[1:2] == ["bound-check"] else sys.argv[1:]
    )
    lines = [
        "# False alarms of the derived error bound",
        "",
        f"Command: `{command.strip()}`  ",
        f"Date: {datetime.date.today()}, commit {commit or 'unknown'}, {secs:.0f} s on the CPU.",
        "",
        "Worst |subject - oracle| / bound over every real logit and every traced boundary the "
        "subject exposes under the contract's module names (oracle/roundoff.py; bound = "
        "10 x the spread of 32 perturbed runs)"
        + (
            ", and with --grads over the label-smoothed loss and every parameter's gradient of "
            f"{', '.join(GRADIENT_SUBJECTS)} (oracle.bounded over the forward and backward passes)"
            if getattr(args, "grads", False)
            else ""
        )
        + ". A ratio >= 1 would be a false alarm.",
        "",
        "| dtype | subject | configurations | worst ratio | where | configuration |",
        "| --- | --- | ---: | ---: | --- | --- |",
    ]
    for (dtype, name), (r, where, desc) in sorted(worst.items()):
        lines.append(f"| {dtype} | {name} | {runs[(dtype, name)]} | {r:.3f} | {where} | {desc} |")
    lines += ["", "Per dtype, over all subjects:", ""]
    for dtype in TORCH_DTYPES:
        rs = [(r, name) for (d, name), (r, _, _) in worst.items() if d == dtype]
        n = sum(v for (d, _), v in runs.items() if d == dtype)
        if rs:
            r, name = max(rs)
            lines.append(f"- {dtype}: worst ratio {r:.3f} ({name}) over {n} subject runs")
    if skipped:
        lines += ["", "Subjects that could not run in a dtype (first error):", ""]
        lines += [f"- {name} in {dtype}: {why}" for (name, dtype), why in sorted(skipped.items())]
    return "\n".join(lines) + "\n"
