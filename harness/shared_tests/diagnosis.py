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
from typing import Any

import numpy as np

import oracle
from harness.shared_tests.diagnosis_answer import (
    Answer,
    Candidate,
    Finding,
    judge,
    read_answer,
    relative,
)
from harness.shared_tests.diagnosis_faults import (
    COMMON_EPS,
    attention_candidates,
    embedding_causes,
    extra_final_norm,
    final_norm,
    hypothesis,
    missing_final_norm,
    norm_candidates,
    reads_memory,
)
from harness.shared_tests.diagnosis_variants import agrees, residual_after_norm
from harness.shared_tests.inputs import forward_inputs, golden_inputs, golden_weights
from harness.shared_tests.layout import TIME_FIRST, batch_first
from harness.shared_tests.record import Call, Failure
from harness.shared_tests.verdicts import assert_holds, derived, read_params
from oracle.layers import decoder_layer, encoder_layer
from oracle.model import embed, output_logits, source_attention_mask, target_attention_mask
from oracle.ops import gelu, layer_norm, log_softmax, relu

# --- the known faults, as candidates ------------------------------------------------------------


# --- the re-anchored walk -----------------------------------------------------------------------


# --- the answer in the contract's layout --------------------------------------------------------


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
        candidates = attention_candidates(own, kv, sp, attn_mask, spec.n_heads, causal)
        return established(got, own, candidates, mask, tol)
    if sub == "linear2" and own is not None and f"{prefix}.linear1" in a.outputs:
        h1 = np.asarray(a.outputs[f"{prefix}.linear1"], dtype=np.float64)
        if relative(own, gelu(h1), mask) <= tol:
            return "the feed-forward's activation is GELU: the contract's is ReLU"
        if relative(own, h1, mask) <= tol:
            return "the feed-forward applies no activation between linear1 and linear2 (ReLU)"
    return ""


def established(
    got: np.ndarray, own: np.ndarray, candidates: list[Candidate], mask: np.ndarray, tol: float
) -> str:
    """The cause of the one known fault whose recomputed value (the attention, or x + it) the
    module returns; none where no candidate fits or two different causes fit alike."""
    causes = {
        c.cause
        for c in candidates
        if any(agrees(got, form, mask, tol) for form in (c.value, own + c.value))
    }
    return causes.pop() if len(causes) == 1 else ""


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
    """When the layer computes the other LayerNorm placement, or pre-LN with each residual
    taken after the norm: that, said."""
    spec = a.params.spec
    if prefix not in a.outputs:
        return ""
    if spec.norm == "pre":
        after = residual_after_norm(kind, x, a.params.layer(prefix), args, spec)
        if agrees(np.asarray(a.outputs[prefix]), after, mask, a.tol):
            return (
                f"the residual is taken after the norm: {prefix} computes LN(x) + F(LN(x)) in "
                "each sublayer; pre-LN adds the sublayer to x itself, x + F(LN(x))"
            )
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


def memory_reader(a: Answer) -> tuple[str, np.ndarray | None]:
    """The first hooked module that reads the memory, and the memory it read."""
    for i in range(a.params.spec.n_dec):
        for name in (f"decoder.{i}.cross_attn", f"decoder.{i}"):
            read = a.input(name, 1)
            if read is not None:
                return name, read
    return "", None


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
        assert last is not None  # returned above when neither is there
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
        assert last is not None  # unread only with the decoder's last layer hooked
        weight, bias = final_norm(a, "dec_norm")
        if spec.norm == "pre" and relative(got, output_logits(a.params, last), mask) <= a.tol:
            cause = missing_final_norm("dec_norm")
        elif spec.norm == "post" and any(
            relative(got, output_logits(a.params, layer_norm(last, weight, bias, e)), mask) <= a.tol
            for e in (spec.ln_eps, *COMMON_EPS)
        ):
            cause = extra_final_norm("decoder")
    return Finding("logits", relative(got, want, mask), cause=cause)


def traced_forward(params: Any, src: Any, tgt_in: Any, src_mask: Any, tgt_mask: Any) -> tuple:
    """oracle.forward with its trace: (logits, {boundary: value})."""
    return oracle.forward(params, src, tgt_in, src_mask, tgt_mask, trace=True)


@dataclasses.dataclass
class Walk:
    """What one config's diagnosis judged, for a picture of it (xfmr check --html): every judged
    point in order of computation (the walk's findings, then the logits'), and the walk's one
    relative tolerance. Left empty where the diagnosis stopped before its walk."""

    points: list[Finding] = dataclasses.field(default_factory=list)
    tol: float = 0.0


def first_divergence(
    answer: Any, cfg: dict, b: dict[str, np.ndarray], seen: Walk | None = None
) -> str:
    """The diagnosis of one config's forward pass, in a sentence or two. It never raises: the
    subject's answer is any plain data, and an error the diagnosis meets on it is said for this
    config ("no diagnosis: <why>") instead of stopping the grade. `seen`, when given, receives
    what the walk judged (the sentence is the same either way)."""
    try:
        with np.errstate(invalid="ignore", over="ignore", divide="ignore"):  # NaN in, NaN said
            return divergence(answer, cfg, b, seen)
    except Failure as e:  # the weights cannot be read, or no error model fits: nothing to compare
        return f"cannot compare: {e}"
    except Exception as e:  # the boundary: the diagnosis's own logic stays strict inside
        return f"no diagnosis: {type(e).__name__}: {str(e)[:300]}"


def divergence(
    answer: dict[str, Any], cfg: dict, b: dict[str, np.ndarray], seen: Walk | None = None
) -> str:
    """first_divergence's work, which raises on what it cannot read."""
    if not isinstance(answer, dict):
        raise TypeError(f"the probe's answer is a {type(answer).__name__}, not a mapping")
    state: Any = answer.get("state_dict")  # the subject's; read_params says if it is unreadable
    params = read_params(state, cfg)
    dtype: Any = answer.get("dtype")  # the subject's; `derived` says if it has no error model
    (want, trace), (bound, trace_bound) = derived(
        traced_forward,
        params,
        b["src"],
        b["tgt_in"],
        b["src_mask"],
        b["tgt_mask"],
        dtype=dtype,
        rows=True,
    )
    # one relative tolerance for the walk's every comparison (a diagnosis, never a verdict): the
    # loosest of the logits' and every traced boundary's largest derived bound over its scale
    tol = max(
        float(np.max(v, initial=0.0)) / max(1.0, float(np.abs(w).max(initial=0.0)))
        for v, w in [(bound, want), *((trace_bound[k], trace[k]) for k in trace)]
    )
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
        if seen is not None:
            seen.points, seen.tol = [*found, Finding("logits", overall, "logits", own=True)], tol
        return f"the forward pass agrees with the oracle{shape}"
    departures = [f for f in found if f.departs]
    end = logits_finding(a, got, want, b["tgt_mask"])
    if seen is not None:
        seen.points, seen.tol = [*found, end], tol
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


def diagnose(call: Call, walks: dict[str, Walk] | None = None) -> dict[str, str]:
    """first_divergence on the golden test's inputs (the same weights, the same batches), per
    config. Never raises: what stops one config's diagnosis (the subject raising in the probe,
    a worker that died, an answer it cannot read) is said for that config. `walks`, when given,
    receives each config's Walk (first_divergence's `seen`)."""
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
        seen = walks.setdefault(name, Walk()) if walks is not None else None
        found[name] = first_divergence({**answer, "state_dict": weights}, cfg, b, seen)
    return found
