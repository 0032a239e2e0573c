"""The dropout laws: dropout only in training mode, and at the configured rate at every site."""

from __future__ import annotations

import math
from collections.abc import Iterator
from typing import Any

import numpy as np

from harness.shared_tests.inputs import (
    batch,
    config,
    forward_inputs,
    pushed_weights,
)
from harness.shared_tests.record import Call, Failure, law
from harness.shared_tests.verdicts import (
    assert_close,
    assert_equal_bits,
    assert_holds,
    errors,
    read_params,
    unit_roundoff,
)

# Dropout at rate 0.5 on every site zeroes or doubles about half of each sublayer's outputs: the
# logits move by O(1). A change below 1e-6 means no dropout ran (float64 rounding is ~1e-15).
DROPOUT_VISIBLE = 1e-6


@law(
    "test_dropout_only_in_training",
    "dropout acts in training mode, with new masks each pass, never in eval mode, and not at all "
    "at dropout=0",
    timeout=20.0,
)
def check_dropout_only_in_training(call: Call) -> None:
    # Training mode drops out (each forward pass draws new masks); eval mode does not, before
    # and after training mode, so eval logits stay equal to each other.
    cfg = config(dropout=0.5, n_enc=1, n_dec=1)
    b = forward_inputs(batch(np.random.default_rng(23), cfg, src_lens=[5, 3], tgt_lens=[4, 4]))
    weights = pushed_weights(call, [cfg], "dropout in training")[0]
    r = call("dropout_logits", cfg=cfg, weights=weights, **b)
    assert_holds("dropout=0.5", r["state_dict"], weights)
    mask = b["tgt_mask"]
    before, after = r["eval"]
    try:
        assert_close("eval-mode logits after a training-mode pass", after, before, 0.0, mask=mask)
    except Failure as e:
        raise Failure(f"{e}{eval_cause(call, cfg, weights, b)}") from None
    for i, train in enumerate(r["train"]):
        change = errors(train, before, mask)[0].max()
        if not change > DROPOUT_VISIBLE:
            raise Failure(
                f"training-mode pass {i} with dropout=0.5 gave the eval-mode logits (max change "
                f"{change:.3g}): dropout is not applied in training mode"
            )
    change = errors(r["train"][1], r["train"][0], mask)[0].max()
    if not change > DROPOUT_VISIBLE:
        raise Failure(
            f"two training-mode passes gave the same logits (max change {change:.3g}): "
            "dropout draws no new masks"
        )
    # at dropout 0 training mode computes what eval mode does: the same bits (gradients on, so
    # torch's own layers take the same path in both modes)
    zero = {**cfg, "dropout": 0.0}
    r = call("train_eval_logits", cfg=zero, weights=weights, **b)
    assert_holds("dropout=0", r["state_dict"], weights)
    assert_equal_bits(
        "dropout=0: training-mode logits vs eval-mode logits",
        r["train"],
        r["eval"],
        ("row", "position", "token"),
    )


def eval_cause(call: Call, cfg: dict, weights: dict, b: dict) -> str:
    """Why two eval-mode passes differ, when established: at dropout=0 (the same weights and
    inputs) they agree, so the rate is what moves them: dropout acts in eval mode."""
    try:
        zero = call("dropout_logits", cfg={**cfg, "dropout": 0.0}, weights=weights, **b)
        first, second = (np.asarray(x, dtype=np.float64) for x in zero["eval"])
    except (Failure, KeyError, TypeError, ValueError):  # nothing to tell by: no cause said
        return ""
    if first.shape != second.shape or not np.array_equal(first, second):
        return ""
    return (
        "; dropout acts in eval mode: the eval-mode passes differ at dropout=0.5 and agree at "
        "dropout=0 (F.dropout(x, p) without training=self.training, or a module left in "
        "training mode)"
    )


# The false-alarm budget of the dropout-site test, split evenly over its rate checks (a union
# bound): each check's two-sided Hoeffding bound P(|k/n - p| >= e) <= 2 exp(-2 n e^2) sets e.
DROPOUT_FALSE_ALARM = 1e-6


def rate_margin(n: int, checks: int) -> float:
    """The e with 2 exp(-2 n e^2) = DROPOUT_FALSE_ALARM / checks: an honest site's fraction of
    dropped elements lies within e of the rate but with probability below that share."""
    return math.sqrt(math.log(2 * checks / DROPOUT_FALSE_ALARM) / (2 * n))


