"""A progress bar for long runs: one line redrawn on a terminal, plain lines otherwise.

Regressions run for minutes; a user must see how far along they are and how long is left.
In CI logs (not a terminal) redrawing would be noise, so each step is one plain line.
"""

from __future__ import annotations

import sys
import time
from collections.abc import Callable
from typing import TextIO


class Bar:
    """``total`` steps; ``step(label)`` marks one more done."""

    def __init__(self, total: int, title: str, stream: TextIO | None = None,
                 width: int = 30) -> None:
        self.total = max(total, 1)
        self.title = title
        self.stream = stream or sys.stderr
        self.width = width
        self.done = 0
        self.t0 = time.monotonic()
        self.tty = self.stream.isatty()

    def eta_s(self) -> float | None:
        """Seconds left at the mean pace so far; None before the first step."""
        if self.done == 0:
            return None
        return (time.monotonic() - self.t0) / self.done * (self.total - self.done)

    def line(self, label: str) -> str:
        filled = int(self.width * self.done / self.total)
        eta = self.eta_s()
        left = "" if eta is None else f", {int(eta // 60)}m{int(eta % 60):02d}s left"
        return (f"{self.title} [{'#' * filled}{'.' * (self.width - filled)}] "
                f"{self.done}/{self.total}{left}  {label}")

    def show(self, label: str) -> None:
        """Say what is running now, without counting it done."""
        if self.tty:
            self.stream.write("\r\033[K" + self.line(label))
        else:
            self.stream.write(self.line(label) + "\n")
        self.stream.flush()

    def step(self, label: str = "") -> None:
        self.done = min(self.done + 1, self.total)
        self.show(label)

    def close(self) -> None:
        if self.tty:
            self.stream.write("\n")
            self.stream.flush()


class Ticker:
    """A time bar while a phase of known length runs: ``with Ticker(10, "[hash5] traffic"):``.

    Only on a terminal (a thread redraws it twice a second); elsewhere it does nothing, so
    logs keep one line per phase. Expected length, not a deadline: it stops at 100 %.
    ``clock`` is what the elapsed time is read from (``time.monotonic``).
    """

    def __init__(self, seconds: float, label: str, stream: TextIO | None = None,
                 width: int = 30, interval: float = 0.5,
                 clock: Callable[[], float] = time.monotonic) -> None:
        import threading
        self.seconds = max(seconds, 1e-3)
        self.label = label
        self.stream = stream or sys.stderr
        self.width = width
        self.interval = interval
        self.clock = clock
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self.active = self.stream.isatty()

    def line(self, elapsed: float) -> str:
        frac = min(elapsed / self.seconds, 1.0)
        filled = int(self.width * frac)
        return (f"{self.label} [{'#' * filled}{'.' * (self.width - filled)}] "
                f"{min(elapsed, self.seconds):.0f}/{self.seconds:.0f} s")

    def _run(self) -> None:
        t0 = self.clock()
        while not self._stop.wait(self.interval):
            self.stream.write("\r\033[K" + self.line(self.clock() - t0))
            self.stream.flush()

    def __enter__(self) -> Ticker:
        if self.active:
            self._thread.start()
        return self

    def __exit__(self, *_exc: object) -> None:
        if self.active:
            self._stop.set()
            self._thread.join()
            self.stream.write("\r\033[K")
            self.stream.flush()
