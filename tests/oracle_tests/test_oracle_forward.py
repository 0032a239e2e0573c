"""The oracle's forward pass against impl, the torch copy, and itself in extended precision."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from oracle_cases import (
    CASE_IDS,
    CASES,
    copy_of,
    make_batch,
    make_model,
    max_abs,
    model_from,
    tiny_configs,
)

import oracle

# Two float64 computations of the same model differ only by rounding order: each op adds about
# one unit roundoff (1.1e-16) relative to values of order 1-10, over ~30 ops for 2 + 2 layers
# (measured: at most 1.2e-14). 1e-12 leaves room for that and nothing for a wrong computation,
# whose errors are of order 1e-3 and above.
F64_TOL = 1e-12

# impl in float32 vs the oracle: float32's unit roundoff u = 2^-24, times a growth factor G,
# times the logits' scale. Over 12 drawn models (both norms, 2 + 2 layers, d 16) the measured
# max|err| / (u * max|logits|) was 2.0 to 4.3; G = 16 is 4x the worst draw. A float32 bug
# (a float32 PE table, a missing scale) gives errors of 1e-3 and more, far above 16u.
F32_GROWTH = 16
F32_U = 2.0**-24

# The oracle's own error budget (issue 2): its float64 result against the same functions run
# in np.longdouble (64-bit mantissa on x86, unit roundoff 5.4e-20).
LONGDOUBLE_REL_TOL = 1e-13


def _impl_logits(model, src, tgt, src_mask, tgt_mask) -> np.ndarray:
    with torch.no_grad():
        return model(src, tgt, src_mask, tgt_mask).double().numpy()


@pytest.mark.parametrize("norm,tie,src_vocab,tgt_vocab", CASES, ids=CASE_IDS)
def test_oracle_matches_impl_in_float64(norm, tie, src_vocab, tgt_vocab):
    model = make_model(norm, tie, src_vocab, tgt_vocab)
    src, tgt, src_mask, tgt_mask = make_batch(model.cfg)
    params = oracle.read_state_dict(model)
    logits = oracle.forward(params, src, tgt, src_mask, tgt_mask)
    assert logits.dtype == np.float64 and logits.shape == (3, 6, tgt_vocab)
    assert max_abs(logits, _impl_logits(model, src, tgt, src_mask, tgt_mask), tgt_mask) < F64_TOL
    with torch.no_grad():
        memory = model.encode(src, src_mask).numpy()
    assert max_abs(oracle.encode(params, src, src_mask), memory, src_mask) < F64_TOL


@pytest.mark.parametrize("norm,tie,src_vocab,tgt_vocab", CASES, ids=CASE_IDS)
def test_oracle_matches_the_torch_copy_in_float64(norm, tie, src_vocab, tgt_vocab):
    twin = copy_of(make_model(norm, tie, src_vocab, tgt_vocab, seed=1))
    src, tgt, src_mask, tgt_mask = make_batch(twin.cfg, seed=1)
    logits = oracle.forward(oracle.read_state_dict(twin), src, tgt, src_mask, tgt_mask)
    assert max_abs(logits, _impl_logits(twin, src, tgt, src_mask, tgt_mask), tgt_mask) < F64_TOL


@settings(max_examples=12, deadline=None)
@given(config=tiny_configs(), seed=st.integers(0, 2**16), B=st.integers(1, 3))
def test_oracle_matches_impl_on_drawn_configs(config, seed, B):
    model = model_from(config, seed)
    src, tgt, src_mask, tgt_mask = make_batch(model.cfg, seed, B=B, S=5, T=4)
    logits = oracle.forward(oracle.read_state_dict(model), src, tgt, src_mask, tgt_mask)
    assert max_abs(logits, _impl_logits(model, src, tgt, src_mask, tgt_mask), tgt_mask) < F64_TOL


@pytest.mark.parametrize("norm", ["post", "pre"])
def test_impl_in_float32_is_within_its_rounding_budget(norm):
    model = make_model(norm, False, 11, 13, seed=2)
    src, tgt, src_mask, tgt_mask = make_batch(model.cfg, seed=2)
    truth = oracle.forward(oracle.read_state_dict(model), src, tgt, src_mask, tgt_mask)
    approx = _impl_logits(model.float(), src, tgt, src_mask, tgt_mask)
    tol = F32_GROWTH * F32_U * np.abs(truth).max()
    err = max_abs(truth, approx, tgt_mask)
    assert err < tol, f"float32 error {err:.3g} exceeds {F32_GROWTH} u max|logits| = {tol:.3g}"


@pytest.mark.skipif(
    np.finfo(np.longdouble).eps > 1e-18, reason="np.longdouble is no wider than float64 here"
)
@pytest.mark.parametrize("norm", ["post", "pre"])
def test_oracle_error_against_extended_precision(norm):
    model = make_model(norm, False, 11, 13, seed=3)
    src, tgt, src_mask, tgt_mask = make_batch(model.cfg, seed=3)
    params = oracle.read_state_dict(model)
    logits = oracle.forward(params, src, tgt, src_mask, tgt_mask)
    exact = oracle.forward(params.astype(np.longdouble), src, tgt, src_mask, tgt_mask)
    assert exact.dtype == np.longdouble
    m = np.asarray(tgt_mask)
    rel = np.abs(logits - exact)[m].max() / np.abs(exact)[m].max()
    assert rel < LONGDOUBLE_REL_TOL, rel


def _contract_order(n_enc: int, n_dec: int, norm: str) -> list[str]:
    """The contract's module names in the order of computation for this norm placement."""
    if norm == "post":
        enc = ["self_attn", "norm1", "linear1", "linear2", "norm2"]
        dec = ["self_attn", "norm1", "cross_attn", "norm2", "linear1", "linear2", "norm3"]
    else:  # pre-LN normalizes each sublayer's input, so the norm comes first
        enc = ["norm1", "self_attn", "norm2", "linear1", "linear2"]
        dec = ["norm1", "self_attn", "norm2", "cross_attn", "norm3", "linear1", "linear2"]
    names = []
    for i in range(n_enc):
        names += [f"encoder.{i}.{m}" for m in enc] + [f"encoder.{i}"]
    names += ["enc_norm"] if norm == "pre" else []
    for i in range(n_dec):
        names += [f"decoder.{i}.{m}" for m in dec] + [f"decoder.{i}"]
    return names + (["dec_norm"] if norm == "pre" else [])


