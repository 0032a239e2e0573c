"""The Transformer's primitives in numpy, each forward beside its backward.

Every function is pure and works in the dtype of its inputs: float64 for the oracle, np.longdouble
when a test reruns the same computation in extended precision to measure the oracle's own error.
A backward `name_bwd(dy, ...)` takes the gradient of the loss with respect to the forward's output
and returns the gradients with respect to its inputs, in the forward's argument order.
"""

from __future__ import annotations

import numpy as np
import numpy.typing as npt

# The real dtypes the oracle computes in: float64, and longdouble for the error-budget test.
FLOATS = (np.dtype(np.float64), np.dtype(np.longdouble))


def _real(*arrays: np.ndarray) -> None:
    for a in arrays:
        assert a.dtype in FLOATS, f"expected float64 or longdouble, got {a.dtype}"


def _const(x: np.ndarray, value: float) -> np.floating:
    """`value` in x's dtype (so sqrt(d) is rounded once, in the precision of the computation)."""
    return x.dtype.type(value)


# --- Input: embeddings and positions (section 3.4, 3.5) -------------------------------------------


def positional_encoding(max_len: int, d: int, dtype: npt.DTypeLike = np.float64) -> np.ndarray:
    """PE[p, 2i] = sin(p / 10000^(2i/d)), PE[p, 2i+1] = cos(p / 10000^(2i/d)) (section 3.5)."""
    dtype = np.dtype(dtype)
    p = np.arange(max_len, dtype=dtype)[:, None]  # [max_len, 1]
    two_i = np.arange(0, d, 2, dtype=dtype)  # [ceil(d/2)]
    angle = p / dtype.type(10000) ** (two_i / dtype.type(d))  # [max_len, ceil(d/2)]
    pe = np.empty((max_len, d), dtype=dtype)
    pe[:, 0::2] = np.sin(angle)
    pe[:, 1::2] = np.cos(angle[:, : d // 2])
    return pe


def embedding(E: np.ndarray, ids: np.ndarray, scale: float) -> np.ndarray:
    """E[ids] * scale, the table lookup of section 3.4 (scale = sqrt(d_model) in the paper)."""
    _real(E)
    assert E.ndim == 2 and np.issubdtype(ids.dtype, np.integer), (E.shape, ids.dtype)
    return E[ids] * _const(E, scale)


def embedding_bwd(dy: np.ndarray, ids: np.ndarray, vocab: int, scale: float) -> np.ndarray:
    """dE[v] = scale * sum of dy over the positions holding id v (a row no id selects stays 0)."""
    rows, dE_rows = embedding_bwd_rows(dy, ids, scale)
    dE = np.zeros((vocab, dy.shape[-1]), dtype=dy.dtype)
    dE[rows] = dE_rows
    return dE


def embedding_bwd_rows(dy: np.ndarray, ids: np.ndarray, scale: float) -> tuple[np.ndarray, ...]:
    """embedding_bwd's nonzero rows: (rows, dE[rows]), rows the distinct ids in ascending order.

    The same numbers as the dense dE (each row's sum of dy in position order, then scaled), without
    a pass over the [V, d] table: with a 58k vocabulary that table is 227 MiB, the ids a few
    hundred rows of it."""
    _real(dy)
    d = dy.shape[-1]
    rows, slot = np.unique(ids.reshape(-1), return_inverse=True)  # ids == rows[slot]
    dE_rows = np.zeros((rows.size, d), dtype=dy.dtype)
    np.add.at(dE_rows, slot.reshape(-1), dy.reshape(-1, d))  # sum of dy over each id's positions
    dE_rows *= _const(dy, scale)
    return rows, dE_rows


# --- Linear layers and activations (section 3.3) --------------------------------------------------


def linear(x: np.ndarray, W: np.ndarray, b: np.ndarray | None) -> np.ndarray:
    """y = x W^T + b, with W in torch's (out, in) layout."""
    _real(x, W)
    assert W.ndim == 2 and x.shape[-1] == W.shape[1], (x.shape, W.shape)
    # One 2-D matmul over all positions: a single BLAS call instead of one per batch row.
    y = x.reshape(-1, W.shape[1]) @ W.T
    if b is not None:
        assert b.shape == (W.shape[0],), (b.shape, W.shape)
        y += b
    return y.reshape(*x.shape[:-1], W.shape[0])


def linear_bwd(
    dy: np.ndarray, x: np.ndarray, W: np.ndarray
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """dx = dy W, dW = dy^T x, db = sum of dy over positions (a layer without a bias ignores
    it)."""
    _real(dy, x, W)
    dy2 = dy.reshape(-1, W.shape[0])
    x2 = x.reshape(-1, W.shape[1])
    dx = (dy2 @ W).reshape(x.shape)
    dW = dy2.T @ x2
    db = dy2.sum(axis=0)
    return dx, dW, db


def relu(x: np.ndarray) -> np.ndarray:
    """relu(x) = max(0, x) (section 3.3)."""
    _real(x)
    return np.maximum(x, 0)


def relu_bwd(dy: np.ndarray, x: np.ndarray) -> np.ndarray:
    """d relu / dx = 1 where x > 0, else 0 (0 at x = 0, as torch)."""
    return dy * (x > 0)  # twice as fast as np.where(x > 0, dy, 0); a zero may come out as -0.0


def erf(x: np.ndarray) -> np.ndarray:
    """The error function erf(x) = 2/sqrt(pi) * integral_0^x exp(-t^2) dt, vectorized.

    |x| < 3: the series erf(x) = 2/sqrt(pi) exp(-x^2) sum_n 2^n x^(2n+1) / (1*3*...*(2n+1)), whose
    terms are all positive (no cancellation); 80 terms reach float64's last bit at |x| = 3.
    |x| >= 3: erf = 1 - erfc with Laplace's continued fraction
    erfc(x) = exp(-x^2)/sqrt(pi) / (x + (1/2)/(x + 1/(x + (3/2)/(x + ...)))), 60 levels deep.
    Against math.erf on [-8, 8]: within 1.4e-15 absolute (12 ulp), far inside the 1e-12 the oracle
    is held to; tests/test_oracle_ops.py pins it.
    """
    _real(x)
    a = np.abs(x)
    small = np.minimum(a, 3)  # the series branch, evaluated everywhere and then selected
    term = small.copy()
    total = small.copy()
    sq = small * small
    for n in range(1, 80):
        term = term * (2 * sq) / (2 * n + 1)
        total = total + term
    series = 2 / np.sqrt(_const(x, np.pi)) * np.exp(-sq) * total
    big = np.maximum(a, 3)
    frac = big.copy()
    for k in range(60, 0, -1):
        frac = big + (k / 2) / frac
    erfc_big = np.exp(-big * big) / np.sqrt(_const(x, np.pi)) / frac
    return np.sign(x) * np.where(a < 3, series, 1 - erfc_big)


def gelu(x: np.ndarray) -> np.ndarray:
    """gelu(x) = x * Phi(x) = x/2 * (1 + erf(x / sqrt(2))), the exact (erf) form."""
    return x / 2 * (1 + erf(x / np.sqrt(_const(x, 2))))


def gelu_bwd(dy: np.ndarray, x: np.ndarray) -> np.ndarray:
    """d gelu / dx = Phi(x) + x * phi(x), phi the standard normal density."""
    Phi = (1 + erf(x / np.sqrt(_const(x, 2)))) / 2
    phi = np.exp(-x * x / 2) / np.sqrt(2 * _const(x, np.pi))
    return dy * (Phi + x * phi)


def sigmoid(x: np.ndarray) -> np.ndarray:
    """sigmoid(x) = 1 / (1 + exp(-x)), written so that exp never overflows."""
    _real(x)
    e = np.exp(-np.abs(x))
    return np.where(x >= 0, 1 / (1 + e), e / (1 + e))


def silu(x: np.ndarray) -> np.ndarray:
    """silu(x) = x * sigmoid(x) (also called swish)."""
    return x * sigmoid(x)


def silu_bwd(dy: np.ndarray, x: np.ndarray) -> np.ndarray:
    """d silu / dx = s + x s (1 - s), s = sigmoid(x)."""
    s = sigmoid(x)
    return dy * (s + x * s * (1 - s))


ACTIVATIONS = {"relu": (relu, relu_bwd), "gelu": (gelu, gelu_bwd), "silu": (silu, silu_bwd)}


# --- LayerNorm (Ba et al. 2016; section 3.1's LayerNorm(x + Sublayer(x))) -------------------------


def layer_norm(x: np.ndarray, gamma: np.ndarray, beta: np.ndarray, eps: float) -> np.ndarray:
    """LN(x) = gamma * (x - mean(x)) / sqrt(var(x) + eps) + beta over the last axis (biased var)."""
    _real(x, gamma, beta)
    assert gamma.shape == beta.shape == (x.shape[-1],), (x.shape, gamma.shape, beta.shape)
    mu = x.mean(axis=-1, keepdims=True)
    xc = x - mu
    var = (xc * xc).mean(axis=-1, keepdims=True)
    # y = xc / sqrt(var + eps) * gamma + beta, in place on xc (our own temporary): ~30% faster
    y = xc
    y /= np.sqrt(var + _const(x, eps))
    if np.result_type(y, gamma, beta) != y.dtype:  # a wider gain (longdouble): no narrowing
        return y * gamma + beta
    y *= gamma
    y += beta
    return y


def layer_norm_bwd(
    dy: np.ndarray, x: np.ndarray, gamma: np.ndarray, eps: float
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """With x_hat = (x - mu) / sigma and g = dy * gamma:
    dx = (g - mean(g) - x_hat * mean(g * x_hat)) / sigma, dgamma = sum dy * x_hat, dbeta = sum dy.

    mu and sigma are recomputed from x (a few elementwise passes, cheaper than caching them).
    """
    _real(dy, x, gamma)
    mu = x.mean(axis=-1, keepdims=True)
    xc = x - mu
    inv_sigma = 1 / np.sqrt((xc * xc).mean(axis=-1, keepdims=True) + _const(x, eps))
    x_hat = xc * inv_sigma
    g = dy * gamma
    dx = (
        g - g.mean(axis=-1, keepdims=True) - x_hat * (g * x_hat).mean(axis=-1, keepdims=True)
    ) * inv_sigma
    d = x.shape[-1]
    dgamma = (dy * x_hat).reshape(-1, d).sum(axis=0)
    dbeta = dy.reshape(-1, d).sum(axis=0)
    return dx, dgamma, dbeta


# --- Softmax and attention (section 3.2.1) --------------------------------------------------------


def softmax(z: np.ndarray) -> np.ndarray:
    """softmax(z)_j = exp(z_j - max z) / sum_k exp(z_k - max z) over the last axis."""
    _real(z)
    e = np.exp(z - z.max(axis=-1, keepdims=True))
    return e / e.sum(axis=-1, keepdims=True)


def softmax_bwd(dp: np.ndarray, p: np.ndarray) -> np.ndarray:
    """dz = p * (dp - sum_j dp_j p_j) over the last axis."""
    return p * (dp - (dp * p).sum(axis=-1, keepdims=True))


def log_softmax(z: np.ndarray) -> np.ndarray:
    """log softmax(z)_j = z_j - max z - log sum_k exp(z_k - max z) over the last axis."""
    _real(z)
    shifted = z - z.max(axis=-1, keepdims=True)
    # in place on our own temporary: a [.., V] array fewer at once (the output layer's 58k ids)
    shifted -= np.log(np.exp(shifted).sum(axis=-1, keepdims=True))
    return shifted


def scaled_dot_product_attention(
    Q: np.ndarray, K: np.ndarray, V: np.ndarray, mask: np.ndarray
) -> tuple[np.ndarray, np.ndarray]:
    """Attention(Q, K, V) = softmax(Q K^T / sqrt(d_k)) V, keys where mask is False get weight 0.

    Section 3.2.1. Q [.., T, d_k], K and V [.., S, d_k], mask bool broadcastable to [.., T, S].
    Returns the output [.., T, d_k] and the attention weights A [.., T, S].
    """
    _real(Q, K, V)
    assert mask.dtype == bool, mask.dtype
    d_k = Q.shape[-1]
    assert K.shape[-1] == d_k and K.shape[-2] == V.shape[-2], (Q.shape, K.shape, V.shape)
    scores = (Q @ K.swapaxes(-1, -2)) / np.sqrt(_const(Q, d_k))  # [.., T, S]
    A = softmax(np.where(mask, scores, -np.inf))
    return A @ V, A


def scaled_dot_product_attention_bwd(
    dout: np.ndarray, Q: np.ndarray, K: np.ndarray, V: np.ndarray, A: np.ndarray
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """dV = A^T dout, dA = dout V^T, dS = softmax_bwd(dA, A) / sqrt(d_k), dQ = dS K, dK = dS^T Q.

    Masked keys have A = 0, so their dS is exactly 0: nothing flows into padding.
    """
    _real(dout, Q, K, V, A)
    dV = A.swapaxes(-1, -2) @ dout
    dS = softmax_bwd(dout @ V.swapaxes(-1, -2), A) / np.sqrt(_const(Q, Q.shape[-1]))
    return dS @ K, dS.swapaxes(-1, -2) @ Q, dV


def split_heads(x: np.ndarray, h: int) -> np.ndarray:
    """[B, T, d] -> [B, h, T, d/h]: head i reads features i*d_k .. (i+1)*d_k - 1."""
    B, T, d = x.shape
    assert d % h == 0, (d, h)
    return x.reshape(B, T, h, d // h).transpose(0, 2, 1, 3)


def merge_heads(x: np.ndarray) -> np.ndarray:
    """[B, h, T, d_k] -> [B, T, h * d_k]: Concat(head_1, ..., head_h) in head order."""
    B, h, T, d_k = x.shape
    return x.transpose(0, 2, 1, 3).reshape(B, T, h * d_k)
