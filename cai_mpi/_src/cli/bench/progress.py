"""Progress of long runs (bench, soak) on stderr: only on a terminal (or when asked), only after a few seconds.

tqdm draws it when installed (the ``bench`` extra); without tqdm a plain text line of the same shape does, redrawn
in place with a carriage return."""

from __future__ import annotations

import sys
import time
from typing import Any, TextIO

try:
    from tqdm import tqdm
except ImportError:  # the bench extra is not installed: the plain line below
    tqdm = None  # type: ignore[assignment,misc]

__all__ = ["Progress"]


def _bar_class() -> Any:
    """A tqdm class whose bars start no monitor thread, or None without tqdm."""
    if tqdm is None:
        return None

    # (tqdm is generic in its type stubs only: a bar over no iterable)
    class _Bar(tqdm):  # type: ignore[type-arg]
        # tqdm's monitor is a thread per process that wakes every 10 s to repaint stalled bars; every draw here
        # comes from the loop being measured, and an MPI rank is better off without an extra thread.
        monitor_interval = 0

    return _Bar


def _clock(seconds: float) -> str:
    minutes, secs = divmod(int(seconds), 60)
    hours, minutes = divmod(minutes, 60)
    return f"{hours}:{minutes:02d}:{secs:02d}" if hours else f"{minutes:02d}:{secs:02d}"


class _PlainBar:
    """What tqdm draws, without tqdm: ``" 25%|#######                     | label [00:03<00:09]"``."""

    def __init__(self, total: float, desc: str, file: TextIO, delay: float, mininterval: float, width: int) -> None:
        self.total, self.n, self.desc, self.file = total, 0.0, desc, file
        self.delay, self.interval, self.width = delay, mininterval, width
        self.start = self.last = time.monotonic()
        self.drawn = 0  # characters on the line now
        self.shown = False

    def set_description_str(self, desc: str, refresh: bool = True) -> None:
        self.desc = desc

    def update(self, amount: float) -> None:
        self.n += amount
        now = time.monotonic()
        if now - self.start >= self.delay and (not self.shown or now - self.last >= self.interval):
            self.last, self.shown = now, True
            text = str(self)
            self.file.write("\r" + text.ljust(self.drawn))
            self.file.flush()
            self.drawn = max(self.drawn, len(text))

    def __str__(self) -> str:
        done = min(max(self.n / self.total, 0.0), 1.0)
        filled = int(done * self.width)
        elapsed = time.monotonic() - self.start
        left = _clock(elapsed / done - elapsed) if done > 0 else "?"
        return f"{done * 100:3.0f}%|{'#' * filled}{' ' * (self.width - filled)}| {self.desc} [{_clock(elapsed)}<{left}]"

    def close(self) -> None:
        if self.drawn:
            self.file.write("\r" + " " * self.drawn + "\r")
            self.file.flush()
            self.drawn = 0


class Progress:
    """``start(total)``, then ``advance(amount, label)``; ``close()`` erases the bar.

    Amounts are any positive numbers (bench counts estimated work, not items), so the bar shows a percentage,
    the label of the current step, the time elapsed and an estimate of the time left.

    Args:
        enabled: ``True`` draws (``--progress``), ``False`` never does; ``None`` draws only when ``stream``
            is a terminal, so logs and pipes stay free of carriage returns.
        stream: where to draw (default ``sys.stderr``).
        delay: nothing is drawn before this many seconds have passed since ``start`` (short runs stay silent).
        interval: at most one redraw per this many seconds.
        width: the bar's width in characters.
    """

    def __init__(
        self, enabled: bool | None = None, stream: TextIO | None = None, *, delay: float = 2.0,
        interval: float = 0.2, width: int = 28,
    ) -> None:
        self.stream = sys.stderr if stream is None else stream
        self.enabled = self.stream.isatty() if enabled is None else enabled
        self.delay = delay
        self.interval = interval
        self.width = width
        self.label = ""
        self._bar: Any = None

    def start(self, total: float) -> None:
        """A new run of ``total`` units of work (a bar still open is closed first)."""
        self.close()
        if not self.enabled:
            return
        bar = _bar_class()
        if bar is None:
            self._bar = _PlainBar(max(total, 1e-9), self.label, self.stream, self.delay, self.interval, self.width)
        else:
            self._bar = bar(
                total=max(total, 1e-9), desc=self.label, file=self.stream, leave=False, delay=self.delay,
                mininterval=self.interval, miniters=0,  # miniters=0: redraw by time only, however small a step
                bar_format=f"{{percentage:3.0f}}%|{{bar:{self.width}}}| {{desc}} [{{elapsed}}<{{remaining}}]",
            )

    def status(self, label: str) -> None:
        """Show ``label`` as what is being done now."""
        self.advance(0, label)

    def advance(self, amount: float, label: str | None = None) -> None:
        """``amount`` more units are done; ``label`` (if given) says what is being done now."""
        if label is not None:
            self.label = label
        if self._bar is not None:
            self._bar.set_description_str(self.label, refresh=False)
            self._bar.update(amount)  # draws when the delay and the interval have passed

    def line(self) -> str:
        """The bar's text as drawn (empty when nothing is being drawn)."""
        return str(self._bar) if self._bar is not None else ""

    def close(self) -> None:
        """Erase the bar (if one was drawn)."""
        if self._bar is not None:
            self._bar.close()
            self._bar = None
