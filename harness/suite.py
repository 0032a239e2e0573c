"""What a test is to the engine: a named check that judges answers fetched from a worker.

A check runs in the trusted parent. It asks the subject's worker for plain data through `call`
(a probe name and inputs the parent chose) and judges it, raising Failure with a message that
says what differed, by how much, and where. It never touches the subject directly.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from harness.subjects import Subject

# call(probe_name, **inputs) -> the probe's value (plain data)
Call = Callable[..., Any]


class Failure(Exception):
    """The verdict: the subject's answer breaks the law the test states."""


def _always(subject: Subject) -> bool:
    return True


@dataclass(frozen=True)
class Test:
    """One test: a name, the law it checks in one sentence, the check, and its time limit."""

    __test__ = False  # a record, not a pytest test class

    name: str
    law: str
    check: Callable[[Call], None]
    timeout: float  # seconds of wall time for all of the test's probe calls
    applies: Callable[[Subject], bool] = field(default=_always)
