"""Probes of the training laws: make_optimizer, fit's runs, and a learning run whose trained
weights the parent judges."""

from __future__ import annotations

from typing import Any

import numpy as np
import torch

from harness.isolation.child import channel
from harness.isolation.child.probes.base import (
    build,
    gradients,
    load_weights,
    numpy_of,
    parameters_by_name,
    probe,
    tensor_of,
    training_dtype,
)


def _fit(module, model, data, seed, **kw) -> dict[str, Any]:
    calls: list[list[float]] = []
    losses = module.fit(
        model,
        tensor_of(data["src"]),
        tensor_of(data["tgt"]),
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
def fit_runs(module, cfg, data, steps, batch, warmup, factor, lr, fit_seed, weights=None, seed=0):
    """fit on one initial model: twice with the Noam schedule and the same seed, once with a
    constant rate, once from eval mode, and one update whose parameter change shows its rate."""
    model, dtype = build(module, cfg, seed, only=training_dtype(), weights=weights)
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


def own_gradient(module, model, data, smoothing) -> dict[str, dict[str, np.ndarray]]:
    """The gradient of the subject's own smoothed loss of `data` (one batch, training mode) at
    the model's weights: {"grads": by state_dict name where an entry is the parameter,
    "by_parameter": by named_parameters name} (base.gradients; a parameter the loss does not
    reach: 0)."""
    src, tgt, pad = tensor_of(data["src"]), tensor_of(data["tgt"]), data["pad_id"]
    tgt_in, tgt_out = tgt[:, :-1], tgt[:, 1:]
    model.train()
    loss = module.label_smoothed_loss(
        model(src, tgt_in, src != pad, tgt_in != pad), tgt_out, smoothing, pad
    )
    model.zero_grad(set_to_none=True)
    loss.backward()
    grads = gradients(model)
    model.zero_grad(set_to_none=True)
    return {"grads": grads["grads"], "by_parameter": grads["by_parameter"]}


class _Stop(Exception):
    """Raised from fit's callback to end training early."""


@probe
def learn(
    module,
    cfg,
    data,
    steps,
    batch,
    warmup,
    factor,
    lr,
    checkpoints=None,
    weights=None,
    seed=0,
    first=None,
):
    """fit for up to `steps` updates; the trained weights, which the parent judges with the
    oracle (never the subject's own logits or loss).

    weights (optional): the parent's initial weights, loaded before training.

    first (optional) {"data", "weights", "smoothing"}: before the run, one update of fit with
    all of `data` as its one batch, on a model (float64 where the subject runs in it) holding
    `weights`: the gradient of the subject's own loss of that batch there, and the parameters
    after the update, for the parent to compare with Adam's first step on that gradient (a fit
    that makes no update, or not from its data and weights, shows there).

    checkpoints (optional) {"src", "tgt", "pad_id", "every"}: after every `every`-th update the
    parent is asked (channel.ask) with the weights so far and the model's own eval-mode
    cross-entropy on those rows (numpy's log-softmax of its logits), and fit ends when it
    answers {"stop": true}. The parent judges the weights with the oracle on its own held-out
    rows; eval-mode passes draw no random numbers, so the updates run are the same as without
    the checkpoints. The trained model's logits on those rows come back too ("val_logits"):
    when the verdict fails, the parent tells a model that learned badly from one whose forward
    pass is not the contract's.
    """
    kw = {"steps": steps, "batch": batch, "warmup": warmup, "factor": factor, "lr": lr}
    first_update = None
    if first is not None:
        one, one_dtype = build(module, cfg, seed, only=training_dtype(), weights=first["weights"])
        rows = len(first["data"]["src"])
        grads = own_gradient(module, one, first["data"], first["smoothing"])
        one_losses = module.fit(
            one, tensor_of(first["data"]["src"]), tensor_of(first["data"]["tgt"]),
            pad_id=first["data"]["pad_id"], seed=seed,
            **{**kw, "steps": 1, "batch": rows},
        )  # fmt: skip
        first_update = {
            "dtype": one_dtype,
            "grads": grads["grads"],
            "grads_by_parameter": grads["by_parameter"],
            "after": parameters_by_name(one),
            "losses": [float(x) for x in one_losses],
        }
    torch.manual_seed(seed)
    # the model's own dtype (float32 as users train it): a learning bar, not a rounding check
    model = module.Transformer(module.TransformerConfig(**cfg))
    if weights is not None:
        load_weights(model, weights)
    updates = [0]

    def own_loss() -> float:
        src, tgt = tensor_of(checkpoints["src"]), tensor_of(checkpoints["tgt"])
        pad = checkpoints["pad_id"]
        tgt_in, tgt_out = tgt[:, :-1], checkpoints["tgt"][:, 1:]
        model.eval()
        try:
            with torch.no_grad():
                z = numpy_of(model(src, tgt_in, src != pad, tgt_in != pad))
        finally:
            model.train()
        z = z - z.max(axis=-1, keepdims=True)
        logp = z - np.log(np.exp(z).sum(axis=-1, keepdims=True))
        real = tgt_out != pad
        picked = np.take_along_axis(logp, tgt_out[..., None], axis=-1)[..., 0]
        return float(-(picked * real).sum() / real.sum())

    def callback(step, rate, loss) -> None:
        updates[0] += 1  # counted here: the subject's step numbers are its own
        if checkpoints is not None and updates[0] % checkpoints["every"] == 0:
            question = {
                "update": updates[0],
                "state_dict": parameters_by_name(model),
                "own_loss": own_loss(),
            }
            if channel.ask(question).get("stop") is True:
                raise _Stop

    try:
        losses = module.fit(
            model, tensor_of(data["src"]), tensor_of(data["tgt"]), pad_id=data["pad_id"], seed=seed,
            callback=callback, **kw,
        )  # fmt: skip
        losses = [float(x) for x in losses]
    except _Stop:
        losses = None
    found = {
        "losses": losses,
        "updates": updates[0],
        "state_dict": parameters_by_name(model),
        "first_update": first_update,
    }
    if checkpoints is not None:  # the trained model's logits on the validation rows: a diagnosis
        src, tgt = tensor_of(checkpoints["src"]), tensor_of(checkpoints["tgt"])
        pad = checkpoints["pad_id"]
        tgt_in = tgt[:, :-1]
        model.eval()
        with torch.no_grad():
            found["val_logits"] = numpy_of(model(src, tgt_in, src != pad, tgt_in != pad))
        found["dtype"] = str(next(model.parameters()).dtype).removeprefix("torch.")
    return found
