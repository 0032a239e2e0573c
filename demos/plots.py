"""PNG curves for the demos; matplotlib (the optional extra `plots`) is imported only here."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path


def pyplot():
    try:
        import matplotlib
    except ImportError as err:
        raise RuntimeError(
            "writing a PNG needs matplotlib, the optional extra 'plots': "
            "pip install 'xfmr-oracle[plots]'"
        ) from err
    matplotlib.use("Agg")  # files only: never open a window, works without a display
    import matplotlib.pyplot as plt

    return plt


def loss_curve(losses: Sequence[float], path: str | Path, title: str) -> Path:
    """One training run's loss per update."""
    plt = pyplot()
    fig, ax = plt.subplots(figsize=(7, 4))
    ax.plot(range(len(losses)), losses, lw=1)
    ax.set(xlabel="update", ylabel="label-smoothed loss", title=title)
    ax.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return Path(path)


def loss_curves(
    runs: Mapping[str, Sequence[Sequence[float]]], path: str | Path, title: str
) -> Path:
    """Several labelled groups of runs (one group per setting, one curve per seed)."""
    plt = pyplot()
    fig, ax = plt.subplots(figsize=(7, 4))
    for colour, (label, group) in enumerate(runs.items()):
        for k, losses in enumerate(group):
            ax.plot(losses, color=f"C{colour}", lw=1, alpha=0.8, label=label if k == 0 else None)
    ax.set(xlabel="update", ylabel="label-smoothed loss", title=title)
    ax.grid(alpha=0.3)
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return Path(path)
