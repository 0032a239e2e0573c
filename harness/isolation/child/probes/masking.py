"""Probes of the masking laws: one model's logits on several batches."""

from __future__ import annotations

from typing import Any

import torch

from harness.isolation.child.probes.base import (
    build,
    numpy_of,
    probe,
    tensor_of,
)


@probe
def forward_logits(module, cfg, seed, batches) -> dict[str, Any]:
    """forward(src, tgt_in, src_mask, tgt_mask) of one model on each batch, in eval mode."""
    model, dtype = build(module, cfg, seed)
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
    return {"dtype": dtype, "logits": logits}
