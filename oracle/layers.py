"""The Transformer's sublayers and layers (section 3.1-3.3), each forward beside its backward.

A forward returns (output, cache): the cache holds the intermediate arrays its backward needs, so
the gradient pass never recomputes a matmul. `p` is a layer's arrays with the layer's prefix
removed ('self_attn.q_proj.weight', 'norm1.weight', ...); the gradients come back under the same
names. `trace`, when given, receives each contract module's output under its full name, in the
order of computation (CONTRACT.md, "module names").
"""

from __future__ import annotations

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


def _sub(p: dict[str, np.ndarray], name: str) -> dict[str, np.ndarray]:
    head = name + "."
    return {k[len(head) :]: v for k, v in p.items() if k.startswith(head)}


def _record(trace: dict[str, np.ndarray] | None, name: str, value: np.ndarray) -> None:
    if trace is not None:
        trace[name] = value


def key_value_heads(
    x_kv: np.ndarray, p: dict[str, np.ndarray], h: int
) -> tuple[np.ndarray, np.ndarray]:
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
    kv: tuple[np.ndarray, np.ndarray] | None = None,
) -> tuple[np.ndarray, Cache]:
    """MultiHead(x_q, x_kv) = Concat(head_1, ..., head_h) W^O + b^O (section 3.2.2),
    head_i = Attention(x_q W_i^Q, x_kv W_i^K, x_kv W_i^V).

    x_q [B, T, d]; x_kv [B, S, d]; mask bool broadcastable to [B, h, T, S]. `kv` replaces the
    key/value projection of x_kv with given heads (a decoding cache); then x_kv is not read.
    """
    Q = split_heads(linear(x_q, p["q_proj.weight"], p["q_proj.bias"]), h)  # [B, h, T, d_k]
    K, V = key_value_heads(x_kv, p, h) if kv is None else kv  # [B, h, S, d_k]
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


def feed_forward(
    x: np.ndarray, p: dict[str, np.ndarray], activation: str, trace: dict | None, prefix: str
) -> tuple[np.ndarray, Cache]:
    """FFN(x) = max(0, x W_1 + b_1) W_2 + b_2 (section 3.3); linear1 is W_1, linear2 is W_2."""
    act, _ = ACTIVATIONS[activation]
    h1 = linear(x, p["linear1.weight"], p["linear1.bias"])  # [B, T, d_ff]
    _record(trace, f"{prefix}.linear1", h1)
    a = act(h1)
    y = linear(a, p["linear2.weight"], p["linear2.bias"])  # [B, T, d]
    _record(trace, f"{prefix}.linear2", y)
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


def _norm(x: np.ndarray, p: dict[str, np.ndarray], name: str, spec: ModelSpec) -> np.ndarray:
    return layer_norm(x, p[f"{name}.weight"], p[f"{name}.bias"], spec.ln_eps)


def _norm_bwd(
    dy: np.ndarray, x: np.ndarray, p: dict[str, np.ndarray], name: str, spec: ModelSpec, g: Grads
) -> np.ndarray:
    """LayerNorm `name`'s backward at input x: its gains' gradients go into g, dx is returned."""
    dx, g[f"{name}.weight"], g[f"{name}.bias"] = layer_norm_bwd(
        dy, x, p[f"{name}.weight"], spec.ln_eps
    )
    return dx


def into(g: Grads, prefix: str, sub: Grads) -> None:
    """Add a sublayer's gradients `sub` to g under their full names, `prefix.name`."""
    g.update({f"{prefix}.{k}": v for k, v in sub.items()})


