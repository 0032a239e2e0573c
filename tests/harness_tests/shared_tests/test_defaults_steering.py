"""Defaults judged where the subject cannot tell a probe from an ordinary call (issue 49).

Three submissions give twice the contract's Noam rate in ordinary calls that leave `factor` out
and the contract's rate where they guess a check is looking: keyed on their own call history
(a call leaving it out for arguments already given it), on the calling stack frame (the
defaults probe's helper) and on the call count (the first three calls leaving it out). Each is
an overlay on examples/correct_submission.py (tests/harness_tests/isolation/hostile/steer_*.py).
The defaults law draws its inputs, the number of calls, which arguments each leaves out and
their order from the run's secret, and calls noam_rate through two probes: each overlay fails it
under every draw, and the correct submission passes under the same draws.

A fourth (steer_defaults_frame) keys on what only the defaults law's probe has: its fit keeps
the contract's factor only when called from a probe whose function name holds "default". The
defaults law cannot see it; the laws that call the contract's functions anyway (the Noam hand
example, fit, translate and the beam search) leave the defaulted arguments out at secret points
(harness.shared_tests.omitted), and the fit law, which owns the call, fails it under every draw
(before, every law passed it).

Each subject is loaded afresh per draw (a grade's worker is fresh) and judged through the
probes a grader's worker runs, in this process (trusted code)."""

from __future__ import annotations

import itertools
from pathlib import Path

import numpy as np
import pytest

from harness.isolation.child import probes
from harness.isolation.child.load import from_source
from harness.shared_tests import inputs
from harness.shared_tests.laws import BY_NAME
from harness.shared_tests.record import Failure

ROOT = Path(__file__).resolve().parents[3]
HOSTILE = ROOT / "tests" / "harness_tests" / "isolation" / "hostile"
CORRECT = (ROOT / "examples" / "correct_submission.py").read_text()
LAW = BY_NAME["test_defaults_are_the_contracts"]
ATTACKS = ("steer_defaults_history", "steer_defaults_stack", "steer_defaults_count")
FRAME = "steer_defaults_frame"
FIT = "test_fit_follows_the_schedule_and_is_reproducible"
# the laws that leave the contract's defaults out of calls they make anyway (issue 49)
ORDINARY = (
    "test_hand_example_noam",
    FIT,
    "test_translate_is_greedy_with_beam_one_and_drops_eos",
    "test_beam_search_matches_oracle",
)
DRAWS = 20
_names = itertools.count()


def subject(attack: str | None):
    source = (
        CORRECT if attack is None else CORRECT + "\n\n" + (HOSTILE / f"{attack}.py").read_text()
    )
    return from_source(source, f"<{attack or 'correct'}>", name=f"xfmr_steer_{next(_names)}")


def verdict(attack: str | None, law: str = LAW.name) -> str | None:
    """A law (the defaults law unless named) on a fresh subject: None where it holds, else its
    message."""
    module = subject(attack)
    try:
        BY_NAME[law].check(lambda probe, **kw: probes.PROBES[probe](module, **kw))
    except Failure as e:
        return str(e)
    return None


@pytest.fixture
def draw_secret():
    """Set the run's secret for a test, and restore the one it had."""
    before = inputs.draw_secret()
    yield inputs.set_draw_secret
    inputs.set_draw_secret(before)


def charged(message: str | None) -> bool:
    return message is not None and "with factor left out" in message and "2 times it" in message


@pytest.mark.parametrize("attack", ATTACKS)
def test_a_steering_noam_rate_fails_the_defaults_law(draw_secret, attack):
    draw_secret(49)
    message = verdict(attack)
    assert charged(message), message


def test_the_correct_submission_passes_the_defaults_law(draw_secret):
    draw_secret(49)
    assert verdict(None) is None


def charged_by_fit(message: str | None) -> bool:
    return (
        message is not None
        and "with factor left out: update" in message
        and "the default in effect is not the contract's" in message
    )


def test_a_fit_keyed_on_the_defaults_probe_fails_the_fit_law_not_the_defaults_law(draw_secret):
    draw_secret(49)
    assert verdict(FRAME) is None  # the defaults law's calls all come from its own probe
    message = verdict(FRAME, FIT)
    assert charged_by_fit(message), message
    assert verdict(None, FIT) is None


