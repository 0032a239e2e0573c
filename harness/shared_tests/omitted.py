"""The contract's defaulted arguments left out of the ordinary laws' calls, at secret points
(issue 49).

test_defaults_are_the_contracts calls each function leaving its defaults out, on secret inputs
in a secret order; but its calls come from probes of their own, and a subject that inspects its
stack could tell them apart and keep an honest default for them alone. So the laws that already
call a contract function with arguments equal to the contract's defaults (the Noam hand example,
fit, translate) leave some of those arguments out: which calls, and how many trailing arguments
each leaves out, are drawn from the run's secret, and what the call returns is judged as before,
against the oracle with the contract's defaults. A call leaving an argument out reaches the
subject like any other call of that law, from the same probe, so no history, count, stack or
input tells a subject which of its calls gave every argument; a subject whose default in effect
differs on any of them fails the law that made the call (its message says the argument was left
out).

Where a call's arguments differ from the contract's defaults nothing is left out: the law judges
them as given.
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from typing import Any

import numpy as np

from harness.shared_tests.inputs import draw_seed

# translate(model, src, bos, eos, pad_id, max_len, beam_size=1, length_penalty=1.0): its
# defaulted trailing arguments, in order (CONTRACT.md)
TRANSLATE_DEFAULTS = (1, 1.0)
TRANSLATE_NAMES = ("beam_size", "length_penalty")
# noam_rate(step, d_model, warmup, factor=1.0)
NOAM_DEFAULTS = (1.0,)


def droppable(values: Sequence[Any], defaults: Sequence[Any]) -> int:
    """How many trailing `values` may be left out: the longest tail equal to the contract's
    defaults for those positions (`values` end with the defaulted arguments, in order)."""
    n = 0
    for value, default in zip(reversed(values), reversed(defaults), strict=False):
        if value != default or isinstance(value, bool) != isinstance(default, bool):
            break
        n += 1
    return n


def secret_picks(eligible: Sequence[bool], *purpose: Any) -> list[bool]:
    """Which of the eligible positions leave their defaults out in this run: each with even odds,
    at least one where any is eligible, drawn from the run's secret and `purpose`."""
    rng = np.random.default_rng(draw_seed("defaults left out", *purpose))
    picks = [bool(ok) and bool(rng.random() < 0.5) for ok in eligible]
    where = [i for i, ok in enumerate(eligible) if ok]
    if where and not any(picks):
        picks[where[int(rng.integers(len(where)))]] = True
    return picks


def trimmed(
    calls: Sequence[Sequence[Any]], defaults: Sequence[Any], *purpose: Any
) -> list[list[Any]]:
    """Each call's trailing defaulted arguments as sent: at the secret picks (secret_picks), a
    drawn number (1 up to what droppable allows) of trailing arguments equal to the contract's
    defaults left out; every other call whole."""
    most = [droppable(c, defaults) for c in calls]
    picks = secret_picks([m > 0 for m in most], *purpose)
    rng = np.random.default_rng(draw_seed("defaults left out: how many", *purpose))
    out = []
    for c, m, pick in zip(calls, most, picks, strict=True):
        cut = int(rng.integers(1, m + 1)) if pick else 0
        out.append(list(c[: len(c) - cut]))
    return out


def settings_key(settings: list, src: np.ndarray, eos: int) -> tuple[str, str, int]:
    """What tells one translate call of a law from another, for its secret draw."""
    return repr(settings), hashlib.sha256(np.ascontiguousarray(src).tobytes()).hexdigest(), eos


def left_out_said(names: tuple[str, ...]) -> str:
    """' (beam_size and length_penalty left out: the contract's defaults)', or '' for none."""
    if not names:
        return ""
    return f" ({' and '.join(names)} left out: the contract's default{'s' * (len(names) > 1)})"
