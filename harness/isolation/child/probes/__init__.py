"""Probes: the worker's half of each shared test, calling the subject's contract API.

A probe takes the subject's module and inputs the parent chose (JSON values and numpy arrays),
and returns plain data (numpy arrays, lists, scalars): what the parent's verdicts judge. Probes
never judge. They live by family, each module named as the module of harness.shared_tests.laws
whose checks call them; `base` and `hooks` are what they share. Importing this package registers
every probe in PROBES, by its function's name.
"""

from __future__ import annotations

from harness.isolation.child.probes import (  # noqa: F401  (each module registers its probes)
    decoding,
    dropout,
    hand_examples,
    interface,
    masking,
    optimizer,
    training,
    values,
)
from harness.isolation.child.probes.base import PROBES, probe

__all__ = ["PROBES", "probe"]
