"""The oracle's label-smoothed loss and Noam rate: the seed's worked examples and impl agreement."""

from __future__ import annotations

import numpy as np
import pytest
import torch

import oracle
from impl import transformer as impl

# The seed (section 3) prints its numbers to 6 decimals: they hold to half a unit of the last.
PRINTED = 5e-7
# impl and the oracle in float64: a log-softmax and a mean over a few rows, rounding only.
F64_TOL = 1e-14


def test_hand_example_label_smoothing():
    # V = 3, logits (1, 0, 0), target 0, eps 0.1; a second row whose target is the pad id
    logits = np.array([[1.0, 0.0, 0.0], [3.0, -1.0, 0.5]])
    loss, grad = oracle.label_smoothed_loss(logits, np.array([0, 2]), 0.1, pad_id=2)
    assert abs(loss - 0.618111) < PRINTED
    np.testing.assert_allclose(grad[0], [-0.357216, 0.178608, 0.178608], rtol=0, atol=PRINTED)
    # the pad row: no loss, no gradient, and not counted in the mean (else the loss would halve)
    assert np.array_equal(grad[1], np.zeros(3))


def test_hand_example_noam():
    # d = 16, warmup 4: update 0 runs at n = 1, the peak at update 3, decay after
    rates = [oracle.noam_rate(s, 16, 4) for s in (0, 3, 15)]
    assert rates == [0.03125, 0.125, 0.0625]
    assert oracle.noam_rate(0, 16, 4, factor=2.0) == 0.0625
    with pytest.raises(ValueError, match="step >= 0"):
        oracle.noam_rate(-1, 16, 4)


def test_loss_matches_impl_and_its_gradient_is_p_minus_q():
    g = np.random.default_rng(0)
    logits = g.normal(size=(4, 5, 7)) * 3
    targets = g.integers(0, 7, size=(4, 5))
    targets[1, 2:] = 0  # pad id 0
    loss, grad = oracle.label_smoothed_loss(logits, targets, 0.2, pad_id=0)
    z = torch.tensor(logits, requires_grad=True)
    ref = impl.label_smoothed_loss(z, torch.tensor(targets), 0.2, 0)
    ref.backward()
    assert abs(loss - ref.item()) < F64_TOL
    assert np.abs(grad - z.grad.numpy()).max() < F64_TOL
    assert not grad[targets == 0].any()


def test_loss_rejects_all_pad_and_bad_shapes():
    with pytest.raises(ValueError, match="every target equals pad_id=0"):
        oracle.label_smoothed_loss(np.zeros((2, 3)), np.zeros(2, dtype=int), 0.1, 0)
    with pytest.raises(ValueError, match="plus a vocabulary axis"):
        oracle.label_smoothed_loss(np.zeros((2, 3)), np.zeros(3, dtype=int), 0.1, 0)
