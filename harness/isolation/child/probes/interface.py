"""Probes of the interface laws: defaults, state_dict names and shapes, buffers, and what bad
input through every entry point raises."""

from __future__ import annotations

import sysconfig
import traceback
from collections.abc import Callable
from pathlib import Path
from types import ModuleType
from typing import Any

import torch

from harness.isolation.child.probes.base import (
    build,
    parameter_views,
    parameters_by_name,
    persistent_buffers,
    probe,
    state_tensors,
    tensor_of,
)


@probe
def defaults(module, functions, vocab=None) -> dict[str, Any]:
    """The default of every TransformerConfig field, as a config made with only the
    vocabularies (`vocab`: {src_vocab, tgt_vocab}) holds it (a field it does not hold, or a
    config that cannot be made so: its signature's default), and of every parameter of the
    named contract functions (a parameter without one: absent)."""
    import inspect

    def of(fn: Any) -> dict[str, Any]:
        params = inspect.signature(fn).parameters.values()
        return {p.name: p.default for p in params if p.default is not inspect.Parameter.empty}

    config = of(module.TransformerConfig)
    if vocab is not None:
        try:
            made = module.TransformerConfig(**vocab)
        except TypeError:  # a field past the vocabularies without a default: the signature's
            made = None
        if made is not None:
            held = {n: getattr(made, n) for n in config if n not in vocab and hasattr(made, n)}
            config = {**config, **held}
    return {
        "config": config,
        "functions": {f: of(getattr(module, f)) for f in functions},
    }


def _attempt(fn: Callable[[], Any]) -> dict[str, Any]:
    """fn's result as {"value": ...}, or what it raised as {"raised": name, "message": ...}."""
    try:
        return {"value": fn()}
    except Exception as e:
        return {"raised": type(e).__name__, "message": str(e)[:300]}


@probe
def omitted_defaults(module, cfg, weights, inputs, bos, eos, pad_id, max_len, calls):
    """Each of `calls`, in the parent's order: {"f": "noam_rate", "translate" or "fit", "case":
    an index into inputs[f], "kw": the arguments given by name}; every defaulted argument not in
    "kw" is left out. noam_rate(*inputs["noam_rate"][case]) (step, d_model, warmup); translate
    with the parent's weights on inputs["translate"][case] (a source padded with pad_id); fit
    from the parent's weights on inputs["fit"][case] ({"src", "tgt", "pad_id"}): its losses and
    the weights it leaves. The global random state is seeded alike before each call, so that
    calls differ only by what they give. Each result, in order: {"value": ...} or {"raised",
    "message"}."""
    model, _ = build(module, cfg, weights=weights)
    init = {name: t.clone() for name, t in model.state_dict().items()}

    def rate(case: list, **kw: Any) -> float:
        return float(module.noam_rate(*case, **kw))

    def translated(case: Any, **kw: Any) -> list[list[int]]:
        model.load_state_dict(init)  # the parent's weights, whatever fit made of them
        model.eval()
        torch.manual_seed(0)  # the same draws for every call: randomness in eval is another law's
        out = module.translate(model, tensor_of(case), bos, eos, pad_id, max_len, **kw)
        return [[int(tok) for tok in row] for row in out]

    def fitted(case: dict, **kw: Any) -> dict[str, Any]:
        model.load_state_dict(init)
        model.train()
        torch.manual_seed(0)
        src, tgt = tensor_of(case["src"]), tensor_of(case["tgt"])
        losses = module.fit(model, src, tgt, steps=2, batch=2, pad_id=case["pad_id"], **kw)
        return {"losses": [float(x) for x in losses], "weights": parameters_by_name(model)}

    runs = {"noam_rate": rate, "translate": translated, "fit": fitted}
    out = []
    for c in calls:
        case = inputs[c["f"]][c["case"]]
        out.append(_attempt(lambda run=runs[c["f"]], case=case, kw=c["kw"]: run(case, **kw)))
    return out


@probe
def state_dict_shapes(module, cfgs) -> list[dict[str, list[int]]]:
    """For each config, the state_dict's names and shapes (in the subject's order)."""
    out = []
    for cfg in cfgs:
        model = module.Transformer(module.TransformerConfig(**cfg))
        out.append({name: list(t.shape) for name, t in model.state_dict().items()})
    return out


