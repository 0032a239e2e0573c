"""`xfmr bench`: the oracle's speed against torch float64 on the same model, measured in one run.

The model is the paper's base size (d=512, h=8, d_ff=2048, 6 + 6 layers) on a batch of B=8
sentences of S=T=32 tokens. Each repeat times, interleaved so that load on the machine hits all
alike: the oracle's forward, torch's forward (no_grad), the oracle's forward+backward
(loss_and_grads, its backward timed on its own too) and torch's forward+backward (autograd).
Medians are compared. A large float64 np.matmul measures what the machine's BLAS can do, and the
oracle's backward is rated by the matmul FLOPs it performs per second against that (timed in the
same interleaved rounds).
"""

from __future__ import annotations

import argparse
import os
import statistics
import time
from collections.abc import Callable

import numpy as np
import torch

from impl import transformer as impl
from oracle import read_state_dict
from oracle.grads import backward, forward_for_grads
from oracle.model import forward
from oracle.params import ModelSpec

EPS, PAD = 0.1, 0
FORWARD_TARGET = 1.5  # issue 2: oracle forward within 1.5x of torch float64
TRAIN_TARGET = 2.0  # issue 3: oracle forward+backward within 2x


def configure_bench(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--repeats", type=int, default=3, help="timed repeats of each measurement")
    parser.add_argument("--vocab", type=int, default=1000, help="source and target vocabulary")
    parser.add_argument("--batch", type=int, default=8, help="B")
    parser.add_argument("--length", type=int, default=32, help="S = T")
    parser.add_argument("--layers", type=int, default=6, help="encoder and decoder layers each")
    parser.add_argument("--matmul", type=int, default=1536, help="n of the n x n throughput matmul")
    parser.add_argument("--seed", type=int, default=0)


def forward_matmul_flops(spec: ModelSpec, B: int, S: int, T: int) -> int:
    """Multiply-add FLOPs (2 per multiply-add) of every matmul in one forward pass."""
    d, d_ff = spec.d_model, spec.d_ff
    enc = 8 * B * S * d * d + 4 * B * S * d * d_ff + 4 * B * S * S * d  # q,k,v,out; FF; QK^T, AV
    dec_self = 8 * B * T * d * d + 4 * B * T * T * d
    dec_cross = 4 * B * T * d * d + 4 * B * S * d * d + 4 * B * T * S * d  # q,out; k,v of memory
    dec = dec_self + dec_cross + 4 * B * T * d * d_ff
    return spec.n_enc * enc + spec.n_dec * dec + 2 * B * T * d * spec.tgt_vocab


def backward_matmul_flops(spec: ModelSpec, B: int, S: int, T: int) -> int:
    """Every forward matmul C = A B has two in the backward (dA = dC B^T, dB = A^T dC)."""
    return 2 * forward_matmul_flops(spec, B, S, T)


def _seconds(fn: Callable[[], object]) -> float:
    start = time.perf_counter()
    fn()
    return time.perf_counter() - start


def matmul_seconds(n: int) -> Callable[[], float]:
    """A timer of one n x n float64 np.matmul: the machine's BLAS throughput, 2 n^3 FLOPs."""
    rng = np.random.default_rng(0)
    a, b = rng.standard_normal((n, n)), rng.standard_normal((n, n))
    return lambda: _seconds(lambda: a @ b)


def run_bench(args: argparse.Namespace) -> int:
    torch.manual_seed(args.seed)
    cfg = impl.TransformerConfig(
        src_vocab=args.vocab,
        tgt_vocab=args.vocab,
        n_enc=args.layers,
        n_dec=args.layers,
    )
    model = impl.Transformer(cfg).double().eval()  # eval: no dropout, the oracle's computation
    params = read_state_dict(model)
    B, L = args.batch, args.length
    g = torch.Generator().manual_seed(args.seed)
    src = torch.randint(1, args.vocab, (B, L), generator=g)
    tgt = torch.randint(1, args.vocab, (B, L), generator=g)
    tgt_out = torch.randint(1, args.vocab, (B, L), generator=g)
    mask = torch.ones(B, L, dtype=torch.bool)
    src_np, tgt_np, out_np, mask_np = src.numpy(), tgt.numpy(), tgt_out.numpy(), mask.numpy()

    def torch_forward() -> None:
        with torch.no_grad():
            model(src, tgt, mask, mask)

    def torch_train() -> None:
        model.zero_grad(set_to_none=True)
        impl.label_smoothed_loss(model(src, tgt, mask, mask), tgt_out, EPS, PAD).backward()

    def oracle_forward() -> None:
        forward(params, src_np, tgt_np, mask_np, mask_np)

    def oracle_train() -> tuple[float, float]:
        """(forward+backward seconds, backward seconds) of the oracle's loss_and_grads."""
        start = time.perf_counter()
        _, dlogits, enc_cache, dec_cache = forward_for_grads(
            params, src_np, tgt_np, out_np, mask_np, mask_np, EPS, PAD
        )
        middle = time.perf_counter()
        backward(params, dlogits, enc_cache, dec_cache)
        end = time.perf_counter()
        return end - start, end - middle

    matmul = matmul_seconds(args.matmul)
    times: dict[str, list[float]] = {k: [] for k in ("of", "tf", "ot", "ob", "tt", "mm")}
    print(
        f"model d=512 h=8 d_ff=2048 {args.layers}+{args.layers} layers, V={args.vocab}, "
        f"B={B} S=T={L}; torch threads {torch.get_num_threads()}, cpus {os.cpu_count()}, "
        f"OMP_NUM_THREADS={os.environ.get('OMP_NUM_THREADS', 'unset')}"
    )
    for repeat in range(args.repeats + 1):  # the first round warms up and is not counted
        of, tf = _seconds(oracle_forward), _seconds(torch_forward)
        ot, ob = oracle_train()
        tt, mm = _seconds(torch_train), matmul()
        if repeat:
            for key, value in zip(times, (of, tf, ot, ob, tt, mm), strict=True):
                times[key].append(value)
    med = {k: statistics.median(v) for k, v in times.items()}
    peak = 2 * args.matmul**3 / med["mm"] / 1e9
    flops = backward_matmul_flops(params.spec, B, L, L)
    achieved = flops / med["ob"] / 1e9
    for label, ours, theirs, target in (
        ("forward", med["of"], med["tf"], FORWARD_TARGET),
        ("forward+backward", med["ot"], med["tt"], TRAIN_TARGET),
    ):
        print(
            f"{label:<17} oracle {ours:.3f} s  torch {theirs:.3f} s  "
            f"ratio {ours / theirs:.2f}  (target <= {target})"
        )
    print(
        f"oracle backward   {med['ob']:.3f} s for {flops / 1e9:.1f} GFLOP of matmuls = "
        f"{achieved:.1f} GFLOP/s, {achieved / peak:.0%} of np.matmul's {peak:.1f} GFLOP/s "
        f"({args.matmul}x{args.matmul} float64)"
    )
    print(f"medians of {args.repeats} interleaved repeats")
    return 0
