"""A suite tuned to the published pitfalls: eleven tests, one aimed at each of s01-s11 and at
nothing else. It kills every published mutant (a mutation score of 1.00) and says little about
the rest of the contract: the generated sample of `xfmr mutation-score` shows what it misses.

The subject is the fixture `transformer` (or `import tinyllm.xfmr.transformer`).
"""

import torch

PAD, BOS = 0, 1


def model(T, **kw):
    torch.manual_seed(0)
    base = dict(src_vocab=11, tgt_vocab=11, d_model=8, n_heads=2, d_ff=16, n_enc=1, n_dec=1)
    return T.Transformer(T.TransformerConfig(**{**base, "dropout": 0.0, **kw})).double().eval()


def batch():
    src = torch.tensor([[3, 4, 5, 6], [7, 8, PAD, PAD]])
    tgt = torch.tensor([[BOS, 3, 9, 4], [BOS, 5, 6, 7]])
    return src, tgt, src != PAD, tgt != PAD


def normalized(x):
    """Rows with mean 0 and variance 1: a LayerNorm's output at its initial weight and bias."""
    return x.mean(-1).abs().max() < 1e-6 and (x.var(-1, unbiased=False) - 1).abs().max() < 1e-3


def test_s01_post_ln_ends_each_layer_with_its_norm(transformer):
    m = model(transformer, norm="post")
    src, _, sm, _ = batch()
    with torch.no_grad():
        assert normalized(m.encode(src, sm)[sm])


def test_s02_pre_ln_ends_with_the_final_norm(transformer):
    m = model(transformer, norm="pre")
    src, _, sm, _ = batch()
    with torch.no_grad():
        assert normalized(m.encode(src, sm)[sm])


def test_s03_the_decoder_is_causal(transformer):
    m = model(transformer)
    src, tgt, sm, tm = batch()
    later = tgt.clone()
    later[:, 2:] = 10
    with torch.no_grad():
        assert torch.equal(m(src, tgt, sm, tm)[:, :2], m(src, later, sm, tm)[:, :2])


def test_s04_the_decoder_reads_the_source(transformer):
    m = model(transformer)
    src, tgt, sm, tm = batch()
    with torch.no_grad():
        a = m(src, tgt, sm, tm)
        b = m(src.flip(0), tgt, sm.flip(0), tm)
    assert (a[0, 0] - b[0, 0]).abs().max() > 1e-6


def test_s05_embeddings_are_scaled_by_sqrt_d(transformer):
    m = model(transformer, norm="pre")
    with torch.no_grad():
        for name, p in m.named_parameters():
            if name.startswith(("encoder", "enc_norm")):
                p.zero_() if not name.endswith("norm.weight") else p.fill_(1.0)
        src = torch.tensor([[3]])
        # one layer whose sublayers add nothing: the final norm of x0 = E[3] sqrt(8) + PE(0)
        x0 = m.state_dict()["src_emb.weight"][3] * 8**0.5 + torch.tensor([0.0, 1.0] * 4)
        want = (x0 - x0.mean()) / (x0.var(unbiased=False) + 1e-5) ** 0.5
        assert torch.allclose(m.encode(src, src != PAD)[0, 0], want, atol=1e-9)


def test_s06_source_padding_is_never_read(transformer):
    m = model(transformer)
    src, tgt, sm, tm = batch()
    other = src.clone()
    other[1, 2:] = 9
    with torch.no_grad():
        assert torch.allclose(m(src, tgt, sm, tm), m(other, tgt, sm, tm), atol=1e-12)


def test_s07_label_smoothing_ignores_pad_targets(transformer):
    logits = torch.tensor([[1.0, 0.0, 0.0], [0.3, -1.2, 2.0]], dtype=torch.float64)
    both = transformer.label_smoothed_loss(logits, torch.tensor([0, 2]), 0.1, pad_id=2)
    one = transformer.label_smoothed_loss(logits[:1], torch.tensor([0]), 0.1, pad_id=2)
    assert abs(float(both) - float(one)) < 1e-12


def test_s08_noams_first_update_has_a_rate(transformer):
    assert abs(transformer.noam_rate(0, 16, 4) - 0.03125) < 1e-12


def test_s09_the_output_layer_is_tied(transformer):
    assert "out.weight" not in model(transformer, tie_embeddings=True).state_dict()


def test_s10_decode_step_gives_each_position_its_row(transformer):
    m = model(transformer)
    src, tgt, sm, _ = batch()
    with torch.no_grad():
        memory = m.encode(src, sm)
        full = m.decode(tgt, memory, sm, torch.ones_like(tgt, dtype=torch.bool))
        state = m.init_state(sm)
        for t in range(tgt.shape[1]):
            step, state = m.decode_step(tgt[:, t], memory, state)
            assert torch.allclose(step, full[:, t], atol=1e-10)


def test_s11_translate_drops_eos(transformer):
    m = model(transformer)
    src = batch()[0][:1]
    with torch.no_grad():
        first = m(src, torch.tensor([[BOS]]), src != PAD, torch.tensor([[True]]))[0, -1]
    eos = int(first.argmax())  # the first token greedy emits: the output must be empty
    assert transformer.translate(m, src, BOS, eos, PAD, max_len=5, beam_size=1) == [[]]
