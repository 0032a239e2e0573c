"""Where and how the demos run: device, CPU threads, and the machine's load for timings."""

from __future__ import annotations

import argparse
import os
from collections.abc import Iterator
from contextlib import contextmanager

import torch

from demos.args import device, positive_int

# Models this small gain little from intra-op threads, and on a shared machine a second thread
# waiting for a busy core made every update ~8x slower (2.3 s against 0.27 s, load 6 on 2 cores).
THREADS = 1


@contextmanager
def torch_threads(n: int) -> Iterator[None]:
    """Run with n intra-op threads, restoring the caller's setting (tests share the process)."""
    previous = torch.get_num_threads()
    torch.set_num_threads(n)
    try:
        yield
    finally:
        torch.set_num_threads(previous)


def machine_load() -> list[float]:
    """1, 5 and 15 minute load averages (the machine is shared: timings need them)."""
    return [round(x, 2) for x in os.getloadavg()]


def add_runtime_args(parser: argparse.ArgumentParser) -> None:
    """--device and --threads, shared by every demo command."""
    parser.add_argument("--device", type=device, default="cpu", help="cpu or cuda")
    parser.add_argument("--threads", type=positive_int, default=THREADS, help="torch CPU threads")
