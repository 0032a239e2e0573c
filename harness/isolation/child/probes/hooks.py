"""The contract's module names in a subject's model (torch's stack names translated, a wrapper
module looked through), and forward hooks that record what those modules receive and return."""

from __future__ import annotations

import re
from typing import Any

import torch

from harness.isolation.child.probes.base import (
    numpy_of,
    parameter_views,
)


def float_tensors(args: tuple, kwargs: dict) -> list[torch.Tensor]:
    """A call's floating-point tensor arguments, positional first, then by keyword."""
    found = [*args, *kwargs.values()]
    return [t for t in found if isinstance(t, torch.Tensor) and t.is_floating_point()]


def query_first(tensors: list[torch.Tensor], out: torch.Tensor) -> list[torch.Tensor]:
    """A call's tensor inputs with the query first and the keys' source second, in whatever
    order the call took them: the query is the input shaped as the output (attention maps
    [B, T, d] to [B, T, d]), and among several such, the one passed once where another is
    passed twice (one memory as the keys and the values: OpenNMT's (key, value, query),
    fairseq's (query, key, value)); else the contract's order (query first) is kept."""
    if len(tensors) < 2:
        return tensors
    times: dict[int, int] = {}
    for t in tensors:
        times[id(t)] = times.get(id(t), 0) + 1
    shaped = [t for t in tensors if t.shape == out.shape]
    once = [t for t in shaped if times[id(t)] == 1]
    if not shaped:
        return tensors
    query = once[0] if once and max(times.values()) > 1 else shaped[0]
    at = next(i for i, t in enumerate(tensors) if t is query)
    rest = tensors[:at] + tensors[at + 1 :]
    rest.sort(key=lambda t: -times[id(t)])  # stable: the memory (given twice) before the rest
    return [query, *rest]


def first_calls(model: torch.nn.Module, names: Any) -> dict[str, dict[str, Any]]:
    """Hooks on the submodules whose contract names `names(name)` accepts: each one's first
    call, in order of completion, records its floating-point tensor inputs (at most two: the
    query, then the keys' source, whatever order the call took them in: `query_first`) and its
    output (a tuple's first element)."""
    seen: dict[str, dict[str, Any]] = {}

    def hook(name: str):
        def record(mod: torch.nn.Module, args: tuple, kwargs: dict, out: Any) -> None:
            first = out[0] if isinstance(out, tuple) and out else out
            if name in seen or not isinstance(first, torch.Tensor):
                return
            tensors = query_first(float_tensors(args, kwargs), first)
            inputs = [numpy_of(t) for t in tensors[:2]]
            seen[name] = {"inputs": inputs, "output": numpy_of(first)}

        return record

    for name, sub in contract_modules(model).items():
        if names(name):
            sub.register_forward_hook(hook(name), with_kwargs=True)
    return seen


def contract_modules(model: torch.nn.Module) -> dict[str, Any]:
    """The submodules that carry the contract's module names, by those names: torch's stack
    names translated, and looked for inside a wrapper module when not at the model's top; a
    name no submodule carries is the submodule whose parameters are exactly those the
    state_dict lists under it (`modules_by_parameters`: attribute names of the subject's own,
    renamed only in its state_dict). One module that carries several names (layers that are one
    module, nn.ModuleList([layer] * n)) is given as a `SharedCall` per name, whose hooks see
    that name's calls only."""
    modules = dict(model.named_modules())
    wrapper = wrapper_prefix(modules)
    found: dict[str, torch.nn.Module] = {}
    for name, sub in modules.items():
        if name.startswith(wrapper) and CONTRACT_NAME.match(contract_name(name[len(wrapper) :])):
            found.setdefault(contract_name(name[len(wrapper) :]), sub)
    for name, sub in modules_by_parameters(model).items():
        found.setdefault(name, sub)
    carried: dict[int, list[str]] = {}
    for name, sub in found.items():
        carried.setdefault(id(sub), []).append(name)
    out: dict[str, Any] = dict(found)
    for names in carried.values():
        if len(names) > 1:
            names.sort(key=lambda n: [int(x) if x.isdigit() else -1 for x in n.split(".")])
            calls = [0]
            found[names[0]].register_forward_pre_hook(lambda *_, calls=calls: _count(calls))
            for i, name in enumerate(names):
                out[name] = SharedCall(found[name], i, len(names), calls)
    return out


