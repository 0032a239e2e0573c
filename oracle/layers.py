"""The Transformer's sublayers and layers (section 3.1-3.3), each forward beside its backward.

A layer is the paper's stack of residual sublayers: two in the encoder (self-attention, the
feed-forward network), three in the decoder (masked self-attention, attention over the encoder's
output, the feed-forward network). `residual` is the one place where the LayerNorm's placement
lives:

    post-LN (the paper's):  x <- LN(x + Sublayer(x))
    pre-LN:                 x <- x + Sublayer(LN(x))

A forward returns (output, cache): the cache holds the intermediate arrays its backward needs, so
the gradient pass never recomputes a matmul. `p` is a layer's arrays with the layer's prefix
removed ('self_attn.q_proj.weight', 'norm1.weight', ...); the gradients come back under the same
names.

`trace`, when given, receives each contract module's output under its full name, in the order of
computation (CONTRACT.md, "module names"). Tracing wraps the functions a layer is built from
(`traced`); the equations themselves never look at it.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np

from oracle.ops import (
    ACTIVATIONS,
    layer_norm,
    layer_norm_bwd,
    linear,
    linear_bwd,
    merge_heads,
    scaled_dot_product_attention,
    scaled_dot_product_attention_bwd,
    split_heads,
)
from oracle.params import ModelSpec

Cache = dict[str, Any]
Grads = dict[str, np.ndarray]
KV = tuple[np.ndarray, np.ndarray]  # an attention's key and value heads [B, h, S, d_k]
Sublayer = Callable[[np.ndarray], tuple[np.ndarray, Cache]]  # x -> (Sublayer(x), its cache)
Trace = dict[str, np.ndarray] | None


def _sub(p: dict[str, np.ndarray], name: str) -> dict[str, np.ndarray]:
    head = name + "."
    return {k[len(head) :]: v for k, v in p.items() if k.startswith(head)}


def traced(trace: Trace, name: str, f: Callable[..., Any]) -> Callable[..., Any]:
    """f, recording its output (the first of a pair) in `trace` under `name`; f itself without a
    trace."""
    if trace is None:
        return f

    def recorded(*args: Any) -> Any:
        out = f(*args)
        trace[name] = out[0] if isinstance(out, tuple) else out
        return out

    return recorded


# --- Attention (section 3.2) ------------------------------------------------------------------


def key_value_heads(x_kv: np.ndarray, p: dict[str, np.ndarray], h: int) -> KV:
    """K = x_kv W^K, V = x_kv W^V split into h heads [B, h, S, d_k] (section 3.2.2)."""
    K = split_heads(linear(x_kv, p["k_proj.weight"], p["k_proj.bias"]), h)
    V = split_heads(linear(x_kv, p["v_proj.weight"], p["v_proj.bias"]), h)
    return K, V


def multi_head_attention(
    x_q: np.ndarray,
    x_kv: np.ndarray | None,
    p: dict[str, np.ndarray],
    mask: np.ndarray,
    h: int,
    kv: KV | None = None,
) -> tuple[np.ndarray, Cache]:
    """MultiHead(x_q, x_kv) = Concat(head_1, ..., head_h) W^O + b^O (section 3.2.2),
    head_i = Attention(x_q W_i^Q, x_kv W_i^K, x_kv W_i^V).

    x_q [B, T, d]; x_kv [B, S, d]; mask bool broadcastable to [B, h, T, S]. `kv` replaces the
    key/value projection of x_kv with given heads (a decoding cache); then x_kv is not read.
    """
    Q = split_heads(linear(x_q, p["q_proj.weight"], p["q_proj.bias"]), h)  # [B, h, T, d_k]
    if kv is None:
        if x_kv is None:
            raise ValueError("multi_head_attention needs x_kv or the heads kv")
        kv = key_value_heads(x_kv, p, h)
    K, V = kv  # [B, h, S, d_k]
    heads, A = scaled_dot_product_attention(Q, K, V, mask)  # [B, h, T, d_k], A [B, h, T, S]
    concat = merge_heads(heads)  # [B, T, d]
    out = linear(concat, p["out_proj.weight"], p["out_proj.bias"])
    return out, {"x_q": x_q, "x_kv": x_kv, "Q": Q, "K": K, "V": V, "A": A, "concat": concat}


def multi_head_attention_bwd(
    dout: np.ndarray, c: Cache, p: dict[str, np.ndarray], h: int
) -> tuple[np.ndarray, np.ndarray, Grads]:
    """(dx_q, dx_kv, grads): the projections' backward around the attention's, heads split and
    merged back. For self-attention x_q is x_kv and the caller adds the two."""
    g: Grads = {}
    dconcat, g["out_proj.weight"], g["out_proj.bias"] = linear_bwd(
        dout, c["concat"], p["out_proj.weight"]
    )
    dQ, dK, dV = scaled_dot_product_attention_bwd(
        split_heads(dconcat, h), c["Q"], c["K"], c["V"], c["A"]
    )
    dx_q, g["q_proj.weight"], g["q_proj.bias"] = linear_bwd(
        merge_heads(dQ), c["x_q"], p["q_proj.weight"]
    )
    dx_k, g["k_proj.weight"], g["k_proj.bias"] = linear_bwd(
        merge_heads(dK), c["x_kv"], p["k_proj.weight"]
    )
    dx_v, g["v_proj.weight"], g["v_proj.bias"] = linear_bwd(
        merge_heads(dV), c["x_kv"], p["v_proj.weight"]
    )
    return dx_q, dx_k + dx_v, g


# --- The feed-forward network (section 3.3) -----------------------------------------------------


def feed_forward(
    x: np.ndarray, p: dict[str, np.ndarray], activation: str, trace: Trace, prefix: str
) -> tuple[np.ndarray, Cache]:
    """FFN(x) = max(0, x W_1 + b_1) W_2 + b_2 (section 3.3); linear1 is W_1, linear2 is W_2."""
    act, _ = ACTIVATIONS[activation]
    h1 = traced(trace, f"{prefix}.linear1", linear)(x, p["linear1.weight"], p["linear1.bias"])
    a = act(h1)
    y = traced(trace, f"{prefix}.linear2", linear)(a, p["linear2.weight"], p["linear2.bias"])
    return y, {"x": x, "h1": h1, "a": a}


def feed_forward_bwd(
    dy: np.ndarray, c: Cache, p: dict[str, np.ndarray], activation: str
) -> tuple[np.ndarray, Grads]:
    """(dx, grads) of FFN: linear2's backward, the activation's, linear1's."""
    _, act_bwd = ACTIVATIONS[activation]
    g: Grads = {}
    da, g["linear2.weight"], g["linear2.bias"] = linear_bwd(dy, c["a"], p["linear2.weight"])
    dh1 = act_bwd(da, c["h1"])
    dx, g["linear1.weight"], g["linear1.bias"] = linear_bwd(dh1, c["x"], p["linear1.weight"])
    return dx, g


