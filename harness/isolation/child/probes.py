"""Probes: the worker's half of each shared test, calling the subject's contract API.

A probe takes the subject's module and inputs the parent chose (JSON values and numpy arrays),
and returns plain data (numpy arrays, lists, scalars): what the parent's verdicts judge. Probes
never judge. Models are built from the subject's own TransformerConfig and Transformer, seeded
with torch.manual_seed, and run in float64 where the subject allows it (see `build`).
"""

from __future__ import annotations

import json
import re
import tempfile
from collections.abc import Callable
from pathlib import Path
from types import ModuleType
from typing import Any

import numpy as np
import torch

PROBES: dict[str, Callable[..., Any]] = {}


def probe(fn: Callable[..., Any]) -> Callable[..., Any]:
    """Register a probe under its function's name."""
    PROBES[fn.__name__] = fn
    return fn


def _np(t: torch.Tensor) -> np.ndarray:
    """A tensor as a float64 (or integer/bool) numpy array the wire can carry."""
    t = t.detach().cpu()
    if t.is_floating_point():
        t = t.to(torch.float64)
    return t.numpy().copy()


def _t(a: Any) -> torch.Tensor:
    return torch.from_numpy(np.array(a))


def _buffers(model: torch.nn.Module) -> set[str]:
    """The state_dict's persistent buffers: not parameters, so no value test reads them (the
    contract lists none; the names test alone charges one)."""
    return {name for name, _ in model.named_buffers()} & set(model.state_dict())


def _state_dict(model: torch.nn.Module) -> dict[str, np.ndarray]:
    """The model's parameters under their state_dict names (persistent buffers left out)."""
    buffers = _buffers(model)
    return {name: _np(t) for name, t in model.state_dict().items() if name not in buffers}


def _smoke_inputs(cfg: dict[str, Any]) -> tuple[torch.Tensor, ...]:
    src = torch.ones(1, 2, dtype=torch.long) % cfg["src_vocab"]
    tgt = torch.ones(1, 2, dtype=torch.long) % cfg["tgt_vocab"]
    mask = torch.ones(1, 2, dtype=torch.bool)
    return src, tgt, mask, mask


def build(
    module: ModuleType, cfg: dict[str, Any], seed: int, only: str | None = None
) -> tuple[torch.nn.Module, str]:
    """The subject's model for `cfg`, initialized under `seed`, in eval mode, and its dtype.

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
        return model, str(dtype).removeprefix("torch.")
    raise AssertionError("unreachable")


@probe
def loss_example(module, logits, targets, eps, pad_id) -> dict[str, Any]:
    """The subject's label_smoothed_loss and its gradient with respect to the logits."""
    z = _t(logits).requires_grad_(True)
    loss = module.label_smoothed_loss(z, _t(targets), eps, pad_id)
    loss.backward()
    return {"loss": float(loss.detach()), "grad": _np(z.grad) if z.grad is not None else None}


@probe
def defaults(module, functions) -> dict[str, Any]:
    """The default of every TransformerConfig field, and of every parameter of the named
    contract functions (a parameter without one: absent)."""
    import inspect

    def of(fn: Any) -> dict[str, Any]:
        params = inspect.signature(fn).parameters.values()
        return {p.name: p.default for p in params if p.default is not inspect.Parameter.empty}

    return {
        "config": of(module.TransformerConfig),
        "functions": {f: of(getattr(module, f)) for f in functions},
    }


@probe
def noam_rates(module, cases) -> list[float]:
    """noam_rate(step, d_model, warmup, factor) for each case."""
    return [float(module.noam_rate(s, d, w, f)) for s, d, w, f in cases]


@probe
def golden(module, cfg, seed, src, tgt_in, tgt_out, src_mask, tgt_mask, eps, pad_id, dtype=None):
    """Logits, the smoothed loss and every gradient (by named_parameters name), in eval mode."""
    model, dtype = build(module, cfg, seed, only=dtype)
    logits = model(_t(src), _t(tgt_in), _t(src_mask), _t(tgt_mask))
    loss = module.label_smoothed_loss(logits, _t(tgt_out), eps, pad_id)
    model.zero_grad(set_to_none=True)
    loss.backward()
    params = dict(model.named_parameters())
    return {
        "dtype": dtype,
        "state_dict": _state_dict(model),
        "logits": _np(logits),
        "loss": float(loss.detach()),
        # a parameter the loss does not reach has gradient 0 (None in torch)
        "grads": {
            n: _np(p.grad) if p.grad is not None else np.zeros(tuple(p.shape))
            for n, p in params.items()
        },
        "no_grad": [n for n, p in params.items() if p.grad is None],
    }


