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
from harness.shared_tests.record import Call, Failure
from harness.shared_tests.verdicts import assert_holds, errors, read_params, tolerance
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
    """The probe's answer, with the oracle's reading of the subject's weights."""

    params: Any
    inputs: dict[str, list[np.ndarray]]
    outputs: dict[str, np.ndarray]
    order: list[str]
    tol: float

    def input(self, name: str, i: int = 0) -> np.ndarray | None:
        found = self.inputs.get(name) or []
        return np.asarray(found[i], dtype=np.float64) if len(found) > i else None


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
        memory = subject_memory(a) if kind == "decoder" else None
        for i in range(stack):
            found += judge_layer(a, kind, i, masks, memory)
        top = "enc_norm" if kind == "encoder" else "dec_norm"
        last = a.outputs.get(f"{kind}.{stack - 1}")
        if top in a.outputs:
            if spec.norm == "post":
                found.append(
                    Finding(
                        top,
                        math.inf,
                        cause=f"a final LayerNorm after the {kind} in a post-LN model: the "
                        "contract has none (nn.Transformer{Encoder,Decoder}(norm=...) adds one: "
                        "pass norm=None)".replace("{Encoder,Decoder}", kind.capitalize()),
                    )
                )
            else:
                z = a.input(top)
                z = z if z is not None else last
                if z is not None:
                    w, bias = a.params.arrays[f"{top}.weight"], a.params.arrays[f"{top}.bias"]
                    cands = norm_candidates(z, w, bias, spec.ln_eps)
                    found.append(judge(top, a.outputs[top], cands, mask, a.tol))
    return found


def subject_memory(a: Answer) -> np.ndarray | None:
    """The encoder's output as the subject computed it: enc_norm's, else the last layer's."""
    spec = a.params.spec
    name = "enc_norm" if spec.norm == "pre" else f"encoder.{spec.n_enc - 1}"
    got = a.outputs.get(name)
    return None if got is None else np.asarray(got, dtype=np.float64)


def logits_finding(a: Answer, got: np.ndarray, want: np.ndarray, mask: np.ndarray) -> Finding:
    """The logits against the contract's from the subject's own last value (the output layer's
    input), with the log-probabilities fault named."""
    y = a.input("out")
    if y is not None:
        local = output_logits(a.params, y)
        f = judge("logits", got, [Candidate("logits", local)], mask, a.tol)
        if not f.departs:
            return dataclasses.replace(f, error=relative(got, want, mask))
        want = local
    shift = got - want
    centred = shift - shift.mean(axis=-1, keepdims=True)
    if relative(got, log_softmax(want), mask) <= a.tol:
        cause = "the logits are log-probabilities (log_softmax applied): return the raw logits"
    elif relative(centred + want, want, mask) <= a.tol:
        cause = "the logits differ by a constant per position: a softmax-like normalisation"
    else:
        cause = ""
    return Finding("logits", relative(got, want, mask), cause=cause)


def first_divergence(answer: dict[str, Any], cfg: dict, b: dict[str, np.ndarray]) -> str:
    """The diagnosis of one config's forward pass, in a sentence or two."""
    params = read_params(answer["state_dict"], cfg)
    want = oracle.forward(params, b["src"], b["tgt_in"], b["src_mask"], b["tgt_mask"])
    got = np.asarray(answer["logits"], dtype=np.float64)
    tol = tolerance(answer["dtype"], "logits")
    if got.shape != want.shape:
        return f"the logits have shape {got.shape}, expected {want.shape}"
    outputs = {k: np.asarray(v, dtype=np.float64) for k, v in answer["outputs"].items()}
    inputs = {k: [np.asarray(x, dtype=np.float64) for x in v] for k, v in answer["inputs"].items()}
    a = Answer(params, inputs, outputs, list(answer["modules"]), tol)
    overall = relative(got, want, b["tgt_mask"])
    found = walk(a, b)
    shape = boundaries([f for f in found if f.matched and not f.own])
    if overall <= tol:
        return f"the forward pass agrees with the oracle{shape}"
    departures = [f for f in found if f.departs]
    end = logits_finding(a, got, want, b["tgt_mask"])
    if end.departs:
        departures.append(end)
    if not outputs or not departures:
        # nothing hooked to locate it by, or nothing hooked departs: the whole-model hypotheses
        fits = hypothesis(params, b, got, tol)
        where = (
            "no submodule carrying the contract's module names is called, so no module is located"
            if not outputs
            else "every hooked module computes the contract's function of its own input"
        )
        said = f"the logits match the contract's model where {fits}" if fits else where
        if fits and outputs:
            said += f" ({where})"
        return f"the logits differ by {overall:.3g} (relative): {said}{shape}"
    first = departures[0]
    line = f"first divergence: {say(first)}"
    largest = max(departures, key=lambda f: f.error)
    if largest is not first and largest.error > 10 * first.error:
        line += f"; largest: {say(largest)}"
    return line + f"; the logits differ by {overall:.3g} (relative){shape}"


# --- without hooks: whole-model hypotheses -----------------------------------------------------


def variant_forward(params: Any, b: dict, eps: dict[str, float], spec: Any = None) -> np.ndarray:
    """The contract's forward pass with `spec` for the layers and, per LayerNorm (a layer's
    prefix, 'enc_norm' or 'dec_norm'), its own eps: the model a hypothesis describes."""
    spec = spec or params.spec
    a = params.arrays
    at = dataclasses.replace
    x = embed(dataclasses.replace(params, spec=spec), params.src_table, b["src"])
    enc_mask = source_attention_mask(b["src_mask"])
    for i in range(spec.n_enc):
        s = at(spec, ln_eps=eps.get(f"encoder.{i}", spec.ln_eps))
        x, _ = encoder_layer(x, params.layer(f"encoder.{i}"), enc_mask, s)
    if spec.norm == "pre":
        x = layer_norm(
            x, a["enc_norm.weight"], a["enc_norm.bias"], eps.get("enc_norm", spec.ln_eps)
        )
    y = embed(dataclasses.replace(params, spec=spec), params.tgt_table, b["tgt_in"])
    self_mask = target_attention_mask(b["tgt_mask"])
    for i in range(spec.n_dec):
        s = at(spec, ln_eps=eps.get(f"decoder.{i}", spec.ln_eps))
        y, _ = decoder_layer(y, x, params.layer(f"decoder.{i}"), self_mask, enc_mask, s)
    if spec.norm == "pre":
        y = layer_norm(
            y, a["dec_norm.weight"], a["dec_norm.bias"], eps.get("dec_norm", spec.ln_eps)
        )
    return output_logits(dataclasses.replace(params, spec=spec), y)


def hypotheses(params: Any, b: dict) -> Iterator[tuple[str, np.ndarray]]:
    """(cause, logits) for the classic whole-model faults, one at a time."""
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


def hypothesis(params: Any, b: dict, got: np.ndarray, tol: float) -> str:
    """The classic fault whose whole model gives the subject's logits, if one does. float32
    rounding of the table is matched at float32's level, the others at the test's tolerance."""
    for cause, logits in hypotheses(params, b):
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
    config."""
    found = {}
    for name, cfg, b in golden_inputs():
        try:
            weights = golden_weights(call, name, cfg)
            answer = call("module_outputs", cfg=cfg, weights=weights, **forward_inputs(b))
            assert_holds(name, answer.get("state_dict"), weights)
            found[name] = first_divergence({**answer, "state_dict": weights}, cfg, b)
        except Failure as e:
            found[name] = f"cannot compare: {e}"
    return found