# --- Residual connections and LayerNorm (section 5.4's dropout aside: none in the oracle) -------


def residual(
    x: np.ndarray,
    sublayer: Sublayer,
    norm: Callable[[np.ndarray], np.ndarray],
    placement: str,
) -> tuple[np.ndarray, Cache]:
    """post: LN(x + Sublayer(x)); pre: x + Sublayer(LN(x))."""
    if placement == "post":
        f, inner = sublayer(x)
        z = x + f
        return norm(z), {"x": x, "z": z, "sublayer": inner}
    f, inner = sublayer(norm(x))
    return x + f, {"x": x, "sublayer": inner}


def residual_bwd(
    dout: np.ndarray,
    c: Cache,
    sublayer_bwd: Callable[[np.ndarray, Cache], tuple[np.ndarray, ...]],
    norm_bwd: Callable[[np.ndarray, np.ndarray], np.ndarray],
    placement: str,
) -> np.ndarray:
    """dx of `residual`: the path that skips the sublayer plus the sublayer's. `sublayer_bwd`
    gives the gradient at the sublayer's input as its terms (self-attention: through the queries,
    through the keys and values), added in that order."""
    if placement == "post":
        dz = norm_bwd(dout, c["z"])
        return sum(sublayer_bwd(dz, c["sublayer"]), start=dz)
    first, *rest = sublayer_bwd(dout, c["sublayer"])
    return dout + norm_bwd(sum(rest, start=first), c["x"])


