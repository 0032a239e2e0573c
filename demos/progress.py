"""A small progress bar for training loops, written to stderr (no tqdm dependency)."""

from __future__ import annotations

import sys
import time
from typing import TextIO


def _clock(seconds: float) -> str:
    m, s = divmod(int(seconds), 60)
    return f"{m}:{s:02d}"


class Progress:
    """`Progress(total)(step, rate, loss)` fits fit()'s callback(step, rate, loss).

    On a terminal the bar redraws in place at most every `every` seconds; elsewhere (a log file,
    CI) it writes one line per tenth of the run so logs stay short.
    """

    def __init__(
        self, total: int, label: str = "", stream: TextIO | None = None, every: float = 0.2
    ) -> None:
        self.total, self.label, self.every = total, label, every
        self.stream = sys.stderr if stream is None else stream
        self.tty = self.stream.isatty()
        self.start = time.perf_counter()
        self.last_draw = -float("inf")
        self.next_line = 0

    def __call__(self, step: int, rate: float, loss: float) -> None:
        done = step + 1
        now = time.perf_counter()
        if self.tty:
            if now - self.last_draw < self.every and done < self.total:
                return
            self.last_draw = now
            self.stream.write("\r" + self.line(done, rate, loss, now))
            if done >= self.total:
                self.stream.write("\n")
        elif done >= self.next_line or done >= self.total:
            self.next_line = done + max(1, self.total // 10)
            self.stream.write(self.line(done, rate, loss, now) + "\n")
        self.stream.flush()

    def line(self, done: int, rate: float, loss: float, now: float) -> str:
        """One status line: bar, updates, loss, learning rate, speed, elapsed and remaining time."""
        width = 24
        fill = width * done // max(self.total, 1)
        elapsed = now - self.start
        speed = done / elapsed if elapsed > 0 else 0.0
        left = (self.total - done) / speed if speed > 0 else 0.0
        return (
            f"{self.label}[{'#' * fill}{'.' * (width - fill)}] {done}/{self.total} "
            f"loss {loss:.4f} lr {rate:.2e} {speed:.1f} upd/s "
            f"{_clock(elapsed)}<{_clock(left)}"
        )
