"""Defaults judged where the subject cannot tell a probe from an ordinary call (issue 49).

Three submissions give twice the contract's Noam rate in ordinary calls that leave `factor` out
and the contract's rate where they guess a check is looking: keyed on their own call history
(a call leaving it out for arguments already given it), on the calling stack frame (the
defaults probe's helper) and on the call count (the first three calls leaving it out). Each is
an overlay on examples/correct_submission.py (tests/harness_tests/isolation/hostile/steer_*.py).
The defaults law draws its inputs, the number of calls, which arguments each leaves out and
their order from the run's secret, and calls noam_rate through two probes: each overlay fails it
under every draw, and the correct submission passes under the same draws.

Each subject is loaded afresh per draw (a grade's worker is fresh) and judged through the
probes a grader's worker runs, in this process (trusted code)."""

from __future__ import annotations

import itertools
from pathlib import Path

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
DRAWS = 20
_names = itertools.count()


def subject(attack: str | None):
    source = (
        CORRECT if attack is None else CORRECT + "\n\n" + (HOSTILE / f"{attack}.py").read_text()
    )
    return from_source(source, f"<{attack or 'correct'}>", name=f"xfmr_steer_{next(_names)}")


def verdict(attack: str | None) -> str | None:
    """The defaults law on a fresh subject: None where it holds, else its message."""
    module = subject(attack)
    try:
        LAW.check(lambda probe, **kw: probes.PROBES[probe](module, **kw))
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


@pytest.mark.slow
def test_every_steering_submission_fails_and_the_correct_one_passes_under_20_draws(draw_secret):
    missed: dict[str, list[int]] = {a: [] for a in ATTACKS}
    alarms: list[tuple[int, str]] = []
    for secret in range(DRAWS):
        draw_secret(secret)
        message = verdict(None)
        if message is not None:
            alarms.append((secret, message))
        for attack in ATTACKS:
            if not charged(verdict(attack)):
                missed[attack].append(secret)
    assert not alarms, alarms
    assert not any(missed.values()), missed
