"""The oracle's memory-lean and faster forms (issues 26, 51) against the plain equations, to the
last bit, and the lifetimes of its caches: a forward keeps none, a backward frees each layer's as
it passes it."""

from __future__ import annotations

import itertools

import numpy as np
import pytest
from oracle_cases import make_batch, make_model

import oracle
from oracle.grads import backward, forward_for_grads
from oracle.model import embed_bwd, encoder_stack
from oracle.ops import embedding_bwd, embedding_bwd_rows, layer_norm, log_softmax, relu_bwd

DTYPES = [np.float64, np.longdouble]


@pytest.mark.parametrize("dtype", DTYPES, ids=["float64", "longdouble"])
def test_dlogits_is_p_minus_q_over_n_to_the_last_bit(dtype):
    # law: writing q's target entries after p - eps / V (no [.., V] array for q) changes no bit of
    # the plain (p - q) / N
    rng = np.random.default_rng(0)
    logits = (rng.normal(size=(3, 4, 9)) * 4).astype(dtype)
    targets = rng.integers(0, 9, size=(3, 4))
    targets[2, 1:] = 0  # pad id 0
    eps, V = 0.1, 9
    _, dlogits = oracle.label_smoothed_loss(logits, targets, eps, 0)
    keep = targets != 0
    q = np.full_like(logits, eps / V)
    np.put_along_axis(q, targets[..., None], 1 - eps + eps / V, axis=-1)
    plain = (np.exp(log_softmax(logits)) - q) * (keep[..., None] / dtype(keep.sum()))
    assert dlogits.dtype == dtype and np.array_equal(dlogits, plain)


@pytest.mark.parametrize("dtype", DTYPES, ids=["float64", "longdouble"])
def test_log_softmax_and_embedding_bwd_in_place_equal_the_plain_forms(dtype):
    rng = np.random.default_rng(1)
    z = (rng.normal(size=(2, 5, 7)) * 5).astype(dtype)
    shifted = z - z.max(axis=-1, keepdims=True)
    assert np.array_equal(
        log_softmax(z), shifted - np.log(np.exp(shifted).sum(axis=-1, keepdims=True))
    )
    dy, ids = rng.normal(size=(2, 3, 4)).astype(dtype), np.array([[0, 2, 2], [4, 0, 2]])
    dE = np.zeros((6, 4), dtype=dtype)
    np.add.at(dE, ids.reshape(-1), dy.reshape(-1, 4))
    assert np.array_equal(embedding_bwd(dy, ids, 6, 2.5), dE * dtype(2.5))


def test_relu_bwd_is_dy_where_x_is_positive():
    # 0 at x = 0 as torch; dy * (x > 0) may give -0.0 where np.where gives 0.0: equal values
    rng = np.random.default_rng(2)
    x, dy = rng.normal(size=(4, 6)), rng.normal(size=(4, 6))
    x[0, :3] = 0.0
    assert np.array_equal(relu_bwd(dy, x), np.where(x > 0, dy, 0.0))


def _batch(norm: str, tie: bool):
    model = make_model(norm, tie, 11, 11 if tie else 13)
    src, tgt, src_mask, tgt_mask = make_batch(model.cfg)
    tgt_out = np.where(tgt_mask.numpy(), 1, 0)
    return oracle.read_state_dict(model), (src, tgt, tgt_out, src_mask, tgt_mask, 0.1, 0)


@pytest.mark.parametrize("norm", ["post", "pre"])
def test_a_forward_keeps_no_layer_cache_and_a_backward_frees_each(norm):
    params, args = _batch(norm, True)
    src, _, _, src_mask, _, _, _ = args
    _, alone = encoder_stack(params, src.numpy(), src_mask.numpy(), None)
    assert alone["layers"] == []  # law: a forward alone drops each layer's arrays after it
    _, _, dlogits, enc_cache, dec_cache = forward_for_grads(params, *args)
    assert len(enc_cache["layers"]) == 2 and len(dec_cache["layers"]) == 2
    backward(params, dlogits, enc_cache, dec_cache)
    # law: the backward takes each layer's cache as it runs (autograd frees saved tensors so)
    assert enc_cache["layers"] == [] and dec_cache["layers"] == []


