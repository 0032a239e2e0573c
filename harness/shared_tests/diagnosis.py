"""Where a wrong forward pass goes wrong, and why: the grader's diagnosis.

In the worker, the probe `module_outputs` (harness.isolation.child.probes) hooks every submodule
that carries one of the contract's module names (CONTRACT.md, "module names"; torch's stack
names translated) and sends back what each received and returned in one forward pass on the
golden test's inputs. Here, in the parent, every layer is judged *re-anchored*: the oracle
recomputes the contract's layer from the subject's own input to that layer, so a tiny error early
on (a float32 table) cannot make every later module look wrong, and a large one further on is
seen at its own size.

Inside a layer, each hooked module's output is compared with the contract's values at that
boundary, not only with the module's own output in the contract: an attention module may return
the attention, x + attention or LN(x + attention) (the residual and the norm inside it, a common
layout), and the diagnosis says which one it returns. A module that returns none of them is a
departure; at a departure the module's own input is used to name the classic causes (the
LayerNorm's variance or eps, the pre-/post-LN placement, a missing mask, GELU for ReLU, a float32
positional table, log-probabilities for logits). When the logits agree, no divergence is ever
reported, whatever the modules' boundaries.

Hooked values are judged by meaning, not layout: each is first put in the contract's
batch-first layout (layout.batch_first; fairseq keeps [T, B, C] inside its stacks), and a
boundary that cannot be (an odd shape or dtype) is said to be not judged, the others judged
without it. The stream between the stacks is judged too: what the decoder reads as memory and
what the output layer reads, against the contract's final norms of the subject's own last
layers, so a final norm never applied (or one too many) is named at its first reader.

`first_divergence` never raises: it is the boundary between the subject's answer (any plain
data) and the grade, and an error of the diagnosis itself becomes "no diagnosis: <why>" for
that config; inside it the logic stays strict.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import numpy as np

import oracle
from harness.shared_tests.inputs import forward_inputs, golden_inputs, golden_weights
from harness.shared_tests.layout import TIME_FIRST, batch_first
from harness.shared_tests.record import Call, Failure
from harness.shared_tests.verdicts import (
    assert_holds,
    errors,
    listing,
    read_params,
    tolerance,
    unwrapped,
)
from oracle.layers import decoder_layer, encoder_layer, multi_head_attention
from oracle.model import embed, output_logits, source_attention_mask, target_attention_mask
from oracle.ops import gelu, layer_norm, log_softmax, positional_encoding, relu

# A value that differs from the contract's by more than float64 rounding but by less than this
# (relative to its scale) differs by float32 rounding: 2^-24 = 6e-8 per operation, compounded
# over the few operations of a table or a norm, stays far below 1e-5, and every fault of the
# model itself (a wrong constant, a missing term) moves values by 1e-3 or more.
FLOAT32_LEVEL = 1e-5

# LayerNorm epsilons that implementations hard-code instead of cfg.ln_eps: torch's default, the
# Annotated Transformer's, TensorFlow's and Hugging Face's, and none.
COMMON_EPS = (1e-5, 1e-6, 1e-3, 1e-12, 0.0)


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


# --- the known faults, as candidates ------------------------------------------------------------


def norm_candidates(z: np.ndarray, gamma: np.ndarray, beta: np.ndarray, eps: float) -> list:
    """LN(z) and the LayerNorms written by hand or configured wrongly."""
    mu = z.mean(axis=-1, keepdims=True)
    zc = z - mu
    var, n = (zc * zc).mean(axis=-1, keepdims=True), z.shape[-1]
    out = [Candidate("LN", layer_norm(z, gamma, beta, eps))]
    out.append(
        Candidate(
            "unbiased",
            zc / np.sqrt(var * n / (n - 1) + eps) * gamma + beta,
            "a LayerNorm with the unbiased variance (divided by d - 1, torch's x.std()): use "
            "the biased variance, as nn.LayerNorm does",
        )
    )
    out.append(
        Candidate(
            "eps outside",
            zc / (np.sqrt(var) + eps) * gamma + beta,
            "a LayerNorm that adds eps to the standard deviation, (x - mean) / (std + eps): "
            "eps goes inside the square root, (x - mean) / sqrt(var + eps)",
        )
    )
    out.append(
        Candidate(
            "the Annotated Transformer's",
            zc / (np.sqrt(var * n / (n - 1)) + eps) * gamma + beta,
            "a LayerNorm with the unbiased variance and eps added to the standard deviation, "
            "(x - mean) / (x.std() + eps), the Annotated Transformer's: use the biased "
            "variance with eps inside the square root, as nn.LayerNorm does",
        )
    )
    for other in COMMON_EPS:
        if other != eps:
            out.append(
                Candidate(
                    f"eps {other:g}",
                    layer_norm(z, gamma, beta, other),
                    f"a LayerNorm with eps {other:g}, not cfg.ln_eps = {eps:g}: pass "
                    "eps=cfg.ln_eps to every LayerNorm",
                )
            )
    return out


def attention_candidates(
    q: np.ndarray, kv: np.ndarray, p: dict, mask: np.ndarray, h: int, causal: bool
) -> list[Candidate]:
    """The attention faults a module's output may show, from its own inputs."""
    B, T = q.shape[:2]
    S = kv.shape[1]
    out = []
    everything = np.ones((B, 1, T, S), dtype=bool)
    out.append(
        Candidate(
            "no mask",
            multi_head_attention(q, kv, p, everything, h)[0],
            "attention applies no mask: "
            + ("the decoder reads future positions" if causal else "padded keys are read"),
        )
    )
    if causal:
        pad = mask[..., -1:, :].repeat(T, axis=-2)  # the last query's keys: every real one
        for k, cause in ((1, "sees one position ahead"), (-1, "hides the position itself")):
            shifted = np.tril(np.ones((T, S), dtype=bool), k)[None, None] & pad
            with np.errstate(invalid="ignore"):  # "hides itself": position 0 reads nothing
                value = multi_head_attention(q, kv, p, shifted, h)[0]
            out.append(
                Candidate(
                    f"causal {k:+d}", value, f"the causal mask is off by one: position t {cause}"
                )
            )
        out.append(
            Candidate(
                "padding only",
                multi_head_attention(q, kv, p, pad, h)[0],
                "the decoder's self-attention masks padding but not the future",
            )
        )
    scaled = {**p}
    for k in ("q_proj.weight", "q_proj.bias"):
        scaled[k] = p[k] / math.sqrt(h)  # scores / sqrt(d_model) = (Q / sqrt(h)) K^T / sqrt(d_k)
    out.append(
        Candidate(
            "sqrt(d_model)",
            multi_head_attention(q, kv, scaled, mask, h)[0],
            "the scores are divided by sqrt(d_model), not sqrt(d_k) = sqrt(d_model / n_heads)",
        )
    )
    return out


