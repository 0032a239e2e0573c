"""The diagnosis's reading of a subject's answer: what one forward pass sent back (logits, each
hooked module's inputs and outputs) put in the contract's layout beside the contract's own values,
and the judgement of one boundary against the forms a module may return there (`Candidate`,
`Finding`, `judge`). harness.shared_tests.diagnosis walks the layers with it."""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass
from typing import Any

import numpy as np

import oracle
from harness.shared_tests.layout import TIME_FIRST, batch_first
from harness.shared_tests.verdicts import (
    errors,
    listing,
)
from oracle.model import embed

# A value that differs from the contract's by more than float64 rounding but by less than this
# (relative to its scale) differs by float32 rounding: 2^-24 = 6e-8 per operation, compounded
# over the few operations of a table or a norm, stays far below 1e-5, and every fault of the
# model itself (a wrong constant, a missing term) moves values by 1e-3 or more.
FLOAT32_LEVEL = 1e-5
# An error below this (relative to its scale) is float64 rounding, never float32's: 2^-33 is
# 2^20 float64 units (2^-53) where a few operations, cancellation included, give tens, and a
# 256th of one float32 rounding (2^-25 of the largest entries of a table or a norm's output,
# which a float32 table or factor moves by that much). A cause names float32 only above it.
FLOAT64_LEVEL = 2.0**-33


@dataclass(frozen=True)
class Candidate:
    """A value the subject's module may return at a boundary: an accepted form (cause "") or a
    known fault, with the cause said in the student's terms."""

    label: str
    value: np.ndarray
    cause: str = ""


@dataclass(frozen=True)
class Finding:
    """One judged point of the forward pass."""

    where: str  # a contract module name, or "x0 (source)", "logits"
    error: float  # max abs error against the contract's value, relative to its scale
    matched: str = ""  # the accepted form it returns, when it returns one
    cause: str = ""  # the classic cause, when a known fault fits
    own: bool = False  # the form it returns is the contract's own boundary

    @property
    def departs(self) -> bool:
        return not self.matched


def relative(got: np.ndarray, want: np.ndarray, mask: np.ndarray) -> float:
    """max |got - want| over real positions, over max(1, max |want|); inf for a bad shape."""
    if got.shape != want.shape:
        return math.inf
    err, scale = errors(got, want, mask)
    return float(err.max(initial=0.0)) / scale


def judge(
    where: str, got: np.ndarray, candidates: list[Candidate], mask: np.ndarray, tol: float
) -> Finding:
    """Which candidate `got` is, within `tol`: the first accepted form it matches, else a
    departure whose error is against the first (the contract's own) value, with the cause of
    the known fault it matches, if any."""
    got = np.asarray(got, dtype=np.float64)
    contract = relative(got, candidates[0].value, mask)
    for c in candidates:
        if relative(got, c.value, mask) <= tol:
            if not c.cause:
                return Finding(where, contract, matched=c.label, own=c is candidates[0])
            return Finding(where, contract, cause=c.cause)
    want = candidates[0].value
    if got.shape != want.shape:  # a sequence-first layout, say
        return Finding(where, contract, cause=f"shape {got.shape}, expected {want.shape}")
    return Finding(where, contract)


@dataclass
class Answer:
    """The probe's answer read in the contract's layout (`read_answer`), with the oracle's
    reading of the subject's weights: every value float64 and batch-first, of the shape the
    contract gives its boundary; a value that could not be read is absent (None)."""

    params: Any
    inputs: dict[str, list[np.ndarray | None]]
    outputs: dict[str, np.ndarray]
    order: list[str]
    tol: float
    state: dict = dataclasses.field(default_factory=dict)  # the weights as the subject names them

    def input(self, name: str, i: int = 0) -> np.ndarray | None:
        found = self.inputs.get(name) or []
        return found[i] if len(found) > i else None


def boundary_shapes(spec: Any, b: dict) -> dict[str, tuple[tuple, list[tuple]]]:
    """Each contract module's output shape and its inputs' (the query, then the keys' source),
    batch-first, for the batch b."""
    B, S = b["src"].shape
    T = b["tgt_in"].shape[1]
    d, f = spec.d_model, spec.d_ff
    memory = (B, S, d)
    shapes: dict[str, tuple[tuple, list[tuple]]] = {}
    for kind, n, L, top in (
        ("encoder", spec.n_enc, S, "enc_norm"),
        ("decoder", spec.n_dec, T, "dec_norm"),
    ):
        x = (B, L, d)
        for i in range(n):
            p = f"{kind}.{i}"
            shapes[p] = (x, [x, memory] if kind == "decoder" else [x])
            shapes[f"{p}.self_attn"] = (x, [x, x])
            if kind == "decoder":
                shapes[f"{p}.cross_attn"] = (x, [x, memory])
            for norm in ("norm1", "norm2", "norm3")[: 3 if kind == "decoder" else 2]:
                shapes[f"{p}.{norm}"] = (x, [x])
            shapes[f"{p}.linear1"] = ((B, L, f), [x])
            shapes[f"{p}.linear2"] = (x, [(B, L, f)])
        shapes[top] = (x, [x])
    shapes["out"] = ((B, T, spec.tgt_vocab), [(B, T, spec.d_model)])
    return shapes


