"""What a shared test is: one record, made where its check is defined.

A check runs in the trusted parent. It asks the subject's worker for plain data through `call`
(a probe name and inputs the parent chose) and judges it, raising Failure with a message that
says what differed, by how much, and where. It never touches the subject directly.

`@law(...)` on the check is the whole record: its name, the law in one sentence, its time limit,
its points in a grade, whether it compares the model's values with the oracle's (a failure then
gets the forward-pass diagnosis), and its Gradescope visibility. The registry's order is the
order of the matrix's columns and of a grade's lines.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

# call(probe_name, **inputs) -> the probe's value (plain data)
Call = Callable[..., Any]

VISIBILITIES = ("visible", "hidden", "after_due_date", "after_published")  # Gradescope's


class Failure(Exception):
    """The verdict: the subject's answer breaks the law the test states."""


@dataclass(frozen=True)
class Test:
    """One test: a name, the law it checks in one sentence, the check, and its time limit."""

    __test__ = False  # a record, not a pytest test class

    name: str
    law: str
    check: Callable[[Call], None]
    timeout: float  # seconds of wall time for all of the test's probe calls
    points: float = 5.0  # what passing it earns in `xfmr grade`
    values: bool = False  # compares values with the oracle's: a failure gets the diagnosis
    visibility: str = "visible"  # Gradescope's visibility of its result
    # parent-side work that depends on the run's draws only, never on the subject (the oracle's
    # bounds for the contract's layout): started in the background as a subject's run begins,
    # so that it overlaps with the worker; the check finds it done, or waits for it
    warm: Callable[[], None] | None = None


REGISTRY: list[Test] = []


def law(
    name: str,
    statement: str,
    *,
    timeout: float,
    points: float = 5.0,
    values: bool = False,
    visibility: str = "visible",
    warm: Callable[[], None] | None = None,
) -> Callable[[Callable[[Call], None]], Callable[[Call], None]]:
    """Register the decorated check as the shared test `name`."""
    if visibility not in VISIBILITIES:
        raise ValueError(f"visibility must be one of {VISIBILITIES}, got {visibility!r}")

    def register(check: Callable[[Call], None]) -> Callable[[Call], None]:
        if any(t.name == name for t in REGISTRY):
            raise ValueError(f"a shared test named {name!r} is registered twice")
        REGISTRY.append(Test(name, statement, check, timeout, points, values, visibility, warm))
        return check

    return register
