"""The forward pass's derived error bound (oracle.forward_bounds, a view of oracle/roundoff.py)
as data: honest subjects in float32, bfloat16 and float16 stay inside it on every real logit
and traced boundary; faults leave it.

Hypothesis draws small configurations (both norms, every tying, 1-2 layers, d 8-32), weights and
padded batches; impl (with its traced modules) and the torch copy run in each dtype on the CPU.
`xfmr bound-check` runs the same over hundreds of configurations with more subjects
(results/oracle/bound_false_alarms.md).
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

import oracle
from harness.tools.bound_check import DTYPES, draw_case, ratios, run_subject
from impl import torch_copy
from impl import transformer as impl
from oracle.error_bounds import forward_bounds, label_smoothed_loss_bound
from oracle.precision import PRECISIONS

SMALL = (8, 16, 32)  # widths: the CI cost stays a few seconds per dtype


@pytest.mark.parametrize("dtype", list(DTYPES))
@settings(max_examples=25, deadline=None, derandomize=True, database=None)
@given(seed=st.integers(0, 2**31))
@pytest.mark.slow
def test_honest_subjects_stay_inside_the_bound(dtype, seed):
    case = draw_case(np.random.default_rng(seed), seed, SMALL)
    for build in (impl.Transformer, torch_copy.Transformer):
        params, logits, seen = run_subject(build, case, dtype, trace=build is impl.Transformer)
        found = ratios(case, params, logits, seen, dtype)
        # the law: |subject - oracle| <= bound on every real logit and traced boundary
        assert max(found.values()) < 1, (build.__module__, dtype, case.cfg, found)


@pytest.mark.parametrize("dtype", list(DTYPES))
def test_the_loss_of_honest_logits_stays_inside_its_bound(dtype):
    case = draw_case(np.random.default_rng(5), 5, SMALL)
    b = case.batch
    params, logits, _ = run_subject(impl.Transformer, case, dtype)
    want, bound = label_smoothed_loss_bound(
        params, b["src"], b["tgt_in"], b["tgt_out"], b["src_mask"], b["tgt_mask"], 0.1, 0, dtype
    )
    z = torch.tensor(logits).to(DTYPES[dtype])
    got = float(impl.label_smoothed_loss(z, torch.tensor(b["tgt_out"]), 0.1, 0))
    assert abs(got - want) <= bound, (got, want, bound)
    # useful, not vacuous: measured 11-19 u of the loss in bfloat16/float16 and 50-70 u in
    # float32 (where the accumulation's sqrt(n) sum|t| dominates), 4 draws each
    assert bound < 128 * PRECISIONS[dtype].u * max(1.0, abs(want))


def test_float64_bound_is_a_few_hundred_ulps_and_holds():
    case = draw_case(np.random.default_rng(3), 3, SMALL)
    params, logits, _ = run_subject(impl.Transformer, case, "float32")
    b = case.batch
    model = impl.Transformer(case.cfg).double().eval()
    state = {k: torch.tensor(v) for k, v in params.arrays.items() if k in model.state_dict()}
    model.load_state_dict(state)
    with torch.no_grad():
        got = model(*(torch.tensor(b[k]) for k in ("src", "tgt_in", "src_mask", "tgt_mask")))
    fb = forward_bounds(params, b["src"], b["tgt_in"], b["src_mask"], b["tgt_mask"], "float64")
    keep = np.broadcast_to(b["tgt_mask"][..., None], fb.logits.shape)
    assert np.all(np.abs(got.numpy() - fb.logits)[keep] <= fb.bound[keep])
    assert fb.bound.max() < 1e-12 * max(1.0, np.abs(fb.logits).max())


def test_a_layer_norm_eps_off_by_ten_is_outside_the_float32_bound():
    # a fault of the course (an eps other than the config's) must not hide inside the bound
    case = draw_case(np.random.default_rng(7), 7, SMALL)
    case.cfg["ln_eps"] = 1e-5
    b = case.batch
    params, logits, _ = run_subject(impl.Transformer, case, "float32")
    faulty = oracle.Params(
        oracle.ModelSpec(**{**params.spec.__dict__, "ln_eps": 1e-4}), params.arrays
    )
    fb = forward_bounds(faulty, b["src"], b["tgt_in"], b["src_mask"], b["tgt_mask"], "float32")
    keep = np.broadcast_to(b["tgt_mask"][..., None], fb.logits.shape)
    assert np.any((np.abs(logits - fb.logits) > fb.bound)[keep])


def test_the_bound_is_deterministic_and_traces_what_the_oracle_traces():
    case = draw_case(np.random.default_rng(11), 11, SMALL)
    b = case.batch
    params, _, _ = run_subject(impl.Transformer, case, "bfloat16")
    args = (params, b["src"], b["tgt_in"], b["src_mask"], b["tgt_mask"], "bfloat16")
    one, two = forward_bounds(*args), forward_bounds(*args)
    assert np.array_equal(one.bound, two.bound)
    _, trace = oracle.forward(*args[:5], trace=True)
    assert list(one.trace_bound) == list(trace)
    assert all(one.trace_bound[k].shape == v.shape for k, v in trace.items())
