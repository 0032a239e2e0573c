"""`xfmr bench`: the oracle's speed and memory against torch float64 on the same model, one run.

The model is built by impl (the contract's torch model) in float64 and read into the oracle, so
both sides compute the same thing. Each repeat times, interleaved so that load on the machine hits
all alike (the order rotates every repeat): the oracle's forward, torch's forward (no_grad), the
oracle's forward+backward (loss_and_grads; its backward timed on its own too), torch's
forward+backward (autograd), and one large float64 np.matmul, the machine's BLAS throughput. The
oracle's backward is rated by the matmul FLOPs it performs per second against that matmul's.

Shapes: `--preset base | long | marian`, or `all` for the three in turn in one process (issue 51's
sizes); medians of `--repeats` >= 5 interleaved runs; each report prints the machine's load average
before and after its timed repeats, the commit, and where the timed oracle was imported from.

Every measurement has two clocks. Wall time, and CPU time (time.process_time): with one thread on
each side (the default) CPU time is the work a side did, whatever other jobs on the machine took
from it meanwhile; on a shared machine it is the steadier of the two. Medians are compared.

Peak memory is measured once per side, apart from the timed repeats (both measurements slow what
they watch): numpy's with tracemalloc (numpy reports its array buffers to it), torch's from its
CPU allocator's own count ('Total Allocated' in torch.profiler's memory events). Each is the most
the forward+backward holds at once beyond what was allocated before it (parameters and inputs),
gradients included.
"""

from __future__ import annotations

import argparse
import atexit
import ctypes
import datetime
import glob
import importlib
import json
import os
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
import tracemalloc
import types
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

import oracle
from impl import transformer as impl
from oracle import read_state_dict
from oracle.grads import backward, forward_for_grads, loss_and_grads
from oracle.model import forward
from oracle.params import ModelSpec, Params

EPS, PAD = 0.1, 0
FORWARD_TARGET = 1.5  # issue 2: oracle forward within 1.5x of torch float64
TRAIN_TARGET = 1.0  # issue 26: forward+backward no slower than torch float64
BACKWARD_SHARE_TARGET = 0.75  # issue 26: the backward at 75% of np.matmul's throughput
MEMORY_TARGET = 1.5  # issue 26: peak memory within 1.5x of torch's

MIN_REPEATS = 5  # issue 51: the targets are judged on medians of at least 5 runs in one process

# Model and batch shapes by name; --d-model, --heads, --d-ff, --layers, --vocab, --batch, --seq
# override a preset's field. `--preset all` runs the three in turn in one process.
PRESETS = {
    # the paper's base model on a small vocabulary: the benchmark of issues 2, 3 and 26
    "base": dict(d_model=512, heads=8, d_ff=2048, layers=6, vocab=1000, batch=8, seq=32),
    # a narrower, shallower model on longer and more sequences (B*T = 2048 rows per matmul)
    "long": dict(d_model=256, heads=4, d_ff=1024, layers=3, vocab=1000, batch=32, seq=64),
    # the shape of Hugging Face's opus-mt-en-de (MarianMTModel): the base model with its 58101-id
    # shared vocabulary; built by impl, so ReLU and sinusoids where Marian has swish and its table
    "marian": dict(d_model=512, heads=8, d_ff=2048, layers=6, vocab=58101, batch=8, seq=32),
}


def configure_bench(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--preset", choices=[*PRESETS, "all"], default="base", help="model shape ('all': each)"
    )
    parser.add_argument("--d-model", type=int, help="d_model (default: the preset's)")
    parser.add_argument("--heads", type=int, help="h (default: the preset's)")
    parser.add_argument("--d-ff", type=int, help="d_ff (default: the preset's)")
    parser.add_argument("--layers", type=int, help="encoder and decoder layers each")
    parser.add_argument("--vocab", type=int, help="source and target vocabulary (tied)")
    parser.add_argument("--batch", type=int, help="B (default: the preset's)")
    parser.add_argument("--seq", type=int, help="S = T (default: the preset's)")
    parser.add_argument(
        "--repeats",
        type=int,
        default=MIN_REPEATS,
        help=f"timed repeats of each measurement, medians reported (at least {MIN_REPEATS})",
    )
    parser.add_argument("--threads", type=int, default=1, help="torch's and numpy's BLAS threads")
    parser.add_argument("--matmul", type=int, default=1536, help="n of the n x n throughput matmul")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument(
        "--record", type=Path, help="append the run, with its command, to this file"
    )
    parser.add_argument(
        "--paired-with",
        type=Path,
        metavar="DIR",
        help="also time the oracle/ under DIR (e.g. `git archive OLD oracle | tar -x -C DIR`) "
        "against this checkout's, forward+backward alternated: a change's own effect",
    )


