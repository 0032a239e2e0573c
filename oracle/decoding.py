"""Autoregressive decoding: a KV-cached decode_step, and translate with the contract's beam search.

decode_step reads one position per call; the self-attention keys and values of the earlier
positions come from the state, so the prefix is never recomputed. The state is never mutated.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np

from oracle.layers import KV, decoder_layer, key_value_heads
from oracle.model import embed, encode, output_logits, source_attention_mask
from oracle.ops import layer_norm, log_softmax
from oracle.params import Params


@dataclass(frozen=True, eq=False)
class DecodeState:
    """The next position to decode, the source mask, and per decoder layer the self-attention
    heads of the positions so far and the cross-attention heads of the memory (None until the
    first step has seen the memory)."""

    position: int
    src_mask: np.ndarray  # [B, S]
    self_kv: tuple[KV, ...]
    cross_kv: tuple[KV, ...] | None

    def select(self, rows: Any) -> DecodeState:
        """The state of the batch rows `rows` (in that order, repeats allowed): for beam search."""
        rows = np.asarray(rows, dtype=np.intp)

        def pick(kvs: tuple[KV, ...]) -> tuple[KV, ...]:
            return tuple((K[rows], V[rows]) for K, V in kvs)

        cross = None if self.cross_kv is None else pick(self.cross_kv)
        return DecodeState(self.position, self.src_mask[rows], pick(self.self_kv), cross)


def init_state(params: Params, src_mask: Any) -> DecodeState:
    """The state before the first target position (bos)."""
    src_mask = np.asarray(src_mask)
    if src_mask.dtype != bool:
        raise TypeError(f"src_mask must be bool (True = a real token), got {src_mask.dtype}")
    if src_mask.ndim != 2:
        raise ValueError(f"src_mask must be [B, S], got shape {src_mask.shape}")
    spec = params.spec
    B, d_k = src_mask.shape[0], spec.d_model // spec.n_heads
    empty = np.zeros((B, spec.n_heads, 0, d_k), dtype=params.dtype)
    return DecodeState(0, src_mask, tuple((empty, empty) for _ in range(spec.n_dec)), None)


def decode_step(
    params: Params, y_prev: Any, memory: Any, state: DecodeState
) -> tuple[np.ndarray, DecodeState]:
    """The logits [B, V_tgt] at the state's position given its token y_prev [B], and the next state.

    Equal to row `state.position` of decode() on the same prefix.
    """
    spec = params.spec
    y_prev = np.asarray(y_prev)
    B = state.src_mask.shape[0]
    if y_prev.shape != (B,) or not np.issubdtype(y_prev.dtype, np.integer):
        raise ValueError(
            f"y_prev must be integer ids of shape ({B},), got {y_prev.dtype} {y_prev.shape}"
        )
    t = state.position
    cross_kv = state.cross_kv
    if cross_kv is None:
        memory = np.asanyarray(memory, dtype=params.dtype)
        if memory.shape != (B, state.src_mask.shape[1], spec.d_model):
            raise ValueError(
                f"memory has shape {memory.shape}, expected (B, S, d) = "
                f"{(B, state.src_mask.shape[1], spec.d_model)}"
            )
        heads = spec.n_heads
        cross_kv = tuple(
            key_value_heads(memory, params.layer(f"decoder.{i}.cross_attn"), heads)
            for i in range(spec.n_dec)
        )
    self_mask = np.ones((B, 1, 1, t + 1), dtype=bool)  # every earlier position is a real token
    cross_mask = source_attention_mask(state.src_mask)
    y = embed(params, params.tgt_table, y_prev[:, None], start=t)  # [B, 1, d]
    self_kv = []
    for i in range(spec.n_dec):
        p = params.layer(f"decoder.{i}")
        extend = _extended(state.self_kv[i], params.layer(f"decoder.{i}.self_attn"), spec.n_heads)
        y, c = decoder_layer(
            y, None, p, self_mask, cross_mask, spec, self_kv=extend, cross_kv=cross_kv[i]
        )
        attended = c["self"]["sublayer"]  # the self-attention's cache: the heads it read
        self_kv.append((attended["K"], attended["V"]))
    if spec.norm == "pre":
        a = params.arrays
        y = layer_norm(y, a["dec_norm.weight"], a["dec_norm.bias"], spec.ln_eps)
    logits = output_logits(params, y)[:, 0]  # [B, V_tgt]
    return logits, DecodeState(t + 1, state.src_mask, tuple(self_kv), cross_kv)


def _extended(past: KV, p: dict[str, np.ndarray], h: int) -> Callable[[np.ndarray], KV]:
    """The self-attention's key/value heads at a new position: the cached positions' heads
    `past`, then the new position's, projected from the sublayer's input x [B, 1, d]."""

    def heads(x: np.ndarray) -> KV:
        K_new, V_new = key_value_heads(x, p, h)
        return np.concatenate([past[0], K_new], axis=2), np.concatenate([past[1], V_new], axis=2)

    return heads


@dataclass(frozen=True)
class Hypothesis:
    """A beam entry: tokens after bos (ending in eos once finished), total log-prob, score."""

    tokens: tuple[int, ...]
    logp: float
    score: float | None = None


def beam_search(
    params: Params,
    memory: np.ndarray,
    src_mask: np.ndarray,
    bos: int,
    eos: int,
    max_len: int,
    beam_size: int,
    length_penalty: float,
    gaps: list[float] | None = None,
    stop_early: bool = True,
) -> list[Hypothesis]:
    """The contract's pinned beam search for one source row (memory [1, S, d], src_mask [1, S]):
    every finished hypothesis with its score logp / len(tokens) ** length_penalty, in the order
    they finished (CONTRACT.md, translate).

    gaps (optional): appended, per step, the smallest margin of the step's choices (between each
    live hypothesis's last kept token and the next, and between the last candidate taken and the
    first left): how far the log-probabilities may move before another search results.

    stop_early=False runs the same search on past the pinned stop (beam_size finished), until
    max_len or no live hypothesis: not the contract's search, but what a search that misses the
    stop rule returns; the tests choose inputs where the two disagree."""
    live = [Hypothesis((), 0.0)]
    state = init_state(params, src_mask)
    finished: list[Hypothesis] = []
    for _ in range(max_len):
        y_prev = np.array([h.tokens[-1] if h.tokens else bos for h in live])
        logits, state = decode_step(params, y_prev, np.repeat(memory, len(live), axis=0), state)
        logp = log_softmax(logits)  # [live, V]
        # each hypothesis's beam_size best tokens; a stable sort puts the lower id first on ties
        order = np.argsort(-logp, axis=-1, kind="stable")
        top = order[:, :beam_size]
        candidates = [
            (float(h.logp + logp[r, tok]), r, int(tok))
            for r, h in enumerate(live)
            for tok in top[r]
        ]
        candidates.sort(key=lambda c: -c[0])  # stable: live order, then token rank
        next_live: list[Hypothesis] = []
        parents: list[int] = []
        taken = 0
        for total, r, tok in candidates:
            if len(next_live) == beam_size:
                break
            taken += 1
            tokens = live[r].tokens + (tok,)
            if tok == eos:
                finished.append(Hypothesis(tokens, total, total / len(tokens) ** length_penalty))
            else:
                next_live.append(Hypothesis(tokens, total))
                parents.append(r)
        if gaps is not None:
            step = [math.inf]
            if logp.shape[-1] > beam_size:
                rows = np.arange(len(live))
                cut = logp[rows, order[:, beam_size - 1]] - logp[rows, order[:, beam_size]]
                step.append(float(cut.min()))
            if 0 < taken < len(candidates):
                step.append(candidates[taken - 1][0] - candidates[taken][0])
            gaps.append(min(step))
        live = next_live
        if (stop_early and len(finished) >= beam_size) or not live:
            break
        state = state.select(parents)
    if not finished:  # max_len reached with nothing finished: the live hypotheses finish
        # an empty hypothesis (max_len 0) scores its logp, as if of length 1
        finished = [
            Hypothesis(h.tokens, h.logp, h.logp / max(len(h.tokens), 1) ** length_penalty)
            for h in live
        ]
    return finished


def best_hypothesis(finished: list[Hypothesis]) -> Hypothesis:
    """The highest score, the earliest finished on ties."""
    return max(finished, key=_score)  # max keeps the first of equal keys


def _score(h: Hypothesis) -> float:
    if h.score is None:
        raise ValueError(f"hypothesis {h.tokens} is not finished: it has no score")
    return h.score


def translate(
    params: Params,
    src: Any,
    bos: int,
    eos: int,
    pad_id: int,
    max_len: int,
    beam_size: int = 1,
    length_penalty: float = 1.0,
) -> list[list[int]]:
    """Per source row (padded with pad_id), the best hypothesis's tokens without bos and eos.

    beam_size=1 is greedy argmax decoding.
    """
    if beam_size < 1 or max_len < 0:
        raise ValueError(f"need beam_size >= 1 and max_len >= 0, got {beam_size}, {max_len}")
    src = np.asarray(src)
    src_mask = src != pad_id
    memory = encode(params, src, src_mask)
    out = []
    for b in range(src.shape[0]):
        finished = beam_search(
            params,
            memory[b : b + 1],
            src_mask[b : b + 1],
            bos,
            eos,
            max_len,
            beam_size,
            length_penalty,
        )
        tokens = list(best_hypothesis(finished).tokens)
        out.append(tokens[:-1] if tokens and tokens[-1] == eos else tokens)
    return out
