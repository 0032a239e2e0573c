"""The classic faults the diagnosis can name: at one boundary, as candidate values a module may
return (a LayerNorm's variance or eps, the placement, a missing mask, the attention's scale, the
embeddings' scale or table; the attention and LayerNorm faults students write, recomputed from
the module's own input by harness.shared_tests.diagnosis_variants), and for a whole model, as
hypotheses whose forward pass gives the subject's logits when nothing hooked locates the fault
(eps, placement, GELU, no sqrt(d), a float32 positional table, log-probabilities, a final norm
missing or one too many)."""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Iterator, Mapping
from typing import Any

import numpy as np

from harness.shared_tests.diagnosis_answer import (
    FLOAT32_LEVEL,
    FLOAT64_LEVEL,
    Answer,
    Candidate,
    relative,
)
from harness.shared_tests.diagnosis_variants import (
    attention_fault_candidates,
    norm_fault_candidates,
)
from harness.shared_tests.verdicts import (
    unwrapped,
)
from oracle.layers import decoder_layer, encoder_layer, multi_head_attention
from oracle.model import embed, output_logits, source_attention_mask, target_attention_mask
from oracle.ops import layer_norm, log_softmax, positional_encoding

# LayerNorm epsilons that implementations hard-code instead of cfg.ln_eps: torch's default, the
# Annotated Transformer's, TensorFlow's and Hugging Face's, and none.
COMMON_EPS = (1e-5, 1e-6, 1e-3, 1e-12, 0.0)


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
    return out + norm_fault_candidates(z, gamma, beta, eps)


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
    out += attention_fault_candidates(q, kv, p, mask, h)
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
            (lookups + pe) * math.sqrt(d),
            "the positional encoding is scaled with the embeddings, (E[ids] + PE) * "
            "sqrt(d_model): add PE after the scaling, E[ids] * sqrt(d_model) + PE",
        ),
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
    if FLOAT64_LEVEL < err <= FLOAT32_LEVEL:  # float64 rounding cannot explain it, float32 can
        return (
            f"; an error this small ({err:.2g} of the values' scale) is float32 rounding: the "
            "positional table (or the sqrt(d) factor) is computed in float32 while the model "
            "runs in float64. Compute it in the parameters' dtype, e.g. register it as a buffer "
            "(persistent=False) so that .double() converts it, or build it with the embedding's "
            "dtype"
        )
    return ""


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


def variant_forward(
    params: Any,
    b: dict,
    eps: dict[str, float],
    spec: Any = None,
    tops: Mapping[str, tuple[np.ndarray, np.ndarray] | None] | None = None,
) -> np.ndarray:
    """The contract's forward pass with `spec` for the layers and, per LayerNorm (a layer's
    prefix, 'enc_norm' or 'dec_norm'), its own eps: the model a hypothesis describes. `tops`
    replaces a stack's final norm ('enc_norm', 'dec_norm'): None for none, else its (weight,
    bias); the contract's where not given."""
    spec = spec or params.spec
    a = params.arrays
    at = dataclasses.replace
    finals: dict[str, tuple[np.ndarray, np.ndarray] | None] = {
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
    placement = "post" if spec.norm == "pre" else "pre"
    if placement == "post":
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
    rounding of the table is matched at float32's level, the others at the test's tolerance; it
    is named only where float64 rounding cannot explain the error (past FLOAT64_LEVEL)."""
    contract = relative(got, variant_forward(a.params, b, {}), b["tgt_mask"])
    for cause, logits in hypotheses(a, b):
        bound = FLOAT32_LEVEL if "float32" in cause else tol
        if "float32" in cause and contract <= FLOAT64_LEVEL:
            continue
        if relative(got, logits, b["tgt_mask"]) <= bound:
            return cause
    return ""
