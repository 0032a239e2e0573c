"""`xfmr compare`: a user's weights, inputs and outputs against the oracle's derived bound."""

from __future__ import annotations

import json

import numpy as np
import torch
from safetensors.torch import load_file, save_file

import oracle
from harness.cli import main
from harness.tools.bound_check import draw_case, run_subject
from impl import transformer as impl


def _user_files(tmp_path, dtype="bfloat16", fmt="safetensors"):
    """A user's bfloat16 run of impl: weights, config, inputs and outputs (logits and the
    traced modules), as files."""
    case = draw_case(np.random.default_rng(4), 4, (16,))
    params, logits, seen = run_subject(impl.Transformer, case, dtype, trace=True)
    tensors = {k: torch.tensor(v, dtype=torch.float32) for k, v in params.arrays.items()}
    state = tmp_path / f"model.{fmt}"
    if fmt == "safetensors":
        save_file(tensors, str(state))
    else:
        torch.save(tensors, state)
    config = tmp_path / "config.json"
    config.write_text(json.dumps(case.cfg))
    inputs = tmp_path / "batch.npz"
    np.savez(inputs, **{k: case.batch[k] for k in ("src", "tgt_in", "src_mask", "tgt_mask")})
    b = case.batch
    _, trace = oracle.forward(params, b["src"], b["tgt_in"], b["src_mask"], b["tgt_mask"], True)
    outputs = {"logits": logits, **{k: v for k, v in seen.items() if k in trace}}
    return state, config, inputs, outputs


def _run(capsys, *argv):
    status = main(["compare", *map(str, argv)])
    out = capsys.readouterr()
    return status, out.out, out.err


def test_an_honest_bfloat16_run_lies_inside_the_bound(tmp_path, capsys):
    state, config, inputs, outputs = _user_files(tmp_path)
    np.savez(tmp_path / "out.npz", **outputs)
    status, out, _ = _run(
        capsys, state, config, tmp_path / "out.npz", "--inputs", inputs, "--dtype", "bfloat16"
    )
    assert status == 0, out
    assert "every value lies inside its bound" in out and "decoder.0.norm1" in out


def test_a_fault_in_one_layer_is_the_first_divergence(tmp_path, capsys):
    state, config, inputs, outputs = _user_files(tmp_path, fmt="pt")
    # the second decoder layer's (or the first's) output moved by 0.5 at one real position:
    # every later boundary diverges too, the first is named
    name = "decoder.1" if "decoder.1" in outputs else "decoder.0"
    outputs[name] = outputs[name].copy()
    outputs[name][0, 0, 0] += 0.5
    outputs["logits"] = outputs["logits"] + 0.5
    np.savez(tmp_path / "out.npz", **outputs)
    status, out, _ = _run(
        capsys, state, config, tmp_path / "out.npz", "--inputs", inputs, "--dtype", "bfloat16"
    )
    assert status == 1
    assert out.strip().endswith(f"first divergence: {name}")


def test_logits_alone_and_the_default_batch(tmp_path, capsys):
    state, config, _, _ = _user_files(tmp_path)
    assert main(["compare", str(config), "--emit-inputs", str(tmp_path / "b.npz")]) == 0
    b = dict(np.load(tmp_path / "b.npz"))
    cfg = json.loads(config.read_text())
    model = impl.Transformer(cfg).eval()
    model.load_state_dict(load_file(str(state)))
    with torch.no_grad():
        logits = model(*(torch.tensor(b[k]) for k in ("src", "tgt_in", "src_mask", "tgt_mask")))
    np.save(tmp_path / "logits.npy", logits.numpy())
    status, out, _ = _run(capsys, state, config, tmp_path / "logits.npy", "--dtype", "float32")
    assert status == 0, out


def test_bad_input_is_a_one_line_usage_error(tmp_path, capsys):
    state, config, inputs, outputs = _user_files(tmp_path)
    np.save(tmp_path / "short.npy", outputs["logits"][:, :1])
    (tmp_path / "bad.json").write_text("{not json")
    cases = [
        ([state, config], "expected STATE CONFIG OUTPUTS"),
        ([state, tmp_path / "bad.json", tmp_path / "short.npy"], "not a readable JSON"),
        ([config, config, tmp_path / "short.npy"], "expected a .safetensors, .pt or .pth"),
        ([state, config, tmp_path / "short.npy", "--inputs", inputs], "has shape"),
        ([state, config, tmp_path / "missing.npy"], "no such file"),
    ]
    for argv, words in cases:
        status, _, err = _run(capsys, *argv)
        assert status == 2 and words in err and len(err.strip().splitlines()) == 1, (argv, err)
