"""Where a wrong forward pass first goes wrong: the subject's module outputs vs the oracle's trace.

In the worker, the probe `module_outputs` (harness.isolation.child.probes) hooks the subject's
submodules that carry the contract's module names (CONTRACT.md, "module names"; torch's stack
names are translated) and returns what each output on the golden test's inputs. Here, in the
parent, `first_divergence` runs the oracle with trace=True on the subject's own weights and
names the first module, in the order of computation, whose output differs by more than the
tolerance:
"first divergence: decoder.0.cross_attn, max abs error 0.31".
"""

from __future__ import annotations

from typing import Any

import numpy as np

import oracle
from harness.shared_tests.inputs import GOLDEN_SEED, forward_inputs, golden_inputs
from harness.shared_tests.record import Call, Failure
from harness.shared_tests.verdicts import errors, read_params, tolerance


def first_divergence(answer: dict[str, Any], cfg: dict, b: dict[str, np.ndarray]) -> str:
    """The first traced module whose output differs from the oracle's, as one sentence."""
    params = read_params(answer["state_dict"], cfg)
    logits, trace = oracle.forward(
        params, b["src"], b["tgt_in"], b["src_mask"], b["tgt_mask"], trace=True
    )
    tol = tolerance(answer["dtype"], "logits")
    outputs = answer["outputs"]
    missing = [name for name in trace if name not in outputs]
    for i, (name, want) in enumerate(trace.items()):
        if name not in outputs:
            continue
        got = np.asarray(outputs[name], dtype=np.float64)
        if got.shape != want.shape:
            return f"first divergence: {name}, shape {got.shape}, expected {want.shape}"
        # rows at padded positions are not part of the contract
        mask = b["src_mask"] if name.startswith(("encoder", "enc_norm")) else b["tgt_mask"]
        err, scale = errors(got, want, mask)
        if err.max(initial=0.0) > tol * scale:
            hint = (
                " (the first traced module: its input, the embeddings, may differ)"
                if i == 0
                else ""
            )
            return f"first divergence: {name}, max abs error {err.max():.3g}{hint}"
    got = np.asarray(answer["logits"], dtype=np.float64)
    if got.shape != logits.shape:
        return f"the logits have shape {got.shape}, expected {logits.shape}"
    err, scale = errors(got, logits, b["tgt_mask"])
    found = f" ({len(missing)} of {len(trace)} names not found as submodules)" if missing else ""
    if not outputs:
        return f"no submodule carries the contract's module names: cannot locate{found}"
    if err.max(initial=0.0) > tol * scale:
        return (
            f"every traced module agrees{found}; the logits differ by {err.max():.3g}: "
            "the output layer (or what follows the last layer)"
        )
    return f"the forward pass agrees with the oracle{found}"


def diagnose(call: Call) -> dict[str, str]:
    """first_divergence on the golden test's inputs (same seed, same batches), per config."""
    found = {}
    for name, cfg, b in golden_inputs():
        try:
            answer = call("module_outputs", cfg=cfg, seed=GOLDEN_SEED, **forward_inputs(b))
            found[name] = first_divergence(answer, cfg, b)
        except Failure as e:
            found[name] = f"cannot compare: {e}"
    return found
