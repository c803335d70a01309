"""The collective engine: the steady-state rule that posts the payload of the last agreed signature
(``transport.signature``) with the vote (``steady``), and the verdict after a vote (``verdict``), each written once.

Every one-shot collective (reductions, gathers, bcast, bucketed allreduce) runs the same rule in the steady state:
the payload collectives of the last agreed signature are posted into this rank's own buffers when its call is that
signature's, into scratch otherwise (so every rank makes the same MPI calls whatever the vote says), together with
the vote (``transport.agreement``); the result is kept when the vote says every rank's call was the agreed one,
else the own buffers are given back and the call takes its full path. allgather's one-round form (the ballot's
words carried in the payload, no vote) is the gather form of the same rule (``api.gathers``).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any, Protocol, TypeVar

from mpi4py import MPI

from ..progress.deadlines import Deadline
from .agreement import Ballot, Joined, disagree, posted, reason, vote
from .privcomm import PrivateComms
from .signature import Signature

__all__ = ["SLOT_PAYLOAD_BYTES", "Call", "Own", "slotted", "steady", "verdict"]

#: A bcast whose agreed payload has at most this many bytes travels in its vote (``slotted``). With the vote's 48
#: bytes it stays under 2 KiB, where MPI libraries reduce by recursive doubling (MPICH's short-message allreduce):
#: the vote's latency at any scale, and half the time of the vote and an ``Ibcast`` at 2 ranks (docs/benchmarks.md).
#: A constant, not a setting: every rank must make the same choice.
SLOT_PAYLOAD_BYTES = 1024
_LOWEST = (1 << 63).to_bytes(8, "little")  # INT64_MIN, little-endian: below (or equal to) every word of a payload

#: A payload collective to post: its name in the posting table (``agreement.collective``) and its arguments
Call = tuple[str, tuple[Any, ...]]


class Own(Protocol):
    """This rank's buffers for a steady-state call, given back when the call must be made again."""

    def release(self) -> None: ...


T = TypeVar("T", bound=Own)


def steady(fn: str, pc: PrivateComms, ballot: Ballot, due: Deadline | None, sig: Signature, own: T | None,
           calls: Callable[[Signature, T | None, MPI.Comm], Sequence[Call]]) -> T | None:
    """The steady-state rule: post ``calls(sig, own, comm)`` (the payload collectives of ``sig`` into ``own``, this
    rank's buffers when its call is ``sig``'s, else into scratch of ``sig``'s sizes when ``own`` is None) with the
    vote, every wait bounded by ``due``. Returns ``own`` when every rank's call was ``sig``'s; else None, with
    ``own`` given back, and the call takes its full path (the vote's verdict in ``ballot``)."""
    comm = pc.header
    posts = calls(sig, own, comm)
    vote(fn, pc, ballot, due, [posted(comm, name, *args) for name, args in posts], keep=(own, posts))
    if own is not None:
        if ballot.matches(sig.head):
            return own
        own.release()
    return None


def slotted(fn: str, pc: PrivateComms, ballot: Ballot, due: Deadline | None, sig: Signature,
            payload: bytes | None) -> memoryview | None:
    """bcast's steady state up to ``SLOT_PAYLOAD_BYTES``, in one collective: the vote's ``Allreduce(MAX)`` carries
    a slot of ``sig.nbytes`` bytes (in int64 words) after the ballot's words, where the root writes its ``payload``
    (when its call is the agreed one) and every other rank ``INT64_MIN``, so the MAX is the root's bytes exactly.
    Returns them when every rank's call was the agreed one; else None (the vote's verdict in ``ballot``)."""
    words = -(-sig.nbytes // 8)
    if payload is None:
        ballot.votes += _LOWEST * words
    else:
        ballot.votes += payload
        ballot.votes += bytes(words * 8 - len(payload))
    vote(fn, pc, ballot, due)
    if ballot.matches(sig.head):
        return memoryview(ballot.votes)[len(ballot.votes) - words * 8 :]
    return None


def verdict(fn: str, pc: PrivateComms, ballot: Ballot, due: Deadline | None, text: str, error: BaseException | None,
            rule: str, *, failures: bool = True) -> Joined:
    """After the vote: when it did not agree (with ``failures``, also when a rank failed), every rank's description
    (``text``, or this rank's ``error``) to every rank and the error (``disagree``: ``rule`` is what they broke);
    else the collective steps of the rest of the call (``Joined``)."""
    steps = Joined(fn, pc, due)
    if not (ballot.agreed if failures else ballot.same_common):
        disagree(fn, steps, text if error is None else reason(error), error, rule)
    return steps
