"""An independent check of oracle/roundoff.py: the rounding model written out by hand.

oracle.bounded runs the oracle's own code under Monte Carlo arithmetic (every numpy operation
rounded at dispatch). Here the same model (oracle/roundoff.py argues it) is written out equation
by equation for the forward pass, with K runs along a leading axis, as the project first derived
its bounds. Nothing in oracle/ or harness/ uses it: test_roundoff.py checks that the two give the
same spread (a numpy operation the dispatch missed, or a rounding the model lost, shows as a
ratio far from 1).
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

import oracle.model as model
from oracle.ops import ACTIVATIONS
from oracle.params import Params
from oracle.precision import PRECISIONS, U64, pe_error, representable
from oracle.roundoff import LAMBDA

_FINITE = 1e300  # an operand's size capped here: a masked -inf score stays itself


class Rounding:
    """The model's roundings for K runs at once (a leading axis K on every array), drawn from
    one seeded generator."""

    def __init__(self, dtype: str, samples: int, seed: int) -> None:
        if dtype not in PRECISIONS:
            raise ValueError(f"dtype must be one of {tuple(PRECISIONS)}, got {dtype!r}")
        p = PRECISIONS[dtype]
        self.dtype, self.K = dtype, samples
        self.u, self.u_acc, self.eta = p.u + U64, p.u_acc + U64, p.eta
        self.rng = np.random.default_rng(seed)

    def sign(self, shape: tuple[int, ...]) -> np.ndarray:
        return self.rng.integers(0, 2, size=shape) * 2.0 - 1.0

    def store(self, y: np.ndarray, rel: float | None = None) -> np.ndarray:
        """fl(y): y + s (u|y| + eta), s = +-1 per element."""
        size = (self.u if rel is None else rel) * np.abs(y) + self.eta
        return y + self.sign(y.shape) * size

    def accumulate(self, y: np.ndarray, n: int, abs_sum: np.ndarray) -> np.ndarray:
        """y plus a length-n reduction's error, u_acc sqrt(n) sum|t| times N(0, 1)."""
        return y + self.rng.standard_normal(y.shape) * (self.u_acc * math.sqrt(n)) * abs_sum

    def add(self, a: np.ndarray, b: np.ndarray) -> np.ndarray:
        """fl(a + b) of operands held at their own magnitudes: a + b + s u (|a| + |b|), stored."""
        y = a + b
        spread = self.u * np.minimum(np.abs(a) + np.abs(b), _FINITE)
        y = np.where(np.isfinite(y), y + self.sign(y.shape) * spread, y)
        return self.store(y)

    def weight(self, w: np.ndarray) -> np.ndarray:
        """The subject's copies of w [K, ...]: rounded (+-u|w|) where w is not of its dtype."""
        exact = representable(w, self.dtype)
        size = np.where(exact, 0.0, self.u * np.abs(w) + self.eta)
        return w + self.sign((self.K, *w.shape)) * size


# --- The equations, run with the model's roundings (K runs along the leading axis) --------------


def matmul(r: Rounding, A: np.ndarray, B: np.ndarray) -> np.ndarray:
    """fl(A @ B): the reduction over the inner axis, then the product stored."""
    y = r.accumulate(A @ B, A.shape[-1], np.abs(A) @ np.abs(B))
    return r.store(y)


def linear(r: Rounding, x: np.ndarray, W: np.ndarray, b: np.ndarray | None) -> np.ndarray:
    """y = x W^T + b; x [K, .., n], W [K, out, n]."""
    K, n = x.shape[0], x.shape[-1]
    y = matmul(r, x.reshape(K, -1, n), W.swapaxes(-1, -2))
    y = y.reshape(*x.shape[:-1], W.shape[-2])
    return y if b is None else r.add(y, b[:, None, None, :])


def softmax(r: Rounding, z: np.ndarray, mask: np.ndarray) -> np.ndarray:
    """exp(z - max z) / sum exp(z - max z): shift, exp, sum, quotient each rounded."""
    s = np.where(mask, r.add(z, -np.max(np.where(mask, z, -np.inf), -1, keepdims=True)), 0.0)
    E = np.where(mask, r.store(np.exp(s), r.u + 2 * r.u_acc), 0.0)
    total = r.store(r.accumulate(E.sum(-1, keepdims=True), E.shape[-1], E.sum(-1, keepdims=True)))
    return np.where(mask, r.store(E / total), 0.0)