# Each sublayer's residual: (stack, norm) -> [(site, before, after, sublayer)], where after -
# before is the sublayer's output after its dropout; (module, "in"/"out") names what a hook saw
# ("" is the layer itself).
RESIDUALS = {
    ("encoder", "post"): [
        ("encoder self-attention output", ("", "in"), ("norm1", "in"), "self_attn"),
        ("encoder feed-forward output", ("norm1", "out"), ("norm2", "in"), "linear2"),
    ],
    ("encoder", "pre"): [
        ("encoder self-attention output", ("", "in"), ("norm2", "in"), "self_attn"),
        ("encoder feed-forward output", ("norm2", "in"), ("", "out"), "linear2"),
    ],
    ("decoder", "post"): [
        ("decoder self-attention output", ("", "in"), ("norm1", "in"), "self_attn"),
        ("decoder cross-attention output", ("norm1", "out"), ("norm2", "in"), "cross_attn"),
        ("decoder feed-forward output", ("norm2", "out"), ("norm3", "in"), "linear2"),
    ],
    ("decoder", "pre"): [
        ("decoder self-attention output", ("", "in"), ("norm2", "in"), "self_attn"),
        ("decoder cross-attention output", ("norm2", "in"), ("norm3", "in"), "cross_attn"),
        ("decoder feed-forward output", ("norm3", "in"), ("", "out"), "linear2"),
    ],
}


def residual_sites(cfg: dict) -> Iterator[tuple[str, tuple[str, str], tuple[str, str], str]]:
    """RESIDUALS for every layer of cfg, with the modules' full contract names."""
    for stack, n in (("encoder", cfg["n_enc"]), ("decoder", cfg["n_dec"])):
        for i in range(n):
            layer = f"{stack}.{i}"

            def full(sub: str, layer: str = layer) -> str:
                return f"{layer}.{sub}" if sub else layer

            for site, (b, b_end), (a, a_end), sub in RESIDUALS[(stack, cfg["norm"])]:
                yield site, (full(b), b_end), (full(a), a_end), full(sub)


def dropout_observations(
    r: dict, cfg: dict, tol: float
) -> dict[str, list[tuple[np.ndarray, np.ndarray]]]:
    """site -> [(got, want)]: what the training pass gave at the site, and what it would give
    with nothing dropped (each element: 0 when dropped, want when kept).

    A sublayer or feed-forward whose eval pass does not have the contract's form (after - before
    is not the sublayer's output, linear2 does not read relu(linear1)) is left out: that is a
    value fault, the value tests' to charge, and its dropout cannot be told from it here."""
    p, train, evals = cfg["dropout"], r["train"], r["eval"]

    def holds(got: np.ndarray, want: np.ndarray) -> bool:
        return got.shape == want.shape and bool(
            np.all(np.abs(got - want) <= tol * max(1.0, float(np.abs(want).max(initial=0.0))))
        )

    def seen(where: dict, name: str, end: str) -> np.ndarray:
        try:
            return np.asarray(where[name][end], dtype=np.float64)
        except KeyError:
            raise Failure(
                f"no {'input' if end == 'in' else 'output'} of the contract's module {name} was "
                "seen in a forward pass: its dropout cannot be observed"
            ) from None

    sites: dict[str, list[tuple[np.ndarray, np.ndarray]]] = {}
    for stack in ("encoder", "decoder"):
        # the first layer's input is the embedded sequence after its dropout
        site = f"embeddings ({'source' if stack == 'encoder' else 'target'})"
        got, want = seen(train, f"{stack}.0", "in"), seen(evals, f"{stack}.0", "in") / (1 - p)
        sites[site] = [(got, want)]
    for site, before, after, sub in residual_sites(cfg):
        if not holds(seen(evals, *after) - seen(evals, *before), seen(evals, sub, "out")):
            continue
        got = seen(train, *after) - seen(train, *before)
        sites.setdefault(site, []).append((got, seen(train, sub, "out") / (1 - p)))
    for stack, n in (("encoder", cfg["n_enc"]), ("decoder", cfg["n_dec"])):
        for i in range(n):
            one, two = f"{stack}.{i}.linear1", f"{stack}.{i}.linear2"
            if not holds(seen(evals, two, "in"), np.maximum(seen(evals, one, "out"), 0.0)):
                continue
            hidden = np.maximum(seen(train, one, "out"), 0.0)
            got = seen(train, two, "in")
            sites.setdefault(f"inside the {stack} feed-forward", []).append((got, hidden / (1 - p)))
    return sites