def _norm(p: dict[str, np.ndarray], name: str, spec: ModelSpec) -> Callable:
    """LayerNorm `name` of the layer, as a function of its input."""
    return lambda x: layer_norm(x, p[f"{name}.weight"], p[f"{name}.bias"], spec.ln_eps)


def _norm_bwd(p: dict[str, np.ndarray], name: str, spec: ModelSpec, g: Grads) -> Callable:
    """LayerNorm `name`'s backward at its input x: its gains' gradients go into g."""

    def bwd(dy: np.ndarray, x: np.ndarray) -> np.ndarray:
        dx, g[f"{name}.weight"], g[f"{name}.bias"] = layer_norm_bwd(
            dy, x, p[f"{name}.weight"], spec.ln_eps
        )
        return dx

    return bwd


def into(g: Grads, prefix: str, sub: Grads) -> None:
    """Add a sublayer's gradients `sub` to g under their full names, `prefix.name`."""
    g.update({f"{prefix}.{k}": v for k, v in sub.items()})


# --- The layers (section 3.1) -------------------------------------------------------------------


def encoder_layer(
    x: np.ndarray,
    p: dict[str, np.ndarray],
    mask: np.ndarray,
    spec: ModelSpec,
    trace: Trace = None,
    prefix: str = "encoder.0",
) -> tuple[np.ndarray, Cache]:
    """One encoder layer (section 3.1): self-attention, then the feed-forward network, each a
    residual sublayer."""
    h, placement = spec.n_heads, spec.norm

    def norm(name: str) -> Callable:
        return traced(trace, f"{prefix}.{name}", _norm(p, name, spec))

    def self_attention(x: np.ndarray) -> tuple[np.ndarray, Cache]:
        return multi_head_attention(x, x, _sub(p, "self_attn"), mask, h)

    def ffn(x: np.ndarray) -> tuple[np.ndarray, Cache]:
        return feed_forward(x, p, spec.activation, trace, prefix)

    x, c_self = residual(
        x, traced(trace, f"{prefix}.self_attn", self_attention), norm("norm1"), placement
    )
    x, c_ff = residual(x, ffn, norm("norm2"), placement)
    if trace is not None:
        trace[prefix] = x
    return x, {"self": c_self, "ff": c_ff}


def encoder_layer_bwd(
    dout: np.ndarray, c: Cache, p: dict[str, np.ndarray], spec: ModelSpec
) -> tuple[np.ndarray, Grads]:
    """(dx, grads) of encoder_layer: its residual sublayers' backwards in reverse."""
    g: Grads = {}
    h, placement = spec.n_heads, spec.norm

    def self_attention_bwd(d: np.ndarray, cache: Cache) -> tuple[np.ndarray, ...]:
        dq, dkv, g_attn = multi_head_attention_bwd(d, cache, _sub(p, "self_attn"), h)
        into(g, "self_attn", g_attn)
        return dq, dkv

    def ffn_bwd(d: np.ndarray, cache: Cache) -> tuple[np.ndarray, ...]:
        dx, g_ff = feed_forward_bwd(d, cache, p, spec.activation)
        g.update(g_ff)
        return (dx,)

    dx = residual_bwd(dout, c["ff"], ffn_bwd, _norm_bwd(p, "norm2", spec, g), placement)
    dx = residual_bwd(dx, c["self"], self_attention_bwd, _norm_bwd(p, "norm1", spec, g), placement)
    return dx, g


