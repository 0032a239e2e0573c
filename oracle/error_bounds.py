"""How far an honest implementation in a given dtype may be from the oracle: a bound per value.

For every value the oracle computes (the logits, each traced boundary, the label-smoothed loss)
`forward_bounds` returns B >= |subject - oracle|, where the subject is any implementation of the
same equations computing in `dtype` (float64, float32, bfloat16, float16), B holding with a stated
probability (below).

The model of an honest implementation (Higham, "Accuracy and Stability", ch. 2-3):
- every tensor an operation returns is stored in the dtype: |fl(x) - x| <= u|x| (u = 2^-53,
  2^-24, 2^-8, 2^-11), for float16 also + eta, half its smallest subnormal;
- a reduction of n terms t_k (a dot product, softmax's and LayerNorm's sums) accumulates in
  u_acc, the dtype's own for float32/float64 and float32 for bfloat16/float16 (as every BLAS,
  oneDNN and torch's CPU and GPU kernels do); its error sum_k d_k S_k (S_k its partial sums,
  |d_k| <= u_acc) is at most u_acc sqrt(n) sum|t| in the sub-Gaussian scale of Higham & Mary;
- exp, log, sqrt and erf are within 2 u_acc of the exact value before they are stored;
- a sum or difference a + b is exact only for its operands as the subject holds them, and those
  are rounded at their own magnitudes: its error is u (|a| + |b|) (each operand's rounding, one
  sign) plus the result's u|a + b|, not u|a + b| alone, which vanishes where the sum cancels
  and leaves an operand the model holds exact (the oracle's positional table) with no rounding
  at all: a correct float64 x0 of 0.056 failed a bound of 2.1e-16 by one ulp of its terms
  (issue 35). Every addition and subtraction of the model
  rounds so: the embedding + PE sum, residuals, bias adds, LayerNorm's mean subtraction,
  softmax's max subtraction, the loss's terms; reductions and matmuls already carry sum |t|;
- inputs: weights that are not numbers of the dtype are rounded when loaded (u|w|; the shared
  tests draw float32 numbers, exact in float32 and float64); the positional table is computed in
  the accumulation's precision u_acc (float64 for a float64 subject, float32 or better
  otherwise) by any of the contract's honest forms (p / 10000^(2i/d), p exp(-2i ln(10000) / d),
  ...: the angle a = p f within (3 |ln f| + 2) u_acc of itself, the exponent's three roundings
  scaled by |ln f| through the power), sin and cos within 2 u_acc, and rounded once to the dtype
  when it is added (`pe_error`). A float64 table in the exp-log form differs from the oracle's
  by up to 1.8e-15 over 32 positions at d = 16 (measured; 13 times the former model's bound of
  an x0 that cancels, tests/oracle_tests/test_cancellation_bounds.py); a table computed in
  float32 arithmetic in a float64 model carries ~a u32 (1e-5 at position 200): a fault there,
  one of the course's pitfalls.

Propagation, and the choice argued: the worst-case form (Higham's gamma_n = n u on |A||B|,
carried through every equation by |W| |de|) holds for every rounding, but its componentwise
propagation grows by the row sums of |W| (0.8 sqrt(d) for N(0, 1/d) weights) at every matmul:
carried through a 2 + 1 layer post-LN model of width 32 it grew to 1e8 times the logits (an
interval version, kept out of the code for that reason), useless beyond one layer. Real errors
propagate through W with their signs and mostly cancel. So the bound is probabilistic, after
Higham & Mary (2019): rounding errors are taken as mean-independent (round to nearest on data
that is not adversarial), and the analysis is run as a stochastic one: the oracle's equations are
re-run `samples` times in float64 with every rounding of the model replaced by its largest size
times a random sign (the storage roundings: +-u|x|, which overstates round-to-nearest's variance
u^2/3 three times; the accumulations: N(0, 1) u_acc sqrt(n) sum|t|). The spread s of a value over
the runs estimates the standard deviation of a linear combination of independent bounded errors,
whose tail Hoeffding's inequality bounds: P(|err| > lam s) <= 2 exp(-lam^2 / 2). With s estimated
from K = 32 runs, err / s follows Student's t with 32 degrees of freedom, and B = 10 s is exceeded
with probability ~1e-10 per value (P(|t_32| > 10)). The runs are nonlinear (the equations
themselves, not a linearization), so bfloat16's percent-size errors through softmax and
LayerNorm are carried as they are.

The oracle's own float64 rounding is counted too: the bound is on |subject - oracle| (the runs
use u_dtype + 2^-53 everywhere). Not modelled: float16 overflow past 65504 (the bound is inf).
Gradients are not bounded here.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import numpy as np

import oracle.model as model
from oracle.loss import label_smoothed_loss
from oracle.ops import ACTIVATIONS
from oracle.params import Params

U64 = 2.0**-53
SAMPLES = 32  # K, the perturbed runs
LAMBDA = 10.0  # B = LAMBDA * s: P(|t_32| > 10) ~ 1e-10 per value


_FINITE = 1e300  # an operand's size capped here: a masked -inf score stays itself


def pe_error(length: int, d: int, u_acc: float) -> np.ndarray:
    """[length, d]: how far an honest positional table computed in u_acc's precision may be
    from the oracle's, per entry (the module's model): the angle a = p f, f = 10000^(-2i/d),
    within (3 |ln f| + 2) u_acc a of itself moves sin a by |cos a| times that, and sin and cos
    are within 2 u_acc of their values (cos likewise, with |sin a|)."""
    p = np.arange(length, dtype=np.float64)[:, None]
    two_i = np.arange(0, d, 2, dtype=np.float64)
    f = 10000.0 ** (-two_i / d)
    a = p * f
    da = (3.0 * np.abs(np.log(f)) + 2.0) * u_acc * a
    out = np.empty((length, d))
    out[:, 0::2] = np.abs(np.cos(a)) * da + 2 * u_acc * np.abs(np.sin(a))
    out[:, 1::2] = (np.abs(np.sin(a)) * da + 2 * u_acc * np.abs(np.cos(a)))[:, : d // 2]
    return out


@dataclass(frozen=True)
class Precision:
    """A subject's arithmetic: storage unit roundoff u, accumulation's u_acc, subnormal eta."""

    name: str
    u: float
    u_acc: float
    eta: float
    largest: float  # the largest finite number: past it the bound is inf


PRECISIONS = {
    "float64": Precision("float64", 2.0**-53, 2.0**-53, 2.0**-1075, 1.8e308),
    "float32": Precision("float32", 2.0**-24, 2.0**-24, 2.0**-150, 3.4e38),
    "bfloat16": Precision("bfloat16", 2.0**-8, 2.0**-24, 2.0**-134, 3.38e38),
    "float16": Precision("float16", 2.0**-11, 2.0**-24, 2.0**-25, 65504.0),
}


def representable(w: np.ndarray, dtype: str) -> np.ndarray:
    """Where w is a number of `dtype` (held exactly by a subject computing in it)."""
    if dtype == "float64":
        return np.ones(w.shape, dtype=bool)
    f32 = w.astype(np.float32)
    same32 = f32.astype(np.float64) == w
    if dtype == "float32":
        return same32
    if dtype == "float16":
        with np.errstate(over="ignore"):
            return w.astype(np.float16).astype(np.float64) == w
    if dtype == "bfloat16":  # a bfloat16 number is a float32 whose low 16 bits are 0
        return same32 & ((f32.view(np.uint32) & np.uint32(0xFFFF)) == 0)
    raise ValueError(f"dtype must be one of {tuple(PRECISIONS)}, got {dtype!r}")


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


# --- The bounds ------------------------------------------------------------------------------


@dataclass(frozen=True)
class ForwardBounds:
    """The oracle's logits and every traced boundary (oracle.forward's names), each with its
    bound on |subject - oracle| for a subject computing in `dtype`; `runs` holds the perturbed
    runs' logits [K, B, T, V] (the loss's bound starts from them)."""

    dtype: str
    logits: np.ndarray
    bound: np.ndarray
    trace: dict[str, np.ndarray]
    trace_bound: dict[str, np.ndarray]
    runs: np.ndarray
    seed: int


def spread_bound(runs: np.ndarray, value: np.ndarray) -> np.ndarray:
    """LAMBDA times the root mean square deviation of the runs [K, ...] from the oracle's value."""
    return LAMBDA * np.sqrt(np.mean((runs - value) ** 2, axis=0))