# How many times the rounding estimate of a dropped head's computed output (see dropped_heads)
# still counts as 0: a kept head outputs its key's value, O(0.1-1) of the scale. The earlier 1e3
# eps cond(W) took float32 heads of a few percent of the scale for dropped ones (a false alarm on
# an honest float32 subject).
HEAD_NOISE = 30.0


def dropped_heads(r: dict, cfg: dict, params: Any) -> dict[str, np.ndarray]:
    """site -> bool per (row, query, head) of queries that read exactly one key: is that head's
    output zero (dropped) rather than its kept value? One readable key has softmax weight 1, so
    the head outputs that key's value, or nothing when the weight is dropped; out_proj's inverse
    (read from the weights) splits an attention output into its heads.

    An attention whose eval pass does not output the one key's value (v_proj of it) there reads
    other keys or other values: a mask or value fault, the value tests' to charge, left out."""
    h = cfg["n_heads"]
    out: dict[str, list[np.ndarray]] = {}
    last = "enc_norm" if cfg["norm"] == "pre" else f"encoder.{cfg['n_enc'] - 1}"

    def split(a: np.ndarray, w: np.ndarray, b: np.ndarray) -> np.ndarray:
        """a [.., d] = concat(heads) W^T + b -> heads [.., h, d_k]."""
        heads = np.linalg.solve(w, (a - b).reshape(-1, a.shape[-1]).T).T
        return heads.reshape(*a.shape[:-1], h, -1)

    def value(where: dict, name: str, cross: bool) -> np.ndarray | None:
        """[B, 1, h, d_k]: the one key's value per head, from the keys a pass fed attention
        `name` (the encoder's output for cross-attention)."""
        keys = where.get(last, {}).get("out") if cross else where.get(name, {}).get("in")
        if keys is None:
            return None
        w, b = params.arrays[f"{name}.v_proj.weight"], params.arrays[f"{name}.v_proj.bias"]
        v = np.asarray(keys, dtype=np.float64)[:, :1] @ w.T + b
        return v.reshape(v.shape[0], 1, h, -1)

    single = [
        ("encoder self-attention weights", "encoder", cfg["n_enc"], "self_attn", slice(None)),
        ("decoder self-attention weights", "decoder", cfg["n_dec"], "self_attn", slice(0, 1)),
        ("cross-attention weights", "decoder", cfg["n_dec"], "cross_attn", slice(None)),
    ]
    for site, stack, n, attn, queries in single:
        for i in range(n):
            name = f"{stack}.{i}.{attn}"
            if "out" not in r["train"].get(name, {}):
                raise Failure(f"no output of the contract's module {name} was seen in training")
            a = np.asarray(r["train"][name]["out"], dtype=np.float64)[:, queries]  # [B, Q, d]
            w = params.arrays[f"{name}.out_proj.weight"]
            b = params.arrays[f"{name}.out_proj.bias"]
            heads = split(a, w, b)
            # a dropped head is 0 before out_proj; after it and the solve, within the rounding of
            # out_proj's sums (u sqrt(d) of the scale) magnified by cond(W): HEAD_NOISE times that
            u = unit_roundoff(r["dtype"])
            scale = max(1.0, float(np.abs(heads).max()))
            zero = HEAD_NOISE * u * math.sqrt(w.shape[0]) * np.linalg.cond(w) * scale
            # the premise, in the eval pass: each of these queries outputs its one key's value
            v_eval, v_train = (
                value(r[mode], name, attn == "cross_attn") for mode in ("eval", "train")
            )
            a_eval = r["eval"].get(name, {}).get("out")
            if v_eval is None or v_train is None or a_eval is None:
                continue
            heads_eval = split(np.asarray(a_eval, dtype=np.float64)[:, queries], w, b)
            if heads_eval.shape[0] != v_eval.shape[0] or not np.all(
                np.abs(heads_eval - v_eval) <= zero
            ):
                continue
            # a head counts where its two candidates, 0 (dropped) and its kept value / (1 - p)
            # (of the training pass's keys, which dropout upstream changed), lie over 2 `zero`
            # apart, and is dropped when within `zero` of 0 (a head kept without the 1 / (1 - p)
            # is not: c03). A nearly singular out_proj (one bfloat16 draw: smallest singular
            # value 3.9e-5) puts `zero` above every head: its layer then tells nothing (counted
            # as dropped, an honest model's rate read 0.82)
            kept = v_train / (1 - cfg["dropout"])
            to_zero = np.abs(heads).max(axis=-1)
            apart = np.broadcast_to(np.abs(kept).max(axis=-1) > 2 * zero, to_zero.shape)
            out.setdefault(site, []).append((to_zero <= zero)[apart])
    return {site: np.concatenate([m.ravel() for m in masks]) for site, masks in out.items()}