def encoder_layer(
    x: np.ndarray,
    p: dict[str, np.ndarray],
    mask: np.ndarray,
    spec: ModelSpec,
    trace: dict | None = None,
    prefix: str = "encoder.0",
) -> tuple[np.ndarray, Cache]:
    """One encoder layer (section 3.1): self-attention, then the feed-forward network.

    post-LN: x <- LN1(x + SelfAttn(x)), x <- LN2(x + FFN(x)).
    pre-LN:  x <- x + SelfAttn(LN1(x)),  x <- x + FFN(LN2(x)).
    """
    c: Cache = {"x": x}
    if spec.norm == "post":
        a, c["attn"] = multi_head_attention(x, x, _sub(p, "self_attn"), mask, spec.n_heads)
        _record(trace, f"{prefix}.self_attn", a)
        c["z1"] = x + a
        x1 = _norm(c["z1"], p, "norm1", spec)
        _record(trace, f"{prefix}.norm1", x1)
        f, c["ff"] = feed_forward(x1, p, spec.activation, trace, prefix)
        c["z2"] = x1 + f
        out = _norm(c["z2"], p, "norm2", spec)
        _record(trace, f"{prefix}.norm2", out)
    else:
        n1 = _norm(x, p, "norm1", spec)
        _record(trace, f"{prefix}.norm1", n1)
        a, c["attn"] = multi_head_attention(n1, n1, _sub(p, "self_attn"), mask, spec.n_heads)
        _record(trace, f"{prefix}.self_attn", a)
        c["x1"] = x + a
        n2 = _norm(c["x1"], p, "norm2", spec)
        _record(trace, f"{prefix}.norm2", n2)
        f, c["ff"] = feed_forward(n2, p, spec.activation, trace, prefix)
        out = c["x1"] + f
    _record(trace, prefix, out)
    return out, c


def encoder_layer_bwd(
    dout: np.ndarray, c: Cache, p: dict[str, np.ndarray], spec: ModelSpec
) -> tuple[np.ndarray, Grads]:
    """(dx, grads) of encoder_layer: its sublayers' backwards in reverse, each residual adding
    the gradient that skips the sublayer."""
    g: Grads = {}
    h, act = spec.n_heads, spec.activation
    if spec.norm == "post":
        dz2 = _norm_bwd(dout, c["z2"], p, "norm2", spec, g)  # out = LN2(z2), z2 = x1 + FFN(x1)
        dx1_ff, g_ff = feed_forward_bwd(dz2, c["ff"], p, act)
        dz1 = _norm_bwd(dz2 + dx1_ff, c["z1"], p, "norm1", spec, g)  # x1 = LN1(x + SelfAttn(x))
        dq, dkv, g_attn = multi_head_attention_bwd(dz1, c["attn"], _sub(p, "self_attn"), h)
        dx = dz1 + dq + dkv
    else:
        dn2, g_ff = feed_forward_bwd(dout, c["ff"], p, act)  # out = x1 + FFN(LN2(x1))
        dx1 = dout + _norm_bwd(dn2, c["x1"], p, "norm2", spec, g)
        dq, dkv, g_attn = multi_head_attention_bwd(dx1, c["attn"], _sub(p, "self_attn"), h)
        dx = dx1 + _norm_bwd(dq + dkv, c["x"], p, "norm1", spec, g)  # x1 = x + SelfAttn(LN1(x))
    g.update(g_ff)
    into(g, "self_attn", g_attn)
    return dx, g