def embedding_causes(
    got: np.ndarray, params: Any, table: str, ids: np.ndarray, mask: np.ndarray, tol: float
) -> str:
    """The classic reasons x0 differs from E[ids] sqrt(d) + PE, as '; <cause>' or ''."""
    E, d, T = params.arrays[table], params.spec.d_model, ids.shape[1]
    pe = positional_encoding(T, d)
    lookups = E[ids]
    evens = np.arange(0, d, 2)
    angles = np.arange(T)[:, None] / 10000.0 ** (evens / d)
    halves = np.concatenate([np.sin(angles), np.cos(angles)[:, : d // 2]], axis=-1)
    from_one = positional_encoding(T + 1, d)[1:]
    faults = [
        (lookups + pe, "the embeddings are not multiplied by sqrt(d_model)"),
        (lookups * math.sqrt(d), "no positional encoding is added"),
        (
            lookups * math.sqrt(d) + halves,
            "the positional table puts sin in the first half and cos in the second: "
            "interleave them, PE[p, 2i] = sin, PE[p, 2i+1] = cos",
        ),
        (
            lookups * math.sqrt(d) + from_one,
            "positions count from 1: the first position is p = 0",
        ),
    ]
    for value, cause in faults:
        if relative(got, value, mask) <= tol:
            return f"; {cause}"
    err = relative(got, lookups * math.sqrt(d) + pe, mask)
    if err <= FLOAT32_LEVEL:
        return (
            f"; an error this small ({err:.2g} of the values' scale) is float32 rounding: the "
            "positional table (or the sqrt(d) factor) is computed in float32 while the model "
            "runs in float64. Compute it in the parameters' dtype, e.g. register it as a buffer "
            "(persistent=False) so that .double() converts it, or build it with the embedding's "
            "dtype"
        )
    return ""


# --- the re-anchored walk -----------------------------------------------------------------------


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


# --- the answer in the contract's layout --------------------------------------------------------


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
        for why, where in list(by_reason.items())[:3]:
            said += f"; {listing(where)}: not judged: {why}"
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
            array, why = None, f"complex values (dtype {array.dtype})"
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


def layer_candidates(
    kind: str, x: np.ndarray, trace: dict, prefix: str, norm: str
) -> dict[str, list[Candidate]]:
    """For each sublayer of a layer recomputed from its input x: the accepted values at its
    output boundary (the contract's own first)."""
    t = {k[len(prefix) + 1 :]: v for k, v in trace.items() if k.startswith(prefix + ".")}
    subs = ("self_attn", "cross_attn") if kind == "decoder" else ("self_attn",)
    norms = {"self_attn": "norm1", "cross_attn": "norm2", "ff": f"norm{len(subs) + 1}"}
    post = norm == "post"
    forms: dict[str, list[Candidate]] = {}
    stream = x  # the residual stream before each sublayer
    for sub, what in [(s, "attention") for s in subs] + [("linear2", "feed-forward")]:
        n = norms["ff" if sub == "linear2" else sub]
        out = t[sub]
        forms[sub] = [Candidate(f"the {what}", out), Candidate(f"x + {what}", stream + out)]
        if post:  # the norm after the residual: LN(x + F(x)), which a sublayer may return
            forms[sub].append(Candidate(f"LN(x + {what})", t[n]))
            forms[n] = [Candidate(f"LN(x + {what})", t[n])]
            stream = t[n]
        else:  # the norm before the sublayer: F(LN(x))
            forms[n] = [Candidate("LN(x)", t[n])]
            stream = stream + out
    forms["linear1"] = [Candidate("linear1", t["linear1"]), Candidate("relu", relu(t["linear1"]))]
    return forms


def cause_in_layer(
    a: Answer, kind: str, prefix: str, sub: str, mask: np.ndarray, layer_args: tuple
) -> str:
    """The classic cause of a departure at `prefix.sub`, from that module's own input."""
    spec, p = a.params.spec, a.params.layer(prefix)
    name, tol = f"{prefix}.{sub}", a.tol
    got = a.outputs[name]
    own = a.input(name)
    if sub.startswith("norm") and own is not None:
        found = judge(
            name,
            got,
            norm_candidates(own, p[f"{sub}.weight"], p[f"{sub}.bias"], spec.ln_eps),
            mask,
            tol,
        )
        if found.cause:
            return found.cause
    if sub.endswith("attn") and own is not None:
        kv = a.input(name, 1)
        if kv is None or kv.shape[-1] != spec.d_model:
            kv = own if sub == "self_attn" else layer_args[1]
        attn_mask = layer_args[2] if sub == "self_attn" else layer_args[3]
        sp = {k[len(sub) + 1 :]: v for k, v in p.items() if k.startswith(sub + ".")}
        causal = kind == "decoder" and sub == "self_attn"
        for c in attention_candidates(own, kv, sp, attn_mask, spec.n_heads, causal):
            for form in (c.value, own + c.value):
                if relative(got, form, mask) <= tol:
                    return c.cause
    if sub == "linear2" and own is not None and f"{prefix}.linear1" in a.outputs:
        h1 = np.asarray(a.outputs[f"{prefix}.linear1"], dtype=np.float64)
        if relative(own, gelu(h1), mask) <= tol:
            return "the feed-forward's activation is GELU: the contract's is ReLU"
        if relative(own, h1, mask) <= tol:
            return "the feed-forward applies no activation between linear1 and linear2 (ReLU)"
    return ""


def judge_layer(
    a: Answer, kind: str, i: int, masks: dict, memory: np.ndarray | None
) -> list[Finding]:
    """One layer re-anchored at its own input: its hooked sublayers in order of completion, up
    to the first departure, then the layer's output."""
    spec = a.params.spec
    prefix = f"{kind}.{i}"
    x = a.input(prefix)
    if x is None:
        return []
    mask = masks["src"] if kind == "encoder" else masks["tgt"]
    p = a.params.layer(prefix)
    trace: dict[str, np.ndarray] = {}
    if kind == "encoder":
        args: tuple = (x, None, masks["enc_attn"], None)
        out, _ = encoder_layer(x, p, masks["enc_attn"], spec, trace, prefix)
    else:
        m = a.input(prefix, 1)
        m = m if m is not None and m.shape[-1] == spec.d_model else memory
        if m is None:
            return []
        args = (x, m, masks["self_attn"], masks["cross_attn"])
        out, _ = decoder_layer(
            x, m, p, masks["self_attn"], masks["cross_attn"], spec, trace, prefix
        )
    forms = layer_candidates(kind, x, trace, prefix, spec.norm)
    found: list[Finding] = []
    for name in a.order:
        sub = name[len(prefix) + 1 :] if name.startswith(prefix + ".") else ""
        if sub not in forms:
            continue
        f = judge(name, a.outputs[name], forms[sub], mask, a.tol)
        if f.departs:
            cause = f.cause or cause_in_layer(a, kind, prefix, sub, mask, args)
            other = placement(a, kind, prefix, x, args, mask)
            if other:  # the whole layer is the other placement: said of the layer
                error = relative(np.asarray(a.outputs.get(prefix, out)), out, mask)
                found.append(Finding(prefix, error, cause=other))
            else:
                found.append(dataclasses.replace(f, cause=cause))
            return found
        found.append(f)
    if prefix in a.outputs:
        f = judge(prefix, a.outputs[prefix], [Candidate("the layer", out)], mask, a.tol)
        if f.departs:
            f = dataclasses.replace(f, cause=placement(a, kind, prefix, x, args, mask))
        found.append(f)
    return found


def placement(a: Answer, kind: str, prefix: str, x: np.ndarray, args: tuple, mask) -> str:
    """When the layer computes the other LayerNorm placement: that, said."""
    spec = a.params.spec
    if prefix not in a.outputs:
        return ""
    other = dataclasses.replace(spec, norm="post" if spec.norm == "pre" else "pre")
    p = a.params.layer(prefix)
    if kind == "encoder":
        out, _ = encoder_layer(x, p, args[2], other)
    else:
        out, _ = decoder_layer(x, args[1], p, args[2], args[3], other)
    if relative(np.asarray(a.outputs[prefix]), out, mask) > a.tol:
        return ""
    said = {"post": "LN(x + F(x))", "pre": "x + F(LN(x))"}
    return (
        f"the LayerNorm placement: {prefix} computes {other.norm}-LN, {said[other.norm]}, "
        f"though cfg.norm is '{spec.norm}': {said[spec.norm]}"
    )


def walk(a: Answer, b: dict[str, np.ndarray]) -> list[Finding]:
    """Every judged point in order of computation."""
    spec = a.params.spec
    masks = {
        "src": b["src_mask"],
        "tgt": b["tgt_mask"],
        "enc_attn": source_attention_mask(b["src_mask"]),
        "self_attn": target_attention_mask(b["tgt_mask"]),
        "cross_attn": source_attention_mask(b["src_mask"]),
    }
    found: list[Finding] = []
    for side, first, table, ids, mask in (
        ("source", "encoder.0", a.params.src_table, b["src"], b["src_mask"]),
        ("target", "decoder.0", a.params.tgt_table, b["tgt_in"], b["tgt_mask"]),
    ):
        x0 = a.input(first)
        if x0 is not None:
            want = embed(a.params, table, ids)
            f = judge(f"x0 ({side} embeddings)", x0, [Candidate("x0", want)], mask, a.tol)
            if f.departs:
                f = dataclasses.replace(
                    f, cause=embedding_causes(x0, a.params, table, ids, mask, a.tol)[2:]
                )
            found.append(f)
        stack = spec.n_enc if side == "source" else spec.n_dec
        kind = "encoder" if side == "source" else "decoder"
        if kind == "encoder":
            for i in range(stack):
                found += judge_layer(a, kind, i, masks, None)
        else:
            reader, read = memory_reader(a)
            read_check = stream_finding(a, "enc_norm", reader, read, b["src_mask"])
            memory = read if read is not None else subject_memory(a)
            for i in range(stack):
                layer = judge_layer(a, kind, i, masks, memory)
                if read_check is not None and reader.startswith(f"decoder.{i}"):
                    at = next(
                        (k for k, f in enumerate(layer) if reads_memory(f.where, spec.norm)), None
                    )
                    layer.insert(len(layer) if at is None else at, read_check)
                    read_check = None
                found += layer
        top = "enc_norm" if kind == "encoder" else "dec_norm"
        last = a.outputs.get(f"{kind}.{stack - 1}")
        if top in a.outputs:
            if spec.norm == "post":
                found.append(Finding(top, math.inf, cause=extra_final_norm(kind)))
            else:
                z = a.input(top)
                z = z if z is not None else last
                if z is not None:
                    w, bias = a.params.arrays[f"{top}.weight"], a.params.arrays[f"{top}.bias"]
                    cands = norm_candidates(z, w, bias, spec.ln_eps)
                    found.append(judge(top, a.outputs[top], cands, mask, a.tol))
    read_check = stream_finding(a, "dec_norm", "out", a.input("out"), b["tgt_mask"])
    if read_check is not None:
        found.append(read_check)
    return found


def reads_memory(where: str, norm: str) -> bool:
    """Whether a finding inside a decoder layer is at or after its cross-attention (reading the
    memory) in order of computation (post-LN's norm2 follows it, pre-LN's precedes it)."""
    sub = where.split(".", 2)[2] if where.count(".") >= 2 else ""
    after = ("cross_attn", "linear1", "linear2", "norm3", "") + (
        ("norm2",) if norm == "post" else ()
    )
    return sub in after


def missing_final_norm(top: str) -> str:
    """A pre-LN stack's final norm never applied, said with what reads the stream."""
    if top == "enc_norm":
        return "enc_norm is never applied: the decoder reads the encoder's last layer un-normalised"
    return (
        "dec_norm is never applied: the output layer reads the decoder's last layer un-normalised"
    )


def extra_final_norm(kind: str) -> str:
    return (
        f"a final LayerNorm after the {kind} in a post-LN model: the contract has none "
        f"(nn.Transformer{kind.capitalize()}(norm=...) adds one: pass norm=None)"
    )


def memory_reader(a: Answer) -> tuple[str, np.ndarray | None]:
    """The first hooked module that reads the memory, and the memory it read."""
    for i in range(a.params.spec.n_dec):
        for name in (f"decoder.{i}.cross_attn", f"decoder.{i}"):
            read = a.input(name, 1)
            if read is not None:
                return name, read
    return "", None


def final_norm(a: Answer, top: str) -> tuple[np.ndarray, np.ndarray]:
    """The weights of a stack's final norm: the contract's (pre-LN); in a post-LN model, those
    of the extra norm as the subject names it (nn.Transformer's encoder.norm), else unit gains."""
    arrays = a.params.arrays
    if f"{top}.weight" in arrays:
        return arrays[f"{top}.weight"], arrays[f"{top}.bias"]
    d = a.params.spec.d_model
    state = unwrapped(a.state)
    for name in (top, "encoder.norm" if top == "enc_norm" else "decoder.norm"):
        weight, bias = state.get(f"{name}.weight"), state.get(f"{name}.bias")
        if weight is not None and np.shape(weight) == (d,):
            bias = np.zeros(d) if bias is None else bias
            return np.asarray(weight, dtype=np.float64), np.asarray(bias, dtype=np.float64)
    return np.ones(d), np.zeros(d)


def stream_finding(
    a: Answer, top: str, reader: str, read: np.ndarray | None, mask: np.ndarray
) -> Finding | None:
    """What `reader` reads after a stack (the memory; the output layer's input) against the
    stack's output in the contract, from the subject's own last layer: its final norm's output
    in pre-LN (the subject's own `top`, when hooked: a fault of that norm is its own finding),
    the last layer's in post-LN. A departure is charged to the reader, its first reader, with
    the final norm missing, or one too many, named."""
    spec = a.params.spec
    kind = "encoder" if top == "enc_norm" else "decoder"
    last = a.outputs.get(f"{kind}.{(spec.n_enc if kind == 'encoder' else spec.n_dec) - 1}")
    hooked = a.outputs.get(top)
    if read is None or (hooked is None and last is None):
        return None
    weight, bias = final_norm(a, top)
    if hooked is not None:
        want = hooked
    else:
        want = layer_norm(last, weight, bias, spec.ln_eps) if spec.norm == "pre" else last
    found = judge(reader, read, [Candidate("the stream", want)], mask, a.tol)
    if not found.departs:
        return None
    who = "the decoder" if kind == "encoder" else "the output layer"
    cause = ""
    if last is not None and spec.norm == "pre" and relative(read, last, mask) <= a.tol:
        cause = (
            missing_final_norm(top)
            if hooked is None
            else f"{who} reads the {kind}'s last layer un-normalised, not {top}'s output"
        )
    elif last is not None and spec.norm == "post":
        for eps in (spec.ln_eps, *COMMON_EPS):
            if relative(read, layer_norm(last, weight, bias, eps), mask) <= a.tol:
                cause = extra_final_norm(kind)
                break
    return dataclasses.replace(found, cause=cause)


def subject_memory(a: Answer) -> np.ndarray | None:
    """The encoder's output as the subject computed it: enc_norm's, else the last layer's."""
    spec = a.params.spec
    name = "enc_norm" if spec.norm == "pre" else f"encoder.{spec.n_enc - 1}"
    return a.outputs.get(name)


def logits_finding(a: Answer, got: np.ndarray, want: np.ndarray, mask: np.ndarray) -> Finding:
    """The logits against the contract's from the subject's own last value (the output layer's
    input; else the decoder's last layer and final norm), with the log-probabilities fault and a
    final norm missing or one too many named."""
    spec = a.params.spec
    y = a.input("out")
    last = a.outputs.get(f"decoder.{spec.n_dec - 1}")
    unread = y is None and "dec_norm" not in a.outputs and last is not None
    if y is None:
        y = a.outputs.get("dec_norm")
    if y is None and last is not None:
        weight, bias = final_norm(a, "dec_norm")
        y = layer_norm(last, weight, bias, spec.ln_eps) if spec.norm == "pre" else last
    if y is not None:
        local = output_logits(a.params, y)
        f = judge("logits", got, [Candidate("logits", local)], mask, a.tol)
        if not f.departs:
            return dataclasses.replace(f, error=relative(got, want, mask))
        want = local
    shift = got - want
    centred = shift - shift.mean(axis=-1, keepdims=True)
    cause = ""
    if relative(got, log_softmax(want), mask) <= a.tol:
        cause = "the logits are log-probabilities (log_softmax applied): return the raw logits"
    elif relative(centred + want, want, mask) <= a.tol:
        cause = "the logits differ by a constant per position: a softmax-like normalisation"
    elif unread:  # the output layer's input is not hooked: a final norm judged by the logits
        weight, bias = final_norm(a, "dec_norm")
        if spec.norm == "pre" and relative(got, output_logits(a.params, last), mask) <= a.tol:
            cause = missing_final_norm("dec_norm")
        elif spec.norm == "post" and any(
            relative(got, output_logits(a.params, layer_norm(last, weight, bias, e)), mask) <= a.tol
            for e in (spec.ln_eps, *COMMON_EPS)
        ):
            cause = extra_final_norm("decoder")
    return Finding("logits", relative(got, want, mask), cause=cause)


def first_divergence(answer: Any, cfg: dict, b: dict[str, np.ndarray]) -> str:
    """The diagnosis of one config's forward pass, in a sentence or two. It never raises: the
    subject's answer is any plain data, and an error the diagnosis meets on it is said for this
    config ("no diagnosis: <why>") instead of stopping the grade."""
    try:
        with np.errstate(invalid="ignore", over="ignore", divide="ignore"):  # NaN in, NaN said
            return divergence(answer, cfg, b)
    except Failure as e:  # the weights cannot be read, or no tolerance fits: nothing to compare
        return f"cannot compare: {e}"
    except Exception as e:  # the boundary: the diagnosis's own logic stays strict inside
        return f"no diagnosis: {type(e).__name__}: {str(e)[:300]}"


def divergence(answer: dict[str, Any], cfg: dict, b: dict[str, np.ndarray]) -> str:
    """first_divergence's work, which raises on what it cannot read."""
    if not isinstance(answer, dict):
        raise TypeError(f"the probe's answer is a {type(answer).__name__}, not a mapping")
    state = answer.get("state_dict")
    params = read_params(state, cfg)
    want = oracle.forward(params, b["src"], b["tgt_in"], b["src_mask"], b["tgt_mask"])
    tol = tolerance(answer.get("dtype"), "logits")
    logits = batch_first(answer.get("logits"), want.shape, want, b["tgt_mask"])
    if logits.array is None or np.iscomplexobj(logits.array):
        return f"the logits cannot be compared: {logits.reason or 'complex values'}"
    if logits.layout == TIME_FIRST:
        return (
            f"the logits have shape {np.shape(answer['logits'])}, expected {want.shape}: they are "
            "time-first [T, B, V]; the contract's logits are batch-first [B, T, V]"
        )
    got = np.asarray(logits.array, dtype=np.float64)
    a, reading = read_answer(answer, params, b, tol)
    a.state = state if isinstance(state, dict) else {}
    overall = relative(got, want, b["tgt_mask"])
    found = walk(a, b)
    shape = boundaries([f for f in found if f.matched and not f.own]) + reading.note()
    if overall <= tol:
        return f"the forward pass agrees with the oracle{shape}"
    departures = [f for f in found if f.departs]
    end = logits_finding(a, got, want, b["tgt_mask"])
    if end.departs:
        departures.append(end)
    if not a.outputs or not departures:
        # nothing hooked to locate it by, or nothing hooked departs: the whole-model hypotheses
        fits = hypothesis(a, b, got, tol)
        where = (
            "no submodule carrying the contract's module names is called, so no module is located"
            if not a.outputs
            else "every hooked module computes the contract's function of its own input"
        )
        said = f"the logits match the contract's model where {fits}" if fits else where
        if fits and a.outputs:
            said += f" ({where})"
        return f"the logits differ by {overall:.3g} (relative): {said}{shape}"
    first = departures[0]
    line = f"first divergence: {say(first)}"
    largest = max(departures, key=lambda f: f.error)
    if largest is not first and largest.error > 10 * first.error:
        line += f"; largest: {say(largest)}"
    return line + f"; the logits differ by {overall:.3g} (relative){shape}"


# --- without hooks: whole-model hypotheses -----------------------------------------------------


def variant_forward(
    params: Any,
    b: dict,
    eps: dict[str, float],
    spec: Any = None,
    tops: dict[str, tuple | None] | None = None,
) -> np.ndarray:
    """The contract's forward pass with `spec` for the layers and, per LayerNorm (a layer's
    prefix, 'enc_norm' or 'dec_norm'), its own eps: the model a hypothesis describes. `tops`
    replaces a stack's final norm ('enc_norm', 'dec_norm'): None for none, else its (weight,
    bias); the contract's where not given."""
    spec = spec or params.spec
    a = params.arrays
    at = dataclasses.replace
    finals: dict[str, tuple | None] = {
        top: (a[f"{top}.weight"], a[f"{top}.bias"]) if spec.norm == "pre" else None
        for top in ("enc_norm", "dec_norm")
    }
    finals.update(tops or {})

    def final(top: str, z: np.ndarray) -> np.ndarray:
        norm = finals[top]
        return z if norm is None else layer_norm(z, *norm, eps.get(top, spec.ln_eps))

    x = embed(dataclasses.replace(params, spec=spec), params.src_table, b["src"])
    enc_mask = source_attention_mask(b["src_mask"])
    for i in range(spec.n_enc):
        s = at(spec, ln_eps=eps.get(f"encoder.{i}", spec.ln_eps))
        x, _ = encoder_layer(x, params.layer(f"encoder.{i}"), enc_mask, s)
    x = final("enc_norm", x)
    y = embed(dataclasses.replace(params, spec=spec), params.tgt_table, b["tgt_in"])
    self_mask = target_attention_mask(b["tgt_mask"])
    for i in range(spec.n_dec):
        s = at(spec, ln_eps=eps.get(f"decoder.{i}", spec.ln_eps))
        y, _ = decoder_layer(y, x, params.layer(f"decoder.{i}"), self_mask, enc_mask, s)
    return output_logits(dataclasses.replace(params, spec=spec), final("dec_norm", y))


def final_norm_hypotheses(a: Answer, b: dict) -> Iterator[tuple[str, np.ndarray]]:
    """(cause, logits) for a stack's final norm never applied (pre-LN) or one too many
    (post-LN), each named with the first reader of the stream it changes."""
    params = a.params
    readers = {"enc_norm": "decoder.0.cross_attn", "dec_norm": "the output layer, out"}
    if params.spec.norm == "pre":
        for tops in (("enc_norm",), ("dec_norm",), ("enc_norm", "dec_norm")):
            said = [f"{missing_final_norm(top)} (its first reader: {readers[top]})" for top in tops]
            yield "; ".join(said), variant_forward(params, b, {}, tops=dict.fromkeys(tops))
    else:
        for tops in (("enc_norm",), ("dec_norm",), ("enc_norm", "dec_norm")):
            said = [
                f"{extra_final_norm(kind)} (its first reader: {readers[top]})"
                for top, kind in (("enc_norm", "encoder"), ("dec_norm", "decoder"))
                if top in tops
            ]
            norms = {top: final_norm(a, top) for top in tops}
            yield "; ".join(said), variant_forward(params, b, {}, tops=norms)


def hypotheses(a: Answer, b: dict) -> Iterator[tuple[str, np.ndarray]]:
    """(cause, logits) for the classic whole-model faults, one at a time."""
    params = a.params
    spec = params.spec
    at = dataclasses.replace
    norms = [f"encoder.{i}" for i in range(spec.n_enc)] + [
        f"decoder.{i}" for i in range(spec.n_dec)
    ]
    if spec.norm == "pre":
        norms += ["enc_norm", "dec_norm"]
    for other in COMMON_EPS:
        if other == spec.ln_eps:
            continue
        yield (
            f"every LayerNorm has eps {other:g}, not cfg.ln_eps = {spec.ln_eps:g}",
            variant_forward(params, b, dict.fromkeys(norms, other)),
        )
        for name in norms:
            what = f"the LayerNorms of {name}" if "." in name else name
            yield (
                f"{what} has eps {other:g}, not cfg.ln_eps = {spec.ln_eps:g}: pass "
                "eps=cfg.ln_eps to every LayerNorm",
                variant_forward(params, b, {name: other}),
            )
    other = "post" if spec.norm == "pre" else "pre"
    if other == "post":
        yield (
            f"the LayerNorm placement: the layers compute post-LN though cfg.norm is '{spec.norm}'",
            variant_forward(params, b, {}, at(spec, norm="post")),
        )
    yield from final_norm_hypotheses(a, b)
    yield (
        "the feed-forward's activation is GELU: the contract's is ReLU",
        variant_forward(params, b, {}, at(spec, activation="gelu")),
    )
    yield (
        "the embeddings are not multiplied by sqrt(d_model)",
        variant_forward(params, b, {}, at(spec, embed_scale=1.0)),
    )
    pe32 = positional_encoding(spec.max_len, spec.d_model).astype(np.float32).astype(np.float64)
    yield (
        "the positional table is rounded to float32: compute it in the parameters' dtype",
        variant_forward(params, b, {}, at(spec, pos_table=pe32)),
    )
    want = variant_forward(params, b, {})
    yield (
        "the logits are log-probabilities (log_softmax applied): return the raw logits",
        log_softmax(want),
    )


def hypothesis(a: Answer, b: dict, got: np.ndarray, tol: float) -> str:
    """The classic fault whose whole model gives the subject's logits, if one does. float32
    rounding of the table is matched at float32's level, the others at the test's tolerance."""
    for cause, logits in hypotheses(a, b):
        bound = FLOAT32_LEVEL if "float32" in cause else tol
        if relative(got, logits, b["tgt_mask"]) <= bound:
            return cause
    return ""


def boundaries(found: list[Finding]) -> str:
    """The module boundaries other than the contract's, once per kind of module: " (the
    self_attn and cross_attn modules return LN(x + attention))"."""
    kinds: dict[str, list[str]] = {}
    for f in found:
        kind = f.where.rsplit(".", 1)[-1]
        if kind not in kinds.setdefault(f.matched, []):
            kinds[f.matched].append(kind)
    said = [f"the {' and '.join(k)} modules return {form}" for form, k in kinds.items()]
    if not said:
        return ""
    return f" (boundaries other than the contract's, judged as such: {'; '.join(said)})"


def say(f: Finding) -> str:
    size = "" if math.isinf(f.error) else f", max abs error {f.error:.3g} (relative)"
    return f"{f.where}{size}" + (f": {f.cause}" if f.cause else "")


def diagnose(call: Call) -> dict[str, str]:
    """first_divergence on the golden test's inputs (the same weights, the same batches), per
    config. Never raises: what stops one config's diagnosis (the subject raising in the probe,
    a worker that died, an answer it cannot read) is said for that config."""
    found = {}
    for name, cfg, b in golden_inputs():
        try:
            weights = golden_weights(call, name, cfg)
            answer = call("module_outputs", cfg=cfg, weights=weights, **forward_inputs(b))
            if not isinstance(answer, dict):
                raise TypeError(f"module_outputs gave a {type(answer).__name__}, not a mapping")
            assert_holds(name, answer.get("state_dict"), weights)
        except Failure as e:
            found[name] = f"cannot compare: {e}"
            continue
        except Exception as e:  # the boundary: a grade goes on whatever one config met
            found[name] = f"no diagnosis: {type(e).__name__}: {str(e)[:300]}"
            continue
        found[name] = first_divergence({**answer, "state_dict": weights}, cfg, b)
    return found
