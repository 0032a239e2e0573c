"""The torch reference impl/transformer.py against the contract, on its own (no oracle here)."""

from __future__ import annotations

import copy
import math
from dataclasses import asdict
from types import SimpleNamespace

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from safetensors.torch import load_file

from impl.transformer import (
    DecodeState,
    Transformer,
    TransformerConfig,
    fit,
    label_smoothed_loss,
    load_transformer,
    make_optimizer,
    noam_rate,
    positional_encoding,
    save_transformer,
    translate,
)

# The seed's worked examples are printed with 6 decimals, so they agree to half a unit there.
PRINTED = 1e-6
# decode_step and decode run the same float64 operations on the same numbers; only the shapes of
# the matrix products (cached K/V vs whole matrices) change the summation order, which moves
# results by a few ulps of O(1) logits (~1e-15). 1e-12 leaves room for depth, not for a bug.
STEP_VS_FULL = 1e-12

PAD, BOS, EOS = 0, 1, 2
FAST = settings(max_examples=8, deadline=None)


@pytest.fixture(autouse=True, scope="module")
def one_thread():
    """Tiny matrices on a shared machine: a second intra-op thread only waits (10x slower here)."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


def tiny(norm="post", tie=True, src_vocab=11, tgt_vocab=11, dropout=0.0, **kw) -> Transformer:
    cfg = dict(d_model=16, n_heads=2, d_ff=32, n_enc=2, n_dec=2, max_len=12)
    cfg.update(kw)
    return Transformer(
        TransformerConfig(
            src_vocab, tgt_vocab, dropout=dropout, norm=norm, tie_embeddings=tie, **cfg
        )
    )


def padded_batch(gen, vocab, lengths, width):
    """ids [B, width] of real tokens 3..vocab-1 followed by PAD, and their mask."""
    ids = torch.randint(3, vocab, (len(lengths), width), generator=gen)
    mask = torch.arange(width)[None, :] < torch.tensor(lengths)[:, None]
    return ids.masked_fill(~mask, PAD), mask


# --- the seed's section 3 ---------------------------------------------------------------------


def test_hand_example_label_smoothing():
    logits = torch.tensor([[1.0, 0.0, 0.0]], dtype=torch.float64, requires_grad=True)
    loss = label_smoothed_loss(logits, torch.tensor([0]), 0.1, pad_id=2)
    loss.backward()
    assert loss.item() == pytest.approx(0.618111, abs=PRINTED)
    # the gradient of the smoothed cross-entropy is p - q
    expected = torch.tensor([[-0.357216, 0.178608, 0.178608]], dtype=torch.float64)
    torch.testing.assert_close(logits.grad, expected, rtol=0, atol=PRINTED)

    # a second row whose target is the pad id: no loss, no gradient, not counted in the mean
    both = torch.tensor(
        [[1.0, 0.0, 0.0], [0.3, -2.0, 5.0]], dtype=torch.float64, requires_grad=True
    )
    loss2 = label_smoothed_loss(both, torch.tensor([0, 2]), 0.1, pad_id=2)
    loss2.backward()
    assert loss2.item() == loss.item()  # the pad row adds an exact zero
    assert torch.equal(both.grad[0], logits.grad[0])
    assert torch.equal(both.grad[1], torch.zeros(3, dtype=torch.float64))


def test_label_smoothing_is_the_mean_over_real_targets_of_the_smoothed_cross_entropy():
    gen = torch.Generator().manual_seed(0)
    logits = torch.randn(2, 4, 7, generator=gen, dtype=torch.float64)
    targets = torch.randint(0, 7, (2, 4), generator=gen)
    targets[0, 3] = targets[1, 1] = PAD
    q = torch.full((2, 4, 7), 0.2 / 7, dtype=torch.float64)
    q.scatter_add_(-1, targets[..., None], torch.full((2, 4, 1), 0.8, dtype=torch.float64))
    per = -(q * torch.log_softmax(logits, -1)).sum(-1)
    real = targets != PAD
    expected = per[real].mean()
    # the same sums in a different order: a few ulps
    assert label_smoothed_loss(logits, targets, 0.2, PAD).item() == pytest.approx(
        expected.item(), rel=1e-14
    )


def test_hand_example_noam():
    # d = 16, w = 4: d^-1/2 = 0.25; powers of two, so exact
    assert noam_rate(0, 16, 4) == 0.03125
    assert noam_rate(3, 16, 4) == 0.125  # the peak, at n = w
    assert noam_rate(15, 16, 4) == 0.0625
    assert noam_rate(3, 16, 4, factor=2.0) == 0.25


def test_optimizer_is_the_papers_adam():
    opt = make_optimizer(tiny())
    assert isinstance(opt, torch.optim.Adam)
    (group,) = opt.param_groups
    assert group["betas"] == (0.9, 0.98)
    assert group["eps"] == 1e-9
    assert group["weight_decay"] == 0.0


# --- names and tying -----------------------------------------------------------------------------


def expected_names(cfg: TransformerConfig) -> set[str]:
    attn = [
        f"{p}.{w}" for p in ("q_proj", "k_proj", "v_proj", "out_proj") for w in ("weight", "bias")
    ]
    wb = ("weight", "bias")
    names = {"src_emb.weight"}
    if not (cfg.tie_embeddings and cfg.src_vocab == cfg.tgt_vocab):
        names.add("tgt_emb.weight")
    if not cfg.tie_embeddings:
        names.add("out.weight")
    for i in range(cfg.n_enc):
        names |= {f"encoder.{i}.self_attn.{a}" for a in attn}
        names |= {
            f"encoder.{i}.{m}.{w}" for m in ("linear1", "linear2", "norm1", "norm2") for w in wb
        }
    for i in range(cfg.n_dec):
        names |= {f"decoder.{i}.{s}.{a}" for s in ("self_attn", "cross_attn") for a in attn}
        mods = ("linear1", "linear2", "norm1", "norm2", "norm3")
        names |= {f"decoder.{i}.{m}.{w}" for m in mods for w in wb}
    if cfg.norm == "pre":
        names |= {f"{n}.{w}" for n in ("enc_norm", "dec_norm") for w in wb}
    return names


@pytest.mark.parametrize("norm", ["post", "pre"])
@pytest.mark.parametrize(
    "tie, src_vocab, tgt_vocab", [(True, 11, 11), (True, 11, 13), (False, 11, 11), (False, 9, 13)]
)
def test_parameter_names_follow_the_norm_and_the_tying(norm, tie, src_vocab, tgt_vocab):
    model = tiny(norm, tie, src_vocab, tgt_vocab)
    sd = model.state_dict()
    assert set(sd) == expected_names(model.cfg)
    # state_dict holds exactly the parameters: no buffers, and a tied table listed once
    params = dict(model.named_parameters())
    assert list(sd) == list(params)
    assert len({t.data_ptr() for t in sd.values()}) == len(sd)
    shapes = {"src_emb.weight": (src_vocab, 16), "tgt_emb.weight": (tgt_vocab, 16)}
    shapes["out.weight"] = (tgt_vocab, 16)
    shapes["encoder.0.self_attn.q_proj.weight"] = (16, 16)
    shapes["decoder.1.linear1.weight"] = (32, 16)  # torch's (out, in)
    for name, shape in shapes.items():
        if name in sd:
            assert tuple(sd[name].shape) == shape


def test_tied_table_is_source_target_and_output():
    model = tiny(tie=True)
    assert model.tgt_table() is model.src_emb.weight
    assert model.out_weight() is model.src_emb.weight
    unequal = tiny(tie=True, tgt_vocab=13)
    assert unequal.out_weight() is unequal.tgt_emb.weight
    untied = tiny(tie=False)
    assert untied.out_weight() is untied.out.weight


def test_any_object_with_the_fields_configures_a_model():
    cfg = TransformerConfig(7, 9, d_model=8, n_heads=2, d_ff=16, n_enc=1, n_dec=1, norm="pre")
    assert Transformer(asdict(cfg)).cfg == cfg
    assert Transformer(SimpleNamespace(**asdict(cfg))).cfg == cfg


def test_tables_start_at_variance_one_over_d():
    torch.manual_seed(0)
    model = tiny(tie=False, src_vocab=400, tgt_vocab=400, d_model=64, n_heads=4)
    for table in (model.src_emb.weight, model.tgt_emb.weight, model.out.weight):
        # 25600 draws of N(0, 1/64): the sample variance's relative sd is sqrt(2/25600) = 0.9%,
        # so 4.5% is 5 sigma; torch's N(0, 1) default would be off by 64x
        assert table.var().item() == pytest.approx(1 / 64, rel=0.045)


def test_embeddings_scaled_and_positions_interleaved():
    model = tiny().double().eval()
    pe = positional_encoding(0, 5, 16, torch.float64, "cpu")
    p, i = 3, 2  # feature 2i = 4 and 2i + 1 = 5 share the frequency 10000^(-4/16)
    assert pe[p, 2 * i].item() == pytest.approx(math.sin(p / 10000 ** (4 / 16)), abs=1e-15)
    assert pe[p, 2 * i + 1].item() == pytest.approx(math.cos(p / 10000 ** (4 / 16)), abs=1e-15)
    assert torch.equal(pe[0, 1::2], torch.ones(8, dtype=torch.float64))  # cos 0 at position 0
    ids = torch.tensor([[4, 5, 6, 7, 8]])
    x0 = model._embed(ids, model.src_emb.weight)
    assert torch.equal(x0, model.src_emb.weight[ids] * math.sqrt(16) + pe)


def test_hooks_see_one_tensor_per_contract_module():
    model = tiny("pre").eval()
    seen = {}
    for name, module in model.named_modules():
        if name.endswith(("self_attn", "cross_attn", "norm1", "norm3", "linear2", "_norm")):
            module.register_forward_hook(lambda m, a, out, name=name: seen.setdefault(name, out))
    src, tgt = torch.randint(3, 11, (2, 5)), torch.randint(3, 11, (2, 4))
    model(src, tgt, src != PAD, tgt != PAD)
    assert {"encoder.0.self_attn", "decoder.1.cross_attn", "enc_norm", "dec_norm"} <= set(seen)
    for name, out in seen.items():
        assert isinstance(out, torch.Tensor) and out.shape[-1] == 16, name


# --- decoding ------------------------------------------------------------------------------------


@FAST
@given(
    norm=st.sampled_from(["post", "pre"]),
    tie=st.booleans(),
    tgt_vocab=st.sampled_from([11, 13]),
    n_heads=st.sampled_from([1, 2, 4]),
    n_layers=st.integers(1, 2),
    src_lengths=st.lists(st.integers(1, 6), min_size=1, max_size=3),
    seed=st.integers(0, 2**16),
)
def test_decode_step_equals_decode(norm, tie, tgt_vocab, n_heads, n_layers, src_lengths, seed):
    torch.manual_seed(seed)
    model = tiny(norm, tie, 11, tgt_vocab, n_heads=n_heads, n_enc=n_layers, n_dec=n_layers)
    model = model.double().eval()
    gen = torch.Generator().manual_seed(seed)
    src, src_mask = padded_batch(gen, 11, src_lengths, 6)
    tgt = torch.randint(3, tgt_vocab, (len(src_lengths), 7), generator=gen)
    tgt[:, 0] = BOS
    memory = model.encode(src, src_mask)
    full = model.decode(tgt, memory, src_mask, torch.ones_like(tgt, dtype=torch.bool))
    assert full.dtype == torch.float64
    state = model.init_state(src_mask)
    for t in range(tgt.size(1)):
        before = (state.pos, [k.clone() for kv in state.self_kv for k in kv])
        logits, new_state = model.decode_step(tgt[:, t], memory, state)
        again, _ = model.decode_step(tgt[:, t], memory, state)
        # the given state is untouched, so stepping it twice gives the same answer
        assert state.pos == before[0] == t and new_state.pos == t + 1
        assert all(
            torch.equal(a, b)
            for a, b in zip(before[1], [k for kv in state.self_kv for k in kv], strict=True)
        )
        assert torch.equal(logits, again)
        torch.testing.assert_close(logits, full[:, t], rtol=0, atol=STEP_VS_FULL)
        state = new_state


def test_decode_state_is_frozen():
    model = tiny().eval()
    state = model.init_state(torch.ones(1, 3, dtype=torch.bool))
    assert isinstance(state, DecodeState)
    with pytest.raises(AttributeError):
        state.pos = 3


def greedy_by_decode(model, src, eos, max_len):
    """A hand argmax loop over the full decode (no cache), one source row at a time."""
    out = []
    for row in src:
        src_row, mask = row[None], row[None] != PAD
        memory = model.encode(src_row, mask)
        tokens = [BOS]
        for _ in range(max_len):
            tgt = torch.tensor([tokens])
            logits = model.decode(tgt, memory, mask, torch.ones_like(tgt, dtype=torch.bool))
            token = int(logits[0, -1].argmax())
            if token == eos:
                break
            tokens.append(token)
        out.append(tokens[1:])
    return out


@pytest.mark.parametrize("norm", ["post", "pre"])
def test_beam_one_is_greedy_and_drops_eos(norm):
    torch.manual_seed(3)
    model = tiny(norm, tgt_vocab=13).double().eval()
    gen = torch.Generator().manual_seed(4)
    src, _ = padded_batch(gen, 11, [5, 2, 4], 5)
    with torch.no_grad():
        never = greedy_by_decode(model, src, eos=-1, max_len=8)  # runs to max_len
        # an eos the greedy path reaches, so that decoding finishes early on some row
        eos = never[0][3]
        expected = greedy_by_decode(model, src, eos=eos, max_len=8)
    got = translate(model, src, BOS, eos, PAD, max_len=8, beam_size=1)
    assert got == expected
    assert all(eos not in row for row in got)
    assert len(got[0]) < 8  # row 0 finished on eos, which was dropped
    assert translate(model, src, BOS, -1, PAD, max_len=8) == never  # no eos: max_len tokens


def test_beam_search_keeps_a_finished_hypothesis_over_longer_live_ones():
    # a model whose every step gives token 5 logit 2, eos logit 1 and the rest 0: beam 2
    # finishes (eos,) at step 0, keeps (5,) live, and finishes (5, eos) at step 1, then stops.
    model = tiny(tgt_vocab=11).double().eval()
    with torch.no_grad():
        for p in model.parameters():
            p.zero_()
        for layer in model.decoder:
            layer.norm3.bias[0] = 1.0  # the stream after the last sublayer is e_0
        model.src_emb.weight[5, 0] = 2.0  # logit 2 for token 5
        model.src_emb.weight[EOS, 0] = 1.0  # logit 1 for eos, 0 for the rest
    src = torch.tensor([[4, 5, PAD]])
    assert translate(model, src, BOS, EOS, PAD, max_len=3, beam_size=1) == [[5, 5, 5]]
    # length_penalty 0 scores raw sums: log p(eos) beats log p(5) + log p(eos)
    assert translate(model, src, BOS, EOS, PAD, max_len=3, beam_size=2, length_penalty=0.0) == [[]]
    # length_penalty 1 scores means: (log p(5) + log p(eos)) / 2 = -1.45 beats log p(eos) = -1.95
    assert translate(model, src, BOS, EOS, PAD, max_len=3, beam_size=2, length_penalty=1.0) == [[5]]


@pytest.mark.parametrize("training", [True, False])
def test_translate_decodes_in_eval_mode_without_gradients_and_restores_the_mode(training):
    model = tiny(dropout=0.5).train(training)
    seen = []
    model.encoder[0].register_forward_hook(
        lambda m, a, out: seen.append((m.training, torch.is_grad_enabled()))
    )
    src = torch.tensor([[4, 5, 6], [7, 8, PAD]])
    first = translate(model, src, BOS, EOS, PAD, max_len=6, beam_size=2)
    assert model.training is training
    assert seen and all(mode == (False, False) for mode in seen)
    assert translate(model, src, BOS, EOS, PAD, max_len=6, beam_size=2) == first  # no dropout


# --- save and load -------------------------------------------------------------------------------


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("tie, tgt_vocab", [(True, 11), (True, 13), (False, 11)])
def test_save_load_gives_identical_outputs(tmp_path, dtype, tie, tgt_vocab):
    model = tiny("pre", tie, 11, tgt_vocab, dropout=0.1).to(dtype).eval()
    save_transformer(model, tmp_path / "ckpt")
    stored = load_file(str(tmp_path / "ckpt" / "model.safetensors"))
    assert set(stored) == set(model.state_dict())  # a tied table stored once
    loaded = load_transformer(tmp_path / "ckpt").eval()
    assert loaded.cfg == model.cfg
    assert all(p.dtype == dtype for p in loaded.parameters())
    src, tgt = torch.randint(3, 11, (2, 5)), torch.randint(3, tgt_vocab, (2, 4))
    masks = (src != PAD, tgt != PAD)
    assert torch.equal(loaded(src, tgt, *masks), model(src, tgt, *masks))
    if tie and tgt_vocab == 11:
        assert loaded.out_weight() is loaded.src_emb.weight  # still one tensor after loading


# --- fit -----------------------------------------------------------------------------------------


def copy_task(n=10, length=4, vocab=11, seed=0):
    gen = torch.Generator().manual_seed(seed)
    src = torch.randint(3, vocab, (n, length), generator=gen)
    src[::3, -1] = PAD  # some shorter rows
    body = src.clone()
    tgt = torch.cat([torch.full((n, 1), BOS), body, torch.full((n, 1), PAD)], dim=1)
    lengths = (body != PAD).sum(1)
    tgt[torch.arange(n), lengths + 1] = EOS
    return src, tgt


def test_fit_follows_the_schedule_and_is_reproducible():
    torch.manual_seed(0)
    model = tiny(dropout=0.1)
    start = copy.deepcopy(model.state_dict())
    src, tgt = copy_task()
    calls = []
    losses = fit(
        model, src, tgt, steps=7, batch=4, pad_id=PAD, warmup=3, callback=lambda *c: calls.append(c)
    )
    assert len(losses) == 7 and [c[0] for c in calls] == list(range(7))
    assert [c[2] for c in calls] == losses
    assert [c[1] for c in calls] == [noam_rate(s, 16, 3) for s in range(7)]
    assert model.training  # restored (it was training)

    model.load_state_dict(start)
    assert fit(model, src, tgt, steps=7, batch=4, pad_id=PAD, warmup=3) == losses  # same seed
    model.load_state_dict(start)
    assert fit(model, src, tgt, steps=7, batch=4, pad_id=PAD, warmup=3, seed=1) != losses


def test_fit_at_a_constant_rate():
    torch.manual_seed(1)
    model = tiny().eval()
    src, tgt = copy_task()
    rates = []
    fit(
        model,
        src,
        tgt,
        steps=3,
        batch=3,
        pad_id=PAD,
        lr=1e-3,
        callback=lambda step, rate, loss: rates.append(rate),
    )
    assert rates == [1e-3] * 3
    assert not model.training  # restored (it was in eval mode)
    # the rate really is what the optimizer uses: at rate 0 Adam moves nothing
    before = copy.deepcopy(model.state_dict())
    fit(model, src, tgt, steps=2, batch=3, pad_id=PAD, lr=0.0)
    assert all(torch.equal(before[k], v) for k, v in model.state_dict().items())


def test_fit_learns_and_leaves_the_global_rng_alone():
    torch.manual_seed(2)
    model = tiny()
    src, tgt = copy_task(n=8)
    torch.manual_seed(5)
    expected = torch.rand(3)
    torch.manual_seed(5)
    losses = fit(model, src, tgt, steps=30, batch=8, pad_id=PAD, lr=3e-3)
    assert torch.equal(torch.rand(3), expected)
    assert losses[-1] < 0.7 * losses[0]  # the copy task is learnable in 30 full-batch updates


# --- dtype ---------------------------------------------------------------------------------------


def test_double_runs_everything_in_float64():
    model = tiny("pre").double().eval()
    src, tgt = torch.randint(3, 11, (2, 5)), torch.randint(3, 11, (2, 4))
    memory = model.encode(src, src != PAD)
    assert memory.dtype == torch.float64
    assert model.decode(tgt, memory, src != PAD, tgt != PAD).dtype == torch.float64
    state = model.init_state(src != PAD)
    assert all(k.dtype == torch.float64 for kv in state.self_kv for k in kv)
    logits, _ = model.decode_step(tgt[:, 0], memory, state)
    assert logits.dtype == torch.float64


# --- bad input -----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "change, fragment",
    [
        (dict(norm="layer"), "'layer'"),
        (dict(d_model=16, n_heads=3), "n_heads=3"),
        (dict(dropout=1.0), "dropout"),
        (dict(d_ff=0), "d_ff"),
    ],
)
def test_bad_config_is_a_value_error(change, fragment):
    args = dict(src_vocab=5, tgt_vocab=5, d_model=16, n_heads=2) | change
    with pytest.raises(ValueError, match=fragment):
        TransformerConfig(**args)


def bad_calls():
    src = torch.tensor([[4, 5, 6], [7, 8, PAD]])
    tgt = torch.tensor([[BOS, 4, 5], [BOS, 6, PAD]])
    sm, tm = src != PAD, tgt != PAD
    long_src = torch.randint(3, 11, (2, 13))  # max_len is 12
    yield "src mask not bool", TypeError, lambda m: m(src, tgt, sm.long(), tm)
    yield "tgt mask not bool", TypeError, lambda m: m(src, tgt, sm, tm.float())
    yield "init_state mask not bool", TypeError, lambda m: m.init_state(sm.int())
    yield "src mask shape", ValueError, lambda m: m(src, tgt, sm[:, :2], tm)
    yield "tgt mask shape", ValueError, lambda m: m(src, tgt, sm, tm[:1])
    yield "batch src vs tgt", ValueError, lambda m: m(src, tgt[:1], sm, tm[:1])
    yield (
        "batch memory vs tgt",
        ValueError,
        lambda m: m.decode(tgt[:1], m.encode(src, sm), sm, tm[:1]),
    )
    yield (
        "memory vs src_mask",
        ValueError,
        lambda m: m.decode(tgt, m.encode(src, sm)[:, :2], sm, tm),
    )
    yield "src too long", ValueError, lambda m: m.encode(long_src, long_src != PAD)
    yield "tgt too long", ValueError, lambda m: m(src, long_src, sm, long_src != PAD)
    empty = sm.clone()
    empty[1] = False
    yield "source row without tokens", ValueError, lambda m: m(src, tgt, empty, tm)
    yield "init_state row without tokens", ValueError, lambda m: m.init_state(empty)
    no_bos = tm.clone()
    no_bos[1, 0] = False
    yield "target row padded at bos", ValueError, lambda m: m(src, tgt, sm, no_bos)
    yield (
        "y_prev batch",
        ValueError,
        lambda m: m.decode_step(tgt[:1, 0], m.encode(src, sm), m.init_state(sm)),
    )
    yield (
        "translate all-pad row",
        ValueError,
        lambda m: translate(m, torch.tensor([[4, 5], [PAD, PAD]]), BOS, EOS, PAD, max_len=4),
    )
    yield "translate past max_len", ValueError, lambda m: translate(m, src, BOS, EOS, PAD, 13)
    yield (
        "loss all pad",
        ValueError,
        lambda m: label_smoothed_loss(torch.zeros(2, 5), torch.tensor([PAD, PAD]), 0.1, PAD),
    )


@pytest.mark.parametrize(
    "what, error, call", list(bad_calls()), ids=lambda x: x if isinstance(x, str) else None
)
def test_bad_input_raises(what, error, call):
    with pytest.raises(error):
        call(tiny().eval())


def test_decode_step_past_max_len_raises():
    model = tiny(max_len=2).eval()
    src = torch.tensor([[4, 5]])
    memory, state = model.encode(src, src != PAD), model.init_state(src != PAD)
    for _ in range(2):
        _, state = model.decode_step(torch.tensor([BOS]), memory, state)
    with pytest.raises(ValueError, match="max_len=2"):
        model.decode_step(torch.tensor([BOS]), memory, state)