@pytest.mark.parametrize("norm,tie", [("post", True), ("pre", False)])
def test_no_two_gradients_share_memory(norm, tie):
    # law: a tied table's gradient is summed in place into an array the backward owns, never
    # into another parameter's gradient or an input
    params, args = _batch(norm, tie)
    _, grads = oracle.loss_and_grads(params, *args)
    for (a, x), (b, y) in itertools.combinations(grads.items(), 2):
        assert not np.shares_memory(x, y), (a, b)
    for name, g in grads.items():
        assert not np.shares_memory(g, params.arrays[name]), name


@pytest.mark.parametrize("dtype", DTYPES, ids=["float64", "longdouble"])
def test_embedding_rows_and_the_tied_sum_equal_the_dense_table_to_the_last_bit(dtype):
    # law (issue 51): only the rows of the ids that occur are summed into a tied table's gradient;
    # every other row of the dense dE is 0, so g + dE is g there: the same bits as the dense sum
    rng = np.random.default_rng(3)
    V, d = 50, 6
    dy = rng.normal(size=(3, 7, d)).astype(dtype)
    ids = rng.integers(0, 9, size=(3, 7))  # repeated ids: each row sums several positions
    ids[0, 0] = V - 1
    dense = np.zeros((V, d), dtype=dtype)
    np.add.at(dense, ids.reshape(-1), dy.reshape(-1, d))
    dense *= dtype(3.5)
    rows, dE_rows = embedding_bwd_rows(dy, ids, 3.5)
    assert np.array_equal(rows, np.unique(ids)) and np.array_equal(dE_rows, dense[rows])
    params, _ = _batch("post", True)
    params = oracle.Params(
        params.spec, {k: v.astype(dtype) for k, v in params.arrays.items()}, params.scheme
    )
    table = params.src_table
    V = params.arrays[table].shape[0]
    ids = rng.integers(0, V, size=(2, 9))
    dx0 = rng.normal(size=(2, 9, params.spec.d_model)).astype(dtype)
    earlier = rng.normal(size=(V, params.spec.d_model)).astype(dtype)  # an earlier use's gradient
    g = {table: earlier.copy()}
    embed_bwd(params, table, ids, dx0, g)
    assert np.array_equal(g[table], earlier + embedding_bwd(dx0, ids, V, params.spec.scale))
    first: dict[str, np.ndarray] = {}  # the first use: dE itself
    embed_bwd(params, table, ids, dx0, first)
    assert np.array_equal(first[table], embedding_bwd(dx0, ids, V, params.spec.scale))


@pytest.mark.parametrize("dtype", DTYPES, ids=["float64", "longdouble"])
def test_layer_norm_in_place_equals_the_plain_form(dtype):
    # law (issue 51): the forward's scale and shift in place on its own temporary change no bit;
    # a gain wider than x (longdouble with float64 x) is not narrowed into x's dtype
    rng = np.random.default_rng(4)
    x = (rng.normal(size=(2, 5, 8)) * 3 + 1).astype(dtype)
    gamma, beta = rng.normal(size=8).astype(dtype), rng.normal(size=8).astype(dtype)
    xc = x - x.mean(axis=-1, keepdims=True)
    var = (xc * xc).mean(axis=-1, keepdims=True)
    plain = xc / np.sqrt(var + dtype(1e-5)) * gamma + beta
    got = layer_norm(x, gamma, beta, 1e-5)
    assert got.dtype == dtype and np.array_equal(got, plain)
    x64 = x.astype(np.float64)
    wide = layer_norm(x64, gamma.astype(np.longdouble), beta.astype(np.longdouble), 1e-5)
    xc = x64 - x64.mean(axis=-1, keepdims=True)
    var = (xc * xc).mean(axis=-1, keepdims=True)
    want = xc / np.sqrt(var + 1e-5) * gamma.astype(np.longdouble) + beta.astype(np.longdouble)
    assert wide.dtype == np.longdouble and np.array_equal(wide, want)