def forward_bounds(
    params: Params,
    src: Any,
    tgt_in: Any,
    src_mask: Any,
    tgt_mask: Any,
    dtype: str,
    samples: int = SAMPLES,
    seed: int = 0,
) -> ForwardBounds:
    """oracle.forward's logits and trace, each with its bound on |subject - oracle| for a subject
    computing in `dtype` (one of PRECISIONS); `samples` perturbed runs drawn from `seed`."""
    if params.dtype != np.float64:
        raise TypeError(f"bounds are derived for the float64 oracle, got {params.dtype}")
    logits, trace = model.forward(params, src, tgt_in, src_mask, tgt_mask, trace=True)
    src, src_mask = model.check_src(params, src, src_mask)
    tgt_in, tgt_mask = model.check_tgt(params, tgt_in, tgt_mask, src.shape[0])
    runs = _Runs(params, Rounding(dtype, samples, seed))
    with np.errstate(over="ignore", invalid="ignore"):
        run_logits = runs.forward(src, tgt_in, src_mask, tgt_mask)
    bound = spread_bound(run_logits, logits)
    trace_bound = {k: spread_bound(runs.trace[k], v) for k, v in trace.items()}
    largest = PRECISIONS[dtype].largest
    if any(np.abs(v).max(initial=0) > largest / 2 for v in [logits, *trace.values()]):
        bound = np.full_like(bound, np.inf)  # the subject may overflow: nothing is bounded
    return ForwardBounds(dtype, logits, bound, trace, trace_bound, run_logits, seed)


