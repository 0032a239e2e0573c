"""The oracle's primitives on their own: erf and the activations, positional encoding."""

from __future__ import annotations

import math
import subprocess
import sys

import numpy as np
import torch

from oracle.ops import erf, gelu, positional_encoding, silu

# oracle.ops.erf is a series below |x| = 3 and a continued fraction above, in float64: measured
# within 1.33e-15 of math.erf (12 ulp of values near 1) on [-8, 8]. This pins that figure.
ERF_TOL = 1.4e-15


def test_erf_agrees_with_math_erf():
    x = np.linspace(-8, 8, 40001)
    ref = np.array([math.erf(v) for v in x])
    assert np.abs(erf(x) - ref).max() < ERF_TOL
    assert erf(np.array([0.0]))[0] == 0.0 and np.all(erf(-x) == -erf(x))  # odd, exactly


def test_activations_agree_with_torch():
    x = np.linspace(-10, 10, 4001)
    t = torch.tensor(x)
    # gelu = x/2 (1 + erf): erf's error times |x|/2 <= 5, so 5 * ERF_TOL plus a rounding or two
    assert np.abs(gelu(x) - torch.nn.functional.gelu(t).numpy()).max() < 8e-15
    # silu is a few correctly rounded operations: a few ulp of |x| <= 10
    assert np.abs(silu(x) - torch.nn.functional.silu(t).numpy()).max() < 1e-14


def test_positional_encoding_is_the_papers_interleaved_sinusoid():
    pe = positional_encoding(50, 9)
    for p, i in ((0, 0), (7, 2), (49, 4), (13, 8)):
        angle = p / 10000 ** ((i - i % 2) / 9)
        want = math.sin(angle) if i % 2 == 0 else math.cos(angle)
        assert abs(pe[p, i] - want) < 1e-15
    wide = positional_encoding(50, 9, np.longdouble)
    assert wide.dtype == np.longdouble and np.abs(wide - pe).max() < 1e-14


def test_the_oracle_never_imports_torch(tmp_path):
    # law: the oracle is independent ground truth, numpy only (reading a safetensors file too)
    from safetensors.numpy import save_file

    file = tmp_path / "w.safetensors"
    save_file({"src_emb.weight": np.zeros((3, 4))}, str(file))
    code = (
        "import sys, oracle; "
        f"oracle.read_state_dict({str(file)!r}, {{'n_heads': 2, 'ln_eps': 1e-5}}); "
        "assert 'torch' not in sys.modules, 'oracle imported torch'"
    )
    subprocess.run([sys.executable, "-c", code], check=True)
