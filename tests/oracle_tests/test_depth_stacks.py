"""oracle.adapters.depth_stacks against the same blocks written independently in float64 torch."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from oracle.adapters.depth_stacks import (
    BLOCK_PARAMS,
    post_norm_block,
    pre_norm_block,
    stack_input_grad,
    stack_post_norm_blocks,
    stack_pre_norm_blocks,
)

# The same float64 arithmetic in another order (BLAS vs torch kernels): a few hundred ulps of the
# O(1)-O(10) values a stack of 8 produces stays far below 1e-12.
TOL = 1e-12

B, T, D, H, D_FF = 2, 5, 8, 2, 12


def _params(seed: int, eps: float = 1e-5) -> dict:
    """Every block parameter drawn, so that no zero bias or unit gain hides a mistake."""
    rng = np.random.default_rng(seed)
    shapes = {"w_1": (D, D_FF), "b_1": (D_FF,), "w_2": (D_FF, D)}
    p = {}
    for name in BLOCK_PARAMS:
        shape = shapes.get(name) or ((D, D) if name.startswith("w_") else (D,))
        scale = 1 / np.sqrt(shape[0]) if name.startswith("w_") else 0.3
        p[name] = scale * rng.standard_normal(shape)
    p["gamma1"] += 1.0
    p["gamma2"] += 1.0
    p["eps"] = eps
    return p


def _torch_block(norm: str, x: torch.Tensor, p: dict, mask: torch.Tensor | None) -> torch.Tensor:
    """Seed 004's blocks with torch ops, x [B, T, D]."""
    t = {k: torch.tensor(v) for k, v in p.items() if k != "eps"}
    ln = torch.nn.functional.layer_norm

    def mha(z):
        def heads(w, b):  # [B, T, D] -> [B, H, T, D/H]
            return (z @ t[w] + t[b]).view(B, T, H, D // H).transpose(1, 2)

        q, k, v = heads("w_q", "b_q"), heads("w_k", "b_k"), heads("w_v", "b_v")
        scores = q @ k.transpose(-1, -2) / (D // H) ** 0.5
        if mask is not None:
            scores = scores.masked_fill(~mask, float("-inf"))
        out = (scores.softmax(-1) @ v).transpose(1, 2).reshape(B, T, D)
        return out @ t["w_o"] + t["b_o"]

    def ffn(z):
        return torch.relu(z @ t["w_1"] + t["b_1"]) @ t["w_2"] + t["b_2"]

    eps = p["eps"]
    if norm == "post":
        x = ln(x + mha(x), (D,), t["gamma1"], t["beta1"], eps)
        return ln(x + ffn(x), (D,), t["gamma2"], t["beta2"], eps)
    x = x + mha(ln(x, (D,), t["gamma1"], t["beta1"], eps))
    return x + ffn(ln(x, (D,), t["gamma2"], t["beta2"], eps))


def _torch_stack(norm, x, depth, p, mask):
    for _ in range(depth):  # the SAME parameters at every depth
        x = _torch_block(norm, x, p, mask)
    return x


STACKS = {"post": stack_post_norm_blocks, "pre": stack_pre_norm_blocks}
CAUSAL = np.tril(np.ones((T, T), dtype=bool))


@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("depth", [1, 2, 8])
@pytest.mark.parametrize("norm", ["post", "pre"])
def test_stack_matches_torch(norm, depth, causal):
    p = _params(depth)
    x = np.random.default_rng(100 + depth).standard_normal((B, T, D))
    mask = CAUSAL if causal else None
    got = STACKS[norm](x, depth, H, p, mask)
    want = _torch_stack(
        norm, torch.tensor(x), depth, p, None if mask is None else torch.tensor(mask)
    )
    assert got.dtype == np.float64 and got.shape == x.shape
    assert np.abs(got - want.numpy()).max() <= TOL


@pytest.mark.parametrize("depth", [1, 2, 8])
@pytest.mark.parametrize("norm", ["post", "pre"])
def test_input_grad_matches_torch_autograd(norm, depth):
    p = _params(10 + depth)
    rng = np.random.default_rng(depth)
    x, dout = rng.standard_normal((B, T, D)), rng.standard_normal((B, T, D))
    out, dx = stack_input_grad(norm, x, dout, depth, H, p, CAUSAL)
    xt = torch.tensor(x, requires_grad=True)
    yt = _torch_stack(norm, xt, depth, p, torch.tensor(CAUSAL))
    (want,) = torch.autograd.grad(yt, xt, torch.tensor(dout))
    assert np.abs(out - yt.detach().numpy()).max() <= TOL
    # the gradient reaches O(10) through a pre-norm stack of 8: 1e-12 is still ~1000 ulps of it
    assert np.abs(dx - want.numpy()).max() <= TOL


def test_single_blocks_are_stacks_of_one_and_accept_unbatched_x():
    p = _params(3)
    x = np.random.default_rng(3).standard_normal((T, D))
    assert post_norm_block(x, H, **p).shape == (T, D)
    assert np.array_equal(post_norm_block(x, H, **p), stack_post_norm_blocks(x, 1, H, p))
    assert np.array_equal(pre_norm_block(x, H, **p), stack_pre_norm_blocks(x, 1, H, p))
    assert np.array_equal(stack_pre_norm_blocks(x, 0, H, p), x)  # depth 0 is the identity


def test_post_norm_output_is_normalized_and_pre_norm_is_not():
    # post-norm ends every block with LN: with gamma = 1, beta = 0 each row has mean 0, var ~1
    p = _params(4) | {"gamma2": np.ones(D), "beta2": np.zeros(D)}
    x = 10 * np.random.default_rng(4).standard_normal((B, T, D))
    post = stack_post_norm_blocks(x, 3, H, p)
    assert np.abs(post.mean(-1)).max() < 1e-12
    assert np.abs(post.var(-1) - 1).max() < 1e-3  # var / (var + eps), eps = 1e-5
    pre = stack_pre_norm_blocks(x, 3, H, p)
    assert np.abs(pre.var(-1) - 1).max() > 1  # the residual stream keeps x's scale of 100


def test_bad_params_are_named():
    p = _params(5)
    with pytest.raises(KeyError, match="w_k"):
        stack_post_norm_blocks(np.zeros((T, D)), 1, H, {k: v for k, v in p.items() if k != "w_k"})
    with pytest.raises(ValueError, match="b_1"):
        stack_pre_norm_blocks(np.zeros((T, D)), 1, H, p | {"b_1": np.zeros(D)})
    with pytest.raises(ValueError, match="num_heads=3"):
        stack_pre_norm_blocks(np.zeros((T, D)), 1, 3, p)
    with pytest.raises(ValueError, match="norm"):
        stack_input_grad("sandwich", np.zeros((T, D)), np.zeros((T, D)), 1, H, p)


def test_depth_demo_writes_png_table_and_command(tmp_path, capsys):
    pytest.importorskip("matplotlib")
    from harness.cli import main

    out = tmp_path / "depth.png"
    argv = ["depth-demo", "--out", str(out), "--max-depth", "3", "--d-model", "8", "--heads", "2"]
    assert main(argv + ["--d-ff", "16", "--tokens", "4"]) == 0
    notes = out.with_suffix(".md").read_text()
    assert out.stat().st_size > 0 and f"--out {out} --max-depth 3 --seed 0" in notes
    rows = [line for line in capsys.readouterr().out.splitlines() if line.startswith("| 3 |")]
    post_rms = float(rows[0].split("|")[2])
    assert abs(post_rms - np.sqrt(8)) < 1e-3  # post-norm pins every token at sqrt(d) (gamma = 1)
