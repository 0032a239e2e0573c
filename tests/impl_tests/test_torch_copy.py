"""The torch copy (impl/torch_copy.py) against the contract, impl/transformer.py and the oracle."""

from __future__ import annotations

import dataclasses
import math

import numpy as np
import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from impl import torch_copy as tc

# Both sides compute in float64 with different summation orders (torch's fused attention vs
# impl's or numpy's matmuls); a tiny model's logits are O(1-10) and the measured worst difference
# is 2e-15. 1e-12 leaves two orders of magnitude and still catches any real difference.
F64_TOL = 1e-12

SETTINGS = settings(max_examples=12, deadline=None, suppress_health_check=[HealthCheck.too_slow])


def _cfg(**overrides) -> tc.TransformerConfig:
    base = dict(src_vocab=13, tgt_vocab=13, d_model=16, n_heads=2, d_ff=24, n_enc=2, n_dec=2)
    return tc.TransformerConfig(**{**base, "dropout": 0.0, **overrides})


def _model(seed: int = 0, dtype=torch.float64, **overrides) -> tc.Transformer:
    torch.manual_seed(seed)
    return tc.Transformer(_cfg(**overrides)).to(dtype).eval()


def _batch(cfg, gen: torch.Generator, B: int = 3, S: int = 5, T: int = 4):
    """Ids and masks with padding anywhere, but a real token in every source row and at bos."""
    src = torch.randint(0, cfg.src_vocab, (B, S), generator=gen)
    tgt = torch.randint(0, cfg.tgt_vocab, (B, T), generator=gen)
    src_mask = torch.rand(B, S, generator=gen) < 0.6
    src_mask[torch.arange(B), torch.randint(0, S, (B,), generator=gen)] = True
    tgt_mask = torch.rand(B, T, generator=gen) < 0.6
    tgt_mask[:, 0] = True
    return src, tgt, src_mask, tgt_mask


def _max_real_diff(a, b, tgt_mask) -> float:
    """max |a - b| over real target positions (padded rows are outside the contract)."""
    a, b = (
        torch.as_tensor(x.detach() if isinstance(x, torch.Tensor) else np.asarray(x))
        for x in (a, b)
    )
    return (a - b)[tgt_mask].abs().max().item()


configs = st.fixed_dictionaries(
    {
        "norm": st.sampled_from(["post", "pre"]),
        "tie_embeddings": st.booleans(),
        "tgt_vocab": st.sampled_from([13, 9]),  # 13 = the source's: equal vocabularies
        # an odd head count takes torch's slow attention path, an even one its fused fast path
        "n_heads": st.sampled_from([1, 2, 4]),
        "n_enc": st.integers(1, 2),
        "n_dec": st.integers(1, 2),
    }
)


# --- names ------------------------------------------------------------------------------------


@pytest.mark.parametrize("norm", ["post", "pre"])
@pytest.mark.parametrize("tie,tgt_vocab", [(True, 13), (True, 9), (False, 13)])
def test_state_dict_uses_contract_names_and_parameters_torch_names(norm, tie, tgt_vocab):
    model = _model(norm=norm, tie_embeddings=tie, tgt_vocab=tgt_vocab, n_enc=1, n_dec=1)
    names = set(model.state_dict())
    tables = {"src_emb.weight"}
    if not (tie and tgt_vocab == 13):
        tables.add("tgt_emb.weight")  # a tied table is listed once, under src_emb
    if not tie:
        tables.add("out.weight")  # tied away otherwise
    attn = [
        f"{p}.{w}" for p in ("q_proj", "k_proj", "v_proj", "out_proj") for w in ("weight", "bias")
    ]
    sub = ["linear1", "linear2", "norm1", "norm2"]
    expected = tables | {f"encoder.0.self_attn.{a}" for a in attn}
    expected |= {f"encoder.0.{s}.{w}" for s in sub for w in ("weight", "bias")}
    expected |= {f"decoder.0.{k}.{a}" for k in ("self_attn", "cross_attn") for a in attn}
    expected |= {f"decoder.0.{s}.{w}" for s in [*sub, "norm3"] for w in ("weight", "bias")}
    if norm == "pre":
        expected |= {"enc_norm.weight", "enc_norm.bias", "dec_norm.weight", "dec_norm.bias"}
    assert names == expected
    params = dict(model.named_parameters())
    assert "encoder.layers.0.self_attn.in_proj_weight" in params
    assert "decoder.layers.0.multihead_attn.in_proj_weight" in params
    assert ("encoder.norm.weight" in params) == (norm == "pre")
    assert tables <= set(params)  # the tables keep the contract's names in both schemes
    # q, k, v are rows 0:d, d:2d, 2d:3d of torch's packed in_proj, in that order
    d = model.cfg.d_model
    packed = params["decoder.layers.0.multihead_attn.in_proj_weight"]
    for j, proj in enumerate(("q_proj", "k_proj", "v_proj")):
        assert torch.equal(
            model.state_dict()[f"decoder.0.cross_attn.{proj}.weight"], packed[j * d : (j + 1) * d]
        )


