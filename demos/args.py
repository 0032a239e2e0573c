"""Argument types for the demos' commands: each error names the bad value and what was expected."""

from __future__ import annotations

import argparse

import torch


def positive_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {text!r}")
    return value


def nonnegative_int(text: str) -> int:
    if not text.isdigit():
        raise argparse.ArgumentTypeError(f"expected an integer >= 0, got {text!r}")
    return int(text)


def positive_float(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a positive number, got {text!r}") from None
    if not value > 0 or value == float("inf"):
        raise argparse.ArgumentTypeError(f"expected a positive number, got {text!r}")
    return value


def fraction(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number in [0, 1), got {text!r}") from None
    if not 0 <= value < 1:
        raise argparse.ArgumentTypeError(f"expected a number in [0, 1), got {text!r}")
    return value


def device(text: str) -> str:
    """A torch device that exists here: 'cpu', 'cuda' or 'cuda:N'."""
    try:
        dev = torch.device(text)
    except RuntimeError:
        raise argparse.ArgumentTypeError(
            f"expected a device such as 'cpu' or 'cuda', got {text!r}"
        ) from None
    if dev.type == "cuda":
        if not torch.cuda.is_available():
            raise argparse.ArgumentTypeError(
                f"device {text!r} asked for, but this torch has no usable CUDA "
                f"(torch {torch.__version__}); use --device cpu"
            )
        if dev.index is not None and dev.index >= torch.cuda.device_count():
            raise argparse.ArgumentTypeError(
                f"device {text!r}: only {torch.cuda.device_count()} CUDA device(s) here"
            )
    elif dev.type != "cpu":
        raise argparse.ArgumentTypeError(f"expected 'cpu' or 'cuda[:N]', got {text!r}")
    return text


def add_model_args(parser: argparse.ArgumentParser, defaults: dict) -> None:
    """The model's shape, shared by train and ln-demo (each with its own defaults)."""
    g = parser.add_argument_group("model")
    g.add_argument("--d-model", type=positive_int, default=defaults["d_model"], help="width d")
    g.add_argument("--heads", type=positive_int, default=defaults["n_heads"], help="heads h")
    g.add_argument("--d-ff", type=positive_int, default=defaults["d_ff"], help="FF width")
    g.add_argument(
        "--layers", type=positive_int, default=defaults["layers"], help="encoder = decoder layers"
    )
    g.add_argument("--dropout", type=fraction, default=defaults["dropout"], help="dropout rate")


def model_args_error(args: argparse.Namespace) -> str | None:
    """What is wrong with the model's arguments taken together (argparse checks each alone)."""
    if args.d_model % args.heads:
        return f"--d-model {args.d_model} is not divisible by --heads {args.heads}"
    return None
