"""oracle.adapters.flax_block against the real Flax Linen module of seed 002, run by jax."""

from __future__ import annotations

import functools

import numpy as np
import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

jax = pytest.importorskip("jax")
nn = pytest.importorskip("flax.linen")
jax.config.update("jax_enable_x64", True)
jnp = jax.numpy

from oracle.adapters.flax_block import flatten_variables, flax_decoder_block  # noqa: E402

# Both sides compute in float64 with the same operations in a different order (flax's LayerNorm
# uses E[x^2] - E[x]^2, XLA its own reductions); a few hundred ulps of O(1) values is ~1e-13.
TOL = 1e-12


class DecoderBlock(nn.Module):
    """Seed 002, written as the exercise asks: unnamed modules created in this order."""

    num_heads: int
    d_ff: int

    @nn.compact
    def __call__(self, x_q, x_kv):
        d = x_q.shape[-1]
        causal_mask = jnp.tril(jnp.ones((x_q.shape[-2], x_q.shape[-2]), dtype=bool))
        n0 = nn.LayerNorm()(x_q)
        x1 = x_q + nn.MultiHeadDotProductAttention(num_heads=self.num_heads, qkv_features=d)(
            n0, mask=causal_mask
        )
        n1 = nn.LayerNorm()(x1)
        n2 = nn.LayerNorm()(x_kv)
        x2 = x1 + nn.MultiHeadDotProductAttention(num_heads=self.num_heads, qkv_features=d)(n1, n2)
        n3 = nn.LayerNorm()(x2)
        # Dense(F) is created before Dense(D), so it is Dense_0
        hidden = nn.relu(nn.Dense(self.d_ff)(n3))
        return x2 + nn.Dense(d)(hidden)


@functools.cache
def _case(seed: int, t_q: int, t_kv: int, d: int, d_kv: int, h: int, d_ff: int):
    """The module's variables tree with every leaf drawn from `seed` (no zero biases, unit scales).

    jax.eval_shape gives the tree Flax's init would build without compiling init's random
    kernels per shape (seconds each); the real seeded init has its own test below. apply is
    jitted: one XLA compile per shape is several times faster than op-by-op dispatch.
    """
    rng = np.random.default_rng(seed)
    x_q = rng.standard_normal((t_q, d))
    x_kv = rng.standard_normal((t_kv, d_kv))
    module = DecoderBlock(num_heads=h, d_ff=d_ff)
    layout = jax.eval_shape(module.init, jax.random.PRNGKey(seed), x_q, x_kv)
    variables = jax.tree_util.tree_map(lambda leaf: 0.5 * rng.standard_normal(leaf.shape), layout)
    expected = np.asarray(jax.jit(module.apply)(variables, x_q, x_kv))
    return variables, x_q, x_kv, expected


@pytest.mark.slow
def test_matches_seeded_flax_init():
    # the exercise's own path: module.init(PRNGKey(seed), x_q, x_kv), then apply
    rng = np.random.default_rng(5)
    x_q, x_kv = rng.standard_normal((4, 8)), rng.standard_normal((3, 6))
    module = DecoderBlock(num_heads=2, d_ff=12)
    variables = jax.jit(module.init)(jax.random.PRNGKey(5), x_q, x_kv)
    expected = np.asarray(jax.jit(module.apply)(variables, x_q, x_kv))
    assert np.abs(flax_decoder_block(variables, x_q, x_kv, 2) - expected).max() <= TOL


# one case shared by the tests that check structure rather than numbers: T_q != T_kv, D_kv != D
_SHARED = (7, 5, 3, 8, 6, 2, 5)


def test_flax_layout_is_the_documented_one():
    variables, *_ = _case(*_SHARED)
    shapes = {k: v.shape for k, v in flatten_variables(variables).items()}
    assert shapes["MultiHeadDotProductAttention_1/key/kernel"] == (6, 2, 4)
    assert shapes["MultiHeadDotProductAttention_0/out/kernel"] == (2, 4, 8)
    assert shapes["LayerNorm_2/scale"] == (6,)  # the encoder input's own LayerNorm
    assert shapes["Dense_0/kernel"] == (8, 5)


@settings(max_examples=6, deadline=None)
@given(
    seed=st.integers(0, 2**16),
    t_q=st.integers(1, 5),
    t_kv=st.integers(1, 5),
    h=st.integers(1, 4),
    d_k=st.integers(1, 4),
    d_kv=st.integers(1, 12),
    d_ff=st.integers(1, 12),
)
@example(seed=7, t_q=5, t_kv=3, h=4, d_k=2, d_kv=6, d_ff=16)  # four heads, every size distinct
@pytest.mark.slow
def test_matches_flax_linen_in_float64(seed, t_q, t_kv, h, d_k, d_kv, d_ff):
    variables, x_q, x_kv, expected = _case(seed, t_q, t_kv, h * d_k, d_kv, h, d_ff)
    got = flax_decoder_block(variables, x_q, x_kv, h)
    assert got.dtype == np.float64 and got.shape == expected.shape
    assert np.abs(got - expected).max() <= TOL


def test_accepts_params_subtree_and_flat_keys():
    variables, x_q, x_kv, expected = _case(*_SHARED)
    flat = {"params/" + k: v for k, v in flatten_variables(variables).items()}
    for tree in (variables, variables["params"], flat, flatten_variables(variables)):
        assert np.abs(flax_decoder_block(tree, x_q, x_kv, 2) - expected).max() <= TOL


def test_decoder_is_causal():
    # with x_kv fixed, changing decoder position t changes no output row before t
    variables, x_q, x_kv, _ = _case(*_SHARED)
    base = flax_decoder_block(variables, x_q, x_kv, 2)
    moved = x_q.copy()
    moved[3] += 1.0
    after = flax_decoder_block(variables, moved, x_kv, 2)
    assert np.array_equal(after[:3], base[:3])
    assert not np.allclose(after[3:], base[3:])


def test_bad_heads_and_missing_params_are_named():
    variables, x_q, x_kv, _ = _case(*_SHARED)
    with pytest.raises(ValueError, match="num_heads=3"):
        flax_decoder_block(variables, x_q, x_kv, 3)
    flat = flatten_variables(variables)
    del flat["LayerNorm_3/bias"]
    with pytest.raises(KeyError, match="LayerNorm_3/bias"):
        flax_decoder_block(flat, x_q, x_kv, 2)