def test_load_state_dict_is_strict_and_names_bad_keys():
    model = _model()
    state = model.state_dict()
    missing = dict(state)
    del missing["encoder.1.self_attn.k_proj.bias"]
    with pytest.raises(RuntimeError, match=r"encoder\.1\.self_attn\.k_proj\.bias"):
        model.load_state_dict(missing)
    with pytest.raises(RuntimeError, match=r"encoder\.layers\.0\.self_attn\.in_proj_weight"):
        model.load_state_dict(
            {**state, "encoder.layers.0.self_attn.in_proj_weight": torch.zeros(1)}
        )
    wrong = {**state, "decoder.0.norm3.bias": torch.zeros(3)}
    with pytest.raises(RuntimeError, match=r"decoder\.0\.norm3\.bias"):
        model.load_state_dict(wrong)


def test_state_dict_round_trips_between_two_copies():
    a, b = _model(seed=1, norm="pre"), _model(seed=2, norm="pre")
    src, tgt, sm, tm = _batch(a.cfg, torch.Generator().manual_seed(0))
    assert _max_real_diff(a(src, tgt, sm, tm), b(src, tgt, sm, tm), tm) > 1e-3
    b.load_state_dict(a.state_dict())
    # the same weights through the same code: bitwise equal
    assert torch.equal(a(src, tgt, sm, tm), b(src, tgt, sm, tm))


# --- agreement with impl and the oracle -------------------------------------------------------


def _impl():
    return pytest.importorskip("impl.transformer")


def _oracle():
    oracle = pytest.importorskip("oracle")
    if not hasattr(oracle, "read_state_dict"):
        pytest.skip("oracle not written yet")
    return oracle


@SETTINGS
@given(over=configs, seed=st.integers(0, 2**16))
def test_logits_equal_impls_in_float64(over, seed):
    impl = _impl()
    torch.manual_seed(seed)
    ref = impl.Transformer(impl.TransformerConfig(**{**_cfg().__dict__, **over})).double().eval()
    copy = tc.Transformer(ref.cfg).double().eval()
    copy.load_state_dict(ref.state_dict())
    src, tgt, sm, tm = _batch(copy.cfg, torch.Generator().manual_seed(seed))
    with torch.no_grad():
        assert _max_real_diff(copy(src, tgt, sm, tm), ref(src, tgt, sm, tm), tm) <= F64_TOL
    # and back: the copy's checkpoint drives impl to the same logits
    back = impl.Transformer(ref.cfg).double().eval()
    back.load_state_dict(copy.state_dict())
    assert _max_real_diff(copy(src, tgt, sm, tm), back(src, tgt, sm, tm), tm) <= F64_TOL


@SETTINGS
@given(over=configs, seed=st.integers(0, 2**16))
def test_logits_equal_the_oracle_in_float64(over, seed):
    oracle = _oracle()
    copy = _model(seed=seed, **over)
    src, tgt, sm, tm = _batch(copy.cfg, torch.Generator().manual_seed(seed))
    params = oracle.read_state_dict(copy.state_dict(), copy.cfg)
    want = oracle.forward(params, src.numpy(), tgt.numpy(), sm.numpy(), tm.numpy())
    with torch.no_grad():
        got = copy(src, tgt, sm, tm)
    assert _max_real_diff(got, want, tm) <= F64_TOL


