"""A dependency-free progress bar on stderr, drawn only once a run has lasted a few seconds."""

from __future__ import annotations

import sys
import time
from typing import TextIO

__all__ = ["Progress"]


def _clock(seconds: float) -> str:
    s = int(seconds + 0.5)
    return f"{s // 60}:{s % 60:02d}"


class Progress:
    """``start(total)``, then ``advance(amount, label)``; ``close()`` erases the bar.

    Nothing is drawn when disabled, nor before ``delay`` seconds have passed (short runs stay
    silent), and at most ``1 / interval`` times per second.
    """

    def __init__(
        self, enabled: bool, stream: TextIO | None = None, *, delay: float = 2.0, interval: float = 0.2,
        width: int = 28,
    ) -> None:
        self.enabled = enabled
        self.stream = sys.stderr if stream is None else stream
        self.delay = delay
        self.interval = interval
        self.width = width
        self.total = 0.0
        self.done = 0.0
        self.label = ""
        self._t0 = time.monotonic()
        self._last = 0.0
        self._drawn = False

    def start(self, total: float) -> None:
        self.total = max(total, 1e-9)
        self.done = 0.0
        self._t0 = time.monotonic()

    def status(self, label: str) -> None:
        self.label = label
        self._draw()

    def advance(self, amount: float, label: str | None = None) -> None:
        self.done += amount
        if label is not None:
            self.label = label
        self._draw()

    def line(self) -> str:
        """The bar's text (without the carriage return)."""
        frac = min(1.0, self.done / self.total) if self.total else 0.0
        filled = int(frac * self.width)
        bar = "=" * filled + (">" if filled < self.width else "") + " " * (self.width - filled - 1)
        elapsed = time.monotonic() - self._t0
        eta = f", ~{_clock(elapsed / frac - elapsed)} left" if frac > 0.02 else ""
        return f"[{bar}] {frac * 100:3.0f}% {self.label:<34.34} {_clock(elapsed)} elapsed{eta}"

    def _draw(self) -> None:
        if not self.enabled:
            return
        now = time.monotonic()
        if now - self._t0 < self.delay or now - self._last < self.interval:
            return
        self._last = now
        self.stream.write("\r" + self.line() + "\x1b[K")
        self.stream.flush()
        self._drawn = True

    def close(self) -> None:
        if self._drawn:
            self.stream.write("\r\x1b[K")
            self.stream.flush()
            self._drawn = False
