"""Probes of the hand-example laws: the subject's loss and Noam rates on the parent's numbers."""

from __future__ import annotations

from typing import Any

from harness.isolation.child.probes.base import (
    numpy_of,
    probe,
    tensor_of,
)


@probe
def loss_example(module, logits, targets, eps, pad_id) -> dict[str, Any]:
    """The subject's label_smoothed_loss and its gradient with respect to the logits."""
    z = tensor_of(logits).requires_grad_(True)
    loss = module.label_smoothed_loss(z, tensor_of(targets), eps, pad_id)
    loss.backward()
    return {"loss": float(loss.detach()), "grad": numpy_of(z.grad) if z.grad is not None else None}


@probe
def noam_rates(module, cases) -> list[float]:
    """noam_rate(step, d_model, warmup, factor) for each case, in order; a case of three numbers
    leaves `factor` out (the contract's default is then in effect)."""
    return [float(module.noam_rate(*case)) for case in cases]
