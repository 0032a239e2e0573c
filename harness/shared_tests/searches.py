"""The oracle's searches that the decoding laws compare a subject's with, and the margins that
say where a comparison is decided for the subject's dtype: greedy decoding (batched over rows),
the pinned beam search (cached per weights and inputs, with the gaps of its choices), the paths
they take, and the bounds of the logits along them; and the beam test's extra source rows,
chosen where a detail of the pinned search decides the winner."""

from __future__ import annotations

import math
from typing import Any

import numpy as np

import oracle
from harness.shared_tests import bounds_store
from harness.shared_tests.inputs import BOS, EOS, PAD, tokens
from harness.shared_tests.verdicts import derived
from oracle.decoding import Hypothesis

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
        found, gap = bounds_store.remembered(_searched, params, row, *args)
        _SEARCHES[cache_key] = ([Hypothesis(*h) for h in found], gap)
    return _SEARCHES[cache_key]


def _searched(params: Any, row: np.ndarray, *args: Any) -> tuple[list[tuple], float]:
    """The pinned search of one row as plain data (what a self-check keeps on disk:
    harness.shared_tests.bounds_store): each finished hypothesis's fields, and the smallest gap."""
    mask = (row != PAD)[None]
    memory = oracle.encode(params, row[None], mask)
    gaps: list[float] = []
    bos, eos, max_len, beam_size, length_penalty = args
    finished = oracle.beam_search(
        params, memory, mask, bos, eos, max_len, beam_size, length_penalty, gaps=gaps
    )
    return [(h.tokens, h.logp, h.score) for h in finished], min(gaps, default=math.inf)


def greedy(params: Any, src: np.ndarray, eos: int | None, max_len: int) -> tuple[list, list]:
    """The oracle's greedy decoding of each row by full decoder passes over its whole prefix (no
    cache), and each row's smallest argmax margin over its steps. The rows go through together:
    a row's logits are the same whichever rows share its batch (each row's attention reads its
    own keys only), and a finished row's later steps are left unread. Kept between self-checks
    (harness.shared_tests.bounds_store)."""
    return bounds_store.remembered(_greedy, params, src, eos, max_len)


def _greedy(params: Any, src: np.ndarray, eos: int | None, max_len: int) -> tuple[list, list]:
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


# Choosing inputs, not judging: a row is kept only where the oracle's winner beats its runner-up
# by far more than the oracle's own float64 rounding of a few log-probabilities (~1e-14);
# whether a subject's search is compared there is score_margins' to decide, for its dtype.
CLEAR_WINNER = 1e-9

# The beam test's extra rows, by what they are chosen for and the run's weights: one choice per
# process (the same for every subject whose names are the contract's).
_CHOSEN_ROWS: dict[tuple, list[np.ndarray]] = {}


def _clear(finished: list) -> bool:
    """The search's winner beats its runner-up by more than CLEAR_WINNER."""
    scores = sorted((h.score for h in finished if h.score is not None), reverse=True)
    return len(scores) < 2 or scores[0] - scores[1] > CLEAR_WINNER


def _chosen_rows(params: Any, cfg: dict, eos: int, max_len: int, why: str) -> list[np.ndarray]:
    """Up to two source rows, drawn one by one from the seed of `why`, on which DECIDES[why]
    holds for the oracle's search with these weights."""
    key = (why, eos, max_len, params_key(params))
    if key not in _CHOSEN_ROWS:
        _CHOSEN_ROWS[key] = bounds_store.remembered(_choose_rows, params, cfg, eos, max_len, why)
    return _CHOSEN_ROWS[key]


def _choose_rows(params: Any, cfg: dict, eos: int, max_len: int, why: str) -> list[np.ndarray]:
    seed, tries, decides = DECIDES[why]
    rng = np.random.default_rng(seed)
    chosen: list[np.ndarray] = []
    for _ in range(tries):
        row = tokens(rng, cfg["src_vocab"], (int(rng.integers(2, 6)),))
        mask = np.ones((1, len(row)), bool)
        memory = oracle.encode(params, row[None], mask)
        if decides(params, memory, mask, eos, max_len):
            chosen.append(row)
            if len(chosen) == 2:
                break
    return chosen


def _best(finished: list, penalty: float) -> tuple[tuple, bool]:
    """The winner of these finished hypotheses under `penalty` (the first of equal scores), and
    whether it beats the runner-up by more than CLEAR_WINNER."""
    scores = [h.logp / max(len(h.tokens), 1) ** penalty for h in finished]
    order = sorted(range(len(scores)), key=lambda i: -scores[i])  # stable: the first of equals
    clear = len(order) < 2 or scores[order[0]] - scores[order[1]] > CLEAR_WINNER
    return finished[order[0]].tokens, clear


def _stop_rule_decides(params: Any, memory: Any, mask: Any, eos: int, max_len: int) -> bool:
    """For some setting, the step that stops the search finishes more than beam_size hypotheses
    at once, and a search that went on past it would end with another winner: a stop rule that
    waits for exactly beam_size finished, for no live hypothesis, or never stops early answers
    differently. (The penalty changes the scores only, not which hypotheses the search keeps or
    when it stops: each search runs once per beam size and is scored under every penalty.)"""
    for beam in (2, 3, 4):
        pinned = oracle.beam_search(params, memory, mask, BOS, eos, max_len, beam, 0.0)
        if len(pinned) <= beam:
            continue
        on = oracle.beam_search(
            params, memory, mask, BOS, eos, max_len, beam, 0.0, stop_early=False
        )
        for penalty in (0.0, 1.0, 2.0):
            (best, clear), (other, clear_on) = _best(pinned, penalty), _best(on, penalty)
            if clear and clear_on and best != other:
                return True
    return False


