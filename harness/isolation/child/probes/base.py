"""What every probe shares: the registry, the subject's model built for a config (float64 where
it runs in it), parent-chosen weights loaded into it, and tensors as plain data."""

from __future__ import annotations

from collections.abc import Callable
from types import ModuleType
from typing import Any

import numpy as np
import torch

PROBES: dict[str, Callable[..., Any]] = {}


def probe(fn: Callable[..., Any]) -> Callable[..., Any]:
    """Register a probe under its function's name."""
    PROBES[fn.__name__] = fn
    return fn


def numpy_of(t: torch.Tensor) -> np.ndarray:
    """A tensor as a float64 (or integer/bool) numpy array the wire can carry."""
    t = t.detach().cpu()
    if t.is_floating_point():
        t = t.to(torch.float64)
    return t.numpy().copy()


def tensor_of(a: Any) -> torch.Tensor:
    return torch.from_numpy(np.array(a))


def persistent_buffers(model: torch.nn.Module) -> set[str]:
    """The state_dict's persistent buffers: not parameters, so no value test reads them (the
    contract lists none; the names test alone charges one)."""
    return {name for name, _ in model.named_buffers()} & set(model.state_dict())


def parameters_by_name(model: torch.nn.Module) -> dict[str, np.ndarray]:
    """The model's parameters under their state_dict names (persistent buffers left out)."""
    buffers = persistent_buffers(model)
    return {name: numpy_of(t) for name, t in model.state_dict().items() if name not in buffers}


def _smoke_inputs(cfg: dict[str, Any]) -> tuple[torch.Tensor, ...]:
    src = torch.ones(1, 2, dtype=torch.long) % cfg["src_vocab"]
    tgt = torch.ones(1, 2, dtype=torch.long) % cfg["tgt_vocab"]
    mask = torch.ones(1, 2, dtype=torch.bool)
    return src, tgt, mask, mask


def build(
    module: ModuleType,
    cfg: dict[str, Any],
    seed: int = 0,
    only: str | None = None,
    weights: dict[str, np.ndarray] | None = None,
) -> tuple[torch.nn.Module, str]:
    """The subject's model for `cfg`, in eval mode, and its dtype: initialized under `seed`, then
    given the parent's `weights` (by the subject's own state_dict names) when there are any.

    float64 where the subject runs in it (a tiny forward pass tells); otherwise the same model
    rebuilt in float32, whose tolerances the parent calibrated on the float32 torch copy.
    `only` ("float32" or "float64") skips the choice.
    """
    dtypes = (torch.float64, torch.float32) if only is None else (getattr(torch, only),)
    for dtype in dtypes:
        torch.manual_seed(seed)
        model = module.Transformer(module.TransformerConfig(**cfg)).to(dtype).eval()
        try:
            with torch.no_grad():
                model(*_smoke_inputs(cfg))
        except Exception:
            if dtype == dtypes[-1]:
                raise
            continue
        if weights is not None:
            load_weights(model, weights)
        return model, str(dtype).removeprefix("torch.")
    raise AssertionError("unreachable")


def load_weights(model: torch.nn.Module, weights: dict[str, np.ndarray]) -> None:
    """load_state_dict of parent-chosen arrays for the model's parameters, in the model's dtype;
    its persistent buffers, if any, keep their own values."""
    dtype = next(model.parameters()).dtype
    state = model.state_dict()
    state.update({k: torch.from_numpy(np.asarray(v)).to(dtype) for k, v in weights.items()})
    model.load_state_dict(state)


@probe
def parameter_layout(module, cfgs) -> list[dict[str, Any]]:
    """For each config, the parameters' state_dict names and shapes (persistent buffers left
    out), and which names share one tensor (name -> the first name listing that tensor): what
    the parent draws its weights for."""
    out = []
    for cfg in cfgs:
        model = module.Transformer(module.TransformerConfig(**cfg))
        buffers = persistent_buffers(model)
        state = {k: t for k, t in model.state_dict().items() if k not in buffers}
        first: dict[tuple, str] = {}
        aliases = {}
        for k, t in state.items():
            where = (t.data_ptr(), tuple(t.shape), tuple(t.stride()))
            aliases[k] = first.setdefault(where, k)
        out.append({"shapes": {k: list(t.shape) for k, t in state.items()}, "aliases": aliases})
    return out