# A site's value in the training pass against what the subject's own eval pass says it would be
# without dropout (each kept element times 1/(1 - p)): one computation apart, no oracle between
# them, so the bound is in units of the subject's dtype's roundoff u relative to the site's scale
# max(1, max |value|): the dropout's scaling, the residual sum the probe subtracts its input
# from (|x + F(x)| is at most a few times the scale for these inputs) and the hook's copy each
# round once by at most u of their value; 64 u is ten times the handful of roundings.
RECONSTRUCTION_ROUNDINGS = 64


@law(
    "test_dropout_at_every_site",
    "training mode drops embeddings, attention weights, sublayer outputs and the feed-forward's "
    "hidden units at the configured rate, scaling the rest by 1/(1 - p)",
    timeout=20.0,
)
def check_dropout_at_every_site(call: Call) -> None:
    # One training pass at p = 0.5 against an eval pass of the same model, seen through hooks on
    # the contract's modules: at each site every element is either 0 (dropped) or its undropped
    # value / (1 - p) (kept), and the dropped fraction is p within a Hoeffding margin. A one-key
    # source (S = 1) makes every encoder and cross-attention query read one key, whose weight
    # is 1: dropping it zeroes that head's output, which out_proj's inverse shows.
    p = 0.5
    rng = np.random.default_rng(25)
    results = []
    for norm in ("post", "pre"):
        cfg = config(dropout=p, norm=norm)
        b = forward_inputs(batch(rng, cfg, src_lens=[1] * 64, tgt_lens=[6] * 64))
        weights = pushed_weights(call, [cfg], "dropout sites", norm)[0]
        r = call("dropout_sites", cfg=cfg, weights=weights, **b, draw=27)
        assert_holds(f"{norm}-LN", r["state_dict"], weights)
        tol = unit_roundoff(r["dtype"]) * RECONSTRUCTION_ROUNDINGS
        for site, pairs in dropout_observations(r, cfg, tol).items():
            got = np.concatenate([g.ravel() for g, _ in pairs])
            want = np.concatenate([w.ravel() for _, w in pairs])
            scale = max(1.0, float(np.abs(want).max()))
            dropped = np.abs(got) <= tol * scale
            kept = np.abs(got - want) <= tol * scale
            neither = np.flatnonzero(~dropped & ~kept)
            if len(neither):
                i = neither[0]
                undropped = np.abs(got - want * (1 - p)) <= tol * scale
                hint = ": nothing is dropped here" if undropped[neither].all() else ""
                raise Failure(
                    f"{norm}-LN, {site}: an element is {got[i]:.8g} in training mode, neither 0 "
                    f"(dropped) nor its value without dropout / (1 - p) = {want[i]:.8g} (kept); "
                    f"{len(neither)} of {len(got)} elements are neither{hint}"
                )
            seen_ = dropped != kept  # an element whose undropped value is 0 tells nothing
            results.append((norm, site, int(dropped[seen_].sum()), int(seen_.sum())))
        try:
            params = read_params(weights, cfg)
        except Failure:
            continue  # names the contract's reader cannot read: the names tests charge that
        for site, zero in dropped_heads(r, cfg, params).items():
            if len(zero):  # none where out_proj is too ill-conditioned for its heads to be told
                results.append((norm, site, int(zero.sum()), len(zero)))
    for norm, site, k, n in results:
        margin = rate_margin(n, len(results))
        if not abs(k / n - p) < margin:
            raise Failure(
                f"{norm}-LN, {site}: {k} of {n} elements dropped in training mode ({k / n:.3f}), "
                f"expected the rate {p} within {margin:.3f} (an honest model lands outside with "
                f"probability below {DROPOUT_FALSE_ALARM / len(results):.1e})"
            )
