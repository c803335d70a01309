"""How a wait that polls spends the time between two polls: first it only yields the core (what it waits for
usually comes sooner than any ``time.sleep``, even of 0, returns), then it sleeps, each pause longer than the last
up to a ceiling, and never past a deadline. One helper for every poll loop: request waits with a timeout,
``waitany`` and the ``Pipeline``'s waits."""

from __future__ import annotations

import math
import os
import time

__all__ = ["Backoff"]


class Backoff:
    """The pauses of one wait: ``pause()`` between polls, until ``until`` (a ``time.monotonic`` reading).

    Args:
        spin: seconds from creation during which ``pause`` only yields the core (``os.sched_yield``).
        step: what each sleep adds to twice the previous one (the first sleep is ``step``).
        most: the longest sleep.
        until: the deadline: ``pause`` never sleeps past it, and returns False once it has passed.
    """

    __slots__ = ("_last", "_most", "_spin_until", "_step", "until")

    def __init__(self, *, spin: float = 1e-3, step: float = 1e-5, most: float = 1e-3, until: float = math.inf) -> None:
        self._spin_until = time.monotonic() + spin
        self._step = step
        self._most = most
        self._last = 0.0
        self.until = until

    def pause(self) -> bool:
        """Wait a little before the next poll; False, at once, when the deadline has passed."""
        now = time.monotonic()
        if now >= self.until:
            return False
        if now < self._spin_until:
            os.sched_yield()  # let other threads run (it releases the GIL without time.sleep's timer slack)
        else:
            self._last = min(self._last * 2 + self._step, self._most, self.until - now)
            time.sleep(self._last)
        return True
