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
    parameter_views,
    parameters_by_name,
    probe,
    state_tensors,
    tensor_of,
    training_dtype,
    view_of,
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
def fit_runs(
    module,
    cfg,
    data,
    steps,
    batch,
    warmup,
    factor,
    lr,
    fit_seed,
    weights=None,
    seed=0,
    left_out=None,
):
    """fit on one initial model: twice with the Noam schedule and the same seed, once with a
    constant rate, once from eval mode, and one update whose parameter change shows its rate.
    left_out (optional) {run name: [argument names]}: the arguments that run's call of fit leaves
    out (the contract's defaults then in effect)."""
    model, dtype = build(module, cfg, seed, only=training_dtype(), weights=weights)
    init = {name: t.clone() for name, t in model.state_dict().items()}
    kw = {"steps": steps, "batch": batch, "warmup": warmup, "factor": factor}
    left_out = left_out or {}

    def run(name: str, **given: Any) -> dict[str, Any]:
        dropped = set(left_out.get(name, ()))
        return _fit(
            module, model, data, fit_seed, **{k: v for k, v in given.items() if k not in dropped}
        )

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
        runs[name] = run(name, **kw, **extra)
    # edge sizes the contract allows: no update at all, and batches of one row
    model.load_state_dict(init)
    runs["no_steps"] = run("no_steps", **{**kw, "steps": 0})
    runs["no_steps"]["moved"] = max(
        float((t - init[n]).abs().max()) for n, t in model.state_dict().items()
    )
    runs["batch_one"] = run("batch_one", **{**kw, "steps": 2, "batch": 1})
    model.load_state_dict(init)
    model.train()
    one = run("one_step", **{**kw, "steps": 1})
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


def _plain(t: torch.Tensor) -> np.ndarray:
    """A tensor as numpy in its own dtype where the wire carries it (float32 stays float32:
    half the bytes of every update's record), else float64."""
    t = t.detach().cpu()
    if t.dtype not in (torch.float32, torch.float64):
        t = t.to(torch.float64)
    return t.numpy().copy()