@dataclass(frozen=True)
class Shape:
    d_model: int
    heads: int
    d_ff: int
    layers: int
    vocab: int
    batch: int
    seq: int


def shape_of(args: argparse.Namespace, preset_name: str | None = None) -> Shape:
    preset = PRESETS[preset_name or args.preset]
    return Shape(**{k: preset[k] if getattr(args, k) is None else getattr(args, k) for k in preset})


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


def blas_threads(n: int) -> str:
    """Set numpy's OpenBLAS to n threads through its own C API (what threadpoolctl does), and say
    what is in effect. numpy's wheels carry scipy-openblas; another BLAS is left as it is, and the
    answer says so (set OPENBLAS_NUM_THREADS / MKL_NUM_THREADS before starting then)."""
    libs = os.path.join(os.path.dirname(np.__file__), os.pardir, "numpy.libs")
    for path in glob.glob(os.path.join(libs, "libscipy_openblas*")):
        lib = ctypes.CDLL(path, mode=os.RTLD_NOLOAD)
        for suffix in ("64_", ""):
            set_n = getattr(lib, f"scipy_openblas_set_num_threads{suffix}", None)
            get_n = getattr(lib, f"scipy_openblas_get_num_threads{suffix}", None)
            if set_n is not None and get_n is not None:
                set_n(n)
                return f"{get_n()} (scipy-openblas, set through its C API)"
    env = {k: os.environ.get(k) for k in ("OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS")}
    return f"not set by the bench (not numpy's scipy-openblas); environment {env}"


@dataclass
class Clocks:
    wall: float
    cpu: float


def timed(fn: Callable[[], object]) -> Clocks:
    wall, cpu = time.perf_counter(), time.process_time()
    fn()
    return Clocks(time.perf_counter() - wall, time.process_time() - cpu)


def numpy_peak_bytes(fn: Callable[[], object]) -> int:
    """The most fn holds at once beyond what was allocated before it (tracemalloc)."""
    tracemalloc.start()
    try:
        before = tracemalloc.get_traced_memory()[0]
        tracemalloc.reset_peak()
        result = fn()
        peak = tracemalloc.get_traced_memory()[1]
        del result
    finally:
        tracemalloc.stop()
    return peak - before


def torch_peak_bytes(fn: Callable[[], object]) -> int:
    """The most fn holds at once in torch's CPU allocator beyond what it held before
    (torch.profiler's memory events)."""
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
        result = fn()
    del result
    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, "trace.json")
        prof.export_chrome_trace(path)
        with open(path) as f:
            events = json.load(f)["traceEvents"]
    memory = [e["args"] for e in events if e.get("name") == "[memory]"]
    if not memory:
        return 0
    # the count runs on across profiles: what it held before fn is the first event's total less
    # that event's own bytes
    before = memory[0]["Total Allocated"] - memory[0]["Bytes"]
    return max(m["Total Allocated"] for m in memory) - before


def _git_commit() -> str:
    def git(*a: str) -> str:
        return subprocess.run(["git", *a], capture_output=True, text=True).stdout.strip()

    commit = git("rev-parse", "--short", "HEAD") or "unknown"
    dirty = git("status", "--porcelain", "--untracked-files=no", "oracle", "harness/tools/bench.py")
    return commit + (" (oracle/ or bench.py modified)" if dirty else "")


def _oracle_dir() -> str:
    """Where the timed oracle was imported from (a copy on PYTHONPATH times an older oracle)."""
    here = Path(oracle.__file__).resolve().parent
    checkout = Path(__file__).resolve().parents[2] / "oracle"
    return "this checkout's oracle/" if here == checkout else str(here)


def _load() -> str:
    return " ".join(f"{x:.2f}" for x in os.getloadavg())


def run_bench(args: argparse.Namespace) -> int:
    if args.repeats < MIN_REPEATS:
        print(f"xfmr bench: --repeats must be at least {MIN_REPEATS}", file=sys.stderr)
        return 2
    if args.paired_with is not None and not (args.paired_with / "oracle" / "__init__.py").is_file():
        print(
            f"xfmr bench: --paired-with {args.paired_with}: no oracle/ package there",
            file=sys.stderr,
        )
        return 2
    for name in PRESETS if args.preset == "all" else [args.preset]:
        lines = bench_one(args, shape_of(args, name))
        print("\n".join(lines), flush=True)
        if args.record is not None:
            command = " ".join(["xfmr", *sys.argv[1:]])
            with args.record.open("a") as f:
                f.write(f"\n```\n$ {command}  # {name}\n" + "\n".join(lines) + "\n```\n")
    return 0