def label_smoothed_loss_bound(
    fb: ForwardBounds, targets: Any, eps: float, pad_id: int
) -> tuple[float, float]:
    """(loss, bound) of oracle.label_smoothed_loss on fb's logits, for the subject of `fb`
    computing the loss in its dtype: each run's logits through log_softmax (shift, exp, sum,
    log, subtraction rounded), the row's two terms, their mean over the real targets."""
    r = Rounding(fb.dtype, fb.runs.shape[0], fb.seed + 1)
    loss, _ = label_smoothed_loss(fb.logits, targets, eps, pad_id)
    t = np.asarray(targets)
    keep = t != pad_id
    z = fb.runs
    V = z.shape[-1]
    s = r.add(z, -z.max(-1, keepdims=True))
    E = r.store(np.exp(s), r.u + 2 * r.u_acc)
    total = r.accumulate(E.sum(-1, keepdims=True), V, E.sum(-1, keepdims=True))
    lse = r.store(np.log(r.store(total)), r.u + 2 * r.u_acc)
    logp = r.add(s, -lse)
    safe_t = np.broadcast_to(np.where(keep, t, 0)[None, ..., None], (*z.shape[:-1], 1))
    nll = -np.take_along_axis(logp, safe_t, -1)[..., 0]
    mean = r.store(r.accumulate(logp.sum(-1), V, np.abs(logp).sum(-1)) / V)
    row = r.add(r.store((1 - eps) * nll), -r.store(eps * mean))
    rows = row[:, keep]
    n = rows.shape[-1]
    losses = r.store(r.store(r.accumulate(rows.sum(-1), n, np.abs(rows).sum(-1))) / n)
    return float(loss), float(spread_bound(losses, np.asarray(loss)))
