"""Timeouts: when a wait gives up (its own ``timeout=``, else ``CAI_MPI_TIMEOUT``), and the error that says what
was awaited, from whom, on which communicator and for how long."""

from __future__ import annotations

import math
import time
from typing import Any

from mpi4py import MPI

from ..config import config
from ..errors import TimeoutError

__all__ = ["Awaited", "Deadline", "deadline"]


class Deadline:
    """A point in time (``time.monotonic``) and the timeout it came from."""

    __slots__ = ("at", "seconds")

    def __init__(self, seconds: float) -> None:
        self.seconds = seconds
        self.at = time.monotonic() + seconds

    def renewed(self) -> Deadline:
        """The same timeout again, from now (the rest of a transfer whose message has matched)."""
        return Deadline(self.seconds)


def deadline(fn: str, timeout: Any) -> Deadline | None:
    """The deadline of a wait starting now: ``timeout`` seconds, or CAI_MPI_TIMEOUT's when None; None: no limit."""
    if timeout is None:
        seconds = config().timeout
        return None if seconds is None else Deadline(seconds)
    if isinstance(timeout, bool) or not isinstance(timeout, (int, float)):
        raise TypeError(f"{fn}: timeout must be a number of seconds or None, got {type(timeout).__name__}")
    if math.isnan(timeout) or timeout < 0:
        raise ValueError(f"{fn}: timeout must be at least 0 seconds, got {timeout}")
    return Deadline(float(timeout))


def _comm_name(comm: MPI.Comm) -> str:
    """The user's communicator behind one of cai_mpi's private duplicates, as its name or size says it."""
    name = comm.Get_name()
    inner = name[name.find("(") + 1 : -1] if name.startswith("cai_mpi-") else name
    return inner or f"a communicator of {comm.Get_size()} ranks"


class Awaited:
    """What an operation waits for, kept cheaply until a timeout needs to say it: the function, whether it sends,
    the peer and tag, and the (private) communicator."""

    __slots__ = ("comm", "fn", "peer", "sends", "tag")

    def __init__(self, fn: str, sends: bool, peer: int, tag: int, comm: MPI.Comm) -> None:
        self.fn, self.sends, self.peer, self.tag, self.comm = fn, sends, peer, tag, comm

    def _message(self) -> str:
        peer = "any rank" if self.peer == MPI.ANY_SOURCE else f"rank {self.peer}"
        tag = "any tag" if self.tag == MPI.ANY_TAG else f"tag {self.tag}"
        way = "to" if self.sends else "from"
        return f"the message {way} {peer} with {tag} on {_comm_name(self.comm)}"

    def expired(self, due: Deadline, *, cancelled: bool, matched: bool = False) -> TimeoutError:
        """The error for a wait past ``due``: the receive was withdrawn (``cancelled``), or what happens to it."""
        what = f"{self.fn}: {self._message()}"
        if cancelled:
            text = f"{what} did not arrive within {due.seconds:g} s (the receive was cancelled: nothing was consumed)"
        elif self.sends:
            text = (f"{what} was not received within {due.seconds:g} s (MPI cannot withdraw a send: it stays posted "
                    "and completes if the peer receives it; the buffer is kept alive, do not modify it)")
        elif matched:
            text = (f"{what} arrived, but its payload did not complete within {due.seconds:g} s (it is received in "
                    "the background and dropped; an out= buffer may still be written)")
        else:
            text = f"{what} did not complete within {due.seconds:g} s"
        return TimeoutError(text, due.seconds, cancelled)


def collective_expired(fn: str, comm: MPI.Comm, due: Deadline) -> TimeoutError:
    """The error for a collective that not every rank joined in time (MPI cannot cancel a collective)."""
    return TimeoutError(
        f"{fn}: not every rank of {_comm_name(comm)} joined within {due.seconds:g} s; MPI cannot withdraw a "
        "collective, so this communicator's collectives are now out of step: end the job (cai_mpi.abort_on_error) "
        "or stop using it for collectives",
        due.seconds, False,
    )
