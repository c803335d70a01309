"""Progress of long runs (bench, soak) on stderr, drawn by tqdm: only on a terminal, and only after a few seconds."""

from __future__ import annotations

import sys
from typing import TYPE_CHECKING, NoReturn, TextIO

from tqdm import tqdm

__all__ = ["Progress"]

if TYPE_CHECKING:
    _Tqdm = tqdm[NoReturn]  # generic in its type stubs only; a bar over no iterable
else:
    _Tqdm = tqdm


class _Bar(_Tqdm):
    # tqdm's monitor is a thread per process that wakes every 10 s to repaint stalled bars; every draw here comes
    # from the loop being measured, and an MPI rank is better off without an extra thread.
    monitor_interval = 0


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
        self._bar: _Bar | None = None

    def start(self, total: float) -> None:
        """A new run of ``total`` units of work (a bar still open is closed first)."""
        self.close()
        if self.enabled:
            self._bar = _Bar(
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
