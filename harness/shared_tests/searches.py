"""The oracle's searches that the decoding laws compare a subject's with, and the margins that
say where a comparison is decided for the subject's dtype: greedy decoding (batched over rows),
the pinned beam search (cached per weights and inputs, with the gaps of its choices), the paths
they take, and the bounds of the logits along them."""

from __future__ import annotations

import math
from typing import Any

import numpy as np

import oracle
from harness.shared_tests.inputs import BOS, PAD
from harness.shared_tests.verdicts import derived

# The decoding tests' expectations depend only on the parent's weights, which follow the
# contract's names and so are the same for every subject: the oracle's searches are computed once
# per process and reused (a matrix asks the same question of 18 subjects).
_SEARCHES: dict[tuple, Any] = {}


def params_key(params: Any) -> bytes:
    """A digest of the weights, for the caches of the oracle's decoding."""
    import hashlib

    digest = hashlib.sha256()
    for name in sorted(params.arrays):
        digest.update(name.encode() + params.arrays[name].tobytes())
    return digest.digest()


def beam_search_once(params: Any, key: bytes, row: np.ndarray, *args: Any) -> list:
    """oracle.beam_search for one source row (padded with PAD), cached by weights and inputs;
    args: bos, eos, max_len, beam_size, length_penalty."""
    return _search(params, key, row, *args)[0]


def search_gap(params: Any, key: bytes, row: np.ndarray, *args: Any) -> float:
    """The smallest margin of any choice beam_search_once's search made (oracle.beam_search's
    gaps): a subject whose log-probabilities move by more may search another way."""
    return _search(params, key, row, *args)[1]


def _search(params: Any, key: bytes, row: np.ndarray, *args: Any) -> tuple[list, float]:
    cache_key = (key, row.tobytes(), *args)
    if cache_key not in _SEARCHES:
        mask = (row != PAD)[None]
        memory = oracle.encode(params, row[None], mask)
        gaps: list[float] = []
        bos, eos, max_len, beam_size, length_penalty = args
        finished = oracle.beam_search(
            params, memory, mask, bos, eos, max_len, beam_size, length_penalty, gaps=gaps
        )
        _SEARCHES[cache_key] = (finished, min(gaps, default=math.inf))
    return _SEARCHES[cache_key]


def greedy(params: Any, src: np.ndarray, eos: int | None, max_len: int) -> tuple[list, list]:
    """The oracle's greedy decoding of each row by full decoder passes over its whole prefix (no
    cache), and each row's smallest argmax margin over its steps. The rows go through together:
    a row's logits are the same whichever rows share its batch (each row's attention reads its
    own keys only), and a finished row's later steps are left unread."""
    mask = src != PAD
    memory = oracle.encode(params, src, mask)
    ys = np.full((len(src), 1), BOS)
    out: list[list[int]] = [[] for _ in src]
    gaps: list[list[float]] = [[] for _ in src]
    live = np.ones(len(src), dtype=bool)
    for _ in range(max_len):
        logits = oracle.decode(params, ys, memory, mask, np.ones_like(ys, dtype=bool))[:, -1]
        top2 = np.sort(logits, axis=-1)[:, -2:]
        toks = np.argmax(logits, axis=-1)
        for i in np.flatnonzero(live):
            gaps[i].append(top2[i, 1] - top2[i, 0])
            if toks[i] == eos:
                live[i] = False
            else:
                out[i].append(int(toks[i]))
        if not live.any():
            break
        ys = np.concatenate([ys, toks[:, None]], axis=1)
    return out, [min(g) for g in gaps]


def decoding_paths(paths: list[list[int]]) -> dict[str, np.ndarray]:
    """bos + each path, right-padded, with its own mask (a path may hold the pad id)."""
    width = 1 + max(len(p) for p in paths)
    tgt_in = np.full((len(paths), width), PAD)
    tgt_mask = np.zeros((len(paths), width), dtype=bool)
    for i, p in enumerate(paths):
        tgt_in[i, : len(p) + 1] = [BOS, *p]
        tgt_mask[i, : len(p) + 1] = True
    return {"tgt_in": tgt_in, "tgt_mask": tgt_mask}


def along_paths(params: Any, src: np.ndarray, paths: dict[str, np.ndarray], dtype: str) -> Any:
    """The oracle's logits along `paths` (decoding_paths') and their bounds for `dtype`."""
    return derived(
        oracle.forward,
        params,
        src,
        paths["tgt_in"],
        src != PAD,
        paths["tgt_mask"],
        dtype=dtype,
        rows=True,
    )


def row_bounds(params: Any, src: np.ndarray, paths: dict[str, np.ndarray], dtype: str) -> Any:
    """Per row, the largest bound of a logit along its path: how far one of its logits may move."""
    _, bound = along_paths(params, src, paths, dtype)
    return np.where(paths["tgt_mask"][..., None], bound, 0.0).max(axis=(1, 2))


def greedy_decided(
    params: Any, src: np.ndarray, paths: dict[str, np.ndarray], margins: list, dtype: str
) -> list[bool]:
    """For each row, whether its greedy path is decided for a subject computing in `dtype`: its
    smallest argmax margin exceeds what two logits of the row may move, the sum of their
    derived bounds (two honest computations may then not pick another token)."""
    spread = 2 * row_bounds(params, src, paths, dtype)
    return [bool(m > s) for m, s in zip(margins, spread, strict=True)]


def score_margins(
    params: Any, src: np.ndarray, paths: dict[str, np.ndarray], dtype: str, max_len: int
) -> np.ndarray:
    """Per row, how far apart two hypotheses' scores must be for the search's choice between
    them to be decided for a subject computing in `dtype`: a score sums at most max_len
    log-probabilities (over len ** penalty >= 1), each within twice its step's largest logit
    bound of the oracle's (log_softmax moves by at most the largest logit's error on either
    side); two scores, each that far off. The bound is the forward pass's along the row's greedy
    path, the same weights and magnitudes as the search's other paths."""
    return 2 * (2 * row_bounds(params, src, paths, dtype) * max_len)
