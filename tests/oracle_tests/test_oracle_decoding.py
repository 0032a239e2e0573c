"""The oracle's decode_step (a KV cache) and translate (the contract's pinned beam search)."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from oracle_cases import (
    make_batch,
    make_model,
    max_abs,
)

import oracle
from impl import transformer as impl

# decode_step and forward compute the same sums in a different grouping (one query row against
# cached keys vs all rows at once): rounding differences only, as in test_oracle_forward.
F64_TOL = 1e-12

# Beam decisions compare sums of log-probabilities; impl in float64 and the oracle differ by
# ~1e-14 per logit, so over <= 8 steps a score differs by < 1e-12. A row whose best hypothesis
# beats the runner-up by more than 1e-9 cannot flip; closer rows are too close to call.
MARGIN = 1e-9

BOS, EOS, PAD = 1, 2, 0


@pytest.mark.parametrize("norm", ["post", "pre"])
def test_decode_step_equals_forward_rows(norm):
    model = make_model(norm, False, 11, 13, seed=7)
    params = oracle.read_state_dict(model)
    src, tgt, src_mask, _ = (t.numpy() for t in make_batch(model.cfg, seed=7))
    tgt_mask = np.ones_like(tgt, dtype=bool)
    full = oracle.forward(params, src, tgt, src_mask, tgt_mask)
    memory = oracle.encode(params, src, src_mask)
    state = oracle.init_state(params, src_mask)
    for t in range(tgt.shape[1]):
        logits, state = oracle.decode_step(params, tgt[:, t], memory, state)
        assert max_abs(logits, full[:, t]) < F64_TOL, t
        assert state.position == t + 1 and state.self_kv[0][0].shape[2] == t + 1


def test_decode_step_never_mutates_its_state():
    model = make_model("pre", True, 11, 11, seed=8)
    params = oracle.read_state_dict(model)
    src, _, src_mask, _ = (t.numpy() for t in make_batch(model.cfg, seed=8))
    memory = oracle.encode(params, src, src_mask)
    _, state = oracle.decode_step(
        params, np.full(3, BOS), memory, oracle.init_state(params, src_mask)
    )
    first, _ = oracle.decode_step(params, np.array([3, 4, 5]), memory, state)
    oracle.decode_step(params, np.array([6, 7, 8]), memory, state)
    again, _ = oracle.decode_step(params, np.array([3, 4, 5]), memory, state)
    assert np.array_equal(first, again)


def _greedy_by_forward(params, src_row, max_len) -> list[int]:
    """Argmax decoding by hand: the whole prefix through forward at every step."""
    src = src_row[None]
    tokens = [BOS]
    for _ in range(max_len):
        tgt = np.array([tokens])
        logits = oracle.forward(params, src, tgt, src != PAD, np.ones_like(tgt, dtype=bool))
        nxt = int(np.argmax(logits[0, -1]))
        if nxt == EOS:
            break
        tokens.append(nxt)
    return tokens[1:]


def _model_and_sources(norm: str, seed: int):
    model = make_model(norm, False, 11, 13, seed=seed)
    with torch.no_grad():  # make eos likely enough that some hypotheses finish
        model.out.weight[EOS] *= 3
    g = torch.Generator().manual_seed(seed)
    src = torch.randint(3, 11, (6, 5), generator=g)
    src[1, 3:] = PAD
    src[4, 1:] = PAD
    return model, src


@pytest.mark.parametrize("norm", ["post", "pre"])
def test_translate_beam_one_is_a_hand_argmax_loop(norm):
    model, src = _model_and_sources(norm, seed=9)
    params = oracle.read_state_dict(model)
    got = oracle.translate(params, src, BOS, EOS, PAD, max_len=8)
    assert got == [_greedy_by_forward(params, row, 8) for row in src.numpy()]
    assert any(len(tokens) < 8 for tokens in got)  # some rows chose eos


@pytest.mark.parametrize("norm", ["post", "pre"])
def test_impl_beam_search_equals_the_oracles(norm):
    model, src = _model_and_sources(norm, seed=10)
    params = oracle.read_state_dict(model)
    memory = oracle.encode(params, src, src != PAD)
    src_mask = (src != PAD).numpy()
    compared = total = finished_by_eos = 0
    for beam in (1, 2, 3, 4):
        for penalty in (0.0, 1.0, 2.0):
            ours = oracle.translate(params, src, BOS, EOS, PAD, 8, beam, penalty)
            theirs = impl.translate(model, src, BOS, EOS, PAD, 8, beam, penalty)
            for b in range(src.shape[0]):
                finished = oracle.beam_search(
                    params, memory[b : b + 1], src_mask[b : b + 1], BOS, EOS, 8, beam, penalty
                )
                scores = sorted((h.score for h in finished), reverse=True)
                finished_by_eos += any(h.tokens[-1:] == (EOS,) for h in finished)
                total += 1
                if len(scores) == 1 or scores[0] - scores[1] > MARGIN:
                    compared += 1
                    assert ours[b] == theirs[b], (beam, penalty, b)
    assert compared >= 0.9 * total, f"only {compared} of {total} rows were clear enough to compare"
    assert finished_by_eos >= total // 2  # the eos path is exercised, not only max_len


def test_translate_drops_eos_and_respects_max_len():
    model, src = _model_and_sources("post", seed=11)
    params = oracle.read_state_dict(model)
    for beam in (1, 3):
        for tokens in oracle.translate(params, src, BOS, EOS, PAD, max_len=4, beam_size=beam):
            assert EOS not in tokens and len(tokens) <= 4
    assert oracle.translate(params, src, BOS, EOS, PAD, max_len=0) == [[]] * 6
