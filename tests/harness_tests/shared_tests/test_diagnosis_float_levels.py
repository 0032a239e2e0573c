"""A diagnosis names float32 only where float64 rounding cannot explain the error (issue 35): an
x0 off by a float64 rounding of a sum that cancels is not 'float32 rounding: the positional
table computed in float32'; a table rounded to float32 still is."""

from __future__ import annotations

import math

import numpy as np

import oracle
from harness.shared_tests.diagnosis_answer import FLOAT32_LEVEL, FLOAT64_LEVEL
from harness.shared_tests.diagnosis_faults import embedding_causes
from harness.shared_tests.inputs import config, contract_shapes, draw_weights
from oracle.ops import positional_encoding


def _case():
    cfg = config(norm="pre", n_enc=1, n_dec=1)
    shapes = {k: list(v) for k, v in contract_shapes(cfg).items()}
    params = oracle.read_state_dict(draw_weights(shapes, cfg, 3), cfg)
    ids = np.array([[1, 2, 3, 4, 5, 6], [7, 8, 9, 0, 0, 0]])
    mask = ids != 0
    mask[0] = True
    E, d = params.arrays[params.src_table], cfg["d_model"]
    x = E[ids] * math.sqrt(d)
    return params, ids, mask, x, positional_encoding(ids.shape[1], d)


def test_an_error_of_float64_rounding_is_not_named_float32():
    params, ids, mask, x, pe = _case()
    got = x + pe
    got[0, 3, 2] += 2.0**-52  # a float64 subject's few ulps where x0 cancels
    assert embedding_causes(got, params, params.src_table, ids, mask, 1e-15) == ""


def test_a_float32_table_is_still_named():
    params, ids, mask, x, pe = _case()
    got = x + pe.astype(np.float32).astype(np.float64)
    err = np.abs(got - (x + pe)).max()
    assert FLOAT64_LEVEL < err < FLOAT32_LEVEL
    assert "float32 rounding" in embedding_causes(got, params, params.src_table, ids, mask, 1e-15)
