"""Probes of the masking laws: one model's logits on several batches."""

from __future__ import annotations

from typing import Any

import torch

from harness.isolation.child.probes.base import (
    build,
    numpy_of,
    parameters_by_name,
    probe,
    tensor_of,
)


@probe
def forward_logits(module, cfg, batches, weights=None, seed=0) -> dict[str, Any]:
    """forward(src, tgt_in, src_mask, tgt_mask) of one model on each batch, in eval mode."""
    model, dtype = build(module, cfg, seed, weights=weights)
    with torch.no_grad():
        logits = [
            numpy_of(
                model(
                    tensor_of(b["src"]),
                    tensor_of(b["tgt_in"]),
                    tensor_of(b["src_mask"]),
                    tensor_of(b["tgt_mask"]),
                )
            )
            for b in batches
        ]
    return {"dtype": dtype, "logits": logits, "state_dict": parameters_by_name(model)}
