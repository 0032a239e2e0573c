"""oracle.read_state_dict on a Hugging Face MarianMTModel: the oracle's logits are Marian's."""

from __future__ import annotations

import numpy as np
import pytest
import torch

transformers = pytest.importorskip("transformers")

import oracle  # noqa: E402
from oracle.readers.marian import marian_positional_table  # noqa: E402

# Both sides run float64 with the same operations in another order; logits are O(1)-O(10), so
# 1e-12 leaves room for some hundred ulps of rounding and no room for a wrong operation.
TOL = 1e-12

B, S, T = 3, 6, 5
SRC_LEN = np.array([6, 4, 1])  # real source tokens per row, the rest padding
TGT_LEN = np.array([5, 3, 2])


def _marian(activation: str, share: bool, scale_embedding: bool, seed: int = 0):
    """A tiny MarianMTModel in float64 and eval mode, every weight redrawn at scales that make
    each sublayer matter (transformers' init_std 0.02 would leave the logits nearly constant)."""
    vocab, dec_vocab, pad = (23, None, 22) if share else (23, 19, 18)
    config = transformers.MarianConfig(
        vocab_size=vocab,
        decoder_vocab_size=dec_vocab,
        d_model=16,
        encoder_layers=2,
        decoder_layers=2,
        encoder_attention_heads=2,
        decoder_attention_heads=2,
        encoder_ffn_dim=24,
        decoder_ffn_dim=24,
        max_position_embeddings=32,
        activation_function=activation,
        scale_embedding=scale_embedding,
        share_encoder_decoder_embeddings=share,
        pad_token_id=pad,
        decoder_start_token_id=pad,
    )
    torch.manual_seed(seed)
    model = transformers.MarianMTModel(config).double().eval()
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "embed_positions" in name:  # the sinusoid stays as transformers built it
                continue
            noise = torch.randn(p.shape, generator=gen, dtype=torch.float64)
            if name.endswith("layer_norm.weight"):
                p.copy_(1 + 0.3 * noise)
            elif p.ndim == 2:
                p.copy_(noise / p.shape[1] ** 0.5)
            else:
                p.copy_(0.3 * noise)
        model.final_logits_bias.copy_(torch.randn(model.final_logits_bias.shape, generator=gen))
    return model


def _batch(model, seed: int = 1):
    """Padded source and target batches; decoder inputs start with Marian's start token (pad)."""
    cfg = model.config
    rng = np.random.default_rng(seed)
    src = rng.integers(0, cfg.vocab_size - 1, (B, S))
    tgt = rng.integers(0, cfg.decoder_vocab_size - 1, (B, T))
    src_mask = np.arange(S) < SRC_LEN[:, None]
    tgt_mask = np.arange(T) < TGT_LEN[:, None]
    src[~src_mask] = cfg.pad_token_id
    tgt[~tgt_mask] = cfg.pad_token_id
    tgt[:, 0] = cfg.decoder_start_token_id
    return src, tgt, src_mask, tgt_mask


def _hf_logits(model, src, tgt, src_mask, tgt_mask) -> np.ndarray:
    with torch.no_grad():
        out = model(
            input_ids=torch.tensor(src),
            attention_mask=torch.tensor(src_mask, dtype=torch.long),
            decoder_input_ids=torch.tensor(tgt),
            decoder_attention_mask=torch.tensor(tgt_mask, dtype=torch.long),
            use_cache=False,
        )
    return out.logits.numpy()


def _max_error_on_real_positions(got: np.ndarray, want: np.ndarray, tgt_mask: np.ndarray) -> float:
    return float(np.abs(got - want)[tgt_mask].max())


@pytest.mark.parametrize(
    "activation, share, scale_embedding",
    [("relu", True, True), ("gelu", False, False), ("swish", True, False)],
)
@pytest.mark.slow
def test_logits_match_marian_on_padded_batches(activation, share, scale_embedding):
    model = _marian(activation, share, scale_embedding)
    src, tgt, src_mask, tgt_mask = _batch(model)
    params = oracle.read_state_dict(model)  # the model's own MarianConfig travels with it
    assert params.scheme == "marian"
    assert params.spec.tie == ("all" if share else "tgt_out")
    got = oracle.forward(params, src, tgt, src_mask, tgt_mask)
    want = _hf_logits(model, src, tgt, src_mask, tgt_mask)
    assert _max_error_on_real_positions(got, want, tgt_mask) <= TOL


def test_state_dict_with_config_and_stored_table():
    # a bare state_dict plus its config; the stored positional table is float32-rounded by
    # transformers, and the oracle must use those stored values
    model = _marian("gelu", True, True, seed=3)
    state = {k: v.numpy() for k, v in model.state_dict().items()}
    params = oracle.read_state_dict(state, model.config.to_dict())
    stored = state["model.encoder.embed_positions.weight"]
    assert np.array_equal(params.spec.pos_table, stored)
    # the recomputed table is transformers' float32 one, value for value
    assert np.array_equal(marian_positional_table(32, 16), stored)
    src, tgt, src_mask, tgt_mask = _batch(model, seed=4)
    want = _hf_logits(model, src, tgt, src_mask, tgt_mask)
    got = oracle.forward(params, src, tgt, src_mask, tgt_mask)
    assert _max_error_on_real_positions(got, want, tgt_mask) <= TOL


def test_stored_table_wins_over_the_recomputed_one():
    model = _marian("relu", True, True, seed=5)
    state = dict(model.state_dict())
    edited = state["model.encoder.embed_positions.weight"] + 0.01
    state["model.encoder.embed_positions.weight"] = edited
    state["model.decoder.embed_positions.weight"] = edited
    params = oracle.read_state_dict(state, model.config)
    assert np.array_equal(params.spec.pos_table, edited.numpy())


def test_checkpoint_without_positions_or_tied_copies():
    # what save_pretrained writes: no embed_positions, the tied tables once under model.shared
    model = _marian("relu", True, False, seed=6)
    drop = ("embed_positions", "embed_tokens", "lm_head")
    state = {k: v for k, v in model.state_dict().items() if not any(d in k for d in drop)}
    params = oracle.read_state_dict(state, model.config)
    src, tgt, src_mask, tgt_mask = _batch(model, seed=7)
    want = _hf_logits(model, src, tgt, src_mask, tgt_mask)
    got = oracle.forward(params, src, tgt, src_mask, tgt_mask)
    assert _max_error_on_real_positions(got, want, tgt_mask) <= TOL


def test_marian_table_puts_sin_first_and_cos_second():
    table = marian_positional_table(5, 6)
    angle = 3 / 10000 ** (np.arange(3) * 2 / 6)  # position 3, frequencies i = 0, 1, 2
    assert np.allclose(table[3, :3], np.sin(angle), atol=1e-7)  # float32-rounded values
    assert np.allclose(table[3, 3:], np.cos(angle), atol=1e-7)


def test_missing_and_unknown_keys_are_named():
    model = _marian("relu", True, True, seed=8)
    state = dict(model.state_dict())
    del state["model.decoder.layers.1.encoder_attn_layer_norm.bias"]
    state["model.decoder.layers.0.adapter.weight"] = torch.zeros(2)
    with pytest.raises(oracle.StateDictError) as err:
        oracle.read_state_dict(state, model.config)
    assert err.value.missing == ["model.decoder.layers.1.encoder_attn_layer_norm.bias"]
    assert err.value.unexpected == ["model.decoder.layers.0.adapter.weight"]
    with pytest.raises(ValueError, match="gelu_new"):
        oracle.read_state_dict(model, model.config.to_dict() | {"activation_function": "gelu_new"})
