"""What a running probe may say to the parent before its reply, on the worker's two pipes.

- `emit(event)`: a frame {"event": ...}, no answer: progress of a long probe (a student's pytest
  suite reports each test as it starts, so a hang costs only one step).
- `ask(question)`: a frame {"ask": ...}, then the parent's {"answer": ...} is read: the parent
  decides, from what the probe showed it, how the call goes on (the learning probe's checkpoints:
  the parent judges the weights so far with the oracle and says whether training stops).

Each frame carries the id of the request being served (harness.wire), as the reply will; the
answer is read under that id too. The serve loop attaches the pipes before it answers any
request, and names each request's id as it starts serving it.
"""

from __future__ import annotations

from typing import Any

from harness import wire

_PIPES: dict[str, int] = {}


def attach(read_fd: int, write_fd: int) -> None:
    """The request pipe's read end and the reply pipe's write end of this worker."""
    _PIPES.update(read=read_fd, write=write_fd)


def serving(request_id: int) -> None:
    """The id of the request now being served."""
    _PIPES["id"] = request_id


def emit(event: Any) -> None:
    """Send an event frame ahead of the current request's reply."""
    if not _PIPES:
        raise RuntimeError("emit outside serve")
    wire.write_frame(_PIPES["write"], {"event": event}, _PIPES["id"])


def ask(question: Any) -> Any:
    """Send a question frame ahead of the current request's reply and wait for the answer."""
    if not _PIPES:
        raise RuntimeError("ask outside serve")
    wire.write_frame(_PIPES["write"], {"ask": question}, _PIPES["id"])
    _, frame = wire.read_frame(_PIPES["read"], expect=_PIPES["id"])
    if not (isinstance(frame, dict) and set(frame) == {"answer"}):
        raise RuntimeError("the parent sent no answer to the probe's question")
    return frame["answer"]
