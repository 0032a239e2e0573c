"""The pre-LN decoder block of a Flax Linen exercise, read from its variables tree.

    x1  = x_q + SelfAttention(LN0(x_q), causal_mask)
    x2  = x1  + CrossAttention(queries=LN1(x1), keys_and_values=LN2(x_kv))
    out = x2  + Dense_1(relu(Dense_0(LN3(x2))))

Flax lays the parameters out as `params/LayerNorm_{0..3}/{scale,bias}` (epsilon 1e-6),
`params/MultiHeadDotProductAttention_{0,1}/{query,key,value}/kernel` [in, H, D/H] with
`bias` [H, D/H], `.../out/kernel` [H, D/H, D] with `bias` [D], and `params/Dense_{0,1}/kernel`
[in, out] with `bias` [out]. Features are the last axis; any leading axes are batch axes.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np

from oracle.ops import layer_norm, relu, scaled_dot_product_attention

# flax.linen.LayerNorm's default epsilon (torch's is 1e-5).
FLAX_LN_EPS = 1e-6


def flatten_variables(variables: Mapping[str, Any]) -> dict[str, np.ndarray]:
    """Flatten a nested (or already 'a/b/c'-keyed) tree to {'Module/param': float64 array}.

    A leading 'params' collection is dropped, so both `variables` and `variables['params']` work.
    """
    flat: dict[str, np.ndarray] = {}

    def walk(prefix: str, node: Any) -> None:
        if isinstance(node, Mapping):
            for key, child in node.items():
                walk(f"{prefix}/{key}" if prefix else str(key), child)
        else:
            flat[prefix] = np.asarray(node, dtype=np.float64)

    walk("", variables)
    if flat and all(key.startswith("params/") for key in flat):
        flat = {key.removeprefix("params/"): value for key, value in flat.items()}
    return flat


def _get(flat: dict[str, np.ndarray], name: str, shape: tuple[int | None, ...]) -> np.ndarray:
    """The array `name`, checked against `shape` (None matches any size)."""
    if name not in flat:
        raise KeyError(f"Flax variables lack {name!r}; found {sorted(flat)}")
    value = flat[name]
    if value.ndim != len(shape) or any(
        n not in (None, m) for n, m in zip(shape, value.shape, strict=True)
    ):
        raise ValueError(f"{name} has shape {value.shape}, expected {shape} (None: any size)")
    return value


def _layer_norm(flat: dict[str, np.ndarray], name: str, x: np.ndarray) -> np.ndarray:
    d = x.shape[-1]
    scale, bias = _get(flat, f"{name}/scale", (d,)), _get(flat, f"{name}/bias", (d,))
    return layer_norm(x, scale, bias, FLAX_LN_EPS)


def _attention(
    flat: dict[str, np.ndarray],
    name: str,
    x_q: np.ndarray,
    x_kv: np.ndarray,
    h: int,
    mask: np.ndarray,
) -> np.ndarray:
    """Concat(head_1, ..., head_h) W^O + b^O, head_i = Attention(x_q W_i^Q, x_kv W_i^K, x_kv W_i^V)
    (section 3.2.2), with Flax's per-head kernels [in, h, d_k] and out kernel [h, d_k, d]."""
    d = x_q.shape[-1]
    d_k = d // h
    heads = []
    for part, x in (("query", x_q), ("key", x_kv), ("value", x_kv)):
        kernel = _get(flat, f"{name}/{part}/kernel", (x.shape[-1], h, d_k))
        bias = _get(flat, f"{name}/{part}/bias", (h, d_k))
        heads.append(np.einsum("...ti,ihk->...htk", x, kernel) + bias[:, None, :])
    Q, K, V = heads
    out, _ = scaled_dot_product_attention(Q, K, V, mask)  # [.., h, T_q, d_k]
    out_kernel = _get(flat, f"{name}/out/kernel", (h, d_k, d))
    return np.einsum("...htk,hko->...to", out, out_kernel) + _get(flat, f"{name}/out/bias", (d,))


def _dense(flat: dict[str, np.ndarray], name: str, x: np.ndarray, out: int | None) -> np.ndarray:
    """x @ kernel + bias, kernel [in, out]."""
    kernel = _get(flat, f"{name}/kernel", (x.shape[-1], out))
    return x @ kernel + _get(flat, f"{name}/bias", (kernel.shape[1],))


def flax_decoder_block(
    variables: Mapping[str, Any], x_q: Any, x_kv: Any, num_heads: int
) -> np.ndarray:
    """Seed 002's pre-LN decoder block: x_q [.., T_q, D], x_kv [.., T_kv, D_kv] -> [.., T_q, D]."""
    flat = flatten_variables(variables)
    x_q = np.asarray(x_q, dtype=np.float64)
    x_kv = np.asarray(x_kv, dtype=np.float64)
    if x_q.ndim < 2 or x_kv.ndim < 2:
        raise ValueError(f"x_q {x_q.shape} and x_kv {x_kv.shape} must be [.., T, features]")
    d = x_q.shape[-1]
    if num_heads < 1 or d % num_heads:
        raise ValueError(f"num_heads={num_heads} must be positive and divide D={d}")
    t_q, t_kv = x_q.shape[-2], x_kv.shape[-2]
    # key j is visible to query i exactly when j <= i; cross-attention reads every encoder position
    causal = np.tril(np.ones((t_q, t_q), dtype=bool))
    everything = np.ones((t_q, t_kv), dtype=bool)

    attn0, attn1 = "MultiHeadDotProductAttention_0", "MultiHeadDotProductAttention_1"
    n0 = _layer_norm(flat, "LayerNorm_0", x_q)
    x1 = x_q + _attention(flat, attn0, n0, n0, num_heads, causal)
    n1, n2 = _layer_norm(flat, "LayerNorm_1", x1), _layer_norm(flat, "LayerNorm_2", x_kv)
    x2 = x1 + _attention(flat, attn1, n1, n2, num_heads, everything)
    hidden = relu(_dense(flat, "Dense_0", _layer_norm(flat, "LayerNorm_3", x2), None))
    return x2 + _dense(flat, "Dense_1", hidden, d)
