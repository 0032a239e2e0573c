"""A strong student suite (rung R5): a float64 numpy forward pass from the state_dict, the
section 3 numbers, the causal and padding laws, decode_step and translate.

The subject is the fixture `transformer` (or `import tinyllm.xfmr.transformer`).
"""

import math

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

PAD, BOS, EOS = 0, 1, 2


def cfg(T, **kw):
    base = dict(src_vocab=11, tgt_vocab=11, d_model=8, n_heads=2, d_ff=16, n_enc=1, n_dec=1)
    return T.TransformerConfig(**{**base, "dropout": 0.0, **kw})


def model(T, seed=0, **kw):
    torch.manual_seed(seed)
    return T.Transformer(cfg(T, **kw)).double().eval()


def batch():
    src = torch.tensor([[3, 4, 5, 6], [7, 8, PAD, PAD]])
    tgt = torch.tensor([[BOS, 3, 9, 4], [BOS, 5, PAD, PAD]])
    return src, tgt, src != PAD, tgt != PAD


# --- the forward pass again, in numpy -----------------------------------------------------------


def layer_norm(x, w, b, eps=1e-5):
    mu = x.mean(-1, keepdims=True)
    var = ((x - mu) ** 2).mean(-1, keepdims=True)
    return (x - mu) / np.sqrt(var + eps) * w + b