def test_gradients_named_by_torch_are_read_by_the_oracle():
    """The harness canonicalizes named_parameters() gradients with the oracle's reader."""
    oracle = _oracle()
    copy = _model(norm="pre", tie_embeddings=False)
    grads = {n: torch.zeros_like(p) for n, p in copy.named_parameters()}
    oracle.read_state_dict(grads, copy.cfg)  # raises on any name it does not know


@pytest.mark.parametrize("norm", ["post", "pre"])
def test_torchs_eval_fast_path_agrees_with_its_slow_path(norm):
    """Eval under no_grad runs torch's fused kernels (even head count); real rows must not move."""
    model = _model(norm=norm, n_heads=2)
    src, tgt, sm, tm = _batch(model.cfg, torch.Generator().manual_seed(5))
    with torch.no_grad():
        fast = model(src, tgt, sm, tm)
    torch.backends.mha.set_fastpath_enabled(False)
    try:
        with torch.no_grad():
            slow = model(src, tgt, sm, tm)
    finally:
        torch.backends.mha.set_fastpath_enabled(True)
    assert _max_real_diff(fast, slow, tm) <= F64_TOL


# --- decoding ----------------------------------------------------------------------------------


@pytest.mark.parametrize("norm", ["post", "pre"])
def test_decode_step_equals_decode_rows_and_never_mutates_state(norm):
    model = _model(norm=norm)
    src, tgt, sm, _ = _batch(model.cfg, torch.Generator().manual_seed(3), T=5)
    full = torch.ones_like(tgt, dtype=torch.bool)
    with torch.no_grad():
        memory = model.encode(src, sm)
        rows = model.decode(tgt, memory, sm, full)
        state = model.init_state(sm)
        for t in range(tgt.shape[1]):
            cache_before = [(k.clone(), v.clone()) for k, v in state.cache]
            logits, new_state = model.decode_step(tgt[:, t], memory, state)
            assert (logits - rows[:, t]).abs().max().item() <= F64_TOL
            # the same state again gives the same answer: it was not mutated
            again, _ = model.decode_step(tgt[:, t], memory, state)
            assert torch.equal(again, logits)
            for (k, v), (k0, v0) in zip(state.cache, cache_before, strict=True):
                assert torch.equal(k, k0) and torch.equal(v, v0)
            assert new_state.pos == state.pos + 1
            # a KV cache: one more position of keys and values per layer, not a prefix re-run
            assert all(k.shape[2] == t + 1 for k, _ in new_state.cache)
            state = new_state


def _argmax_loop(model, src_row, bos, eos, pad_id, max_len):
    """Greedy decoding by hand: re-run the whole forward pass, take the argmax, stop at eos."""
    ys, out = [bos], []
    src_row = src_row[None]
    for _ in range(max_len):
        tgt = torch.tensor([ys])
        logits = model(src_row, tgt, src_row != pad_id, torch.ones_like(tgt, dtype=torch.bool))
        token = int(logits[0, -1].argmax())
        if token == eos:
            break
        out.append(token)
        ys.append(token)
    return out


@pytest.mark.parametrize("norm", ["post", "pre"])
def test_beam_one_is_the_argmax_loop_and_restores_mode(norm):
    model = _model(norm=norm, tgt_vocab=6, tie_embeddings=False)
    pad, bos = 0, 1
    src = torch.tensor([[3, 4, 5, 0, 0], [5, 6, 7, 8, 9], [4, 0, 0, 0, 0]])
    with torch.no_grad():
        free_run = _argmax_loop(model, src[0], bos, -1, pad, 7)  # no eos: 7 tokens
        eos = free_run[2]  # an eos greedy decoding reaches, so row 0 finishes early
        want = [_argmax_loop(model, row, bos, eos, pad, 7) for row in src]
    model.train()
    got = tc.translate(model, src, bos, eos, pad, max_len=7, beam_size=1)
    assert model.training  # mode restored
    assert got == want
    assert len(got[0]) <= 2 and all(eos not in seq for seq in got)  # eos dropped


