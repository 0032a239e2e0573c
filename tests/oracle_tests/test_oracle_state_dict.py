"""Reading parameters: both naming schemes, every source kind, and errors that name the bad keys."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
import torch
from oracle_cases import (
    CASE_IDS,
    CASES,
    copy_of,
    make_batch,
    make_model,
)
from safetensors.numpy import save_file

import oracle
from impl import transformer as impl
from oracle.readers.state_dict import contract_keys, torch_name


def _torch_stack_dict(state: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """A contract state_dict renamed into torch's stacks, q, k, v packed into in_proj (by hand)."""
    out: dict[str, torch.Tensor] = {}
    for name, value in state.items():
        if "_proj." in name and "out_proj" not in name:
            continue  # packed below from its q_proj name
        out[torch_name(name)[0]] = value
    for name in state:
        if ".q_proj." in name:
            parts = [state[name.replace(".q_proj.", f".{w}_proj.")] for w in "qkv"]
            out[torch_name(name)[0]] = torch.cat(parts, dim=0)
    return out


@pytest.mark.parametrize("norm,tie,src_vocab,tgt_vocab", CASES, ids=CASE_IDS)
def test_torch_stack_scheme_gives_the_same_params(norm, tie, src_vocab, tgt_vocab):
    model = make_model(norm, tie, src_vocab, tgt_vocab)
    stacked = _torch_stack_dict(model.state_dict())
    assert any("in_proj_weight" in k for k in stacked) and not any("q_proj" in k for k in stacked)
    a = oracle.read_state_dict(model.state_dict(), model.cfg)
    b = oracle.read_state_dict(stacked, model.cfg)
    assert (a.scheme, b.scheme) == ("contract", "torch-stack")
    assert a.arrays.keys() == b.arrays.keys()
    assert all(np.array_equal(a.arrays[k], b.arrays[k]) for k in a.arrays)
    src, tgt, src_mask, tgt_mask = make_batch(model.cfg)
    # the same arrays, so the same logits bit for bit
    assert np.array_equal(
        oracle.forward(a, src, tgt, src_mask, tgt_mask),
        oracle.forward(b, src, tgt, src_mask, tgt_mask),
    )


@pytest.mark.parametrize("norm", ["post", "pre"])
def test_torch_copy_named_parameters_read_as_its_state_dict(norm):
    twin = copy_of(make_model(norm, False, 11, 13))
    named = oracle.read_state_dict(dict(twin.named_parameters()), twin.cfg)
    contract = oracle.read_state_dict(twin)
    assert named.scheme == "torch-stack"
    assert all(np.array_equal(named.arrays[k], contract.arrays[k]) for k in contract.arrays)


@pytest.mark.parametrize("norm,tie,src_vocab,tgt_vocab", CASES, ids=CASE_IDS)
def test_layout_is_read_from_the_keys(norm, tie, src_vocab, tgt_vocab):
    model = make_model(norm, tie, src_vocab, tgt_vocab)
    config = {"n_heads": 4, "ln_eps": 1e-5}  # only what no array shows
    spec = oracle.read_state_dict(model.state_dict(), config).spec
    assert (spec.norm, spec.n_enc, spec.n_dec, spec.d_model, spec.d_ff) == (norm, 2, 2, 16, 24)
    assert (spec.src_vocab, spec.tgt_vocab) == (src_vocab, tgt_vocab)
    want = "none" if not tie else ("all" if src_vocab == tgt_vocab else "tgt_out")
    assert spec.tie == want


def test_arrays_are_float64_copies():
    model = make_model("post", True, 11, 11).float()
    params = oracle.read_state_dict(model)
    table = params.arrays["src_emb.weight"]
    assert table.dtype == np.float64
    assert np.array_equal(table, model.src_emb.weight.detach().double().numpy())
    with torch.no_grad():
        model.src_emb.weight.zero_()
    assert table.any()  # a copy: later changes to the model do not reach the oracle