def test_the_ordinary_laws_leave_defaults_out_at_secret_points(draw_secret):
    # which fit runs leave factor out, and which translate settings leave their defaults out,
    # change with the run's secret (and every draw leaves something out)
    from harness.shared_tests.laws.training import FIT_LEFT_OUT
    from harness.shared_tests.omitted import TRANSLATE_DEFAULTS, secret_picks, trimmed

    settings = [[b, p] for b in (1, 2, 3, 4) for p in (0.0, 1.0, 2.0)]
    fits, sent = set(), set()
    for secret in range(8):
        draw_secret(secret)
        picks = tuple(secret_picks([True] * len(FIT_LEFT_OUT), "fit runs"))
        assert any(picks)
        fits.add(picks)
        cut = trimmed(settings, TRANSLATE_DEFAULTS, "translate", "a call")
        assert all(c == s[: len(c)] for c, s in zip(cut, settings, strict=True))
        assert all(len(c) == 2 for c, s in zip(cut, settings, strict=True) if s[1] != 1.0)
        assert any(len(c) < 2 for c in cut)
        sent.add(repr(cut))
    assert len(fits) > 2 and len(sent) > 2


@pytest.mark.slow
def test_every_steering_submission_fails_and_the_correct_one_passes_under_20_draws(draw_secret):
    missed: dict[str, list[int]] = {a: [] for a in (*ATTACKS, FRAME)}
    alarms: list[tuple[int, str, str]] = []
    for secret in range(DRAWS):
        draw_secret(secret)
        for law in (LAW.name, *ORDINARY):
            message = verdict(None, law)
            if message is not None:
                alarms.append((secret, law, message))
        for attack in ATTACKS:
            if not charged(verdict(attack)):
                missed[attack].append(secret)
        if not charged_by_fit(verdict(FRAME, FIT)):
            missed[FRAME].append(secret)
    assert not alarms, alarms
    assert not any(missed.values()), missed


def same_bits(a, b) -> bool:
    from harness.shared_tests.laws.interface import same

    return same(a, b)


def test_leaving_the_defaults_out_changes_nothing_for_a_correct_subject():
    # the probes' calls with the contract's defaults left out give a correct subject's results
    # to the bit: the learning run (warmup and factor of no effect under lr, seed 0), fit's runs
    # (factor 1.0) and translate (beam_size 1, length_penalty 1.0)
    from harness.shared_tests.inputs import PAD, batch, config

    module = subject(None)
    cfg = config(n_enc=1, n_dec=1)
    b = batch(np.random.default_rng(0), cfg, src_lens=[4, 3, 5], tgt_lens=[3, 2, 4])
    tgt = np.concatenate([b["tgt_in"], b["tgt_out"][:, -1:]], axis=1)
    data = {"src": b["src"], "tgt": tgt, "pad_id": PAD}
    learn = {"cfg": cfg, "data": data, "steps": 4, "batch": 2, "warmup": 4, "factor": 1.0}
    whole = probes.PROBES["learn"](module, **learn, lr=0.01, seed=0)
    cut = probes.PROBES["learn"](module, **learn, lr=0.01, left_out=["warmup", "factor", "seed"])
    assert whole["losses"] and same_bits(whole["losses"], cut["losses"])
    assert same_bits(whole["state_dict"], cut["state_dict"])
    fits = {"cfg": cfg, "data": data, "steps": 3, "batch": 2, "warmup": 4, "factor": 1.0}
    fits |= {"lr": 0.01, "fit_seed": 3}
    runs = ("noam_again", "constant", "from_eval", "batch_one")
    whole = probes.PROBES["fit_runs"](module, **fits)
    cut = probes.PROBES["fit_runs"](module, **fits, left_out={n: ["factor"] for n in runs})
    assert same_bits(whole["runs"], cut["runs"])
    weights = {k: v.numpy() for k, v in module.Transformer(module.TransformerConfig(**cfg))
               .state_dict().items()}  # fmt: skip
    common = {"cfg": cfg, "weights": weights, "src": b["src"], "bos": 1, "eos": 2, "pad_id": PAD}
    common |= {"max_len": 5, "train_mode": False, "save_load": False}
    whole = probes.PROBES["translations"](module, **common, settings=[[1, 1.0], [3, 1.0]])
    cut = probes.PROBES["translations"](module, **common, settings=[[], [3]])
    assert same_bits(whole["outputs"], cut["outputs"])
