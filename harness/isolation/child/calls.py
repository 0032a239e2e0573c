"""Which of the subject's functions a request called: the worker's side of call coverage.

While a request asked to be traced runs, every new Python frame whose code comes from the
subject's file (its own functions, methods, lambdas and comprehensions, resumed generators
included) adds the code's qualified name to a set; frames of any other file are not looked at
further (no line tracing), so a traced request costs a few percent more, not a slowdown per
line. The parent (harness.engine.coverage) uses the names of impl's calls to tell which mutants'
changes a test can reach at all.

Only trusted subjects are traced (the matrix's baseline, impl): a subject could switch the trace
off, so a submission's names would prove nothing.
"""

from __future__ import annotations

import sys
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any


@contextmanager
def recorded(filename: str) -> Iterator[set[str]]:
    """The qualified names of the functions from `filename` called inside the block (in any
    thread started meanwhile too)."""
    names: set[str] = set()

    def on_call(frame: Any, event: str, arg: Any) -> Callable[..., Any] | None:
        code = frame.f_code
        if event == "call" and code.co_filename == filename:
            names.add(code.co_qualname)
        return None  # no line events

    previous = sys.gettrace()
    sys.settrace(on_call)
    threading.settrace(on_call)
    try:
        yield names
    finally:
        sys.settrace(previous)
        threading.settrace(previous)