def test_safetensors_file_and_save_transformer_directory(tmp_path):
    model = make_model("pre", False, 11, 13)
    impl.save_transformer(model, tmp_path / "saved")
    from_dir = oracle.read_state_dict(tmp_path / "saved")
    file = tmp_path / "weights.safetensors"
    save_file({k: v.numpy() for k, v in model.state_dict().items()}, str(file))
    from_file = oracle.read_state_dict(file, model.cfg)
    src, tgt, src_mask, tgt_mask = make_batch(model.cfg)
    expected = oracle.forward(oracle.read_state_dict(model), src, tgt, src_mask, tgt_mask)
    for params in (from_dir, from_file):
        assert np.array_equal(oracle.forward(params, src, tgt, src_mask, tgt_mask), expected)


def test_missing_and_unexpected_keys_are_named():
    model = make_model("pre", False, 11, 13)
    state = dict(model.state_dict())
    del state["decoder.1.cross_attn.v_proj.bias"]
    state["decoder.1.extra.weight"] = torch.zeros(3)
    with pytest.raises(oracle.StateDictError) as err:
        oracle.read_state_dict(state, model.cfg)
    assert err.value.missing == ["decoder.1.cross_attn.v_proj.bias"]
    assert err.value.unexpected == ["decoder.1.extra.weight"]
    assert "decoder.1.cross_attn.v_proj.bias" in str(err.value)


def test_missing_keys_are_named_in_the_torch_scheme():
    model = make_model("pre", True, 11, 11)
    stacked = _torch_stack_dict(model.state_dict())
    del stacked["encoder.norm.weight"], stacked["decoder.layers.0.multihead_attn.in_proj_bias"]
    with pytest.raises(oracle.StateDictError) as err:
        oracle.read_state_dict(stacked, model.cfg)
    assert err.value.missing == [
        "decoder.layers.0.multihead_attn.in_proj_bias",
        "encoder.norm.weight",
    ]


def test_config_and_keys_must_agree():
    model = make_model("post", True, 11, 11)
    # the config says pre-LN: the final norms are missing
    with pytest.raises(oracle.StateDictError, match="enc_norm.weight"):
        oracle.read_state_dict(model.state_dict(), dataclasses.replace(model.cfg, norm="pre"))
    # three layers said, two stored
    with pytest.raises(oracle.StateDictError, match=r"encoder\.2\.linear1\.bias"):
        oracle.read_state_dict(model.state_dict(), dataclasses.replace(model.cfg, n_enc=3))
    with pytest.raises(ValueError, match="config says d_model=32 but the arrays have d_model=16"):
        oracle.read_state_dict(model.state_dict(), dataclasses.replace(model.cfg, d_model=32))
    # untied said, one table stored
    with pytest.raises(oracle.StateDictError, match="out.weight"):
        oracle.read_state_dict(model, dataclasses.replace(model.cfg, tie_embeddings=False))


def test_bad_shapes_and_missing_config_are_clear_errors():
    model = make_model("post", True, 11, 11)
    state = dict(model.state_dict())
    state["encoder.0.linear2.weight"] = torch.zeros(16, 23)
    with pytest.raises(ValueError, match=r"encoder.0.linear2.weight has shape \(16, 23\)"):
        oracle.read_state_dict(state, model.cfg)
    with pytest.raises(ValueError, match="n_heads is not recorded"):
        oracle.read_state_dict(model.state_dict())
    with pytest.raises(ValueError, match="no known naming scheme"):
        oracle.read_state_dict({"foo.weight": np.zeros(2)}, model.cfg)


def test_contract_keys_match_impl_state_dict():
    for norm in ("post", "pre"):
        for tie, vs, vt, kind in (
            (True, 5, 5, "all"),
            (True, 5, 7, "tgt_out"),
            (False, 5, 7, "none"),
        ):
            model = make_model(norm, tie, vs, vt, n_enc=1, n_dec=2)
            assert contract_keys(1, 2, norm, kind) == list(model.state_dict()), (norm, kind)
