"""`xfmr compare`: your model's outputs against the oracle, judged by the derived error bound.

    xfmr compare model.safetensors config.json logits.npz --inputs batch.npz --dtype bfloat16
    xfmr compare config.json --emit-inputs batch.npz      # a seeded batch to run your model on

Nothing of yours is executed: you run your model (in your dtype) on the inputs and hand in what
it returned. The oracle reads your weights (any naming scheme oracle.read_state_dict knows:
the contract's, torch's nn.Transformer stacks, Hugging Face Marian), computes the logits in
float64 and, for each value, the bound on how far an honest implementation computing in your
dtype may be from it (oracle/roundoff.py). Reported: the values outside their bound, the
worst ratio |yours - oracle| / bound, and the first divergence: the first traced boundary (in
the order of computation) with a value outside its bound, when you hand in traced values, else
the logits. Exit status: 0 all inside, 1 some value outside, 2 a usage error.

The oracle put to anyone's use (`xfmr --help`: the oracle), not a measurement of the course kept
under results/, so it lives in harness/oracle_checks/ beside `xfmr smoke`, not in harness/tools/.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

import numpy as np

import oracle
from harness.shared_tests.inputs import batch
from oracle.error_bounds import forward_bounds
from oracle.precision import PRECISIONS

HELP = {
    "state": "your weights: a .safetensors file, or a .pt/.pth torch state_dict (loaded with "
    "weights_only=True: tensors only, no code), under any scheme the oracle reads",
    "config": "a JSON file of the model's configuration (the contract's TransformerConfig fields: "
    "src_vocab, tgt_vocab, d_model, n_heads, d_ff, n_enc, n_dec, norm, tie_embeddings, max_len, "
    "ln_eps; or a Marian config)",
    "outputs": "what your model returned on the inputs, in your dtype: a .npy of the logits "
    "[B, T, V], or a .npz with 'logits' and optionally traced boundaries under the oracle's names "
    "('encoder.0.self_attn', 'decoder.1.norm2', ...: `oracle.forward(..., trace=True)` lists them)",
    "inputs": "a .npz with src [B, S] and tgt_in [B, T] (integer ids) and optionally src_mask, "
    "tgt_mask (bool, True = a real token; default: ids != --pad-id); default: the seeded batch "
    "that --emit-inputs writes",
}


class UsageError(Exception):
    """Bad input: reported in one line, exit status 2."""


def configure_compare(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("files", nargs="+", metavar="FILE", help="STATE CONFIG OUTPUTS (see below)")
    parser.add_argument("--inputs", type=Path, help=HELP["inputs"])
    parser.add_argument(
        "--dtype", default="float32", choices=list(PRECISIONS), help="the dtype your model ran in"
    )
    parser.add_argument("--seed", type=int, default=0, help="the default batch's seed")
    parser.add_argument("--pad-id", type=int, default=0, help="the padding id (default masks)")
    parser.add_argument(
        "--emit-inputs", type=Path, metavar="NPZ", help="with CONFIG only: write the default batch"
    )
    parser.add_argument("--json", type=Path, help="also write the report as JSON")
    parser.formatter_class = argparse.RawDescriptionHelpFormatter
    parser.epilog = "\n\n".join(f"{k.upper()}: {v}" for k, v in HELP.items() if k != "inputs")


def _load_config(path: Path) -> dict[str, Any]:
    try:
        cfg = json.loads(path.read_text())
    except (OSError, json.JSONDecodeError) as e:
        raise UsageError(f"config {path}: not a readable JSON file ({e})") from None
    if not isinstance(cfg, dict):
        raise UsageError(f"config {path}: expected a JSON object of config fields")
    return cfg


def _load_state(path: Path) -> dict[str, np.ndarray]:
    import torch

    if path.suffix == ".safetensors":
        from safetensors.torch import load_file

        try:
            tensors = load_file(str(path))
        except Exception as e:  # safetensors raises its own error types
            raise UsageError(f"state {path}: not a readable .safetensors file ({e})") from None
    elif path.suffix in (".pt", ".pth"):
        try:
            tensors = torch.load(path, map_location="cpu", weights_only=True)
        except Exception as e:  # torch.load raises many types for a bad file
            raise UsageError(f"state {path}: not a torch state_dict of tensors ({e})") from None
    else:
        raise UsageError(f"state {path}: expected a .safetensors, .pt or .pth file")
    if not isinstance(tensors, dict) or not all(
        isinstance(v, torch.Tensor) for v in tensors.values()
    ):
        raise UsageError(f"state {path}: expected a dict of tensors (a state_dict)")
    return {k: v.detach().to(torch.float64).numpy() for k, v in tensors.items()}


def _load_outputs(path: Path) -> dict[str, np.ndarray]:
    try:
        loaded = np.load(path, allow_pickle=False)
    except (OSError, ValueError) as e:
        raise UsageError(f"outputs {path}: not a readable .npy/.npz file ({e})") from None
    if isinstance(loaded, np.ndarray):
        return {"logits": loaded.astype(np.float64)}
    out = {k: loaded[k].astype(np.float64) for k in loaded.files}
    if "logits" not in out:
        raise UsageError(f"outputs {path}: the .npz has no 'logits' (it has {sorted(out)})")
    return out


def _load_inputs(args: argparse.Namespace, cfg: dict[str, Any]) -> dict[str, np.ndarray]:
    if args.inputs is None:
        return default_inputs(cfg, args.seed)
    try:
        data = np.load(args.inputs, allow_pickle=False)
        b = {k: data[k] for k in data.files}
    except (OSError, ValueError, AttributeError) as e:
        raise UsageError(f"inputs {args.inputs}: not a readable .npz file ({e})") from None
    missing = [k for k in ("src", "tgt_in") if k not in b]
    if missing:
        raise UsageError(f"inputs {args.inputs}: missing {', '.join(missing)} (has {sorted(b)})")
    b.setdefault("src_mask", b["src"] != args.pad_id)
    b.setdefault("tgt_mask", b["tgt_in"] != args.pad_id)
    return b


def default_inputs(cfg: dict[str, Any], seed: int) -> dict[str, np.ndarray]:
    """The seeded batch compare uses without --inputs: 3 rows, sources 7, 4, 2 long, targets
    6, 3, 5 (padding id 0, bos 1, eos 2)."""
    b = batch(np.random.default_rng(seed), cfg, src_lens=[7, 4, 2], tgt_lens=[6, 3, 5])
    return {k: b[k] for k in ("src", "tgt_in", "src_mask", "tgt_mask")}


def compare(
    params: Any, inputs: dict[str, np.ndarray], outputs: dict[str, np.ndarray], dtype: str
) -> dict[str, Any]:
    """The report: per compared value (traced boundaries in order, then the logits) how many
    real entries lie outside the bound, the worst ratio, and the first divergence."""
    b = inputs
    try:
        fb = forward_bounds(params, b["src"], b["tgt_in"], b["src_mask"], b["tgt_mask"], dtype)
    except (ValueError, TypeError) as e:
        raise UsageError(f"inputs: {e}") from None
    values = {
        **{k: (fb.trace[k], fb.trace_bound[k]) for k in fb.trace},
        "logits": (fb.logits, fb.bound),
    }
    unknown = sorted(set(outputs) - set(values))
    if unknown:
        raise UsageError(f"outputs: names the oracle does not trace: {unknown[:4]}")
    rows, first = [], None
    for name, (want, bound) in values.items():
        if name not in outputs:
            continue
        got = outputs[name]
        if got.shape != want.shape:
            raise UsageError(f"outputs: {name} has shape {got.shape}, expected {want.shape}")
        rows_mask = b["src_mask"] if name.startswith("enc") else b["tgt_mask"]
        keep = np.broadcast_to(rows_mask[..., None], want.shape)
        err = np.where(keep, np.abs(got - want), 0.0)
        err = np.where(keep & ~np.isfinite(got), np.inf, err)
        outside = keep & (err > bound)
        ratio = np.where(keep, err / np.maximum(bound, np.finfo(float).tiny), 0.0)
        i = np.unravel_index(int(np.argmax(ratio)), ratio.shape)
        row = {
            "name": name,
            "outside": int(outside.sum()),
            "checked": int(keep.sum()),
            "worst_ratio": float(ratio[i]),
            "at": [int(k) for k in i],
            "got": float(got[i]),
            "want": float(want[i]),
            "bound": float(bound[i]),
        }
        rows.append(row)
        if first is None and row["outside"]:
            first = name
    return {"dtype": dtype, "values": rows, "first_divergence": first}


def _text(report: dict[str, Any]) -> str:
    lines = [f"compare: a {report['dtype']} subject against the oracle's derived bound"]
    for r in report["values"]:
        lines.append(
            f"  {r['name']:<28} {r['outside']:>6} of {r['checked']} outside; worst "
            f"|err|/bound {r['worst_ratio']:.3g} at {tuple(r['at'])} (got {r['got']:.8g}, "
            f"oracle {r['want']:.8g}, bound {r['bound']:.3g})"
        )
    first = report["first_divergence"]
    lines.append(f"first divergence: {first}" if first else "every value lies inside its bound")
    return "\n".join(lines)


def run_compare(args: argparse.Namespace) -> int:
    try:
        return _run(args)
    except UsageError as e:
        print(f"xfmr compare: {e}", file=sys.stderr)
        return 2


def _run(args: argparse.Namespace) -> int:
    files = [Path(f) for f in args.files]
    if args.emit_inputs is not None:
        if len(files) != 1:
            raise UsageError("--emit-inputs takes one FILE: the CONFIG")
        arrays: dict[str, Any] = default_inputs(_load_config(files[0]), args.seed)
        np.savez(args.emit_inputs, **arrays)
        print(f"wrote {args.emit_inputs}")
        return 0
    if len(files) != 3:
        raise UsageError(f"expected STATE CONFIG OUTPUTS, got {len(files)} file(s)")
    for f in files:
        if not f.is_file():
            raise UsageError(f"{f}: no such file")
    state_path, config_path, outputs_path = files
    cfg = _load_config(config_path)
    state = _load_state(state_path)
    try:
        params = oracle.read_state_dict(state, cfg)
    except (ValueError, KeyError, TypeError, IndexError) as e:
        raise UsageError(f"state {state_path}: the oracle cannot read it ({e})") from None
    inputs = _load_inputs(args, cfg)
    report = compare(params, inputs, _load_outputs(outputs_path), args.dtype)
    print(_text(report))
    if args.json:
        args.json.write_text(json.dumps(report, indent=2))
    return 1 if report["first_divergence"] else 0
