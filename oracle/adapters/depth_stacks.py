"""Post-norm vs pre-norm blocks, stacked with ONE shared parameter dict to isolate depth (seed 004).

    post-norm (Vaswani et al. 2017, section 3.1): x <- LN1(x + MHA(x)),  x <- LN2(x + FFN(x))
    pre-norm  (Xiong et al. 2020):               x <- x + MHA(LN1(x)),  x <- x + FFN(LN2(x))

No final LayerNorm after a pre-norm stack: its residual stream is never renormalized.
A block's parameters are the keyword arguments below, in the paper's x W layout ([in, out]):

    w_q, w_k, w_v, w_o [d, d], b_q, b_k, b_v, b_o [d]   MHA(x) = Concat(head_1..head_h) w_o + b_o,
                                                        head_i = Attention(x w_q + b_q, ...)_i
    w_1 [d, d_ff], b_1 [d_ff], w_2 [d_ff, d], b_2 [d]   FFN(x) = relu(x w_1 + b_1) w_2 + b_2
    gamma1, beta1 [d]   the LayerNorm of the attention half
    gamma2, beta2 [d]   the LayerNorm of the feed-forward half
    eps                 LayerNorm epsilon (optional, default 1e-5 as torch)

x is [T, d] or [B, T, d]; `mask` (optional) is bool broadcastable to [B, h, T, T], True = may
attend (e.g. np.tril for a causal stack); by default every position reads every position.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from oracle.layers import multi_head_attention, multi_head_attention_bwd
from oracle.ops import (
    layer_norm,
    layer_norm_bwd,
    linear,
    relu,
    relu_bwd,
)

BLOCK_PARAMS = (
    "w_q", "b_q", "w_k", "b_k", "w_v", "b_v", "w_o", "b_o",
    "w_1", "b_1", "w_2", "b_2", "gamma1", "beta1", "gamma2", "beta2",
)  # fmt: skip
DEFAULT_EPS = 1e-5
NORMS = ("post", "pre")


def _arrays(params: dict[str, Any]) -> tuple[dict[str, np.ndarray], float]:
    """The block's arrays as float64 (checked against BLOCK_PARAMS) and its epsilon."""
    names = set(params) - {"eps"}
    if names != set(BLOCK_PARAMS):
        raise KeyError(
            f"block params: missing {sorted(set(BLOCK_PARAMS) - names)}, "
            f"unexpected {sorted(names - set(BLOCK_PARAMS))}"
        )
    arrays = {k: np.asarray(params[k], dtype=np.float64) for k in BLOCK_PARAMS}
    d, d_ff = arrays["w_1"].shape
    for name, a in arrays.items():
        want = {"w_1": (d, d_ff), "b_1": (d_ff,), "w_2": (d_ff, d)}.get(name)
        want = want or ((d, d) if name.startswith("w_") else (d,))
        if a.shape != want:
            raise ValueError(f"block param {name} has shape {a.shape}, expected {want}")
    return arrays, float(params.get("eps", DEFAULT_EPS))