def attention(
    r: Rounding,
    x_q: np.ndarray,
    x_kv: np.ndarray,
    w: dict[str, np.ndarray],
    mask: np.ndarray,
    h: int,
) -> np.ndarray:
    """MultiHead(x_q, x_kv) (section 3.2.2): projections, Q K^T / sqrt(d_k) (product, constant
    and quotient rounded), softmax, A V, the heads merged, out_proj."""

    def heads(name: str, x: np.ndarray) -> np.ndarray:
        y = linear(r, x, w[f"{name}.weight"], w[f"{name}.bias"])
        K, B, T, d = y.shape
        return y.reshape(K, B, T, h, d // h).transpose(0, 1, 3, 2, 4)  # [K, B, h, T, d_k]

    Q, Kh, V = heads("q_proj", x_q), heads("k_proj", x_kv), heads("v_proj", x_kv)
    d_k = Q.shape[-1]
    scores = r.store(r.store(matmul(r, Q, Kh.swapaxes(-1, -2)) / math.sqrt(d_k)))
    mask = np.broadcast_to(mask[None], scores.shape)
    A = softmax(r, scores, mask)
    out = matmul(r, A, V)  # [K, B, h, T, d_k]
    K, B, _, T, _ = out.shape
    concat = out.transpose(0, 1, 3, 2, 4).reshape(K, B, T, h * d_k)
    return linear(r, concat, w["out_proj.weight"], w["out_proj.bias"])


def layer_norm(r: Rounding, x: np.ndarray, g: np.ndarray, b: np.ndarray, eps: float) -> np.ndarray:
    """g (x - mu) / sqrt(var + eps) + b, two passes (the mean, then the centred variance)."""
    d = x.shape[-1]
    mu = r.store(r.accumulate(x.sum(-1, keepdims=True), d, np.abs(x).sum(-1, keepdims=True)) / d)
    xc = r.add(x, -mu)
    sq = r.store(xc * xc)
    var = r.store(r.accumulate(sq.sum(-1, keepdims=True), d, sq.sum(-1, keepdims=True)) / d)
    sigma = r.store(np.sqrt(r.add(var, np.full_like(var, eps))), r.u + 2 * r.u_acc)
    gx = r.store(r.store(xc / sigma) * g[:, None, None, :])
    return r.add(gx, b[:, None, None, :])


def activation(r: Rounding, name: str, x: np.ndarray) -> np.ndarray:
    """relu is exact; gelu and silu within 4 u_acc of their value, then stored."""
    y = ACTIVATIONS[name][0](x)
    return y if name == "relu" else r.store(y, r.u + 4 * r.u_acc)


class _Runs:
    """oracle.model's forward pass, K runs at once under the model's roundings, tracing every
    boundary under oracle.forward's names."""

    def __init__(self, params: Params, r: Rounding) -> None:
        self.params, self.spec, self.r = params, params.spec, r
        self.w = {k: r.weight(v) for k, v in params.arrays.items()}
        self.trace: dict[str, np.ndarray] = {}

    def layer(self, prefix: str) -> dict[str, np.ndarray]:
        head = prefix + "."
        return {k[len(head) :]: v for k, v in self.w.items() if k.startswith(head)}

    def norm(self, w: dict[str, np.ndarray], name: str, x: np.ndarray) -> np.ndarray:
        return layer_norm(self.r, x, w[f"{name}.weight"], w[f"{name}.bias"], self.spec.ln_eps)

    def embed(self, table: str, ids: np.ndarray) -> np.ndarray:
        """E[ids] * scale (constant and product rounded) + PE (as an honest subject computes it,
        `pe_error`), the sum of the two rounded at their magnitudes and stored."""
        r = self.r
        E = self.w[table]
        x = r.store(r.store(E[:, ids] * self.spec.scale))
        pe = self.params.pe(ids.shape[1])
        if self.spec.pos_table is None:
            pe = pe + r.sign((r.K, *pe.shape)) * pe_error(pe.shape[0], pe.shape[1], r.u_acc)
        return r.add(x, np.broadcast_to(pe[:, None] if pe.ndim == 3 else pe, x.shape))

    def residual(self, x: np.ndarray, sublayer: Any, w: dict, prefix: str, norm: str) -> Any:
        """post: LN(x + F(x)); pre: x + F(LN(x)); LN's output traced as prefix.norm."""
        if self.spec.norm == "post":
            out = self.norm(w, norm, self.r.add(x, sublayer(x)))
            self.trace[f"{prefix}.{norm}"] = out
            return out
        n = self.norm(w, norm, x)
        self.trace[f"{prefix}.{norm}"] = n
        return self.r.add(x, sublayer(n))

    def attention(self, w: dict, prefix: str, name: str, mask: np.ndarray, kv: Any = None) -> Any:
        sub = {k[len(name) + 1 :]: v for k, v in w.items() if k.startswith(name + ".")}

        def f(x: np.ndarray) -> np.ndarray:
            out = attention(self.r, x, x if kv is None else kv, sub, mask, self.spec.n_heads)
            self.trace[f"{prefix}.{name}"] = out
            return out

        return f

    def ffn(self, w: dict, prefix: str) -> Any:
        def f(x: np.ndarray) -> np.ndarray:
            h1 = linear(self.r, x, w["linear1.weight"], w["linear1.bias"])
            self.trace[f"{prefix}.linear1"] = h1
            a = activation(self.r, self.spec.activation, h1)
            y = linear(self.r, a, w["linear2.weight"], w["linear2.bias"])
            self.trace[f"{prefix}.linear2"] = y
            return y

        return f

    def final_norm(self, x: np.ndarray, name: str) -> np.ndarray:
        if self.spec.norm == "post":
            return x
        w = self.w
        x = layer_norm(self.r, x, w[f"{name}.weight"], w[f"{name}.bias"], self.spec.ln_eps)
        self.trace[name] = x
        return x

    def forward(
        self, src: np.ndarray, tgt: np.ndarray, src_mask: np.ndarray, tgt_mask: np.ndarray
    ) -> np.ndarray:
        spec = self.spec
        enc_mask = model.source_attention_mask(src_mask)
        x = self.embed(self.params.src_table, src)
        for i in range(spec.n_enc):
            prefix, w = f"encoder.{i}", self.layer(f"encoder.{i}")
            x = self.residual(
                x, self.attention(w, prefix, "self_attn", enc_mask), w, prefix, "norm1"
            )
            x = self.residual(x, self.ffn(w, prefix), w, prefix, "norm2")
            self.trace[prefix] = x
        memory = self.final_norm(x, "enc_norm")
        self_mask = model.target_attention_mask(tgt_mask)
        y = self.embed(self.params.tgt_table, tgt)
        for i in range(spec.n_dec):
            prefix, w = f"decoder.{i}", self.layer(f"decoder.{i}")
            y = self.residual(
                y, self.attention(w, prefix, "self_attn", self_mask), w, prefix, "norm1"
            )
            cross = self.attention(w, prefix, "cross_attn", enc_mask, memory)
            y = self.residual(y, cross, w, prefix, "norm2")
            y = self.residual(y, self.ffn(w, prefix), w, prefix, "norm3")
            self.trace[prefix] = y
        y = self.final_norm(y, "dec_norm")
        logits = linear(self.r, y, self.w[self.params.out_table], None)
        if spec.logits_bias is not None:
            logits = self.r.add(logits, self.r.weight(spec.logits_bias)[:, None, None, :])
        return logits


def perturbed_forward_bound(
    params: Params,
    src: Any,
    tgt_in: Any,
    src_mask: Any,
    tgt_mask: Any,
    dtype: str,
    samples: int = 32,
    seed: int = 0,
) -> tuple[np.ndarray, dict[str, np.ndarray]]:
    """The bound of the logits and of every traced boundary, LAMBDA times the root mean square
    deviation of `samples` hand-written perturbed runs from the oracle's values."""
    logits, trace = model.forward(params, src, tgt_in, src_mask, tgt_mask, trace=True)
    src, src_mask = model.check_src(params, src, src_mask)
    tgt_in, tgt_mask = model.check_tgt(params, tgt_in, tgt_mask, src.shape[0])
    runs = _Runs(params, Rounding(dtype, samples, seed))
    with np.errstate(over="ignore", invalid="ignore"):
        run_logits = runs.forward(src, tgt_in, src_mask, tgt_mask)

    def spread(r: np.ndarray, v: np.ndarray) -> np.ndarray:
        return LAMBDA * np.sqrt(np.mean((r - v) ** 2, axis=0))

    return spread(run_logits, logits), {k: spread(runs.trace[k], v) for k, v in trace.items()}
