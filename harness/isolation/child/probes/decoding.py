"""Probes of the decoding laws: decode_step position by position, translate under the parent's
weights with a save/load round trip, and decode_step's work."""

from __future__ import annotations

import json
import tempfile
from pathlib import Path
from typing import Any

import numpy as np
import torch

from harness.isolation.child.probes.base import (
    build,
    load_weights,
    numpy_of,
    parameters_by_name,
    probe,
    search_dtype,
    tensor_of,
)
from harness.isolation.child.probes.hooks import (
    contract_modules,
)


@probe
def decode_steps(module, cfg, src, src_mask, tgt_in, weights=None, seed=0) -> dict[str, Any]:
    """decode on the whole target, and decode_step position by position from init_state.

    Also steps twice from the same states (the first and a middle one): decode_step must not
    mutate the state it is given.
    """
    model, dtype = build(module, cfg, seed, weights=weights)
    src, src_mask, tgt_in = tensor_of(src), tensor_of(src_mask), tensor_of(tgt_in)
    T = tgt_in.shape[1]
    with torch.no_grad():
        memory = model.encode(src, src_mask)
        full = model.decode(tgt_in, memory, src_mask, torch.ones_like(tgt_in, dtype=torch.bool))
        state = model.init_state(src_mask)
        states, steps = [], []
        for t in range(T):
            states.append(state)
            logits, state = model.decode_step(tgt_in[:, t], memory, state)
            steps.append(numpy_of(logits))
        again = {}
        for t in sorted({0, T // 2}):
            for _ in range(2):  # step from states[t] twice more: it must still be position t
                logits, _ = model.decode_step(tgt_in[:, t], memory, states[t])
            again[str(t)] = numpy_of(logits)
    return {
        "dtype": dtype,
        "state_dict": parameters_by_name(model),
        "full": numpy_of(full),
        "steps": np.stack(steps, axis=1),
        "again": again,
    }


@probe
def raised_as_data(module, run, inputs) -> dict[str, Any]:
    """The probe `run` (decode_steps or translations) on `inputs`: {"answer": its value}, or
    what the subject raised, {"raised": {"type", "message"}}, so the parent can say why."""
    chosen = {"decode_steps": decode_steps, "translations": translations}[run]
    try:
        return {"answer": chosen(module, **inputs)}
    except Exception as e:  # the subject's error on a valid input: data for the parent
        return {"raised": {"type": type(e).__name__, "message": str(e)[:300]}}


@probe
def decode_step_rows(module, cfg, weights, src, src_mask, bos, rows) -> dict[str, Any]:
    """decode_step from init_state of src's B rows, with y_prev (bos) of each count in `rows`:
    what it raised (its type and bases), or the shape of the logits it returned."""
    model, _ = build(module, cfg, weights=weights)
    src, src_mask = tensor_of(src), tensor_of(src_mask)
    found: dict[str, Any] = {}
    with torch.no_grad():
        memory = model.encode(src, src_mask)
        for n in rows:
            try:
                logits, _ = model.decode_step(
                    torch.full((n,), bos), memory, model.init_state(src_mask)
                )
            except Exception as e:  # the subject's answer to a bad input: data for the parent
                found[str(n)] = {
                    "type": type(e).__name__,
                    "bases": [c.__name__ for c in type(e).__mro__],
                }
            else:
                found[str(n)] = {"shape": list(getattr(logits, "shape", ()))}
    return found


@probe
def translations(
    module,
    cfg,
    weights,
    src,
    bos,
    eos,
    pad_id,
    max_len,
    settings,
    train_mode,
    paths=None,
    save_load=True,
):
    """translate under each (beam_size, length_penalty) with the parent's weights loaded (a
    setting of one number or none leaves the rest out: the contract's defaults in effect), the
    training mode it leaves, a save_transformer / load_transformer round trip (unless
    `save_load` is false: a search judged on its own never touches them), and the forward
    logits along the parent's decoding `paths` ({"tgt_in", "tgt_mask"}), so the parent can tell
    a search fault from a forward-pass fault. Built in search_dtype()."""
    model, dtype = build(module, cfg, weights=weights, only=search_dtype())
    model.train(train_mode)
    src = tensor_of(src)
    outputs, modes = [], []
    # whether any contract module ran with gradients enabled during translate
    grad_seen: list[bool] = []
    handles = [
        sub.register_forward_pre_hook(lambda *_: grad_seen.append(torch.is_grad_enabled()))
        for sub in contract_modules(model).values()
    ]
    types: set[str] = set()
    for setting in settings:  # [beam_size, length_penalty], or fewer: the rest left out
        out = module.translate(model, src, bos, eos, pad_id, max_len, *setting)
        outputs.append([[int(tok) for tok in row] for row in out])
        modes.append(model.training)
        types |= {type(out).__name__} | {type(row).__name__ for row in out}
        types |= {type(tok).__name__ for row in out for tok in row}
    for handle in handles:
        handle.remove()
    held = parameters_by_name(model)
    model.eval()
    along = None
    if paths is not None:
        with torch.no_grad():
            along = numpy_of(
                model(src, tensor_of(paths["tgt_in"]), src != pad_id, tensor_of(paths["tgt_mask"]))
            )
    return {
        "forward_along_paths": along,
        "state_dict": held,
        "dtype": dtype,
        "outputs": outputs,
        "training_after": modes,
        "types": sorted(types),
        "grad_during": any(grad_seen),
        "modules_seen": len(grad_seen),
        **(round_trip(module, model, src, bos, pad_id) if save_load else {}),
    }


def round_trip(module, model, src, bos, pad_id) -> dict[str, Any]:
    """save_transformer then load_transformer of an eval-mode model: the files written, the
    tensor names model.safetensors holds, and the logits of one step before and after."""
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
    return {
        "files": files,
        "safetensors_keys": header,
        "state_dict_keys": sorted(model.state_dict()),
        "logits_before": numpy_of(before),
        "logits_after_load": numpy_of(after),
    }


@probe
def save_load(module, cases, src, bos, pad_id) -> list[dict[str, Any]]:
    """round_trip of one model per case ({"cfg", "weights"}: the parent's weights loaded)."""
    out = []
    for case in cases:
        model, dtype = build(module, case["cfg"], weights=case["weights"])
        out.append({"dtype": dtype, **round_trip(module, model, tensor_of(src), bos, pad_id)})
    return out


# One decoding session per worker: the model, the encoder's output and the latest state, kept
# between calls so that the parent can choose each step's token after the previous reply and
# change weights between steps.
_SESSION: dict[str, Any] = {}


@probe
def decode_session_open(module, cfg, weights, src, src_mask) -> dict[str, Any]:
    """Start a session: the model with the parent's weights, encode(src), init_state."""
    _SESSION.clear()
    model, dtype = build(module, cfg, weights=weights)
    src, src_mask = tensor_of(src), tensor_of(src_mask)
    with torch.no_grad():
        memory = model.encode(src, src_mask)
        state = model.init_state(src_mask)
    _SESSION.update(model=model, memory=memory, state=state)
    return {"dtype": dtype, "state_dict": parameters_by_name(model)}


@probe
def decode_session_step(module, y_prev, set_weights=None) -> dict[str, Any]:
    """One decode_step of the session from its latest state, after loading `set_weights` (some
    of the parameters, by state_dict name) into the model if given; the step's logits."""
    if not _SESSION:
        raise RuntimeError("decode_session_step before decode_session_open")
    model = _SESSION["model"]
    if set_weights:
        load_weights(model, set_weights)
    with torch.no_grad():
        logits, _SESSION["state"] = model.decode_step(
            tensor_of(y_prev), _SESSION["memory"], _SESSION["state"]
        )
    return {"logits": numpy_of(logits)}