@probe
def state_dict_copies(module, cfgs) -> list[dict[str, list[str]]]:
    """For each config, the state_dict's parameter entries that are copies ("copies": neither a
    parameter nor a view of one, as a hook that clones or concatenates hands out), and the
    named parameters no entry is or views ("unlisted", by named_parameters name)."""
    out = []
    for cfg in cfgs:
        model = module.Transformer(module.TransformerConfig(**cfg))
        views = parameter_views(model)
        state = state_tensors(model)
        copies = [k for k, t in state.items() if t.is_floating_point() and k not in views]
        reached = {id(p) for _, p in views.values()}
        unlisted = [n for n, p in model.named_parameters() if id(p) not in reached]
        out.append({"copies": copies, "unlisted": unlisted})
    return out


@probe
def buffer_names(module, cfgs) -> list[list[str]]:
    """For each config, the persistent buffers its state_dict lists."""
    return [
        sorted(persistent_buffers(module.Transformer(module.TransformerConfig(**c)))) for c in cfgs
    ]


def catcher(module: ModuleType) -> Callable[[Callable[[], Any]], dict[str, Any] | None]:
    """raised(fn): what `fn` raised on `module` (None: nothing): its class and bases, and for
    the message alone (no verdict reads them) its first line and where it came from."""

    def raised(fn: Callable[[], Any]) -> dict[str, Any] | None:
        try:
            fn()
        except Exception as e:
            return {
                "type": type(e).__name__,
                "bases": [c.__name__ for c in type(e).__mro__],
                **origin(e, module),
            }
        return None

    return raised


def origin(e: BaseException, module: ModuleType) -> dict[str, Any]:
    """Where an exception was raised, for a message: "message" (its first line, cut), "at" (the
    innermost frame, file:line in function; "" if none), "yours" (that frame is the subject's
    code: the raise, or a builtin it called, is on that line), "library" (else the library
    whose file it is, "torch"; "" if it cannot be named) and "from" (else the subject's
    innermost frame; "" if none). A NotImplementedError raised inside torch is so told from the
    subject's own."""
    try:
        message = (str(e).strip().splitlines() or [""])[0][:160]
    except Exception:  # a subject's exception whose __str__ fails
        message = ""
    own = Path(str(getattr(module, "__file__", None) or "<none>"))

    def yours(filename: str) -> bool:
        file = Path(filename)
        return file == own or (own.is_absolute() and file.parent == own.parent)

    def said(frame: traceback.FrameSummary) -> str:
        return f"{_short(frame.filename, yours(frame.filename))}:{frame.lineno} in {frame.name}"

    out: dict[str, Any] = {"message": message, "at": "", "yours": False, "library": "", "from": ""}
    frames = traceback.extract_tb(e.__traceback__)
    if frames:
        last = frames[-1]
        out["at"], out["yours"] = said(last), yours(last.filename)
        if not out["yours"]:
            inside, slash, _ = _short(last.filename, False).partition("/")
            out["library"] = inside if slash else ""
            mine = [f for f in frames if yours(f.filename)]
            out["from"] = said(mine[-1]) if mine else ""
    return out


def _short(filename: str, subjects: bool) -> str:
    """A file as a message names it: the subject's by its name, a library's by its path inside
    site-packages (torch/nn/modules/module.py), the standard library's inside its folder."""
    if subjects:
        return Path(filename).name
    for marker in ("site-packages/", "dist-packages/"):
        if marker in filename:
            return filename.rpartition(marker)[2]
    stdlib = sysconfig.get_paths()["stdlib"] + "/"
    return filename[len(stdlib) :] if filename.startswith(stdlib) else Path(filename).name


