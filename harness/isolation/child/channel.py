"""What a running probe may say to the parent before its reply, on the worker's two pipes.

- `emit(event)`: a frame {"event": ...}, no answer: progress of a long probe (a student's pytest
  suite reports each test as it starts, so a hang costs only one step).
- `ask(question)`: a frame {"ask": ...}, then the parent's {"answer": ...} is read: the parent
  decides, from what the probe showed it, how the call goes on (the learning probe's checkpoints:
  the parent judges the weights so far with the oracle and says whether training stops).

The serve loop attaches the pipes before it answers any request.
"""

from __future__ import annotations

from typing import Any

from harness import wire

_PIPES: dict[str, int] = {}


def attach(read_fd: int, write_fd: int) -> None:
    """The request pipe's read end and the reply pipe's write end of this worker."""
    _PIPES.update(read=read_fd, write=write_fd)


def emit(event: Any) -> None:
    """Send an event frame ahead of the current request's reply."""
    if not _PIPES:
        raise RuntimeError("emit outside serve")
    wire.write_frame(_PIPES["write"], {"event": event})


def ask(question: Any) -> Any:
    """Send a question frame ahead of the current request's reply and wait for the answer."""
    if not _PIPES:
        raise RuntimeError("ask outside serve")
    wire.write_frame(_PIPES["write"], {"ask": question})
    frame = wire.read_frame(_PIPES["read"])
    if not (isinstance(frame, dict) and set(frame) == {"answer"}):
        raise RuntimeError("the parent sent no answer to the probe's question")
    return frame["answer"]
