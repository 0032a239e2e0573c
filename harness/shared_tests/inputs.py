"""What the shared tests feed a subject: tiny contract configs, padded batches, parent-drawn
weights, and the learning task's data. Every input is chosen here, in the parent, from seeded
generators; none comes from the subject."""

from __future__ import annotations

import ast
import hashlib
import json
import os
import secrets
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np

import oracle
from oracle.readers.state_dict import contract_keys, expected_shape

PAD, BOS, EOS = 0, 1, 2  # the synthetic vocabularies' special ids; real tokens are 3..V-1


DATA = Path(__file__).resolve().parents[1] / "data"


def config(**kw: Any) -> dict[str, Any]:
    """A tiny contract config (every field given, so any subject's dataclass accepts it)."""
    base = dict(
        src_vocab=13,
        tgt_vocab=13,
        d_model=16,
        n_heads=2,
        d_ff=32,
        n_enc=2,
        n_dec=2,
        dropout=0.1,
        norm="post",
        tie_embeddings=True,
        max_len=32,
        ln_eps=1e-5,
    )
    return {**base, **kw}


# Both norms and every tying: post with one shared table, pre with a shared target/output table
# (vocabularies differ), post untied.
GOLDEN = {
    "post-LN, one shared table": config(),
    # an eps other than torch's default: a LayerNorm built without cfg.ln_eps moves the logits by
    # ~5e-4 here, far above any tolerance
    "pre-LN, target table is the output layer, ln_eps 1e-3": config(
        norm="pre", src_vocab=11, ln_eps=1e-3
    ),
    "post-LN, untied": config(tie_embeddings=False, tgt_vocab=11),
}


POST, PRE = GOLDEN["post-LN, one shared table"], config(norm="pre")


def golden_inputs() -> Iterator[tuple[str, dict[str, Any], dict[str, np.ndarray]]]:
    """The golden test's (name, config, batch) for each of GOLDEN, in order: the golden test
    and the diagnosis of its failures both take their inputs from here (their weights: the run's
    draw, `golden_weights`)."""
    rng = np.random.default_rng(1)
    for name, cfg in GOLDEN.items():
        yield name, cfg, batch(rng, cfg, src_lens=[7, 4, 2], tgt_lens=[6, 3, 5])


# The seed of a subject's own initialization where a test of the project runs a probe without
# the parent's weights (tests/harness_tests/shared_tests/test_diagnosis.py); no shared test uses it.
GOLDEN_SEED = 11


def tokens(rng: np.random.Generator, vocab: int, shape: tuple[int, ...]) -> np.ndarray:
    return rng.integers(3, vocab, size=shape, dtype=np.int64)


def batch(
    rng: np.random.Generator, cfg: dict, src_lens: list[int], tgt_lens: list[int]
) -> dict[str, np.ndarray]:
    """src padded to the longest, and tgt = bos y1.. eos pad.. split into tgt_in and tgt_out.

    tgt_lens counts the real positions of tgt_in (bos included).
    """
    S, T = max(src_lens), max(tgt_lens)
    src = tokens(rng, cfg["src_vocab"], (len(src_lens), S))
    src[np.arange(S) >= np.array(src_lens)[:, None]] = PAD
    tgt = np.full((len(tgt_lens), T + 1), PAD, dtype=np.int64)
    for b, n in enumerate(tgt_lens):
        tgt[b, 0] = BOS
        tgt[b, 1:n] = tokens(rng, cfg["tgt_vocab"], (n - 1,))
        tgt[b, n] = EOS
    tgt_in, tgt_out = tgt[:, :-1], tgt[:, 1:]
    return {
        "src": src,
        "tgt_in": tgt_in,
        "tgt_out": tgt_out,
        "src_mask": src != PAD,
        "tgt_mask": tgt_in != PAD,
    }


def changed(rng: np.random.Generator, ids: np.ndarray, vocab: int, start: int) -> np.ndarray:
    """ids with every real token from position `start` on replaced by a different real token."""
    out = ids.copy()
    tail = out[:, start:]
    shift = rng.integers(1, vocab - 3, tail.shape)  # never 0: every token changes
    out[:, start:] = (tail - 3 + shift) % (vocab - 3) + 3
    return out