def _torch_layout(p: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """The attention's arrays under oracle.layers' names, weights transposed to (out, in)."""
    proj = {"q": "q_proj", "k": "k_proj", "v": "v_proj", "o": "out_proj"}
    return {f"{proj[part]}.{kind}": (p[f"w_{part}"].T if kind == "weight" else p[f"b_{part}"])
            for part in proj for kind in ("weight", "bias")}  # fmt: skip


def _as_batch(x: Any) -> np.ndarray:
    x = np.asarray(x, dtype=np.float64)
    if x.ndim not in (2, 3):
        raise ValueError(f"x has shape {x.shape}, expected [T, d] or [B, T, d]")
    return x[None] if x.ndim == 2 else x


def _attention_bwd(dout: np.ndarray, cache: dict, p: dict[str, np.ndarray], h: int) -> np.ndarray:
    """d MHA(x, x) / dx for self-attention: the query path plus the key and value paths."""
    dx_q, dx_kv, _ = multi_head_attention_bwd(dout, cache, _torch_layout(p), h)
    return dx_q + dx_kv


def _ffn(x: np.ndarray, p: dict[str, np.ndarray]) -> tuple[np.ndarray, np.ndarray]:
    """FFN(x) = relu(x w_1 + b_1) w_2 + b_2 (section 3.3); also returns the pre-activation."""
    h1 = linear(x, p["w_1"].T, p["b_1"])
    return linear(relu(h1), p["w_2"].T, p["b_2"]), h1


def _ffn_bwd(dout: np.ndarray, h1: np.ndarray, p: dict[str, np.ndarray]) -> np.ndarray:
    return relu_bwd(dout @ p["w_2"].T, h1) @ p["w_1"].T


def _block(
    norm: str, x: np.ndarray, h: int, p: dict[str, np.ndarray], eps: float, mask: np.ndarray
) -> tuple[np.ndarray, dict]:
    """One block's output and what its backward needs; x is [B, T, d]."""
    mha = _torch_layout(p)  # four transposed views, no copies
    c: dict[str, Any] = {"x": x}
    if norm == "post":
        a, c["attn"] = multi_head_attention(x, x, mha, mask, h)
        c["z1"] = x + a
        y1 = layer_norm(c["z1"], p["gamma1"], p["beta1"], eps)
        f, c["h1"] = _ffn(y1, p)
        c["z2"] = y1 + f
        return layer_norm(c["z2"], p["gamma2"], p["beta2"], eps), c
    n1 = layer_norm(x, p["gamma1"], p["beta1"], eps)
    a, c["attn"] = multi_head_attention(n1, n1, mha, mask, h)
    c["x1"] = x + a
    f, c["h1"] = _ffn(layer_norm(c["x1"], p["gamma2"], p["beta2"], eps), p)
    return c["x1"] + f, c


def _block_bwd(
    norm: str, dout: np.ndarray, c: dict, h: int, p: dict[str, np.ndarray], eps: float
) -> np.ndarray:
    """d block / dx, the chain rule through _block's two halves in reverse."""
    if norm == "post":
        dz2, _, _ = layer_norm_bwd(dout, c["z2"], p["gamma2"], eps)
        dy1 = dz2 + _ffn_bwd(dz2, c["h1"], p)
        dz1, _, _ = layer_norm_bwd(dy1, c["z1"], p["gamma1"], eps)
        return dz1 + _attention_bwd(dz1, c["attn"], p, h)
    dn2 = _ffn_bwd(dout, c["h1"], p)
    dx1 = dout + layer_norm_bwd(dn2, c["x1"], p["gamma2"], eps)[0]
    dn1 = _attention_bwd(dx1, c["attn"], p, h)
    return dx1 + layer_norm_bwd(dn1, c["x"], p["gamma1"], eps)[0]


def _run(norm: str, x: Any, num_blocks: int, num_heads: int, params: dict, mask: Any):
    if norm not in NORMS:
        raise ValueError(f"norm must be one of {NORMS}, got {norm!r}")
    if num_blocks < 0:
        raise ValueError(f"num_blocks={num_blocks} must be >= 0")
    p, eps = _arrays(params)
    xb = _as_batch(x)
    T, d = xb.shape[1:]
    if p["w_q"].shape[0] != d or num_heads < 1 or d % num_heads:
        raise ValueError(f"x has d={d}; params have d={p['w_q'].shape[0]}, num_heads={num_heads}")
    mask = np.ones((T, T), dtype=bool) if mask is None else np.asarray(mask)
    caches = []
    for _ in range(num_blocks):
        xb, c = _block(norm, xb, num_heads, p, eps, mask)
        caches.append(c)
    return xb, caches, p, eps


def post_norm_block(x: Any, num_heads: int, mask: Any = None, **block_params: Any) -> np.ndarray:
    """x <- LN1(x + MHA(x)), x <- LN2(x + FFN(x)): sublayer, then residual, then norm."""
    return stack_post_norm_blocks(x, 1, num_heads, block_params, mask)


def pre_norm_block(x: Any, num_heads: int, mask: Any = None, **block_params: Any) -> np.ndarray:
    """x <- x + MHA(LN1(x)), x <- x + FFN(LN2(x)): norm, then sublayer, then residual."""
    return stack_pre_norm_blocks(x, 1, num_heads, block_params, mask)


def stack_post_norm_blocks(
    x: Any, num_blocks: int, num_heads: int, block_params: dict, mask: Any = None
) -> np.ndarray:
    """post_norm_block applied num_blocks times with the same block_params; block i feeds i+1."""
    out, _, _, _ = _run("post", x, num_blocks, num_heads, block_params, mask)
    return out.reshape(np.shape(x))


def stack_pre_norm_blocks(
    x: Any, num_blocks: int, num_heads: int, block_params: dict, mask: Any = None
) -> np.ndarray:
    """pre_norm_block applied num_blocks times with the same block_params; block i feeds i+1."""
    out, _, _, _ = _run("pre", x, num_blocks, num_heads, block_params, mask)
    return out.reshape(np.shape(x))


def stack_input_grad(
    norm: str,
    x: Any,
    dout: Any,
    num_blocks: int,
    num_heads: int,
    block_params: dict,
    mask: Any = None,
) -> tuple[np.ndarray, np.ndarray]:
    """(out, dL/dx) of the shared-weight stack for a loss L with dL/dout = `dout` (a vector-Jacobian
    product: dout = ones gives the gradient of sum(out)); norm is 'post' or 'pre'."""
    out, caches, p, eps = _run(norm, x, num_blocks, num_heads, block_params, mask)
    g = np.asarray(dout, dtype=np.float64).reshape(out.shape)
    for c in reversed(caches):
        g = _block_bwd(norm, g, c, num_heads, p, eps)
    return out.reshape(np.shape(x)), g.reshape(np.shape(x))
