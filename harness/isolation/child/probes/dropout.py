"""Probes of the dropout laws: logits in each mode, and what every contract module sees in an
eval pass and a training pass."""

from __future__ import annotations

from typing import Any

import numpy as np
import torch

from harness.isolation.child.probes.base import (
    build,
    numpy_of,
    parameters_by_name,
    probe,
    tensor_of,
    training_dtype,
)
from harness.isolation.child.probes.hooks import (
    contract_modules,
    first_of,
)


@probe
def dropout_logits(
    module, cfg, src, tgt_in, src_mask, tgt_mask, weights=None, seed=0
) -> dict[str, Any]:
    """One model's logits: eval mode, then training mode twice (other dropout draws), then eval
    mode again."""
    model, dtype = build(module, cfg, seed, only=training_dtype(), weights=weights)
    inputs = (tensor_of(src), tensor_of(tgt_in), tensor_of(src_mask), tensor_of(tgt_mask))
    with torch.no_grad():
        before = numpy_of(model(*inputs))
        model.train()
        train = []
        for draw in (1, 2):
            torch.manual_seed(draw)
            train.append(numpy_of(model(*inputs)))
        model.eval()
        after = numpy_of(model(*inputs))
    return {
        "dtype": dtype,
        "eval": [before, after],
        "train": train,
        "state_dict": parameters_by_name(model),
    }


@probe
def dropout_sites(
    module, cfg, src, tgt_in, src_mask, tgt_mask, draw, weights=None, seed=0
) -> dict[str, Any]:
    """What enters and leaves each contract-named submodule in one forward pass in eval mode,
    then in one in training mode (torch.manual_seed(draw) first), with gradients enabled (under
    no_grad torch's own layers take a fused path that skips their submodules' hooks).

    For each pass: {name: {"in": first positional input, "out": output}} of the module's first
    call (a tuple counts by its first element); and the state_dict, whose out_proj weights let
    the parent split an attention output into its heads.
    """
    model, dtype = build(module, cfg, seed, only=training_dtype(), weights=weights)
    inputs = (tensor_of(src), tensor_of(tgt_in), tensor_of(src_mask), tensor_of(tgt_mask))
    seen: dict[str, dict[str, np.ndarray]] = {}

    def hooks(name: str):
        def before(mod: torch.nn.Module, args: Any) -> None:
            first = first_of(args)
            if isinstance(first, torch.Tensor) and "in" not in seen.setdefault(name, {}):
                seen[name]["in"] = numpy_of(first)

        def after(mod: torch.nn.Module, args: Any, out: Any) -> None:
            first = first_of(out)
            if isinstance(first, torch.Tensor) and "out" not in seen.setdefault(name, {}):
                seen[name]["out"] = numpy_of(first)

        return before, after

    for name, sub in contract_modules(model).items():
        before, after = hooks(name)
        sub.register_forward_pre_hook(before)
        sub.register_forward_hook(after)
    passes = {}
    for mode in ("eval", "train"):
        seen = {}
        model.train(mode == "train")
        torch.manual_seed(draw)
        model(*inputs)
        passes[mode] = seen
    return {"dtype": dtype, "state_dict": parameters_by_name(model), **passes}


@probe
def train_eval_logits(
    module, cfg, src, tgt_in, src_mask, tgt_mask, weights=None, seed=0
) -> dict[str, Any]:
    """One model's logits in eval mode and in training mode, with gradients enabled (the same
    path in both modes: under no_grad torch's own layers take a fused path in eval mode only)."""
    model, dtype = build(module, cfg, seed, only=training_dtype(), weights=weights)
    inputs = (tensor_of(src), tensor_of(tgt_in), tensor_of(src_mask), tensor_of(tgt_mask))
    out = {}
    for mode in ("eval", "train"):
        model.train(mode == "train")
        torch.manual_seed(0)
        out[mode] = numpy_of(model(*inputs))
    return {"dtype": dtype, **out, "state_dict": parameters_by_name(model)}