def decoder_layer(
    y: np.ndarray,
    memory: np.ndarray | None,
    p: dict[str, np.ndarray],
    self_mask: np.ndarray,
    cross_mask: np.ndarray,
    spec: ModelSpec,
    trace: dict | None = None,
    prefix: str = "decoder.0",
    past: tuple[np.ndarray, np.ndarray] | None = None,
    cross_kv: tuple[np.ndarray, np.ndarray] | None = None,
) -> tuple[np.ndarray, Cache]:
    """One decoder layer (section 3.1): masked self-attention, cross-attention over the encoder's
    output `memory`, then the feed-forward network.

    post-LN: y <- LN1(y + SelfAttn(y)), y <- LN2(y + CrossAttn(y, m)), y <- LN3(y + FFN(y)).
    pre-LN:  y <- y + SelfAttn(LN1(y)), y <- y + CrossAttn(LN2(y), m), y <- y + FFN(LN3(y)).

    Decoding one position at a time: `past` holds the self-attention heads K, V of the earlier
    positions (the new position's are appended) and `cross_kv` the heads of the memory; the
    returned cache's ['self']['K'], ['self']['V'] are then the extended ones.
    """
    h = spec.n_heads

    def self_attention(x: np.ndarray) -> tuple[np.ndarray, Cache]:
        sp = _sub(p, "self_attn")
        kv = None
        if past is not None:
            K_new, V_new = key_value_heads(x, sp, h)
            kv = (
                np.concatenate([past[0], K_new], axis=2),
                np.concatenate([past[1], V_new], axis=2),
            )
        return multi_head_attention(x, x, sp, self_mask, h, kv)

    def cross_attention(x: np.ndarray) -> tuple[np.ndarray, Cache]:
        return multi_head_attention(x, memory, _sub(p, "cross_attn"), cross_mask, h, cross_kv)

    c: Cache = {"y": y}
    if spec.norm == "post":
        a, c["self"] = self_attention(y)
        _record(trace, f"{prefix}.self_attn", a)
        c["z1"] = y + a
        y1 = _norm(c["z1"], p, "norm1", spec)
        _record(trace, f"{prefix}.norm1", y1)
        b, c["cross"] = cross_attention(y1)
        _record(trace, f"{prefix}.cross_attn", b)
        c["z2"] = y1 + b
        y2 = _norm(c["z2"], p, "norm2", spec)
        _record(trace, f"{prefix}.norm2", y2)
        f, c["ff"] = feed_forward(y2, p, spec.activation, trace, prefix)
        c["z3"] = y2 + f
        out = _norm(c["z3"], p, "norm3", spec)
        _record(trace, f"{prefix}.norm3", out)
    else:
        n1 = _norm(y, p, "norm1", spec)
        _record(trace, f"{prefix}.norm1", n1)
        a, c["self"] = self_attention(n1)
        _record(trace, f"{prefix}.self_attn", a)
        c["y1"] = y + a
        n2 = _norm(c["y1"], p, "norm2", spec)
        _record(trace, f"{prefix}.norm2", n2)
        b, c["cross"] = cross_attention(n2)
        _record(trace, f"{prefix}.cross_attn", b)
        c["y2"] = c["y1"] + b
        n3 = _norm(c["y2"], p, "norm3", spec)
        _record(trace, f"{prefix}.norm3", n3)
        f, c["ff"] = feed_forward(n3, p, spec.activation, trace, prefix)
        out = c["y2"] + f
    _record(trace, prefix, out)
    return out, c


def decoder_layer_bwd(
    dout: np.ndarray, c: Cache, p: dict[str, np.ndarray], spec: ModelSpec
) -> tuple[np.ndarray, np.ndarray, Grads]:
    """(dy, dmemory, grads) of decoder_layer (full-sequence mode): the sublayers' backwards in
    reverse; the cross-attention's key/value gradient is the memory's."""
    g: Grads = {}
    h, act = spec.n_heads, spec.activation
    if spec.norm == "post":
        dz3 = _norm_bwd(dout, c["z3"], p, "norm3", spec, g)  # out = LN3(y2 + FFN(y2))
        dy2_ff, g_ff = feed_forward_bwd(dz3, c["ff"], p, act)
        dz2 = _norm_bwd(dz3 + dy2_ff, c["z2"], p, "norm2", spec, g)  # y2 = LN2(y1 + Cross(y1, m))
        dq, dmemory, g_cross = multi_head_attention_bwd(dz2, c["cross"], _sub(p, "cross_attn"), h)
        dz1 = _norm_bwd(dz2 + dq, c["z1"], p, "norm1", spec, g)  # y1 = LN1(y + SelfAttn(y))
        dq, dkv, g_self = multi_head_attention_bwd(dz1, c["self"], _sub(p, "self_attn"), h)
        dy = dz1 + dq + dkv
    else:
        dn3, g_ff = feed_forward_bwd(dout, c["ff"], p, act)  # out = y2 + FFN(LN3(y2))
        dy2 = dout + _norm_bwd(dn3, c["y2"], p, "norm3", spec, g)
        dq, dmemory, g_cross = multi_head_attention_bwd(dy2, c["cross"], _sub(p, "cross_attn"), h)
        dy1 = dy2 + _norm_bwd(dq, c["y1"], p, "norm2", spec, g)  # y2 = y1 + Cross(LN2(y1), m)
        dq, dkv, g_self = multi_head_attention_bwd(dy1, c["self"], _sub(p, "self_attn"), h)
        dy = dy1 + _norm_bwd(dq + dkv, c["y"], p, "norm1", spec, g)  # y1 = y + SelfAttn(LN1(y))
    g.update(g_ff)
    into(g, "self_attn", g_self)
    into(g, "cross_attn", g_cross)
    return dy, dmemory, g