def load_oracle_copy(root: Path) -> types.ModuleType:
    """The oracle package under root/oracle, imported as `oracle_baseline` beside this one (its
    own imports of oracle.* rewritten to it), so that both can run in one process."""
    source = root / "oracle"
    if not (source / "__init__.py").is_file():
        raise SystemExit(f"xfmr bench: --paired-with {root}: no oracle/__init__.py there")
    if "oracle_baseline" in sys.modules:  # --preset all: loaded for the first size
        return sys.modules["oracle_baseline"]
    root_copy = tempfile.mkdtemp(prefix="xfmr-bench-")
    atexit.register(shutil.rmtree, root_copy, ignore_errors=True)
    target = Path(root_copy) / "oracle_baseline"
    for path in source.rglob("*.py"):
        text = re.sub(r"\b(from|import) oracle\b", r"\1 oracle_baseline", path.read_text())
        copy = target / path.relative_to(source)
        copy.parent.mkdir(parents=True, exist_ok=True)
        copy.write_text(text)
    sys.path.insert(0, str(target.parent))
    return importlib.import_module("oracle_baseline")


def paired_lines(
    args: argparse.Namespace, model: torch.nn.Module, params: Params, inputs: tuple
) -> list[str]:
    """--paired-with: the copy's loss_and_grads (forward+backward) and this oracle's on the same
    model and batch, alternated (who goes first swaps every repeat), CPU medians of --repeats
    after one warm-up pair: the change's own effect, whatever the load did meanwhile."""
    base = load_oracle_copy(args.paired_with)
    base_params = base.read_state_dict(model)
    sides: dict[str, Callable[[], object]] = {
        "here": lambda: loss_and_grads(params, *inputs),
        "there": lambda: base.loss_and_grads(base_params, *inputs),
    }
    cpu: dict[str, list[float]] = {k: [] for k in sides}
    for repeat in range(args.repeats + 1):
        for name in list(sides)[:: 1 if repeat % 2 else -1]:
            clocks = timed(sides[name])
            if repeat:
                cpu[name].append(clocks.cpu)
    here, there = (statistics.median(cpu[k]) for k in ("here", "there"))
    return [
        f"paired with {args.paired_with}/oracle, alternated, cpu medians of {args.repeats}: "
        f"forward+backward {there:.3f} s there, {here:.3f} s here, here / there {here / there:.3f}"
    ]


