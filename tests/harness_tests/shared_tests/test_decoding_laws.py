"""The decoding laws reach the contract's clauses a generic mutant of impl showed unreached:
decode_step given y_prev with fewer rows than its state, and batches of more than 256 rows
through decode_step and translate (a size compared with `is not` holds for CPython's cached
small integers only). Each mutant is impl with the slip written in, loaded in this process
(trusted code) and judged through the probes a grader's worker runs. The beam test also kills
an offset initial log-probability under the draws that left it, and leaves a broken
load_transformer to the translate test."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from harness.isolation.child import probes
from harness.isolation.child.load import from_source
from harness.shared_tests import inputs
from harness.shared_tests.laws import BY_NAME
from harness.shared_tests.record import Failure
from harness.subjects import module_source

ROOT = Path(__file__).resolve().parents[3]
SOURCE = module_source("impl.transformer")[1]
STEP = "test_decode_step_equals_forward"
TRANSLATE = "test_translate_is_greedy_with_beam_one_and_drops_eos"
VALIDATION = "test_validation"
BEAM = "test_beam_search_matches_oracle"
ROWS_CHECK = "if y_prev.dim() != 1 or y_prev.size(0) != state.src_mask.size(0):"


def mutant(old: str, new: str):
    assert SOURCE.count(old) == 1, old
    return from_source(SOURCE.replace(old, new), "<impl mutant>", name="xfmr_decoding_mutant")


def check(test: str, module) -> None:
    BY_NAME[test].check(lambda probe, **inputs: probes.PROBES[probe](module, **inputs))


@pytest.mark.slow
def test_impl_passes_the_decoding_laws_at_every_batch_size():
    module = from_source(SOURCE, "<impl>", name="xfmr_decoding_impl")
    check(STEP, module)
    check(TRANSLATE, module)


def test_y_prev_checked_one_way_only_is_charged_once():
    # `>` for `!=`: more rows raise ValueError (test_validation holds), fewer pass silently
    module = mutant(ROWS_CHECK, ROWS_CHECK.replace("!= state", "> state"))
    with pytest.raises(Failure, match="y_prev of 2 rows for a state of 3 rows"):
        check(STEP, module)
    check(VALIDATION, module)


def test_sizes_compared_by_identity_fail_past_256_rows():
    # `is not` for `!=` between two sizes: equal ints are one object only up to 256
    module = mutant(ROWS_CHECK, ROWS_CHECK.replace("!= state", "is not state"))
    with pytest.raises(Failure, match="decode_step on 264 rows raised ValueError: y_prev must"):
        check(STEP, module)
    old = "    src = src.to(next(model.parameters()).device)\n"
    module = mutant(
        old, old + "    if src.size(0) is not len(src):\n        raise ValueError('rows lost')\n"
    )
    with pytest.raises(Failure, match="translate on 264 rows raised ValueError: rows lost"):
        check(TRANSLATE, module)


STOP_RULE = "if len(finished) >= beam_size or not live:\n            break"
STOP_RULE_SLIPS = {
    "exactly beam_size finished": STOP_RULE.replace(">=", "=="),
    "stops only with nothing live": STOP_RULE.replace(" or ", " and "),
    "never stops early": STOP_RULE.replace("break", "continue"),
}


@pytest.fixture
def draw_secret():
    """Set the run's secret for a test, and restore the one it had."""
    before = inputs.draw_secret()
    yield inputs.set_draw_secret
    inputs.set_draw_secret(before)


# The draws under which the beam test's drawn rows left these slips alive before it chose rows
# where the stop rule decides the winner (XFMR_DRAW_SEED 9 left all three, 5 one).
@pytest.mark.parametrize("secret", [9, 5])
@pytest.mark.slow
def test_impl_passes_the_beam_test_under_those_draws(draw_secret, secret):
    draw_secret(secret)
    check(BEAM, from_source(SOURCE, "<impl>", name="xfmr_decoding_impl"))


@pytest.mark.parametrize("secret", [9, 5])
@pytest.mark.parametrize("slip", sorted(STOP_RULE_SLIPS))
@pytest.mark.slow
def test_the_beam_test_kills_stop_rule_slips_under_any_draw(draw_secret, secret, slip):
    draw_secret(secret)
    module = mutant(STOP_RULE, STOP_RULE_SLIPS[slip])
    with pytest.raises(Failure, match="the pinned beam search gives"):
        check(BEAM, module)


# The initial log-probability of the beam search offset by -1 (generic mutant
# number_replacer@_beam_search#1:-1.0): the draws under which the beam test left it alive when its
# formula rows were chosen for any variant of the score at once, with the test's own eos.
# XFMR_OFFSET_DRAWS=0-59 runs the whole sweep (both offsets killed under each: 5 minutes).
INITIAL_LOGP = "live = [((), 0.0, model.init_state(src_mask))]"
OFFSET_DRAWS = os.environ.get("XFMR_OFFSET_DRAWS", "21,24,25,29,32,39,54,57")


def _draws(text: str) -> list[int]:
    first, _, last = text.partition("-")
    return list(range(int(first), int(last) + 1)) if last else [int(x) for x in text.split(",")]


@pytest.mark.parametrize("secret", _draws(OFFSET_DRAWS))
@pytest.mark.parametrize("offset", ["-1.0", "1.0"])
@pytest.mark.slow
def test_the_beam_test_kills_an_offset_initial_log_probability_under_those_draws(
    draw_secret, secret, offset
):
    draw_secret(secret)
    module = mutant(INITIAL_LOGP, INITIAL_LOGP.replace("0.0", offset))
    with pytest.raises(Failure, match="the pinned beam search gives"):
        check(BEAM, module)


CORRECT = ROOT / "examples" / "correct_submission.py"
# load_transformer that rebuilds the config without its norm: every loaded model is post-LN, and
# a pre-LN model's enc_norm/dec_norm do not load
IGNORES_THE_NORM = """

def load_transformer(dir):
    path = Path(dir)
    fields = json.loads((path / "config.json").read_text())
    fields.pop("norm")
    weights = load_file(path / "model.safetensors")
    model = Transformer(TransformerConfig(**fields)).to(next(iter(weights.values())).dtype)
    model.load_state_dict(weights)
    return model
"""


@pytest.mark.slow
def test_a_load_that_ignores_the_norm_is_charged_to_the_translate_test_only(draw_secret):
    # the beam test searches a model given the parent's weights directly, never a loaded one
    draw_secret(0)
    text = CORRECT.read_text()
    assert "\ndef load_transformer(" in text
    module = from_source(text + IGNORES_THE_NORM, "<overlay>", name="xfmr_load_ignores_norm")
    with pytest.raises(RuntimeError, match="enc_norm"):
        check(TRANSLATE, module)
    check(BEAM, module)