# why -> (the rows' seed, how many rows to try, the test a row must pass)
DECIDES = {
    "stop rule": (91, 8, _stop_rule_decides),
}


_CHOSEN_CASES: dict[tuple, tuple[int, list[np.ndarray]] | None] = {}


def stop_rule_case(params: Any, cfg: dict, max_len: int) -> tuple[int, list[np.ndarray]] | None:
    """An eos, and up to two source rows (of 8 drawn for it), where the pinned stop rule decides
    the winner (`_stop_rule_decides`): the eos is the first real token, in id order, that has
    such a row under these weights; None when none has. Which token reaches eos first on which
    step is the weights' to decide, so the eos is chosen for them (the decoding tests' own eos
    may never finish two hypotheses on one step)."""
    key = (max_len, params_key(params))
    if key not in _CHOSEN_CASES:
        _CHOSEN_CASES[key] = None
        for eos in range(EOS + 1, cfg["tgt_vocab"]):
            rows = _chosen_rows(params, cfg, eos, max_len, "stop rule")
            if rows:
                _CHOSEN_CASES[key] = (eos, rows)
                break
    return _CHOSEN_CASES[key]


# The pinned score is logp / len ** length_penalty, logp summed from 0 at bos. A search that
# slips in the formula scores (logp + c) / len ** (length_penalty + e) instead: an initial
# log-probability of c (generic mutant number_replacer@_beam_search#1:-1.0 of impl) or another
# exponent. Neither changes which hypotheses the search keeps or when it stops, only which
# finished one wins, and then only where finished hypotheses differ in length: each variant is
# covered by rows of its own, on which its winner differs from the pinned one.
FORMULA_VARIANTS = {
    "initial log-probability -1": (-1.0, 0.0),
    "initial log-probability +1": (1.0, 0.0),
    "length_penalty - 0.5": (0.0, -0.5),
    "length_penalty + 0.5": (0.0, 0.5),
}
# the rows' seed and how many to draw; the beam sizes and penalties of the beam test's settings
# where the formula can decide (beam 1 finishes one hypothesis)
FORMULA_ROWS = (90, 16)
FORMULA_SETTINGS = ((2, 3, 4), (0.0, 1.0, 2.0))


def _variants_decided(params: Any, memory: Any, mask: Any, eos: int, max_len: int) -> set[str]:
    """The formula variants whose winner differs from the pinned search's for some beam size and
    penalty of FORMULA_SETTINGS, every difference beyond rounding: the pinned winner beats its
    runner-up, and every choice on the way is apart (the search's gaps), by more than
    CLEAR_WINNER, and under the variant's scores another hypothesis beats the pinned winner by
    more than CLEAR_WINNER. (The penalty changes the scores only: one search per beam size.)"""
    found: set[str] = set()
    beams, penalties = FORMULA_SETTINGS
    for beam in beams:
        gaps: list[float] = []
        finished = oracle.beam_search(params, memory, mask, BOS, eos, max_len, beam, 0.0, gaps=gaps)
        if len(finished) < 2 or min(gaps, default=math.inf) <= CLEAR_WINNER:
            continue
        logp = np.array([h.logp for h in finished])
        length = np.array([max(len(h.tokens), 1) for h in finished], dtype=np.float64)
        for penalty in penalties:
            pinned = logp / length**penalty
            best = int(np.argmax(pinned))  # the first of equal scores
            if np.sort(pinned)[-2] >= pinned[best] - CLEAR_WINNER:
                continue  # no clear pinned winner
            for name, (offset, exponent) in FORMULA_VARIANTS.items():
                moved = (logp + offset) / length ** (penalty + exponent)
                if moved.max() - moved[best] > CLEAR_WINNER:
                    found.add(name)
    return found


_FORMULA_CASES: dict[tuple, dict[int, list[np.ndarray]]] = {}


def formula_cases(
    params: Any, cfg: dict, max_len: int, preferred: list[int]
) -> dict[int, list[np.ndarray]]:
    """Source rows by eos, at most one row per variant of FORMULA_VARIANTS, on which that
    variant's winner differs from the pinned search's (`_variants_decided`): for each eos in
    turn (`preferred` first, the eos of the searches the test runs anyway, then every real token
    in id order), the rows drawn from FORMULA_ROWS' seed (the same for every eos) that cover a
    variant not yet covered. Which hypotheses finish, and how long they are, is the weights' to
    decide, so the eos is chosen for them; a variant that no eos covers under these weights is
    left uncovered (the run's draws, not the subject, came short)."""
    order = list(dict.fromkeys([*preferred, *range(EOS + 1, cfg["tgt_vocab"])]))
    key = (max_len, tuple(order), params_key(params))
    if key not in _FORMULA_CASES:
        _FORMULA_CASES[key] = bounds_store.remembered(_formula_cases, params, cfg, max_len, order)
    return _FORMULA_CASES[key]


def _formula_cases(
    params: Any, cfg: dict, max_len: int, order: list[int]
) -> dict[int, list[np.ndarray]]:
    seed, tries = FORMULA_ROWS
    rng = np.random.default_rng(seed)
    rows = [tokens(rng, cfg["src_vocab"], (int(rng.integers(2, 6)),)) for _ in range(tries)]
    masks = [np.ones((1, len(row)), bool) for row in rows]
    memories = [oracle.encode(params, row[None], m) for row, m in zip(rows, masks, strict=True)]
    left = set(FORMULA_VARIANTS)
    cases: dict[int, list[np.ndarray]] = {}
    for eos in order:
        for row, memory, mask in zip(rows, memories, masks, strict=True):
            if found := _variants_decided(params, memory, mask, eos, max_len) & left:
                cases.setdefault(eos, []).append(row)
                left -= found
            if not left:
                break
        if not left:
            break
    return cases