def decoder_layer(
    y: np.ndarray,
    memory: np.ndarray | None,
    p: dict[str, np.ndarray],
    self_mask: np.ndarray,
    cross_mask: np.ndarray,
    spec: ModelSpec,
    trace: Trace = None,
    prefix: str = "decoder.0",
    self_kv: Callable[[np.ndarray], KV] | None = None,
    cross_kv: KV | None = None,
) -> tuple[np.ndarray, Cache]:
    """One decoder layer (section 3.1): masked self-attention, attention over the encoder's
    output `memory`, then the feed-forward network, each a residual sublayer.

    Decoding (oracle.decoding) supplies the keys and values instead of projecting them here:
    `self_kv` maps the self-attention's input to its heads (the cached positions' and the new
    one's), `cross_kv` is the memory's heads; then `memory` is not read.
    """
    h, placement = spec.n_heads, spec.norm

    def norm(name: str) -> Callable:
        return traced(trace, f"{prefix}.{name}", _norm(p, name, spec))

    def self_attention(x: np.ndarray) -> tuple[np.ndarray, Cache]:
        kv = None if self_kv is None else self_kv(x)
        return multi_head_attention(x, x, _sub(p, "self_attn"), self_mask, h, kv)

    def cross_attention(x: np.ndarray) -> tuple[np.ndarray, Cache]:
        return multi_head_attention(x, memory, _sub(p, "cross_attn"), cross_mask, h, cross_kv)

    def ffn(x: np.ndarray) -> tuple[np.ndarray, Cache]:
        return feed_forward(x, p, spec.activation, trace, prefix)

    y, c_self = residual(
        y, traced(trace, f"{prefix}.self_attn", self_attention), norm("norm1"), placement
    )
    y, c_cross = residual(
        y, traced(trace, f"{prefix}.cross_attn", cross_attention), norm("norm2"), placement
    )
    y, c_ff = residual(y, ffn, norm("norm3"), placement)
    if trace is not None:
        trace[prefix] = y
    return y, {"self": c_self, "cross": c_cross, "ff": c_ff}


def decoder_layer_bwd(
    dout: np.ndarray, c: Cache, p: dict[str, np.ndarray], spec: ModelSpec
) -> tuple[np.ndarray, np.ndarray, Grads]:
    """(dy, dmemory, grads) of decoder_layer (full-sequence mode): the residual sublayers'
    backwards in reverse; the cross-attention's key/value gradient is the memory's."""
    g: Grads = {}
    h, placement = spec.n_heads, spec.norm
    dmemory: list[np.ndarray] = []

    def self_attention_bwd(d: np.ndarray, cache: Cache) -> tuple[np.ndarray, ...]:
        dq, dkv, g_attn = multi_head_attention_bwd(d, cache, _sub(p, "self_attn"), h)
        into(g, "self_attn", g_attn)
        return dq, dkv

    def cross_attention_bwd(d: np.ndarray, cache: Cache) -> tuple[np.ndarray, ...]:
        dq, dm, g_attn = multi_head_attention_bwd(d, cache, _sub(p, "cross_attn"), h)
        into(g, "cross_attn", g_attn)
        dmemory.append(dm)
        return (dq,)

    def ffn_bwd(d: np.ndarray, cache: Cache) -> tuple[np.ndarray, ...]:
        dx, g_ff = feed_forward_bwd(d, cache, p, spec.activation)
        g.update(g_ff)
        return (dx,)

    dy = residual_bwd(dout, c["ff"], ffn_bwd, _norm_bwd(p, "norm3", spec, g), placement)
    dy = residual_bwd(
        dy, c["cross"], cross_attention_bwd, _norm_bwd(p, "norm2", spec, g), placement
    )
    dy = residual_bwd(dy, c["self"], self_attention_bwd, _norm_bwd(p, "norm1", spec, g), placement)
    return dy, dmemory[0], g