def _count(calls: list[int]) -> None:
    calls[0] += 1


class SharedCall:
    """One of the names a module carries with others (layers that are one module): its calls
    are, in each forward pass, the index-th of every `count` calls of the module (layer i of a
    stack of one module is its i-th call). Hooks registered here are the module's, called only
    then; registering returns the module's handle."""

    def __init__(self, module: torch.nn.Module, index: int, count: int, calls: list[int]):
        self.module, self.index, self.count, self.calls = module, index, count, calls

    def mine(self) -> bool:
        return (self.calls[0] - 1) % self.count == self.index

    def register_forward_pre_hook(self, hook: Any, **kw: Any) -> Any:
        def only_mine(*args: Any) -> Any:
            return hook(*args) if self.mine() else None

        return self.module.register_forward_pre_hook(only_mine, **kw)

    def register_forward_hook(self, hook: Any, **kw: Any) -> Any:
        def only_mine(*args: Any) -> Any:
            return hook(*args) if self.mine() else None

        return self.module.register_forward_hook(only_mine, **kw)


def modules_by_parameters(model: torch.nn.Module) -> dict[str, torch.nn.Module]:
    """Contract module name -> the submodule whose parameters are exactly the parameters the
    state_dict's entries under that name are (or are views of), the deepest such (a LayerNorm,
    not a container holding only it); names under one module path above them all (a wrapper)
    are read without it. Matched by what the tensors are, whatever the attributes are called;
    names whose entries are one module's (layers that are one module) all get that module."""
    views = parameter_views(model)
    heads = {k.split(".", 1)[0] for k in views}
    top = any(k.startswith(("src_emb.", "encoder.", "decoder.")) for k in views)
    wrapper = heads.pop() + "." if len(heads) == 1 and not top else ""
    want: dict[str, set[int]] = {}
    for key, (_, p) in views.items():
        parts = key.removeprefix(wrapper).split(".")
        for i in range(1, len(parts)):
            if CONTRACT_NAME.match(name := ".".join(parts[:i])):
                want.setdefault(name, set()).add(id(p))
    owned = [
        (name.count("."), sub, {id(p) for p in sub.parameters()})
        for name, sub in model.named_modules()
    ]
    found: dict[str, torch.nn.Module] = {}
    for name, ids in want.items():
        matches = [(depth, sub) for depth, sub, held in owned if held == ids]
        if matches:
            found[name] = max(matches, key=lambda m: m[0])[1]
    return found


def wrapper_prefix(modules: dict[str, torch.nn.Module]) -> str:
    """'' when the contract's module names are at the model's top; else the path of the one
    child that holds them ('transformer.' for a model wrapped in another module)."""
    if any(CONTRACT_NAME.match(contract_name(n)) for n in modules):
        return ""
    counts: dict[str, int] = {}
    for n in modules:
        head, _, rest = n.partition(".")
        if rest and CONTRACT_NAME.match(contract_name(rest)):
            counts[head + "."] = counts.get(head + ".", 0) + 1
    return max(counts, key=counts.__getitem__) if counts else ""


# torch's nn.TransformerEncoder/Decoder names (the torch copy's) -> the contract's.
TORCH_NAMES = (
    (re.compile(r"^(encoder|decoder)\.layers\.(\d+)"), r"\1.\2"),
    (re.compile(r"\.multihead_attn$"), ".cross_attn"),
    (re.compile(r"^encoder\.norm$"), "enc_norm"),
    (re.compile(r"^decoder\.norm$"), "dec_norm"),
)
CONTRACT_NAME = re.compile(
    r"^(encoder\.\d+(\.(self_attn|norm[12]|linear[12]))?|enc_norm|"
    r"decoder\.\d+(\.(self_attn|cross_attn|norm[123]|linear[12]))?|dec_norm|out)$"
)


def contract_name(name: str) -> str:
    """A submodule's name in the contract's scheme (torch's stack names translated)."""
    for pattern, replacement in TORCH_NAMES:
        name = pattern.sub(replacement, name)
    return name


def first_of(value: Any) -> Any:
    """A module's input or output as the hooks read it: a tuple by its first element."""
    return value[0] if isinstance(value, tuple) and value else value
