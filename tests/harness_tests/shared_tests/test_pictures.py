"""harness.shared_tests.pictures: the pictures of `xfmr check --html` measured through the same
probe calls a worker answers, here answered by the oracle itself (a correct model, one reading
the source padding, one not causal, one giving NaN). Fast: no worker (the real command, read
back in Chromium, is tests/harness_tests/students/test_check_page_in_chromium.py)."""

from __future__ import annotations

import numpy as np
import pytest

import oracle
import oracle.model
from harness.shared_tests import pictures
from harness.shared_tests.inputs import contract_shapes

T, S, REAL = pictures.TARGET, pictures.SOURCE, pictures.REAL


def oracle_subject(reads_padding: bool = False, nan: bool = False):
    """A probe caller answered by the oracle: the contract's model on the weights pushed in
    (optionally reading every source position, padded ones included, or giving NaN logits)."""

    def call(probe: str, **inputs):
        if probe == "parameter_layout":
            return [
                {"shapes": {k: list(v) for k, v in contract_shapes(c).items()}, "aliases": {}}
                for c in inputs["cfgs"]
            ]
        assert probe == "forward_logits", probe
        params = oracle.read_state_dict(inputs["weights"], inputs["cfg"])
        logits = []
        for b in inputs["batches"]:
            src_mask = np.ones_like(b["src_mask"]) if reads_padding else b["src_mask"]
            out = oracle.forward(params, b["src"], b["tgt_in"], src_mask, b["tgt_mask"])
            logits.append(np.full_like(out, np.nan) if nan else out)
        return {"dtype": "float64", "logits": logits, "state_dict": inputs["weights"]}

    return call


def forbidden(grid) -> set[tuple[int, int]]:
    return set(grid.forbidden_reads)


def test_a_correct_model_reads_exactly_what_the_contract_allows():
    targets, source = pictures.dependence(oracle_subject())
    assert targets.reads == targets.allowed == [[j <= i for j in range(T)] for i in range(T)]
    assert source.reads == source.allowed == [[j < REAL for j in range(S)] for _ in range(T)]
    assert not forbidden(targets) and not forbidden(source)
    assert all(targets.finite) and "(pad)" in source.cols[REAL] and "(pad)" not in source.cols[0]


def test_a_model_reading_source_padding_reads_every_padded_column():
    targets, source = pictures.dependence(oracle_subject(reads_padding=True))
    assert forbidden(source) == {(i, j) for i in range(T) for j in range(REAL, S)}
    assert not forbidden(targets)


def test_a_model_without_the_causal_mask_reads_the_future(monkeypatch):
    def no_causal(tgt_mask):
        return np.broadcast_to(tgt_mask[:, None, None, :], (tgt_mask.shape[0], 1, T, T))

    monkeypatch.setattr(oracle.model, "target_attention_mask", no_causal)
    targets, source = pictures.dependence(oracle_subject())
    assert forbidden(targets) == {(i, j) for i in range(T) for j in range(T) if j > i}
    assert not forbidden(source)


def test_outputs_that_are_not_finite_are_said_never_read():
    targets, source = pictures.dependence(oracle_subject(nan=True))
    assert targets.finite == [False] * T and not forbidden(targets) and not forbidden(source)


def test_a_malformed_answer_is_a_failure_of_the_picture_not_a_crash():
    def call(probe, **inputs):
        if probe == "parameter_layout":
            return oracle_subject()(probe, **inputs)
        return {"logits": [np.zeros((2, 3))] * 16, "state_dict": inputs["weights"]}

    with pytest.raises(pictures.Failure, match="shape"):
        pictures.dependence(call)
