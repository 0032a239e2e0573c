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


def state_tensors(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    """The state_dict's entries that are not persistent buffers, as tensors (the parameters,
    under the state_dict's names; a hook may rename them or hand out views of them)."""
    buffers = persistent_buffers(model)
    return {name: t for name, t in model.state_dict().items() if name not in buffers}


def _span(t: torch.Tensor) -> tuple[int, int | torch.SymInt, int | torch.SymInt]:
    """(the storage's address, the first and the last element offset the tensor reads)."""
    last = t.storage_offset() + sum((n - 1) * s for n, s in zip(t.shape, t.stride(), strict=True))
    return t.untyped_storage().data_ptr(), t.storage_offset(), last


def _place(t: torch.Tensor) -> tuple:
    """What a tensor is, as a view: its storage, offset, shape and strides."""
    return (t.untyped_storage().data_ptr(), t.storage_offset(), tuple(t.shape), tuple(t.stride()))


def parameter_views(model: torch.nn.Module) -> dict[str, tuple[str, torch.nn.Parameter]]:
    """Each state_dict entry that *is* a parameter or a view of one (the same storage, inside the
    parameter's elements: a renamed entry, or a slice of a fused projection), by state_dict
    name: the parameter's named_parameters name and the parameter. An entry that is a copy
    (a hook that concatenates or clones) is not listed."""
    spans = [(name, p, _span(p)) for name, p in model.named_parameters() if p.numel()]
    found = {}
    for key, t in state_tensors(model).items():
        if not t.is_floating_point() or not t.numel():
            continue
        ptr, first, last = _span(t)
        for name, p, (p_ptr, p_first, p_last) in spans:
            if ptr == p_ptr and p_first <= first and last <= p_last:
                found[key] = (name, p)
                break
    return found


def view_of(value: torch.Tensor, of: torch.Tensor, like: torch.Tensor) -> torch.Tensor:
    """The elements of `value` (laid out as parameter `of`) that the view `like` of `of` reads."""
    size = of.untyped_storage().nbytes() // of.element_size()
    flat = torch.zeros(size, dtype=value.dtype)
    flat.as_strided(of.shape, of.stride(), of.storage_offset()).copy_(value.detach().cpu())
    return flat.as_strided(like.shape, like.stride(), like.storage_offset()).clone()


def gradients(model: torch.nn.Module) -> dict[str, Any]:
    """The gradients after a backward pass, matched to the state_dict by what they are: each
    state_dict entry that is a parameter (or a view of one) gets that parameter's gradient (or
    the same view of it) under the entry's name, so names sharing one tensor (a tied table
    listed twice, layers that are one module) get the same gradient; a parameter that no entry
    is keeps its named_parameters name. A parameter the loss does not reach has gradient 0.

    {"grads": {name: array}, "no_grad": [names without a gradient], "shared": [[names that are
    one tensor], ...] (state_dict names, each group of two or more), "by_parameter": {every
    named_parameters name: its gradient} (the plain listing, for a reader of those names when
    the state_dict's entries are copies of only some parameters)}."""
    views = parameter_views(model)
    state = state_tensors(model)
    grads: dict[str, np.ndarray] = {}
    no_grad: list[str] = []
    covered = set()
    for key, (_, p) in views.items():
        covered.add(id(p))
        if p.grad is None:
            no_grad.append(key)
            grads[key] = np.zeros(tuple(state[key].shape))
        else:
            grads[key] = numpy_of(view_of(p.grad, p, state[key]))
    for name, p in model.named_parameters():
        if id(p) in covered:
            continue
        if p.grad is None:
            no_grad.append(name)
        grads[name] = numpy_of(p.grad) if p.grad is not None else np.zeros(tuple(p.shape))
    by_parameter = {
        name: numpy_of(p.grad) if p.grad is not None else np.zeros(tuple(p.shape))
        for name, p in model.named_parameters()
    }
    groups: dict[tuple, list[str]] = {}
    for key in views:
        groups.setdefault(_place(state[key]), []).append(key)
    shared = [names for names in groups.values() if len(names) > 1]
    return {"grads": grads, "no_grad": no_grad, "shared": shared, "by_parameter": by_parameter}


def _smoke_inputs(cfg: dict[str, Any]) -> tuple[torch.Tensor, ...]:
    src = torch.ones(1, 2, dtype=torch.long) % cfg["src_vocab"]
    tgt = torch.ones(1, 2, dtype=torch.long) % cfg["tgt_vocab"]
    mask = torch.ones(1, 2, dtype=torch.bool)
    return src, tgt, mask, mask


# The dtype this worker's models are built in when the run names one (`--dtype`), set once by the
# probe use_dtype as the worker starts; None: float64 where the subject runs in it, else float32.
RUN_DTYPE: list[str | None] = [None]
DTYPES = ("float64", "float32", "bfloat16", "float16")


@probe
def use_dtype(module, dtype) -> str:
    """Build every later model of this worker in `dtype` (one of DTYPES)."""
    if dtype not in DTYPES:
        raise ValueError(f"dtype must be one of {DTYPES}, got {dtype!r}")
    RUN_DTYPE[0] = dtype
    return dtype


def training_dtype() -> str | None:
    """The dtype the training-mode probes (fit's, dropout's) build in: the run's, except that a
    16-bit run trains in float32 (updates of 1e-3 vanish under bfloat16's 2^-8 rounding: real
    training in 16 bits keeps float32 weights, which the contract's fit does not model; and
    dropout's kept values are judged against the subject's own eval values, no oracle between,
    where 16-bit rounding would hide a site that drops nothing)."""
    return "float32" if RUN_DTYPE[0] in ("bfloat16", "float16") else RUN_DTYPE[0]


def search_dtype() -> str | None:
    """The dtype the search probes (translate's) build in: the run's, except that a 16-bit run
    searches in float32. Under 16-bit rounding nearly every step's argmax is within the bound of
    its runner-up, so the parent could judge almost no row of a search (the faulty example's
    padding fault passed the translate and beam tests in bfloat16); a search's logic does not
    depend on the dtype its logits were computed in."""
    return training_dtype()


def build(
    module: ModuleType,
    cfg: dict[str, Any],
    seed: int = 0,
    only: str | None = None,
    weights: dict[str, np.ndarray] | None = None,
) -> tuple[Any, str]:  # Any: the subject's torch Module, with the contract's methods
    """The subject's model for `cfg`, in eval mode, and its dtype: initialized under `seed`, then
    given the parent's `weights` (by the subject's own state_dict names) when there are any.

    float64 where the subject runs in it (a tiny forward pass tells); otherwise the same model
    rebuilt in float32, whose bounds the parent derives for float32.
    `only` (one of DTYPES), or else the run's dtype (RUN_DTYPE), skips the choice.
    """
    only = only or RUN_DTYPE[0]
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