@probe
def bad_inputs(module, cfg, seed) -> dict[str, Any]:
    """Each bad input of CONTRACT.md's table, and what the subject raised (None: nothing)."""
    _raised = catcher(module)
    model, _ = build(module, cfg, seed)
    T = torch.tensor
    src, tgt = T([[3, 4, 5]]), T([[1, 6, 7]])
    ok = torch.ones(1, 3, dtype=torch.bool)
    long_src = torch.ones(1, cfg["max_len"] + 1, dtype=torch.long)
    return {
        "norm is not 'post' or 'pre'": _raised(
            lambda: module.Transformer(module.TransformerConfig(**{**cfg, "norm": "side"}))
        ),
        "d_model not divisible by n_heads": _raised(
            # at the config or at the model, like the norm's check
            lambda: module.Transformer(
                module.TransformerConfig(**{**cfg, "n_heads": cfg["d_model"] // 2 + 1})
            )
        ),
        "src_mask not bool": _raised(lambda: model(src, tgt, ok.long(), ok)),
        "tgt_mask not bool": _raised(lambda: model(src, tgt, ok, ok.float())),
        "encode mask not bool": _raised(lambda: model.encode(src, ok.int())),
        "src_mask shape differs from src": _raised(lambda: model(src, tgt, ok[:, :2], ok)),
        "tgt_mask shape differs from tgt_in": _raised(lambda: model(src, tgt, ok, ok[:, :2])),
        "batch sizes differ": _raised(lambda: model(src.repeat(2, 1), tgt, ok.repeat(2, 1), ok)),
        "source longer than max_len": _raised(
            lambda: model.encode(long_src, torch.ones_like(long_src, dtype=torch.bool))
        ),
        "source row with no real token": _raised(lambda: model(src, tgt, torch.zeros_like(ok), ok)),
        "target row with padding at bos": _raised(
            lambda: model(src, tgt, ok, T([[False, True, True]]))
        ),
        **_bad_inputs_past_forward(module, model, cfg, src, tgt, ok),
    }


def _bad_inputs_past_forward(module, model, cfg, src, tgt, ok) -> dict[str, Any]:
    """The bad inputs of CONTRACT.md's table through the other entry points: decode, init_state,
    decode_step, fit and translate."""
    _raised = catcher(module)
    with torch.no_grad():
        memory = model.encode(src, ok)
    T = torch.tensor
    long_tgt = torch.ones(1, cfg["max_len"] + 1, dtype=torch.long)
    two = (src.repeat(2, 1), ok.repeat(2, 1))

    def steps(n: int) -> None:
        state = model.init_state(ok)
        for _ in range(n):
            _, state = model.decode_step(T([1]), memory, state)

    return {
        # not errors: decoding reaches position max_len - 1, and translate max_len tokens
        "accepted: decode_step at positions 0 .. max_len - 1": _raised(
            lambda: steps(cfg["max_len"])
        ),
        "accepted: translate with the model's max_len": _raised(
            lambda: module.translate(model, src, 1, 2, 0, cfg["max_len"])
        ),
        "decode: tgt_mask not bool": _raised(lambda: model.decode(tgt, memory, ok, ok.float())),
        "decode: src_mask not bool": _raised(lambda: model.decode(tgt, memory, ok.long(), ok)),
        "decode: tgt_mask shape differs from tgt_in": _raised(
            lambda: model.decode(tgt, memory, ok, ok[:, :2])
        ),
        "decode: src_mask shape differs from memory": _raised(
            lambda: model.decode(tgt, memory, ok[:, :2], ok)
        ),
        "decode: src_mask of more rows than memory": _raised(
            lambda: model.decode(tgt, memory, two[1], ok)
        ),
        "decode: batch sizes differ": _raised(
            lambda: model.decode(tgt, memory.repeat(2, 1, 1), two[1], ok)
        ),
        "decode: target longer than max_len": _raised(
            lambda: model.decode(long_tgt, memory, ok, torch.ones_like(long_tgt, dtype=torch.bool))
        ),
        "decode: source row with no real token": _raised(
            lambda: model.decode(tgt, memory, torch.zeros_like(ok), ok)
        ),
        "init_state: src_mask not bool": _raised(lambda: model.init_state(ok.long())),
        "init_state: source row with no real token": _raised(
            lambda: model.init_state(torch.zeros_like(ok))
        ),
        "decode_step: y_prev of another batch size": _raised(
            lambda: model.decode_step(T([1, 1]), memory, model.init_state(ok))
        ),
        "decode_step: memory of another batch size": _raised(
            lambda: model.decode_step(T([1]), memory.repeat(2, 1, 1), model.init_state(ok))
        ),
        "decode_step: past max_len": _raised(lambda: steps(cfg["max_len"] + 1)),
        "fit: src and tgt rows differ": _raised(
            lambda: module.fit(model, two[0], tgt, steps=1, batch=2, pad_id=0)
        ),
        "translate: max_len past the model's": _raised(
            lambda: module.translate(model, src, 1, 2, 0, cfg["max_len"] + 1)
        ),
    }