@pytest.mark.parametrize("norm", ["post", "pre"])
def test_trace_is_what_hooks_on_impl_see_in_order(norm):
    model = make_model(norm, True, 11, 11, seed=4)
    src, tgt, src_mask, tgt_mask = make_batch(model.cfg, seed=4)
    seen: dict[str, np.ndarray] = {}
    modules = dict(model.named_modules())
    names = _contract_order(2, 2, norm)

    def hook(name):
        def record(module, inputs, output):
            out = output[0] if isinstance(output, tuple) else output
            seen[name] = out.detach().numpy().copy()

        return record

    handles = [modules[n].register_forward_hook(hook(n)) for n in names]
    try:
        expected = _impl_logits(model, src, tgt, src_mask, tgt_mask)
    finally:
        for h in handles:
            h.remove()
    logits, trace = oracle.forward(
        oracle.read_state_dict(model), src, tgt, src_mask, tgt_mask, True
    )
    assert list(trace) == names == list(seen)
    for name in names:
        mask = src_mask if name.startswith("enc") else tgt_mask
        assert max_abs(trace[name], seen[name], mask) < F64_TOL, name
    assert max_abs(logits, expected, tgt_mask) < F64_TOL


def test_source_padding_is_never_read():
    # law: ids at padded source positions change nothing, bit for bit
    model = make_model("pre", True, 11, 11, seed=5)
    src, tgt, src_mask, tgt_mask = make_batch(model.cfg, seed=5)
    params = oracle.read_state_dict(model)
    other = torch.where(src_mask, src, (src + 1) % 11)
    assert np.array_equal(
        oracle.forward(params, src, tgt, src_mask, tgt_mask),
        oracle.forward(params, other, tgt, src_mask, tgt_mask),
    )


def test_decoder_is_causal():
    # law: changing targets after position t leaves logits 0..t bit for bit equal
    model = make_model("post", False, 11, 13, seed=6)
    src, tgt, src_mask, tgt_mask = make_batch(model.cfg, seed=6)
    params = oracle.read_state_dict(model)
    base = oracle.forward(params, src, tgt, src_mask, tgt_mask)
    changed = tgt.clone()
    changed[:, 3:] = (changed[:, 3:] + 1) % 13
    assert np.array_equal(
        base[:, :3], oracle.forward(params, src, changed, src_mask, tgt_mask)[:, :3]
    )


def test_bad_inputs_raise_the_contracts_errors():
    model = make_model("post", True, 11, 11)
    params = oracle.read_state_dict(model)
    src, tgt, src_mask, tgt_mask = (t.numpy() for t in make_batch(model.cfg))
    with pytest.raises(TypeError, match="src_mask must be bool"):
        oracle.forward(params, src, tgt, src_mask.astype(int), tgt_mask)
    with pytest.raises(TypeError, match="tgt_mask must be bool"):
        oracle.forward(params, src, tgt, src_mask, tgt_mask.astype(float))
    with pytest.raises(ValueError, match="must be equal"):
        oracle.forward(params, src, tgt, src_mask[:, :-1], tgt_mask)
    with pytest.raises(ValueError, match="differs from source batch"):
        oracle.forward(params, src, tgt[:2], src_mask, tgt_mask[:2])
    too_long = np.zeros((1, 33), dtype=np.int64)
    with pytest.raises(ValueError, match="exceeds max_len=32"):
        oracle.encode(params, too_long, too_long == 0)
    empty = src_mask.copy()
    empty[1] = False
    with pytest.raises(ValueError, match=r"source rows \[1\] have no real token"):
        oracle.forward(params, src, tgt, empty, tgt_mask)
    no_bos = tgt_mask.copy()
    no_bos[0, 0] = False
    with pytest.raises(ValueError, match="bos"):
        oracle.forward(params, src, tgt, src_mask, no_bos)
    with pytest.raises(ValueError, match=r"must lie in \[0, 11\)"):
        oracle.forward(params, src + 11, tgt, src_mask, tgt_mask)