def bench_one(args: argparse.Namespace, shape: Shape) -> list[str]:
    """One shape's timed repeats and memory profiles: the report's lines."""
    torch.set_num_threads(args.threads)
    numpy_threads = blas_threads(args.threads)
    torch.manual_seed(args.seed)
    cfg = impl.TransformerConfig(
        src_vocab=shape.vocab,
        tgt_vocab=shape.vocab,
        d_model=shape.d_model,
        n_heads=shape.heads,
        d_ff=shape.d_ff,
        n_enc=shape.layers,
        n_dec=shape.layers,
        max_len=max(256, shape.seq),
    )
    model = impl.Transformer(cfg).double().eval()  # eval: no dropout, the oracle's computation
    params = read_state_dict(model)
    B, L = shape.batch, shape.seq
    g = torch.Generator().manual_seed(args.seed)
    src = torch.randint(1, shape.vocab, (B, L), generator=g)
    tgt = torch.randint(1, shape.vocab, (B, L), generator=g)
    tgt_out = torch.randint(1, shape.vocab, (B, L), generator=g)
    mask = torch.ones(B, L, dtype=torch.bool)
    src_np, tgt_np, out_np, mask_np = src.numpy(), tgt.numpy(), tgt_out.numpy(), mask.numpy()

    def torch_forward() -> torch.Tensor:
        with torch.no_grad():
            return model(src, tgt, mask, mask)

    def torch_train() -> list[torch.Tensor | None]:
        model.zero_grad(set_to_none=True)
        impl.label_smoothed_loss(model(src, tgt, mask, mask), tgt_out, EPS, PAD).backward()
        return [p.grad for p in model.parameters()]

    def oracle_forward() -> np.ndarray:
        return forward(params, src_np, tgt_np, mask_np, mask_np)

    def oracle_train() -> object:
        return loss_and_grads(params, src_np, tgt_np, out_np, mask_np, mask_np, EPS, PAD)

    backward_clocks: list[Clocks] = []

    def oracle_train_split() -> None:
        """loss_and_grads' two halves, the backward's clocks kept on their own."""
        _, _, dlogits, enc_cache, dec_cache = forward_for_grads(
            params, src_np, tgt_np, out_np, mask_np, mask_np, EPS, PAD
        )
        backward_clocks.append(timed(lambda: backward(params, dlogits, enc_cache, dec_cache)))

    rng = np.random.default_rng(0)
    a, b = (rng.standard_normal((args.matmul, args.matmul)) for _ in range(2))
    runs: dict[str, Callable[[], object]] = {
        "oracle forward": oracle_forward,
        "torch forward": torch_forward,
        "oracle forward+backward": oracle_train_split,
        "torch forward+backward": torch_train,
        "matmul": lambda: a @ b,
    }
    times: dict[str, list[Clocks]] = {k: [] for k in runs}
    load_before, started = _load(), datetime.datetime.now().astimezone()
    for repeat in range(args.repeats + 1):  # the first round warms up and is not counted
        names = list(runs)
        names = names[repeat % len(names) :] + names[: repeat % len(names)]
        for name in names:
            clocks = timed(runs[name])
            if repeat:
                times[name].append(clocks)
        if not repeat:
            backward_clocks.clear()
    times["oracle backward"] = backward_clocks
    load_after = _load()
    mem_oracle_train = numpy_peak_bytes(oracle_train)
    model.zero_grad(set_to_none=True)  # the gradients of the timed runs are not the profile's
    mem_torch_train = torch_peak_bytes(torch_train)
    mem_oracle_forward = numpy_peak_bytes(oracle_forward)
    mem_torch_forward = torch_peak_bytes(torch_forward)
    inputs = (src_np, tgt_np, out_np, mask_np, mask_np, EPS, PAD)
    paired = [] if args.paired_with is None else paired_lines(args, model, params, inputs)

    spec = params.spec
    flops = backward_matmul_flops(spec, B, L, L)
    lines = [
        f"date {started:%Y-%m-%d %H:%M %Z}, git {_git_commit()}, "
        f"python {sys.version.split()[0]}, numpy {np.__version__}, torch {torch.__version__}",
        f"machine: {os.cpu_count()} cpus, load average (1, 5, 15 min) {load_before} before the "
        f"timed repeats, {load_after} after",
        f"threads: torch {torch.get_num_threads()}, numpy BLAS {numpy_threads}",
        f"oracle: {_oracle_dir()}",
        f"model d={spec.d_model} h={spec.n_heads} d_ff={spec.d_ff} {spec.n_enc}+{spec.n_dec} "
        f"layers, V={spec.tgt_vocab} (tied), B={B} S=T={L}; "
        f"medians of {args.repeats} interleaved repeats",
        "",
        f"{'':<24}{'wall s':>9}{'cpu s':>9}",
    ]
    med = {
        name: Clocks(
            statistics.median(c.wall for c in clocks), statistics.median(c.cpu for c in clocks)
        )
        for name, clocks in times.items()
    }
    for name, m in med.items():
        lines.append(f"{name:<24}{m.wall:>9.3f}{m.cpu:>9.3f}")
    lines += ["", f"{'ratio':<40}{'wall':>7}{'cpu':>7}  target"]

    def ratio_line(label: str, ours: Clocks, theirs: Clocks, target: str) -> str:
        return f"{label:<40}{ours.wall / theirs.wall:>7.2f}{ours.cpu / theirs.cpu:>7.2f}  {target}"

    lines.append(
        ratio_line(
            "forward, oracle / torch",
            med["oracle forward"],
            med["torch forward"],
            f"<= {FORWARD_TARGET}",
        )
    )
    lines.append(
        ratio_line(
            "forward+backward, oracle / torch",
            med["oracle forward+backward"],
            med["torch forward+backward"],
            f"<= {TRAIN_TARGET}",
        )
    )
    mm_flops = 2 * args.matmul**3
    peak = Clocks(mm_flops / med["matmul"].wall / 1e9, mm_flops / med["matmul"].cpu / 1e9)
    achieved = Clocks(
        flops / med["oracle backward"].wall / 1e9, flops / med["oracle backward"].cpu / 1e9
    )
    lines.append(
        f"{'backward / np.matmul throughput':<40}{achieved.wall / peak.wall:>7.0%}"
        f"{achieved.cpu / peak.cpu:>7.0%}  >= {BACKWARD_SHARE_TARGET:.0%}"
    )
    lines.append(
        f"  the backward's {flops / 1e9:.1f} GFLOP of matmuls at {achieved.wall:.1f} (wall) / "
        f"{achieved.cpu:.1f} (cpu) GFLOP/s; {args.matmul}x{args.matmul} np.matmul "
        f"{peak.wall:.1f} / {peak.cpu:.1f} GFLOP/s"
    )
    mib = 2**20
    lines.append(
        f"{'peak memory fwd+bwd, oracle / torch':<40}{mem_oracle_train / mem_torch_train:>7.2f}"
        f"{'':>7}  <= {MEMORY_TARGET}"
    )
    lines.append(
        f"  oracle {mem_oracle_train / mib:.1f} MiB (tracemalloc), torch "
        f"{mem_torch_train / mib:.1f} MiB (its CPU allocator); forward alone: oracle "
        f"{mem_oracle_forward / mib:.1f} MiB, torch {mem_torch_forward / mib:.1f} MiB (no_grad)"
    )
    return lines + paired