@pytest.mark.parametrize("beam", [1, 2, 3, 4])
@pytest.mark.parametrize("penalty", [0.0, 1.0, 2.0])
def test_beam_search_equals_impls_and_the_oracles(beam, penalty):
    impl = _impl()
    oracle = _oracle()
    # untied: a tied random model mostly repeats its input token; seed 9 gives varied answers,
    # some finished early, that change with the beam size
    torch.manual_seed(9)
    over = _cfg(tgt_vocab=5, tie_embeddings=False).__dict__
    ref = impl.Transformer(impl.TransformerConfig(**over)).double().eval()
    copy = tc.Transformer(ref.cfg).double().eval()
    copy.load_state_dict(ref.state_dict())
    src = torch.tensor([[3, 4, 5, 0, 0], [5, 6, 7, 8, 9], [4, 0, 0, 0, 0], [9, 9, 1, 2, 0]])
    args = dict(bos=1, eos=2, pad_id=0, max_len=6, beam_size=beam, length_penalty=penalty)
    got = tc.translate(copy, src, **args)
    assert any(len(seq) < 6 for seq in got)  # some hypotheses finish: eos handling is exercised
    assert got == impl.translate(ref, src, **args)
    params = oracle.read_state_dict(copy.state_dict(), copy.cfg)
    assert got == oracle.translate(params, src.numpy(), **args)


def test_beam_search_follows_the_pinned_walk():
    """A scripted model with fixed next-token probabilities, so the walk can be followed by hand."""
    eos = 3
    table = {  # tokens after bos -> probabilities of ids 0..3
        (): [0.0, 0.5, 0.3, 0.2],
        (1,): [0.0, 0.6, 0.3, 0.1],
        (2,): [0.0, 0.05, 0.05, 0.9],
        (1, 1): [0.0, 0.1, 0.1, 0.8],
        (1, 2): [0.0, 0.25, 0.25, 0.5],
    }

    @dataclasses.dataclass(frozen=True)
    class Prefix:  # the scripted model's state: the tokens so far
        prefix: torch.Tensor

        def select(self, rows):
            return Prefix(self.prefix[rows])

    class Scripted(torch.nn.Module):
        cfg = tc.TransformerConfig(src_vocab=4, tgt_vocab=4, d_model=2, n_heads=1, max_len=8)

        def encode(self, src, src_mask):
            return torch.zeros(*src.shape, 1)

        def init_state(self, src_mask):
            return Prefix(torch.empty(len(src_mask), 0, dtype=torch.long))

        def decode_step(self, y_prev, memory, state):
            prefix = torch.cat([state.prefix, y_prev[:, None]], 1)
            probs = [table.get(tuple(row[1:].tolist()), [0.25] * 4) for row in prefix]
            logits = torch.tensor(probs, dtype=torch.float64).clamp_min(1e-30).log()
            return logits, Prefix(prefix)

    src = torch.tensor([[5]])
    # beam 2, step 2: (1,1) .30 live, (2,eos) .27 finished, (1,2) .15 live: live full, walk stops.
    # step 3: (1,1,eos) .24 and (1,2,eos) .075 finish; finished holds 3 >= 2: stop.
    # length_penalty 0 ranks log .27 > log .24: [2]; penalty 1: log(.27)/2 < log(.24)/3: [1, 1].
    assert tc.translate(Scripted(), src, 0, eos, 0, max_len=5, beam_size=2, length_penalty=0) == [
        [2]
    ]
    assert tc.translate(Scripted(), src, 0, eos, 0, max_len=5, beam_size=2) == [[1, 1]]
    # greedy: 1 (.5), 1 (.6), eos (.8)
    assert tc.translate(Scripted(), src, 0, eos, 0, max_len=5, beam_size=1) == [[1, 1]]
    # max_len reached with nothing finished: the live hypothesis finishes as it is
    assert tc.translate(Scripted(), src, 0, eos, 0, max_len=2, beam_size=1) == [[1, 1]]


# --- training ----------------------------------------------------------------------------------


