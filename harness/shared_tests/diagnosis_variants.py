"""The contract's functions with one common student fault written in, in numpy (float64): the
diagnosis establishes a cause only by recomputing a module (or a layer) from the subject's own
input with the fault applied and finding the subject's output there within the walk's tolerance
(`agrees`), never from the size or pattern of an error.

- attention (`attention_variant`): the scores not scaled, divided by d_k or sqrt(d_model); the
  softmax over the queries; the heads split as view(B, h, T, d_k) or merged without the
  transpose; the mask inverted or its scores filled with 0 instead of -inf;
- LayerNorm (`norm_fault_candidates`): over the positions, the batch or (positions, features),
  or without its weight and bias;
- a pre-LN layer whose residual is taken after the norm (`residual_after_norm`).
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from harness.shared_tests.diagnosis_answer import Candidate
from oracle.ops import layer_norm, linear, merge_heads, relu, split_heads


def agrees(got: np.ndarray, want: np.ndarray, mask: np.ndarray | None, tol: float) -> bool:
    """Whether `got` is `want` over the real positions (`mask`, broadcast from the left): the
    same entries not finite (a fault that divides 0 by 0 gives NaN at the same places in both),
    and the finite ones within tol of their scale. Nothing finite to compare: not established."""
    got, want = np.asarray(got, dtype=np.float64), np.asarray(want, dtype=np.float64)
    if got.shape != want.shape:
        return False
    keep = np.ones(want.shape, dtype=bool)
    if mask is not None:
        keep = np.broadcast_to(
            mask.reshape(mask.shape + (1,) * (want.ndim - mask.ndim)), want.shape
        )
    odd_got, odd_want = ~np.isfinite(got), ~np.isfinite(want)
    if np.any((odd_got != odd_want) & keep):
        return False
    both = keep & ~odd_got
    if not both.any():
        return False
    scale = max(1.0, float(np.abs(want[both]).max()))
    return float(np.abs(got - want)[both].max()) / scale <= tol


def attention_variant(
    q: np.ndarray,
    kv: np.ndarray,
    p: dict[str, np.ndarray],
    mask: np.ndarray,
    h: int,
    *,
    divisor: float | None = None,
    axis: int = -1,
    split: str = "right",
    merge: str = "right",
    fill: str = "-inf",
) -> np.ndarray:
    """MultiHead(q, kv) (oracle.layers.multi_head_attention) with one fault: the scores divided
    by `divisor` (sqrt(d_k) when None); the softmax over `axis`; `split` 'view' (view(B, h, T,
    d_k), no transpose) and `merge` 'reshape' ([B, h, T, d_k] reshaped to [B, T, d]); `fill`
    'inverted' (the readable scores get -inf), 'zero' (the masked ones get 0)."""
    B, T, d = q.shape

    def heads(x: np.ndarray) -> np.ndarray:
        if split == "view":
            return x.reshape(x.shape[0], h, x.shape[1], d // h)
        return split_heads(x, h)

    Q = heads(linear(q, p["q_proj.weight"], p["q_proj.bias"]))
    K = heads(linear(kv, p["k_proj.weight"], p["k_proj.bias"]))
    V = heads(linear(kv, p["v_proj.weight"], p["v_proj.bias"]))
    scores = Q @ K.swapaxes(-1, -2) / (math.sqrt(d // h) if divisor is None else divisor)
    mask = np.broadcast_to(mask, scores.shape)
    if fill == "inverted":
        scores = np.where(mask, -np.inf, scores)
    elif fill == "zero":
        scores = np.where(mask, scores, 0.0)
    else:
        scores = np.where(mask, scores, -np.inf)
    with np.errstate(invalid="ignore"):  # a row or column of -inf only: NaN, as torch gives
        e = np.exp(scores - scores.max(axis=axis, keepdims=True))
        weights = e / e.sum(axis=axis, keepdims=True)
    out = weights @ V  # [B, h, T, d_k]
    concat = out.reshape(B, T, d) if merge == "reshape" else merge_heads(out)
    return linear(concat, p["out_proj.weight"], p["out_proj.bias"])


def attention_fault_candidates(
    q: np.ndarray, kv: np.ndarray, p: dict, mask: np.ndarray, h: int
) -> list[Candidate]:
    """The attention faults students write, each as the module's output from its own inputs."""
    d = q.shape[-1]
    d_k = d // h
    faults: list[tuple[dict[str, Any], str]] = [
        (
            {"divisor": 1.0},
            "the attention scores are not divided by sqrt(d_k): softmax(Q K^T / sqrt(d_k)) V",
        ),
        (
            {"divisor": float(d_k)},
            "the attention scores are divided by d_k, not by sqrt(d_k)",
        ),
        (
            {"divisor": math.sqrt(d)},
            "the scores are divided by sqrt(d_model), not sqrt(d_k) = sqrt(d_model / n_heads)",
        ),
        (
            {"axis": -2},
            "the attention's softmax runs over the queries (dim=-2): each query's weights "
            "over the keys must sum to 1, softmax(dim=-1)",
        ),
        (
            {"split": "view"},
            "the heads are split by x.view(B, h, T, d_k), which mixes positions: split with "
            "x.view(B, T, h, d_k).transpose(1, 2)",
        ),
        (
            {"merge": "reshape"},
            "the heads are merged by reshaping [B, h, T, d_k] to [B, T, d] without "
            "transpose(1, 2) first, which mixes positions",
        ),
        (
            {"split": "view", "merge": "reshape"},
            "the heads are split by x.view(B, h, T, d_k) and merged by reshaping [B, h, T, d_k] "
            "to [B, T, d], both without the transpose(1, 2), which mixes positions",
        ),
        (
            {"fill": "inverted"},
            "the attention mask is inverted: the positions it allows get -inf and the masked "
            "ones are read (True means readable)",
        ),
        (
            {"fill": "zero"},
            "masked attention scores are set to 0, not -inf, so masked positions still get "
            "weight after the softmax",
        ),
    ]
    return [
        Candidate(str(kw), attention_variant(q, kv, p, mask, h, **kw), cause)
        for kw, cause in faults
    ]


