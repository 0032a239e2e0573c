"""`xfmr depth-demo`: post-norm vs pre-norm stacks of ONE shared parameter dict (seed 004).

For every depth L = 1..max_depth, both stacks run the same block parameters L times on the same
input x0 [T, d], and the demo records the residual stream's size, rms(x_L) = ||x_L||_F / sqrt(T)
(the mean per-token norm), and the input gradient's size ||g0||_F, g0 = d<r, x_L>/dx0 with r a
fixed random direction of unit norm (the same r at every depth). Post-norm ends every block with
LayerNorm, so its stream is re-pinned at sqrt(d); pre-norm's stream is never renormalized.
"""

from __future__ import annotations

import argparse
import shlex
from pathlib import Path

import numpy as np

from oracle.adapters.depth_stacks import BLOCK_PARAMS, stack_input_grad

NORMS = ("post", "pre")


def configure_depth_demo(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--out",
        type=Path,
        default=Path("results/demos/depth_demo.png"),
        help="the PNG; the table and the command go to the same name with .md",
    )
    parser.add_argument("--max-depth", type=int, default=48, help="deepest stack (from 1)")
    parser.add_argument("--seed", type=int, default=0, help="draws the weights, x0 and r")
    parser.add_argument("--d-model", type=int, default=64)
    parser.add_argument("--heads", type=int, default=4)
    parser.add_argument("--d-ff", type=int, default=256)
    parser.add_argument("--tokens", type=int, default=16, help="sequence length T of x0")


def init_block_params(d: int, d_ff: int, rng: np.random.Generator) -> dict[str, np.ndarray]:
    """Weights N(0, 1/fan_in) (variance-preserving at init), biases 0, LayerNorm gamma 1, beta 0."""
    params = {}
    for name in BLOCK_PARAMS:
        if name.startswith("w_"):
            fan_in, fan_out = {"w_1": (d, d_ff), "w_2": (d_ff, d)}.get(name, (d, d))
            params[name] = rng.standard_normal((fan_in, fan_out)) / np.sqrt(fan_in)
        else:
            size = d_ff if name == "b_1" else d
            params[name] = np.ones(size) if name.startswith("gamma") else np.zeros(size)
    return params


def depth_curves(
    max_depth: int, seed: int, d: int, heads: int, d_ff: int, tokens: int
) -> dict[str, np.ndarray]:
    """{'post_rms', 'pre_rms', 'post_grad', 'pre_grad'}: one value per depth 1..max_depth."""
    rng = np.random.default_rng(seed)
    params = init_block_params(d, d_ff, rng)
    x0 = rng.standard_normal((tokens, d))
    r = rng.standard_normal((tokens, d))
    r /= np.linalg.norm(r)
    curves = {f"{norm}_{what}": np.empty(max_depth) for norm in NORMS for what in ("rms", "grad")}
    for depth in range(1, max_depth + 1):
        for norm in NORMS:
            out, dx0 = stack_input_grad(norm, x0, r, depth, heads, params)
            curves[f"{norm}_rms"][depth - 1] = np.linalg.norm(out) / np.sqrt(tokens)
            curves[f"{norm}_grad"][depth - 1] = np.linalg.norm(dx0)
    return curves


def table(curves: dict[str, np.ndarray]) -> str:
    """A markdown table, one row per depth."""
    lines = [
        "| depth | post rms(x_L) | pre rms(x_L) | post ‖g0‖ | pre ‖g0‖ |",
        "| ---: | ---: | ---: | ---: | ---: |",
    ]
    for i in range(len(curves["post_rms"])):
        row = [curves[k][i] for k in ("post_rms", "pre_rms", "post_grad", "pre_grad")]
        lines.append(f"| {i + 1} | " + " | ".join(f"{v:.4g}" for v in row) + " |")
    return "\n".join(lines)


def summary(curves: dict[str, np.ndarray]) -> str:
    """What the curves show, in numbers: first and last depth, and each curve's range."""
    lines = []
    for key, label in (("rms", "residual stream rms(x_L)"), ("grad", "input gradient ‖g0‖")):
        for norm in NORMS:
            c = curves[f"{norm}_{key}"]
            lines.append(
                f"- {norm}-norm {label}: {c[0]:.4g} at depth 1, {c[-1]:.4g} at depth {len(c)}; "
                f"range {c.min():.4g} .. {c.max():.4g}, largest step-to-step ratio "
                f"{np.max(np.maximum(c[1:] / c[:-1], c[:-1] / c[1:]), initial=1):.3g}"
            )
    return "\n".join(lines)


def plot(curves: dict[str, np.ndarray], path: Path, title: str) -> Path:
    """Two panels against depth, log scale: the residual stream's rms and the input gradient."""
    from demos.plots import pyplot

    plt = pyplot()
    depths = np.arange(1, len(curves["post_rms"]) + 1)
    fig, axes = plt.subplots(1, 2, figsize=(11, 4.2))
    panels = (("rms", "residual stream rms(x_L)"), ("grad", "input gradient ‖g0‖"))
    for ax, (what, label) in zip(axes, panels, strict=True):
        for colour, norm in enumerate(NORMS):
            ax.plot(
                depths,
                curves[f"{norm}_{what}"],
                marker=".",
                color=f"C{colour}",
                label=f"{norm}-norm",
            )
        ax.set(xlabel="depth L (blocks sharing one parameter dict)", ylabel=label, yscale="log")
        ax.grid(alpha=0.3, which="both")
        ax.legend()
    fig.suptitle(title)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path


def run_depth_demo(args: argparse.Namespace) -> int:
    if args.max_depth < 1:
        raise SystemExit(f"--max-depth must be >= 1, got {args.max_depth}")
    curves = depth_curves(
        args.max_depth, args.seed, args.d_model, args.heads, args.d_ff, args.tokens
    )
    text = table(curves) + "\n\n" + summary(curves)
    print(text)
    title = (
        f"shared-weight stacks: d={args.d_model}, h={args.heads}, d_ff={args.d_ff}, "
        f"T={args.tokens}, seed {args.seed}"
    )
    png = plot(curves, args.out, title)
    # every option spelled out, so the command reproduces the files whatever the defaults become
    command = shlex.join(
        [
            "xfmr",
            "depth-demo",
            "--out",
            str(args.out),
            "--max-depth",
            str(args.max_depth),
            "--seed",
            str(args.seed),
            "--d-model",
            str(args.d_model),
            "--heads",
            str(args.heads),
            "--d-ff",
            str(args.d_ff),
            "--tokens",
            str(args.tokens),
        ]
    )
    notes = args.out.with_suffix(".md")
    about = __doc__.split("\n", 2)[2]  # the module docstring after its first line
    notes.write_text(
        f"# depth-demo\n\nMade by `{command}`.\n\n![{title}]({png.name})\n\n{about}\n{text}\n"
    )
    print(f"wrote {png} and {notes}")
    return 0