def test_label_smoothed_loss_is_the_worked_example():
    # seed section 3: V = 3, logits (1, 0, 0), target 0, eps 0.1; a second row targets the pad id
    logits = torch.tensor(
        [[1.0, 0.0, 0.0], [3.0, -1.0, 2.0]], dtype=torch.float64, requires_grad=True
    )
    loss = tc.label_smoothed_loss(logits, torch.tensor([0, 2]), 0.1, pad_id=2)
    assert abs(loss.item() - 0.618111) < 5e-7  # the seed prints 6 decimals
    loss.backward()
    want = torch.tensor([[-0.357216, 0.178608, 0.178608], [0.0, 0.0, 0.0]], dtype=torch.float64)
    assert (logits.grad - want).abs().max().item() < 5e-7  # 6 printed decimals


@SETTINGS
@given(
    seed=st.integers(0, 2**16),
    eps=st.floats(0.0, 1.0),
    V=st.integers(2, 7),
)
def test_label_smoothed_loss_is_the_contract_formula(seed, eps, V):
    gen = torch.Generator().manual_seed(seed)
    logits = torch.randn(4, 3, V, generator=gen, dtype=torch.float64)
    targets = torch.randint(0, V, (4, 3), generator=gen)
    targets[0, 0] = 1  # at least one real target (pad id 0 is drawn too)
    logp = logits.log_softmax(-1)
    q = (1 - eps) * torch.nn.functional.one_hot(targets, V).double() + eps / V
    real = targets != 0
    want = -(q * logp).sum(-1)[real].mean()
    got = tc.label_smoothed_loss(logits, targets, eps, pad_id=0)
    assert abs(got.item() - want.item()) <= 1e-14  # float64 of O(1) values, two summation orders


def test_noam_rate_is_the_worked_example():
    # seed section 3: d = 16, w = 4
    assert [tc.noam_rate(s, 16, 4) for s in (0, 3, 15)] == [0.03125, 0.125, 0.0625]
    assert tc.noam_rate(3, 16, 4, factor=2.0) == 0.25


def test_optimizer_is_the_papers_adam():
    group = tc.make_optimizer(_model()).param_groups[0]
    assert group["betas"] == (0.9, 0.98) and group["eps"] == 1e-9 and group["weight_decay"] == 0


def _copy_task(cfg, n=10):
    gen = torch.Generator().manual_seed(0)
    body = torch.randint(3, cfg.src_vocab, (n, 4), generator=gen)
    src = body.clone()
    src[::3, 3] = 0  # some padding
    tgt = torch.cat(
        [torch.ones(n, 1, dtype=torch.long), body.flip(1), 2 * torch.ones(n, 1, dtype=torch.long)],
        1,
    )
    return src, tgt


def test_fit_is_reproducible_and_follows_the_schedule():
    a = _model(dtype=torch.float32, dropout=0.1, n_enc=1, n_dec=1).train(False)
    b = tc.Transformer(a.cfg)
    b.load_state_dict(a.state_dict())
    c = tc.Transformer(a.cfg)
    c.load_state_dict(a.state_dict())
    src, tgt = _copy_task(a.cfg)
    seen = []
    losses_a = tc.fit(
        a, src, tgt, steps=5, batch=4, pad_id=0, warmup=3, callback=lambda *x: seen.append(x)
    )
    losses_b = tc.fit(b, src, tgt, steps=5, batch=4, pad_id=0, warmup=3)
    losses_c = tc.fit(c, src, tgt, steps=5, batch=4, pad_id=0, warmup=3, seed=1)
    assert len(losses_a) == 5 and losses_a == losses_b  # same seed, same weights: identical
    assert losses_a != losses_c  # the seed drives the shuffle and dropout
    assert not a.training  # mode restored
    assert [s for s, _, _ in seen] == list(range(5))
    assert [r for _, r, _ in seen] == [tc.noam_rate(s, a.cfg.d_model, 3) for s in range(5)]
    assert [loss for _, _, loss in seen] == losses_a
    rates = []
    tc.fit(
        c, src, tgt, steps=3, batch=4, pad_id=0, lr=1e-3, callback=lambda s, r, _: rates.append(r)
    )
    assert rates == [1e-3] * 3