def forward_inputs(b: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    return {k: b[k] for k in ("src", "tgt_in", "src_mask", "tgt_mask")}


def tying(cfg: dict) -> str:
    """The contract's tying scheme of a config: one table (all), target and output (tgt_out),
    or none."""
    if not cfg["tie_embeddings"]:
        return "none"
    return "all" if cfg["src_vocab"] == cfg["tgt_vocab"] else "tgt_out"


def contract_shapes(cfg: dict) -> dict[str, tuple[int, ...]]:
    """The contract's state_dict names and shapes for `cfg`."""
    names = contract_keys(cfg["n_enc"], cfg["n_dec"], cfg["norm"], tying(cfg))
    dims = (cfg["d_model"], cfg["d_ff"], cfg["src_vocab"], cfg["tgt_vocab"])
    return {name: expected_shape(name, *dims) for name in names}


# --- the parent's weights ----------------------------------------------------------------------
#
# Every value and law test runs the subject on weights the parent draws afresh for each run and
# pushes in through the subject's own parameter names: a subject's own initialization decides no
# verdict but the init test's (a model whose every weight is 0 gives trivial expectations: logits
# 0, a loss of log V, gradients 0). The run's secret seeds every draw; it is drawn once per
# process, unless XFMR_DRAW_SEED sets it (an integer: to reproduce a run).
_SECRET = [int(os.environ.get("XFMR_DRAW_SEED") or secrets.randbits(63))]


def set_draw_secret(value: int | None) -> None:
    """Fix the run's secret (to reproduce a run), or draw a fresh one (None)."""
    _SECRET[0] = secrets.randbits(63) if value is None else int(value)


def draw_secret() -> int:
    return _SECRET[0]


def draw_seed(*purpose: Any) -> int:
    """A seed for one draw of this run: the run's secret and what the draw is for."""
    digest = hashlib.sha256(repr((_SECRET[0], purpose)).encode()).digest()
    return int.from_bytes(digest[:8], "little")


# The dtype the run's subjects compute in (`--dtype`): None lets each run in float64 where it can
# (else float32). The weights drawn are then numbers of that dtype, so every subject holds
# exactly what the oracle computes with.
RUN_DTYPES = ("float64", "float32", "bfloat16", "float16")
_RUN_DTYPE: list[str | None] = [None]


def set_run_dtype(dtype: str | None) -> None:
    if dtype is not None and dtype not in RUN_DTYPES:
        raise ValueError(f"dtype must be one of {RUN_DTYPES}, got {dtype!r}")
    _RUN_DTYPE[0] = dtype


def run_dtype() -> str | None:
    return _RUN_DTYPE[0]


def in_run_dtype(values: np.ndarray) -> np.ndarray:
    """float64 values rounded to numbers of the run's dtype: float32 by default (exact in float32
    and float64 alike), bfloat16's or float16's in such a run."""
    f32 = values.astype(np.float32)
    if _RUN_DTYPE[0] == "bfloat16":  # round to nearest even on the upper 16 bits
        bits = f32.view(np.uint32).astype(np.uint64)
        rounded = (bits + np.uint64(0x7FFF) + ((bits >> np.uint64(16)) & np.uint64(1))) & np.uint64(
            0xFFFF0000
        )
        f32 = rounded.astype(np.uint32).view(np.float32)
    elif _RUN_DTYPE[0] == "float16":
        f32 = f32.astype(np.float16).astype(np.float32)
    return f32.astype(np.float64)


def draw_weights(
    shapes: dict[str, list[int]],
    cfg: dict,
    seed: int,
    aliases: dict[str, str] | None = None,
) -> dict[str, np.ndarray]:
    """Parent-chosen weights for the subject's state_dict names: tables N(0, 1/d), matrices
    N(0, 1/fan_in), LayerNorm gains near 1, biases near 0: full rank, at the contract's scale.
    Names that share one tensor in the subject (`aliases`: name -> the first name of its tensor)
    get one value. Every value is a number of the run's dtype (float32 by default, `in_run_dtype`),
    so a subject holds exactly what the oracle computes with, in any dtype of the run."""
    rng = np.random.default_rng(seed)
    aliases = aliases or {}
    out: dict[str, np.ndarray] = {}
    for name, shape in sorted(shapes.items()):
        if aliases.get(name, name) != name:
            continue
        if len(shape) == 2:
            fan_in = cfg["d_model"] if name.endswith("emb.weight") else shape[1]
            value = rng.normal(0.0, fan_in**-0.5, shape)
        elif "norm" in name and name.endswith(".weight"):
            value = 1.0 + 0.1 * rng.normal(size=shape)
        else:
            value = 0.1 * rng.normal(size=shape)
        out[name] = in_run_dtype(value)
    for name in shapes:
        first = aliases.get(name, name)
        if first != name:
            out[name] = out[first]
    return out


def pushed_weights(call: Any, cfgs: list[dict], *purpose: Any) -> list[dict[str, np.ndarray]]:
    """For each config, weights drawn for this run under the subject's own parameter names and
    shapes (the probe parameter_layout), to push into its model."""
    layouts = call("parameter_layout", cfgs=cfgs)
    if not isinstance(layouts, list) or len(layouts) != len(cfgs):
        raise ValueError(f"parameter_layout gave {type(layouts).__name__}, not one per config")
    return [
        draw_weights(layout["shapes"], cfg, draw_seed(*purpose, i), layout["aliases"])
        for i, (cfg, layout) in enumerate(zip(cfgs, layouts, strict=True))
    ]


def golden_weights(call: Any, name: str, cfg: dict) -> dict[str, np.ndarray]:
    """This run's weights for one golden config, under the subject's names: the golden test and
    the diagnosis of its failures draw the same ones."""
    return pushed_weights(call, [cfg], "golden", name)[0]


def contract_params(cfg: dict, seed: int) -> Any:
    """The oracle's Params of the contract's model for `cfg`, on weights the parent draws."""
    shapes = {name: list(shape) for name, shape in contract_shapes(cfg).items()}
    return oracle.read_state_dict(draw_weights(shapes, cfg, seed), cfg)


def learning_setup() -> dict[str, Any]:
    """The learning test's task, model and recipe, with the bar derived from impl."""
    return json.loads((DATA / "learning_bar.json").read_text())


def learning_instance(setup: dict[str, Any], *purpose: Any) -> dict[str, Any]:
    """This run's secret instance of the learning task, so that no weights trained before the run
    fit it: the sums split by a drawn seed, and every real token (+ and the ten digits)
    relabelled by a drawn permutation, the same on both sides (11! instances; with i.i.d.
    embedding rows a relabelling leaves how hard the task is to learn exactly as it was). Four
    disjoint parts: training data (what fit sees), validation sums (the worker's early stop
    reads some of them), test sums, which never leave the parent: the verdict is the oracle's
    loss on them, and unused sums, neither trained on nor tested, so that a subject that lists
    the sums it was not given cannot narrow the test sums: of the task's "held_out" sums (2200
    of the 4095), the worker sees at most the 64 validation sums of the checkpoints; 200 of the
    other 2136 are tested (tests/harness_tests/shared_tests/test_learning_split.py).

    An offset added to every answer was tried as a further task parameter and dropped: offsets
    0-9 spread impl's loss over six instances from 0.14 to 0.73 (0.15-0.29 without), past what
    the bar can allow without passing a decoder blind to the source."""
    from tasks import addition

    task = setup["task"]
    n, n_test = task["digits"], task["n_test"]
    rng = np.random.default_rng(draw_seed("learning task", *purpose))
    seed = int(rng.integers(2**31))
    train, held = addition.split_sums(n, task["held_out"], task["n_train"], seed)
    relabel = np.arange(addition.VOCAB)
    relabel[addition.PLUS :] = rng.permutation(relabel[addition.PLUS :])

    def src(pairs: np.ndarray) -> np.ndarray:
        return relabel[addition.source_array(pairs, n)]

    def tgt(pairs: np.ndarray) -> np.ndarray:
        return relabel[addition.target_array(pairs, n)]

    val, test = held[:n_test], held[n_test : 2 * n_test]  # held's order is the draw's
    return {
        "data": {"src": src(train), "tgt": tgt(train), "pad_id": addition.PAD},
        "val_src": src(val),
        "val_tgt": tgt(val),
        "test_src": src(test),
        "test_tgt": tgt(test),
        "relabel": relabel,
    }


CONTRACT_STUB = Path(__file__).resolve().parents[2] / "impl" / "contract.pyi"


def contract_defaults() -> dict[str, dict[str, Any]]:
    """The defaults impl/contract.pyi gives: TransformerConfig's fields, and each module-level
    function's parameters ({"config": {field: value}, "functions": {name: {param: value}}})."""
    tree = ast.parse(CONTRACT_STUB.read_text())
    config: dict[str, Any] = {}
    functions: dict[str, dict[str, Any]] = {}
    for node in tree.body:
        if isinstance(node, ast.ClassDef) and node.name == "TransformerConfig":
            for field in node.body:
                if (
                    isinstance(field, ast.AnnAssign)
                    and isinstance(field.target, ast.Name)
                    and field.value is not None
                ):
                    config[field.target.id] = ast.literal_eval(field.value)
        elif isinstance(node, ast.FunctionDef):
            args = node.args
            positional = [*args.posonlyargs, *args.args][
                len(args.posonlyargs + args.args) - len(args.defaults) :
            ]
            found = {
                a.arg: ast.literal_eval(d) for a, d in zip(positional, args.defaults, strict=True)
            }
            for a, d in zip(args.kwonlyargs, args.kw_defaults, strict=True):
                if d is not None:
                    found[a.arg] = ast.literal_eval(d)
            functions[node.name] = found
    return {"config": config, "functions": functions}