class _Updates:
    """What every update of fit is made of, recorded from outside fit (torch's global optimizer
    step hooks and a forward hook on the model), for the parent to check
    (harness/shared_tests/updates.py): at each optimizer step that holds the model's parameters,
    the rows of the training-mode forward passes since the last step whose logits got a
    gradient (src, tgt_in and dL/dlogits), the gradients the step reads and the weights after
    it, under the state_dict's names (each entry that is a parameter or a view of one); before
    the first step, the weights it starts from."""

    def __init__(self, model: torch.nn.Module) -> None:
        self.model = model
        self.own = {id(p) for p in model.parameters()}
        self.passes: list[dict[str, Any]] = []  # forward passes of the update being made
        self.records: list[dict[str, Any]] = []  # updates not yet shown to the parent
        self.grads: dict[str, np.ndarray] | None = None
        self.before: dict[str, np.ndarray] | None = None
        self.handles: list[Any] = []
        self.views: dict[str, tuple[torch.nn.Parameter, torch.Tensor | None]] = {}

    def __enter__(self) -> _Updates:
        from torch.optim.optimizer import (
            register_optimizer_step_post_hook,
            register_optimizer_step_pre_hook,
        )

        self.views = self._views()
        self.handles = [
            self.model.register_forward_hook(self._forward, with_kwargs=True),
            register_optimizer_step_pre_hook(self._pre),
            register_optimizer_step_post_hook(self._post),
        ]
        return self

    def __exit__(self, *exc: Any) -> None:
        for handle in self.handles:
            handle.remove()

    def _mine(self, optimizer: Any) -> bool:
        return any(
            id(p) in self.own for group in optimizer.param_groups for p in group.get("params", ())
        )

    def _views(self) -> dict[str, tuple[torch.nn.Parameter, torch.Tensor | None]]:
        """Each state_dict entry that is a parameter (None) or a view of one (the view), found
        once as fit starts: a step's records then cost a copy of each tensor, no search."""
        state = state_tensors(self.model)
        out: dict[str, tuple[torch.nn.Parameter, torch.Tensor | None]] = {}
        for key, (_, p) in parameter_views(self.model).items():
            t = state[key]
            same = (t.shape, t.stride(), t.storage_offset()) == (
                p.shape,
                p.stride(),
                p.storage_offset(),
            )
            out[key] = (p, None if same else t)
        return out

    def _tensors(self, grads: bool) -> dict[str, np.ndarray]:
        out = {}
        for key, (p, view) in self.views.items():
            if not grads:
                out[key] = _plain(p if view is None else view)
            elif p.grad is None:
                out[key] = np.zeros(
                    tuple(p.shape if view is None else view.shape), dtype=np.float32
                )
            else:
                out[key] = _plain(p.grad if view is None else view_of(p.grad, p, view))
        return out

    def _forward(self, module: Any, args: tuple, kwargs: dict, output: Any) -> None:
        if not (torch.is_grad_enabled() and isinstance(output, torch.Tensor)):
            return
        if not output.requires_grad:
            return
        given = [*args, kwargs.get("src"), kwargs.get("tgt_in")]
        src, tgt_in = (args[0], args[1]) if len(args) >= 2 else (given[-2], given[-1])
        if not (isinstance(src, torch.Tensor) and isinstance(tgt_in, torch.Tensor)):
            return
        entry: dict[str, Any] = {"src": _plain(src), "tgt_in": _plain(tgt_in), "dlogits": None}
        self.passes.append(entry)

        def grab(g: torch.Tensor) -> None:
            entry["dlogits"] = (
                _plain(g) if entry["dlogits"] is None else entry["dlogits"] + _plain(g)
            )

        output.register_hook(grab)

    def _pre(self, optimizer: Any, args: Any, kwargs: Any) -> None:
        if self._mine(optimizer):
            if self.before is None:
                self.before = self._tensors(grads=False)
            self.grads = self._tensors(grads=True)

    def _post(self, optimizer: Any, args: Any, kwargs: Any) -> None:
        if not self._mine(optimizer) or self.grads is None:
            return
        batches = [e for e in self.passes if e["dlogits"] is not None]
        self.passes = []
        self.records.append(
            {
                "batches": batches,
                "grads": self.grads,
                "after": self._tensors(grads=False),
                "rates": [float(group.get("lr", float("nan"))) for group in optimizer.param_groups],
            }
        )
        self.grads = None

    def take(self) -> dict[str, Any]:
        """The updates recorded since the last take (and the first update's starting weights)."""
        records, self.records = self.records, []
        before, self.before = self.before, {}
        return {"before": before or None, "records": records}


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
    left_out=(),
):
    """fit for up to `steps` updates; the trained weights, which the parent judges with the
    oracle (never the subject's own logits or loss).

    left_out (optional): the names of fit's arguments both calls of fit leave out (warmup,
    factor, seed: the contract's defaults then in effect; the parent leaves out only what is
    the contract's default or, with lr given, has no effect).

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

    Every update of the run is recorded from outside fit (`_Updates`: its rows, dL/dlogits, the
    gradients the optimizer read and the weights after it) and shown to the parent with each
    checkpoint ("updates"), the rest in the reply ("last_updates"): the parent replays them
    (harness/shared_tests/updates.py) and judges only weights its replay reached.
    """
    kw = {"steps": steps, "batch": batch, "warmup": warmup, "factor": factor, "lr": lr}
    kw = {k: v for k, v in {**kw, "seed": seed}.items() if k not in set(left_out)}
    first_update = None
    if first is not None:
        one, one_dtype = build(module, cfg, seed, only=training_dtype(), weights=first["weights"])
        rows = len(first["data"]["src"])
        grads = own_gradient(module, one, first["data"], first["smoothing"])
        one_losses = module.fit(
            one, tensor_of(first["data"]["src"]), tensor_of(first["data"]["tgt"]),
            pad_id=first["data"]["pad_id"], **{**kw, "steps": 1, "batch": rows},
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

    recorder = _Updates(model)

    def callback(step, rate, loss) -> None:
        updates[0] += 1  # counted here: the subject's step numbers are its own
        if checkpoints is not None and updates[0] % checkpoints["every"] == 0:
            question = {
                "update": updates[0],
                "state_dict": parameters_by_name(model),
                "own_loss": own_loss(),
                "updates": recorder.take(),
            }
            if channel.ask(question).get("stop") is True:
                raise _Stop

    try:
        with recorder:
            losses = module.fit(
                model, tensor_of(data["src"]), tensor_of(data["tgt"]), pad_id=data["pad_id"],
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
        "last_updates": recorder.take(),
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