def norm_fault_candidates(
    z: np.ndarray, gamma: np.ndarray, beta: np.ndarray, eps: float
) -> list[Candidate]:
    """A LayerNorm over other axes than the features' (from a [B, T, d] input, padding
    included, as a hand-written norm computes it), or without its weight and bias."""
    out = []
    if z.ndim == 3:
        for axes, said in (
            ((1,), "the positions (dim 1)"),
            ((0,), "the batch (dim 0)"),
            ((1, 2), "the positions and the features together"),
        ):
            mu = z.mean(axis=axes, keepdims=True)
            var = ((z - mu) ** 2).mean(axis=axes, keepdims=True)
            out.append(
                Candidate(
                    f"axes {axes}",
                    (z - mu) / np.sqrt(var + eps) * gamma + beta,
                    f"the LayerNorm normalises over {said}, not over the features: the mean "
                    "and variance are over the last dimension, d_model",
                )
            )
    d = z.shape[-1]
    out.append(
        Candidate(
            "no affine",
            layer_norm(z, np.ones(d), np.zeros(d), eps),
            "the LayerNorm never applies its weight and bias: LN(x) = (x - mean) / sqrt(var + "
            "eps) * weight + bias",
        )
    )
    return out


def residual_after_norm(kind: str, x: np.ndarray, p: dict, args: tuple, spec: Any) -> np.ndarray:
    """A pre-LN layer whose residual starts after the norm: x <- LN(x) + F(LN(x)) for each
    sublayer (ReLU feed-forward; args as diagnosis.judge_layer gives them: x, memory, the
    self-attention's and the cross-attention's masks)."""

    def sub(name: str) -> dict[str, np.ndarray]:
        return {k[len(name) + 1 :]: v for k, v in p.items() if k.startswith(name + ".")}

    def norm(name: str, z: np.ndarray) -> np.ndarray:
        return layer_norm(z, p[f"{name}.weight"], p[f"{name}.bias"], spec.ln_eps)

    def attention(name: str, z: np.ndarray, kv: np.ndarray, mask: np.ndarray) -> np.ndarray:
        return attention_variant(z, kv, sub(name), mask, spec.n_heads)

    def ffn(z: np.ndarray) -> np.ndarray:
        hidden = relu(linear(z, p["linear1.weight"], p["linear1.bias"]))
        return linear(hidden, p["linear2.weight"], p["linear2.bias"])

    z = norm("norm1", x)
    z = z + attention("self_attn", z, z, args[2])
    if kind == "decoder":
        z = norm("norm2", z)
        z = z + attention("cross_attn", z, args[1], args[3])
    z = norm("norm3" if kind == "decoder" else "norm2", z)
    return z + ffn(z)