def test_fit_learns_a_little():
    model = _model(dtype=torch.float32, n_enc=1, n_dec=1, norm="pre")
    src, tgt = _copy_task(model.cfg)
    losses = tc.fit(model, src, tgt, steps=30, batch=10, pad_id=0, lr=3e-3)
    assert losses[-1] < 0.8 * losses[0]


# --- dtype, checkpoints, bad input -------------------------------------------------------------


def test_follows_the_parameters_dtype_and_pe_is_exact_in_float64():
    model = _model(dtype=torch.float32).double()
    src, tgt, sm, tm = _batch(model.cfg, torch.Generator().manual_seed(0))
    assert model(src, tgt, sm, tm).dtype == torch.float64
    pe = tc.positional_encoding(7, 6, torch.float64)
    want = [
        [
            f(p / 10000 ** (2 * (j // 2) / 6))
            for j, f in zip(range(6), [math.sin, math.cos] * 3, strict=True)
        ]
        for p in range(7)
    ]
    assert (pe - torch.tensor(want, dtype=torch.float64)).abs().max().item() <= 1e-15  # exp vs pow


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("tie,tgt_vocab", [(True, 13), (True, 9), (False, 13)])
def test_save_load_gives_identical_outputs(tmp_path, dtype, tie, tgt_vocab):
    model = _model(dtype=dtype, tie_embeddings=tie, tgt_vocab=tgt_vocab, norm="pre")
    tc.save_transformer(model, tmp_path)
    loaded = tc.load_transformer(tmp_path)
    src, tgt, sm, tm = _batch(model.cfg, torch.Generator().manual_seed(0))
    assert loaded.cfg == model.cfg
    assert torch.equal(loaded(src, tgt, sm, tm), model(src, tgt, sm, tm))


def test_checkpoints_cross_between_impl_and_the_copy(tmp_path):
    impl = _impl()
    torch.manual_seed(0)
    ref = impl.Transformer(impl.TransformerConfig(**_cfg(tgt_vocab=9).__dict__)).double().eval()
    impl.save_transformer(ref, tmp_path / "impl")
    copy = tc.load_transformer(tmp_path / "impl")
    src, tgt, sm, tm = _batch(copy.cfg, torch.Generator().manual_seed(0))
    assert _max_real_diff(copy(src, tgt, sm, tm), ref(src, tgt, sm, tm), tm) <= F64_TOL
    tc.save_transformer(copy, tmp_path / "copy")
    back = impl.load_transformer(tmp_path / "copy").double().eval()
    assert _max_real_diff(copy(src, tgt, sm, tm), back(src, tgt, sm, tm), tm) <= F64_TOL


def test_bad_inputs_raise_clear_errors():
    with pytest.raises(ValueError, match="norm"):
        _cfg(norm="sandwich")
    model = _model()
    src, tgt, sm, tm = _batch(model.cfg, torch.Generator().manual_seed(0))
    with pytest.raises(TypeError, match="bool"):
        model(src, tgt, sm.long(), tm)
    with pytest.raises(TypeError, match="bool"):
        model(src, tgt, sm, tm.float())
    with pytest.raises(ValueError, match="shape"):
        model(src, tgt, sm[:, :-1], tm)
    with pytest.raises(ValueError, match="batch"):
        model(src, tgt[:2], sm, tm[:2])
    long_src = torch.ones(1, model.cfg.max_len + 1, dtype=torch.long)
    with pytest.raises(ValueError, match="max_len"):
        model.encode(long_src, torch.ones_like(long_src, dtype=torch.bool))
    empty = sm.clone()
    empty[1] = False
    with pytest.raises(ValueError, match="no real token"):
        model(src, tgt, empty, tm)
    no_bos = tm.clone()
    no_bos[2, 0] = False
    with pytest.raises(ValueError, match="position 0"):
        model(src, tgt, sm, no_bos)
    with pytest.raises(ValueError, match="no real token"):
        tc.translate(model, torch.zeros(1, 3, dtype=torch.long), 1, 2, 0, max_len=3)