def attention(sd, p, q_in, kv_in, mask, h):
    lin = lambda x, n: x @ sd[f"{p}.{n}.weight"].T + sd[f"{p}.{n}.bias"]  # noqa: E731
    B, Tq, d = q_in.shape
    split = lambda x: x.reshape(B, -1, h, d // h).transpose(0, 2, 1, 3)  # noqa: E731
    q, k, v = split(lin(q_in, "q_proj")), split(lin(kv_in, "k_proj")), split(lin(kv_in, "v_proj"))
    s = q @ k.transpose(0, 1, 3, 2) / math.sqrt(d // h) + np.where(mask[:, None], 0.0, -np.inf)
    a = np.exp(s - s.max(-1, keepdims=True))
    a /= a.sum(-1, keepdims=True)
    return lin((a @ v).transpose(0, 2, 1, 3).reshape(B, Tq, d), "out_proj")


def pe(T, d):
    pos, i = np.arange(T)[:, None], np.arange(0, d, 2)[None]
    out = np.zeros((T, d))
    out[:, 0::2], out[:, 1::2] = np.sin(pos / 10000 ** (i / d)), np.cos(pos / 10000 ** (i / d))
    return out


def numpy_logits(m, src, tgt, sm, tm):
    sd = {k: v.detach().numpy() for k, v in m.state_dict().items()}
    c, (src, tgt, sm, tm) = m.cfg, (x.numpy() for x in (src, tgt, sm, tm))
    d, h, pre = c.d_model, c.n_heads, c.norm == "pre"
    emb_t = sd.get("tgt_emb.weight", sd["src_emb.weight"])
    out_w = sd.get("out.weight", emb_t)
    ln = lambda x, n: layer_norm(x, sd[f"{n}.weight"], sd[f"{n}.bias"])  # noqa: E731

    def ff(x, p):
        hid = np.maximum(0, x @ sd[f"{p}.linear1.weight"].T + sd[f"{p}.linear1.bias"])
        return hid @ sd[f"{p}.linear2.weight"].T + sd[f"{p}.linear2.bias"]

    def sub(x, f, norm):  # one residual sublayer, post-LN or pre-LN
        return x + f(ln(x, norm)) if pre else ln(x + f(x), norm)

    S, T = src.shape[1], tgt.shape[1]
    x = sd["src_emb.weight"][src] * math.sqrt(d) + pe(S, d)
    enc_mask = np.broadcast_to(sm[:, None, :], (len(src), S, S))
    for i in range(c.n_enc):
        p = f"encoder.{i}"
        x = sub(x, lambda z, p=p: attention(sd, f"{p}.self_attn", z, z, enc_mask, h), f"{p}.norm1")
        x = sub(x, lambda z, p=p: ff(z, p), f"{p}.norm2")
    if pre:
        x = ln(x, "enc_norm")
    y = emb_t[tgt] * math.sqrt(d) + pe(T, d)
    self_mask = np.tril(np.ones((T, T), bool))[None] & tm[:, None, :]
    cross_mask = np.broadcast_to(sm[:, None, :], (len(src), T, S))
    for i in range(c.n_dec):
        p = f"decoder.{i}"
        y = sub(y, lambda z, p=p: attention(sd, f"{p}.self_attn", z, z, self_mask, h), f"{p}.norm1")
        y = sub(
            y, lambda z, p=p: attention(sd, f"{p}.cross_attn", z, x, cross_mask, h), f"{p}.norm2"
        )
        y = sub(y, lambda z, p=p: ff(z, p), f"{p}.norm3")
    if pre:
        y = ln(y, "dec_norm")
    return y @ out_w.T


@pytest.mark.parametrize("norm", ["post", "pre"])
@pytest.mark.parametrize("tie", [True, False])
@pytest.mark.parametrize("layers", [1, 2])
def test_logits_equal_a_numpy_forward(transformer, norm, tie, layers):
    m = model(transformer, norm=norm, tie_embeddings=tie, n_enc=layers, n_dec=layers)
    src, tgt, sm, tm = batch()
    with torch.no_grad():
        got = m(src, tgt, sm, tm).numpy()
    want = numpy_logits(m, src, tgt, sm, tm)
    real = tm.numpy()
    np.testing.assert_allclose(got[real], want[real], atol=1e-9)


# --- section 3's numbers ----------------------------------------------------------------------


@pytest.mark.parametrize("step, rate", [(0, 0.03125), (3, 0.125), (15, 0.0625)])
def test_noam_hand_values(transformer, step, rate):
    assert transformer.noam_rate(step, 16, 4) == pytest.approx(rate)


def test_label_smoothing_hand_example(transformer):
    logits = torch.tensor([[1.0, 0.0, 0.0]], dtype=torch.float64, requires_grad=True)
    loss = transformer.label_smoothed_loss(logits, torch.tensor([0]), 0.1, pad_id=2)
    loss.backward()
    assert loss.item() == pytest.approx(0.618111, abs=1e-6)
    np.testing.assert_allclose(logits.grad.numpy(), [[-0.357216, 0.178608, 0.178608]], atol=1e-6)


def test_label_smoothing_ignores_pad_rows(transformer):
    logits = torch.tensor([[1.0, 0.0, 0.0], [0.3, -1.2, 2.0]], dtype=torch.float64)
    both = transformer.label_smoothed_loss(logits, torch.tensor([0, 2]), 0.1, pad_id=2)
    one = transformer.label_smoothed_loss(logits[:1], torch.tensor([0]), 0.1, pad_id=2)
    assert float(both) == pytest.approx(float(one), abs=1e-12)


# --- laws ---------------------------------------------------------------------------------------


@settings(max_examples=20)
@given(t=st.integers(0, 3), seed=st.integers(0, 3))
def test_decoder_is_causal(transformer, t, seed):
    m = model(transformer, seed)
    src, tgt, sm, _ = batch()
    src, sm = src[:1].repeat(2, 1), sm[:1].repeat(2, 1)
    tgt, tm = tgt[:1].repeat(2, 1), torch.ones(2, 4, dtype=torch.bool)
    tgt[1, t + 1 :] = 7
    with torch.no_grad():
        out = m(src, tgt, sm, tm)
    assert torch.equal(out[0, : t + 1], out[1, : t + 1])


@pytest.mark.parametrize("norm", ["post", "pre"])
def test_source_padding_is_never_read(transformer, norm):
    m = model(transformer, norm=norm)
    src, tgt, sm, tm = batch()
    other = src.clone()
    other[1, 2:] = 9
    longer = torch.cat([src, torch.full((2, 3), PAD)], 1)
    with torch.no_grad():
        a = m(src, tgt, sm, tm)
        b = m(other, tgt, sm, tm)
        c = m(longer, tgt, longer != PAD, tm)
    real = tm
    assert torch.allclose(a[real], b[real], atol=1e-12)
    assert torch.allclose(a[real], c[real], atol=1e-12)


@pytest.mark.parametrize("norm", ["post", "pre"])
def test_decoder_reads_the_source(transformer, norm):
    m = model(transformer, norm=norm)
    src, tgt, sm, tm = batch()
    with torch.no_grad():
        a = m(src, tgt, sm, tm)
        b = m(src.flip(0), tgt, sm.flip(0), tm)
    assert (a[0, 0] - b[0, 0]).abs().max() > 1e-6


@pytest.mark.parametrize("norm", ["post", "pre"])
def test_decode_step_equals_forward(transformer, norm):
    m = model(transformer, norm=norm)
    src, tgt, sm, _ = batch()
    with torch.no_grad():
        memory = m.encode(src, sm)
        full = m.decode(tgt, memory, sm, torch.ones_like(sm[:, :4]))
        state = m.init_state(sm)
        for t in range(tgt.shape[1]):
            step, state = m.decode_step(tgt[:, t], memory, state)
            assert torch.allclose(step, full[:, t], atol=1e-10), f"position {t}"


def test_embeddings_are_scaled(transformer):
    m = model(transformer, norm="pre")
    sd = {k: v.clone() for k, v in m.state_dict().items()}
    for k in sd:
        if ".out_proj." in k or ".linear2." in k:
            sd[k].zero_()
    m.load_state_dict(sd)
    src, tgt, sm, tm = batch()
    with torch.no_grad():
        got = m.encode(src, sm).numpy()
    x0 = sd["src_emb.weight"].numpy()[src.numpy()] * math.sqrt(8) + pe(4, 8)
    want = layer_norm(x0, sd["enc_norm.weight"].numpy(), sd["enc_norm.bias"].numpy())
    np.testing.assert_allclose(got[sm.numpy()], want[sm.numpy()], atol=1e-9)


def test_tied_embeddings_are_one_table(transformer):
    names = set(model(transformer).state_dict())
    assert "tgt_emb.weight" not in names and "out.weight" not in names


def test_pre_ln_adds_exactly_the_final_norms(transformer):
    post = set(model(transformer, norm="post").state_dict())
    pre = set(model(transformer, norm="pre").state_dict())
    assert pre - post == {f"{s}_norm.{p}" for s in ("enc", "dec") for p in ("weight", "bias")}


def test_optimizer_is_the_papers_adam(transformer):
    opt = transformer.make_optimizer(model(transformer))
    group = opt.param_groups[0]
    assert group["betas"] == (0.9, 0.98) and group["eps"] == 1e-9


def greedy_by_hand(m, src, max_len, eos):
    ys = torch.full((len(src), 1), BOS)
    with torch.no_grad():
        for _ in range(max_len):
            logits = m(src, ys, src != PAD, torch.ones_like(ys, dtype=torch.bool))
            ys = torch.cat([ys, logits[:, -1].argmax(-1, keepdim=True)], 1)
    out = []
    for row in ys[:, 1:].tolist():
        out.append(row[: row.index(eos)] if eos in row else row)
    return out


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_translate_is_greedy_and_drops_eos(transformer, seed):
    m = model(transformer, seed)
    src = batch()[0][:1]
    eos = greedy_by_hand(m, src, 3, eos=-1)[0][1]  # an eos the model emits at step 2
    got = transformer.translate(m, src, BOS, eos, PAD, max_len=6, beam_size=1)
    assert got == greedy_by_hand(m, src, 6, eos)
    assert eos not in got[0]


def test_validation_rejects_a_float_mask(transformer):
    m = model(transformer)
    src, tgt, sm, tm = batch()
    with pytest.raises(TypeError):
        m(src, tgt, sm.float(), tm)
