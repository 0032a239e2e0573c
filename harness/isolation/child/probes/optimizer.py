"""Probes of the optimizer law: the subject's make_optimizer stepped on the parent's gradients.

The probes never look at what the optimizer object says about itself (its class, its param
groups' settings): they set what fit sets (each param group's rate, each parameter's gradient)
and report where the parameters went.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch

from harness.isolation.child.probes.base import build, numpy_of, probe, training_dtype


@probe
def optimizer_parameters(module, cfg, seed) -> dict[str, list[int]]:
    """The model's parameters as an optimizer sees them (named_parameters: a tied table once,
    under its first name), by name and shape: what the parent draws gradients for."""
    model, _ = build(module, cfg, seed, only=training_dtype())
    return {name: list(p.shape) for name, p in model.named_parameters()}


@probe
def optimizer_steps(module, cfg, seed, weights, grads, rates) -> dict[str, Any]:
    """make_optimizer(model) on the model holding the parent's `weights` (by state_dict name);
    before update i, every param group's rate set to rates[i] (as fit drives the Noam schedule)
    and every parameter's .grad to grads[i][its named_parameters name]; then step().

    {"dtype": the model's, "after": [the parameters by named_parameters name after
    make_optimizer, then after each update]}."""
    model, dtype = build(module, cfg, seed, only=training_dtype(), weights=weights)
    opt = module.make_optimizer(model)

    def now() -> dict[str, np.ndarray]:
        return {name: numpy_of(p) for name, p in model.named_parameters()}

    after = [now()]
    for rate, grad in zip(rates, grads, strict=True):
        for group in opt.param_groups:
            group["lr"] = float(rate)
        for name, p in model.named_parameters():
            p.grad = torch.from_numpy(np.array(grad[name], dtype=np.float64)).to(p.dtype)
        opt.step()
        after.append(now())
    return {"dtype": dtype, "after": after}