def contract_values(params: Any, b: dict) -> dict[tuple[str, int], np.ndarray]:
    """The contract's value at each boundary, by (module, slot): slot -1 its output, 0 its
    input, 1 the memory it reads. Only read to tell batch-first from time-first where the shapes
    cannot (as many positions as rows); sublayers' inputs are left out."""
    spec = params.spec
    logits, trace = oracle.forward(
        params, b["src"], b["tgt_in"], b["src_mask"], b["tgt_mask"], trace=True
    )
    memory = trace["enc_norm"] if spec.norm == "pre" else trace[f"encoder.{spec.n_enc - 1}"]
    top = trace["dec_norm"] if spec.norm == "pre" else trace[f"decoder.{spec.n_dec - 1}"]
    out = {(name, -1): value for name, value in trace.items()}
    out[("out", -1)], out[("out", 0)] = logits, top
    for kind, n, table, ids in (
        ("encoder", spec.n_enc, params.src_table, b["src"]),
        ("decoder", spec.n_dec, params.tgt_table, b["tgt_in"]),
    ):
        stream = embed(params, table, ids)
        for i in range(n):
            out[(f"{kind}.{i}", 0)] = stream
            stream = trace[f"{kind}.{i}"]
            if kind == "decoder":
                out[(f"{kind}.{i}", 1)] = out[(f"{kind}.{i}.cross_attn", 1)] = memory
        out[("enc_norm" if kind == "encoder" else "dec_norm", 0)] = stream
    return out


@dataclass
class Reading:
    """How the hooked values were read: the boundaries that could not be (with why), and
    whether any was recorded time-first."""

    unjudged: list[tuple[str, str]] = dataclasses.field(default_factory=list)
    time_first: bool = False

    def note(self) -> str:
        """' (...time-first...)' and '; X: not judged: why' for the line's end."""
        said = ""
        if self.time_first:
            said += (
                " (hooked values recorded time-first, [T, B, C], are judged in the contract's "
                "batch-first layout)"
            )
        by_reason: dict[str, list[str]] = {}
        for where, why in self.unjudged:
            by_reason.setdefault(why, []).append(where)
        for why, places in list(by_reason.items())[:3]:
            said += f"; {listing(places)}: not judged: {why}"
        if len(by_reason) > 3:
            more = sum(len(w) for w in list(by_reason.values())[3:])
            said += f"; {more} more boundaries not judged"
        return said


def read_answer(answer: dict[str, Any], params: Any, b: dict, tol: float) -> tuple[Answer, Reading]:
    """The probe's hooked values in the contract's layout (layout.batch_first): each output
    and input float64 and batch-first, or absent with the reason said in the Reading. A
    value recorded under a name the contract does not have is ignored."""
    reading = Reading()
    outputs_in, inputs_in = answer.get("outputs"), answer.get("inputs")
    for what, value in (("outputs", outputs_in), ("inputs", inputs_in)):
        if value is not None and not isinstance(value, dict):
            reading.unjudged.append(
                (f"the hooked {what}", f"a {type(value).__name__}, not a mapping")
            )
    outputs_in = outputs_in if isinstance(outputs_in, dict) else {}
    inputs_in = inputs_in if isinstance(inputs_in, dict) else {}
    shapes = boundary_shapes(params.spec, b)
    want = contract_values(params, b) if outputs_in or inputs_in else {}

    def arranged(where: str, value: Any, shape: tuple, key: tuple, mask, quiet=False):
        """The value batch-first in float64, or None (said unless `quiet`)."""
        array, layout, why = batch_first(value, shape, want.get(key), mask)
        if array is not None and np.iscomplexobj(array):
            why = f"complex values (dtype {array.dtype})"
            array = None
        if array is None:
            if not quiet:
                reading.unjudged.append((where, why))
            return None
        reading.time_first |= layout == TIME_FIRST
        return np.asarray(array, dtype=np.float64)

    outputs: dict[str, np.ndarray] = {}
    inputs: dict[str, list[np.ndarray | None]] = {}
    for name, (out_shape, in_shapes) in shapes.items():
        mask = b["src_mask"] if name.startswith(("encoder", "enc_norm")) else b["tgt_mask"]
        if name in outputs_in:
            value = arranged(name, outputs_in[name], out_shape, (name, -1), mask)
            if value is not None:
                outputs[name] = value
        recorded = inputs_in.get(name)
        if recorded is None:
            continue
        if not isinstance(recorded, list | tuple):
            reading.unjudged.append(
                (f"{name}'s inputs", f"a {type(recorded).__name__}, not a list")
            )
            continue
        found = (
            [arranged(f"{name}'s input", recorded[0], in_shapes[0], (name, 0), mask)]
            if recorded
            else []
        )
        if len(recorded) > 1 and len(in_shapes) > 1:
            # the second argument: the keys' source when it has their shape, else (a mask, say)
            # nothing the diagnosis reads
            memory_mask = mask if name.endswith("self_attn") else b["src_mask"]
            found.append(
                arranged("", recorded[1], in_shapes[1], (name, 1), memory_mask, quiet=True)
            )
        inputs[name] = found
    modules = answer.get("modules")
    order = (
        [n for n in modules if isinstance(n, str) and n in outputs]
        if isinstance(modules, list | tuple)
        else []
    )
    order += [n for n in outputs if n not in order]
    return Answer(params, inputs, outputs, order, tol), reading
