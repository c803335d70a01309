"""The progress rule: any cai_mpi wait drives every pending request of the process, so "irecv_array then
send_array" on two ranks, or a staged isend_array followed by a blocking recv_array, cannot deadlock.

``PENDING`` holds the requests that still need the library to act (post the payload receive once the header is
in, stage the next chunk...). A request whose remaining step is final (all its MPI operations posted) leaves it:
MPI completes it without us, and a window of sends must not make every other wait poll each of them. A request
abandoned by a timeout stays until MPI is done with its memory, whatever its step: nobody else would complete it,
and it holds that memory. ``requests`` adds and removes its requests; everything else asks the functions below.
A blocking call runs its transfer's steps here too (``drive``), waiting by the same rule.
"""

from __future__ import annotations

import os
from collections.abc import Generator
from typing import TypeVar

from .backoff import Backoff
from .deadlines import Deadline
from .waits import Waitable

__all__ = [
    "PENDING", "Driven", "complete", "complete_by", "drive", "drive_others", "idle", "is_pending", "others_pending",
    "pending_count", "poke",
]

T = TypeVar("T")


class Driven:
    """What the progress rule drives: ``requests.Request`` is one (``_poke`` advances it without blocking)."""

    __slots__ = ()

    def _poke(self) -> None:
        raise NotImplementedError


def poke(item: Driven) -> None:
    """Advance ``item`` without blocking (what every wait does to every pending request)."""
    item._poke()


#: The requests every wait drives (see the module docstring); only ``requests`` changes it.
PENDING: set[Driven] = set()


def idle() -> bool:
    """True when no request needs driving: a blocking MPI call cannot starve another cai_mpi transfer."""
    return not PENDING


def pending_count() -> int:
    """How many requests every wait still drives (0 once everything under way has completed)."""
    return len(PENDING)


def is_pending(req: object) -> bool:
    """True while ``req`` is among the requests every wait drives."""
    return req in PENDING


def others_pending(me: object = None) -> bool:
    """True when a request other than ``me`` needs driving."""
    return bool(PENDING) and (len(PENDING) > 1 or me not in PENDING)


def drive_others(me: object = None) -> None:
    """Advance, without blocking, every pending request but ``me``."""
    for req in list(PENDING):
        if req is not me:
            poke(req)


def complete(waitable: Waitable, me: object = None) -> None:
    """Block until ``waitable`` completes, driving every other pending cai_mpi request meanwhile."""
    if not PENDING or (len(PENDING) == 1 and me in PENDING):  # (no other: block in MPI)
        waitable.wait()
        return
    while True:
        drive_others(me)
        if waitable.test():
            return
        if not others_pending(me):
            waitable.wait()
            return
        os.sched_yield()  # let other threads run (it releases the GIL without time.sleep's timer slack)


def complete_by(waitable: Waitable, due: Deadline, me: object = None) -> bool:
    """Like ``complete``, but give up at ``due``: True if ``waitable`` completed, False if time ran out first.
    Polls with a yield for a millisecond, then sleeps, backing off to a millisecond."""
    backoff = Backoff(spin=1e-3, step=1e-5, most=1e-3, until=due.at)
    while True:
        drive_others(me)
        if waitable.test():
            return True
        if not backoff.pause():
            return False


def drive(steps: Generator[Waitable, None, T]) -> T:
    """Run a transfer's steps to the end in the calling thread (what a blocking call does). A wait that fails is
    raised inside the steps, so they clean up (their ``finally`` runs now) before the error reaches the caller."""
    try:
        waitable = next(steps)
        while True:
            try:
                complete(waitable)
            except BaseException as exc:
                waitable = steps.throw(exc)
                continue
            waitable = next(steps)
    except StopIteration as stop:
        result: T = stop.value  # what the steps returned
        return result