@probe
def forward_logits(module, cfg, seed, batches) -> dict[str, Any]:
    """forward(src, tgt_in, src_mask, tgt_mask) of one model on each batch, in eval mode."""
    model, dtype = build(module, cfg, seed)
    with torch.no_grad():
        logits = [
            _np(model(_t(b["src"]), _t(b["tgt_in"]), _t(b["src_mask"]), _t(b["tgt_mask"])))
            for b in batches
        ]
    return {"dtype": dtype, "logits": logits}


@probe
def dropout_logits(module, cfg, seed, src, tgt_in, src_mask, tgt_mask) -> dict[str, Any]:
    """One model's logits: eval mode, then training mode twice (other dropout draws), then eval
    mode again."""
    model, dtype = build(module, cfg, seed)
    inputs = (_t(src), _t(tgt_in), _t(src_mask), _t(tgt_mask))
    with torch.no_grad():
        before = _np(model(*inputs))
        model.train()
        train = []
        for draw in (1, 2):
            torch.manual_seed(draw)
            train.append(_np(model(*inputs)))
        model.eval()
        after = _np(model(*inputs))
    return {"dtype": dtype, "eval": [before, after], "train": train}


@probe
def decode_steps(module, cfg, seed, src, src_mask, tgt_in) -> dict[str, Any]:
    """decode on the whole target, and decode_step position by position from init_state.

    Also steps twice from the same states (the first and a middle one): decode_step must not
    mutate the state it is given.
    """
    model, dtype = build(module, cfg, seed)
    src, src_mask, tgt_in = _t(src), _t(src_mask), _t(tgt_in)
    T = tgt_in.shape[1]
    with torch.no_grad():
        memory = model.encode(src, src_mask)
        full = model.decode(tgt_in, memory, src_mask, torch.ones_like(tgt_in, dtype=torch.bool))
        state = model.init_state(src_mask)
        states, steps = [], []
        for t in range(T):
            states.append(state)
            logits, state = model.decode_step(tgt_in[:, t], memory, state)
            steps.append(_np(logits))
        again = {}
        for t in sorted({0, T // 2}):
            for _ in range(2):  # step from states[t] twice more: it must still be position t
                logits, _ = model.decode_step(tgt_in[:, t], memory, states[t])
            again[str(t)] = _np(logits)
    return {"dtype": dtype, "full": _np(full), "steps": np.stack(steps, axis=1), "again": again}


@probe
def state_dict(module, cfg, seed) -> dict[str, Any]:
    """The freshly initialized model's state_dict."""
    model, dtype = build(module, cfg, seed)
    return {"dtype": dtype, "state_dict": _state_dict(model)}


@probe
def state_dict_shapes(module, cfgs) -> list[dict[str, list[int]]]:
    """For each config, the state_dict's names and shapes (in the subject's order)."""
    out = []
    for cfg in cfgs:
        model = module.Transformer(module.TransformerConfig(**cfg))
        out.append({name: list(t.shape) for name, t in model.state_dict().items()})
    return out


@probe
def parameter_shapes(module, cfgs) -> list[dict[str, list[int]]]:
    """For each config, the parameters' state_dict names and shapes (persistent buffers left
    out): what the decoding tests draw weights for."""
    out = []
    for cfg in cfgs:
        model = module.Transformer(module.TransformerConfig(**cfg))
        buffers = _buffers(model)
        state = model.state_dict()
        out.append({k: list(t.shape) for k, t in state.items() if k not in buffers})
    return out


@probe
def buffer_names(module, cfgs) -> list[list[str]]:
    """For each config, the persistent buffers its state_dict lists."""
    return [sorted(_buffers(module.Transformer(module.TransformerConfig(**c)))) for c in cfgs]


def _tensors(args: tuple, kwargs: dict) -> list[torch.Tensor]:
    """A call's floating-point tensor arguments, positional first, then by keyword."""
    found = [*args, *kwargs.values()]
    return [t for t in found if isinstance(t, torch.Tensor) and t.is_floating_point()]


def _first_call(model: torch.nn.Module, names: Any) -> dict[str, dict[str, Any]]:
    """Hooks on the submodules whose contract names `names(name)` accepts: each one's first
    call, in order of completion, records its floating-point tensor inputs (at most two: the
    query, then the keys' source) and its output (a tuple's first element)."""
    seen: dict[str, dict[str, Any]] = {}

    def hook(name: str):
        def record(mod: torch.nn.Module, args: tuple, kwargs: dict, out: Any) -> None:
            first = out[0] if isinstance(out, tuple) and out else out
            if name in seen or not isinstance(first, torch.Tensor):
                return
            inputs = [_np(t) for t in _tensors(args, kwargs)[:2]]
            seen[name] = {"inputs": inputs, "output": _np(first)}

        return record

    for name, sub in contract_modules(model).items():
        if names(name):
            sub.register_forward_hook(hook(name), with_kwargs=True)
    return seen


def contract_modules(model: torch.nn.Module) -> dict[str, torch.nn.Module]:
    """The submodules that carry the contract's module names, by those names: torch's stack
    names translated, and looked for inside a wrapper module when not at the model's top."""
    modules = dict(model.named_modules())
    wrapper = _wrapper(modules)
    found = {}
    for name, sub in modules.items():
        if name.startswith(wrapper) and _CONTRACT_NAME.match(contract_name(name[len(wrapper) :])):
            found.setdefault(contract_name(name[len(wrapper) :]), sub)
    return found


def _wrapper(modules: dict[str, torch.nn.Module]) -> str:
    """'' when the contract's module names are at the model's top; else the path of the one
    child that holds them ('transformer.' for a model wrapped in another module)."""
    if any(_CONTRACT_NAME.match(contract_name(n)) for n in modules):
        return ""
    counts: dict[str, int] = {}
    for n in modules:
        head, _, rest = n.partition(".")
        if rest and _CONTRACT_NAME.match(contract_name(rest)):
            counts[head + "."] = counts.get(head + ".", 0) + 1
    return max(counts, key=counts.__getitem__) if counts else ""


@probe
def embedding_stream(module, cfg, seed, src, tgt_in, src_mask, tgt_mask) -> dict[str, Any]:
    """What the first encoder layer and the first decoder layer receive in one forward pass
    (x0 and y0: modules found by the contract's names, torch's stack names translated), and
    the parameters: the parent checks x0 = E[ids] sqrt(d) + PE from them, nothing else."""
    model, dtype = build(module, cfg, seed)
    seen = _first_call(model, lambda name: name in ("encoder.0", "decoder.0"))
    # gradients stay enabled: under no_grad torch's own layers may take a fused path
    model(_t(src), _t(tgt_in), _t(src_mask), _t(tgt_mask))
    first = {k: (v["inputs"][0] if v["inputs"] else None) for k, v in seen.items()}
    answer = {
        "dtype": dtype,
        "state_dict": _state_dict(model),
        "x0": first.get("encoder.0"),
        "y0": first.get("decoder.0"),
    }
    if answer["x0"] is None or answer["y0"] is None:
        # no layer module is called (a functional style): the pre-LN model with every out_proj
        # and linear2 zeroed, so each residual adds 0 and encode gives enc_norm(x0)
        state = model.state_dict()
        for name, t in state.items():
            if ".out_proj." in name or ".linear2." in name:
                t.zero_()
        model.load_state_dict(state)
        with torch.no_grad():
            answer["zeroed_memory"] = _np(model.encode(_t(src), _t(src_mask)))
            answer["zeroed_logits"] = _np(model(_t(src), _t(tgt_in), _t(src_mask), _t(tgt_mask)))
        answer["zeroed_state_dict"] = _state_dict(model)
    return answer


@probe
def optimizer(module, cfg, seed) -> dict[str, Any]:
    """make_optimizer's class, its param groups' settings and which parameters it holds."""
    model, _ = build(module, cfg, seed)
    opt = module.make_optimizer(model)
    held = [id(p) for group in opt.param_groups for p in group["params"]]
    own = [id(p) for p in model.parameters()]
    groups = [
        {
            "betas": [float(b) for b in group.get("betas", ())],
            "eps": float(group.get("eps", float("nan"))),
            "weight_decay": float(group.get("weight_decay", float("nan"))),
            "amsgrad": bool(group.get("amsgrad", False)),
        }
        for group in opt.param_groups
    ]
    return {
        "bases": [f"{c.__module__}.{c.__qualname__}" for c in type(opt).__mro__],
        "groups": groups,
        "n_held": len(held),
        "n_distinct_held": len(set(held)),
        "n_model": len(own),
        "all_held": set(own) <= set(held),
        "foreign": len(set(held) - set(own)),
    }


def _fit(module, model, data, seed, **kw) -> dict[str, Any]:
    calls: list[list[float]] = []
    losses = module.fit(
        model,
        _t(data["src"]),
        _t(data["tgt"]),
        pad_id=data["pad_id"],
        seed=seed,
        callback=lambda step, rate, loss: calls.append([float(step), float(rate), float(loss)]),
        **kw,
    )
    return {
        "losses": [float(x) for x in losses],
        "types": sorted({type(x).__name__ for x in losses} | {type(losses).__name__}),
        "calls": calls,
        "training": model.training,
    }


@probe
def fit_runs(module, cfg, seed, data, steps, batch, warmup, factor, lr, fit_seed):
    """fit on one initial model: twice with the Noam schedule and the same seed, once with a
    constant rate, once from eval mode, and one update whose parameter change shows its rate."""
    model, dtype = build(module, cfg, seed)
    init = {name: t.clone() for name, t in model.state_dict().items()}
    kw = {"steps": steps, "batch": batch, "warmup": warmup, "factor": factor}
    runs = {}
    for global_seed, (name, mode, extra) in enumerate(
        (
            ("noam", True, {}),
            ("noam_again", True, {}),
            ("constant", True, {"lr": lr}),
            ("from_eval", False, {}),
        )
    ):
        model.load_state_dict(init)
        model.train(mode)
        torch.manual_seed(1000 + global_seed)  # fit's draws come from its seed, not from this
        runs[name] = _fit(module, model, data, fit_seed, **kw, **extra)
    # edge sizes the contract allows: no update at all, and batches of one row
    model.load_state_dict(init)
    runs["no_steps"] = _fit(module, model, data, fit_seed, **{**kw, "steps": 0})
    runs["no_steps"]["moved"] = max(
        float((t - init[n]).abs().max()) for n, t in model.state_dict().items()
    )
    runs["batch_one"] = _fit(module, model, data, fit_seed, **{**kw, "steps": 2, "batch": 1})
    model.load_state_dict(init)
    model.train()
    one = _fit(module, model, data, fit_seed, **{**kw, "steps": 1})
    after = model.state_dict()
    delta = max(float((after[n] - init[n]).abs().max()) for n in init)
    return {"dtype": dtype, "runs": runs, "one_step": one, "max_first_update": delta}


def load_weights(model: torch.nn.Module, weights: dict[str, np.ndarray]) -> None:
    """load_state_dict of parent-chosen arrays for the model's parameters, in the model's dtype;
    its persistent buffers, if any, keep their own values."""
    dtype = next(model.parameters()).dtype
    state = model.state_dict()
    state.update({k: torch.from_numpy(v).to(dtype) for k, v in weights.items()})
    model.load_state_dict(state)


@probe
def translations(
    module, cfg, weights, src, bos, eos, pad_id, max_len, settings, train_mode, paths=None
):
    """translate under each (beam_size, length_penalty) with the parent's weights loaded, the
    training mode it leaves, a save_transformer / load_transformer round trip, and the forward
    logits along the parent's decoding `paths` ({"tgt_in", "tgt_mask"}), so the parent can tell
    a search fault from a forward-pass fault."""
    model, dtype = build(module, cfg, 0)
    load_weights(model, weights)
    model.train(train_mode)
    src = _t(src)
    outputs, modes = [], []
    # whether any contract module ran with gradients enabled during translate
    grad_seen: list[bool] = []
    handles = [
        sub.register_forward_pre_hook(lambda *_: grad_seen.append(torch.is_grad_enabled()))
        for sub in contract_modules(model).values()
    ]
    types: set[str] = set()
    for beam, penalty in settings:
        out = module.translate(model, src, bos, eos, pad_id, max_len, beam, penalty)
        outputs.append([[int(tok) for tok in row] for row in out])
        modes.append(model.training)
        types |= {type(out).__name__} | {type(row).__name__ for row in out}
        types |= {type(tok).__name__ for row in out for tok in row}
    for handle in handles:
        handle.remove()
    model.eval()
    mask = src != pad_id
    tgt = torch.full((src.shape[0], 1), bos)
    ones = torch.ones_like(tgt, dtype=torch.bool)
    with tempfile.TemporaryDirectory() as tmp, torch.no_grad():
        before = model(src, tgt, mask, ones)
        module.save_transformer(model, tmp)
        files = sorted(p.name for p in Path(tmp).iterdir())
        header: list[str] = []
        if "model.safetensors" in files:
            raw = (Path(tmp) / "model.safetensors").read_bytes()
            n = int.from_bytes(raw[:8], "little")
            header = sorted(k for k in json.loads(raw[8 : 8 + n]) if k != "__metadata__")
        loaded = module.load_transformer(tmp).eval()
        after = loaded(src, tgt, mask, ones)
        along = None
        if paths is not None:
            along = _np(model(src, _t(paths["tgt_in"]), mask, _t(paths["tgt_mask"])))
    return {
        "forward_along_paths": along,
        "dtype": dtype,
        "outputs": outputs,
        "training_after": modes,
        "types": sorted(types),
        "grad_during": any(grad_seen),
        "modules_seen": len(grad_seen),
        "files": files,
        "safetensors_keys": header,
        "state_dict_keys": sorted(model.state_dict()),
        "logits_before": _np(before),
        "logits_after_load": _np(after),
    }


def _raised(fn: Callable[[], Any]) -> dict[str, Any] | None:
    try:
        fn()
    except Exception as e:
        return {"type": type(e).__name__, "bases": [c.__name__ for c in type(e).__mro__]}
    return None


@probe
def bad_inputs(module, cfg, seed) -> dict[str, Any]:
    """Each bad input of CONTRACT.md's table, and what the subject raised (None: nothing)."""
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


class _Stop(Exception):
    """Raised from fit's callback to end training early."""


@probe
def learn(module, cfg, seed, data, steps, batch, warmup, factor, lr, stop=None):
    """fit for `steps` updates; the trained weights, which the parent judges with the oracle
    (never the subject's own logits or loss).

    stop (optional) {"src", "tgt", "pad_id", "every", "below"}: after every `every`-th update the
    model's own eval-mode cross-entropy on those rows is computed here (numpy's log-softmax of
    its logits), and fit is ended once it is at most `below`. Only when to stop rests on the
    subject's numbers; the verdict is the parent's, on the weights. Eval-mode passes draw no
    random numbers, so the updates run are the same as without the checks.
    """
    torch.manual_seed(seed)
    # the model's own dtype (float32 as users train it): a learning bar, not a rounding check
    model = module.Transformer(module.TransformerConfig(**cfg))
    kw = {"steps": steps, "batch": batch, "warmup": warmup, "factor": factor, "lr": lr}
    updates = [0]

    def own_loss() -> float:
        src, tgt, pad = _t(stop["src"]), _t(stop["tgt"]), stop["pad_id"]
        tgt_in, tgt_out = tgt[:, :-1], stop["tgt"][:, 1:]
        model.eval()
        try:
            with torch.no_grad():
                z = _np(model(src, tgt_in, src != pad, tgt_in != pad))
        finally:
            model.train()
        z = z - z.max(axis=-1, keepdims=True)
        logp = z - np.log(np.exp(z).sum(axis=-1, keepdims=True))
        real = tgt_out != pad
        picked = np.take_along_axis(logp, tgt_out[..., None], axis=-1)[..., 0]
        return float(-(picked * real).sum() / real.sum())

    def callback(step, rate, loss) -> None:
        updates[0] = int(step) + 1
        if stop is not None and updates[0] % stop["every"] == 0 and own_loss() <= stop["below"]:
            raise _Stop

    try:
        losses = module.fit(
            model, _t(data["src"]), _t(data["tgt"]), pad_id=data["pad_id"], seed=seed,
            callback=callback, **kw,
        )  # fmt: skip
        losses = [float(x) for x in losses]
    except _Stop:
        losses = None
    return {"losses": losses, "updates": updates[0], "state_dict": _state_dict(model)}


# torch's nn.TransformerEncoder/Decoder names (the torch copy's) -> the contract's.
_TORCH_NAMES = (
    (re.compile(r"^(encoder|decoder)\.layers\.(\d+)"), r"\1.\2"),
    (re.compile(r"\.multihead_attn$"), ".cross_attn"),
    (re.compile(r"^encoder\.norm$"), "enc_norm"),
    (re.compile(r"^decoder\.norm$"), "dec_norm"),
)
_CONTRACT_NAME = re.compile(
    r"^(encoder\.\d+(\.(self_attn|norm[12]|linear[12]))?|enc_norm|"
    r"decoder\.\d+(\.(self_attn|cross_attn|norm[123]|linear[12]))?|dec_norm|out)$"
)


def contract_name(name: str) -> str:
    """A submodule's name in the contract's scheme (torch's stack names translated)."""
    for pattern, replacement in _TORCH_NAMES:
        name = pattern.sub(replacement, name)
    return name


@probe
def module_outputs(module, cfg, seed, src, tgt_in, src_mask, tgt_mask) -> dict[str, Any]:
    """What each contract-named submodule received and returned during one forward pass (its
    first call, in order of completion), and the weights: the parent's diagnosis recomputes
    each module's contract function from the module's own input with the oracle."""
    model, dtype = build(module, cfg, seed)
    seen = _first_call(model, lambda name: bool(_CONTRACT_NAME.match(name)))
    # gradients stay enabled: under no_grad torch's own layers take a fused fast path that
    # never calls their submodules, so their hooks would not fire
    logits = model(_t(src), _t(tgt_in), _t(src_mask), _t(tgt_mask))
    return {
        "dtype": dtype,
        "state_dict": _state_dict(model),
        "modules": list(seen),
        "inputs": {k: v["inputs"] for k, v in seen.items()},
        "outputs": {k: v["output"] for k, v in seen.items()},
        "logits": _np(logits),
    }


def _first(value: Any) -> Any:
    """A module's input or output as the hooks read it: a tuple by its first element."""
    return value[0] if isinstance(value, tuple) and value else value


@probe
def dropout_sites(module, cfg, seed, src, tgt_in, src_mask, tgt_mask, draw) -> dict[str, Any]:
    """What enters and leaves each contract-named submodule in one forward pass in eval mode,
    then in one in training mode (torch.manual_seed(draw) first), with gradients enabled (under
    no_grad torch's own layers take a fused path that skips their submodules' hooks).

    For each pass: {name: {"in": first positional input, "out": output}} of the module's first
    call (a tuple counts by its first element); and the state_dict, whose out_proj weights let
    the parent split an attention output into its heads.
    """
    model, dtype = build(module, cfg, seed)
    inputs = (_t(src), _t(tgt_in), _t(src_mask), _t(tgt_mask))
    seen: dict[str, dict[str, np.ndarray]] = {}

    def hooks(name: str):
        def before(mod: torch.nn.Module, args: Any) -> None:
            first = _first(args)
            if isinstance(first, torch.Tensor) and "in" not in seen.setdefault(name, {}):
                seen[name]["in"] = _np(first)

        def after(mod: torch.nn.Module, args: Any, out: Any) -> None:
            first = _first(out)
            if isinstance(first, torch.Tensor) and "out" not in seen.setdefault(name, {}):
                seen[name]["out"] = _np(first)

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
    return {"dtype": dtype, "state_dict": _state_dict(model), **passes}


@probe
def train_eval_logits(module, cfg, seed, src, tgt_in, src_mask, tgt_mask) -> dict[str, Any]:
    """One model's logits in eval mode and in training mode, with gradients enabled (the same
    path in both modes: under no_grad torch's own layers take a fused path in eval mode only)."""
    model, dtype = build(module, cfg, seed)
    inputs = (_t(src), _t(tgt_in), _t(src_mask), _t(tgt_mask))
    out = {}
    for mode in ("eval", "train"):
        model.train(mode == "train")
        torch.manual_seed(0)
        out[mode] = _np(model(*inputs))
    return {"dtype": dtype, **out}


@probe
def decode_step_work(module, cfg, seed, src, src_mask, tgt_in) -> dict[str, Any]:
    """The floating-point operations of matrix products (torch's FlopCounterMode: mm, addmm, bmm,
    attention kernels) in each decode_step call, position by position from init_state."""
    from torch.utils.flop_counter import FlopCounterMode

    model, dtype = build(module, cfg, seed)
    src, src_mask, tgt_in = _t(src), _t(src_mask), _t(tgt_in)
    flops = []
    with torch.no_grad():
        memory = model.encode(src, src_mask)
        state = model.init_state(src_mask)
        for t in range(tgt_in.shape[1]):
            counter = FlopCounterMode(display=False)
            with counter:
                _, state = model.decode_step(tgt_in[:, t], memory, state)
            flops.append(int(counter.get_total_flops()))
    return {"dtype": dtype, "flops": flops}
