"""A send that fails after its header went out: how the sender tells the receiver, and how the receiver notices.

Everything that can fail at once (allocations, the device pack, the first staging copy) runs before the header
is posted, so such a failure posts nothing. What only shows later (an asynchronous copy or kernel error that an
event reports, a sticky CUDA error) cannot be undone: the receiver already waits for the payload. The sender then
posts every payload message it has not sent as an empty message (announced ones are never empty), then one
message with its error, all on the payload tag; a header that may be followed by such markers carries
``FLAG_MAY_FAIL``, and only its receiver checks the length of each payload message. The receiver takes every
message of the payload, so nothing is left unmatched, and raises ``SenderFailedError`` with the sender's error.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from mpi4py import MPI

from ..errors import SenderFailedError
from ..progress.waits import MPIWait, Waitable
from .pieces import BYTE, Steps

__all__ = ["PREPARED", "REASON_BYTES", "announce_failure", "failed", "receive_checked", "receive_reason"]

#: At most this many bytes of the sender's error travel to the receiver.
REASON_BYTES = 1024
_EMPTY = bytes(0)


class _Prepared(Waitable):
    """What a send's steps yield once everything that can fail at once has run: the header may go out now."""

    __slots__ = ()

    def wait(self) -> None:
        pass

    def test(self) -> bool:
        return True


PREPARED = _Prepared()


def announce_failure(comm: MPI.Comm, dest: int, tag: int, unsent: int, error: BaseException) -> list[MPI.Request]:
    """After the header went out: the ``unsent`` payload messages as empty ones, then ``error``'s text."""
    reqs = [comm.Isend([_EMPTY, 0, BYTE], dest, tag) for _ in range(unsent)]
    reason = f"{type(error).__name__}: {error}".encode(errors="replace")[:REASON_BYTES]
    reqs.append(comm.Isend([reason, len(reason), BYTE], dest, tag))
    return reqs


def failed(status: MPI.Status, nbytes: int, datatype: MPI.Datatype = BYTE) -> bool:
    """Whether a payload message of ``nbytes`` announced, received as ``datatype`` (MPI.BYTE, or a derived datatype
    of bytes), is a sender's failure marker."""
    return bool(status.Get_elements(datatype) < nbytes)


def receive_reason(comm: MPI.Comm, source: int, tag: int) -> Steps:
    """Receive the failed sender's error after its last payload message, and raise it as SenderFailedError (the
    receive names the message: see ``receive.plan_recv``)."""
    text = bytearray(REASON_BYTES)
    status = MPI.Status()
    yield MPIWait([comm.Irecv([text, BYTE], source, tag)], status)
    reason = bytes(text[: status.Get_count(BYTE)]).decode(errors="replace")
    raise SenderFailedError(reason, source, -1, reason)


def receive_checked(comm: MPI.Comm, source: int, tag: int, specs: Sequence[Any], sizes: list[int]) -> Steps:
    """Receive the payload messages ``specs`` (of ``sizes`` bytes) and raise the sender's error if one was a
    failure marker, once all have arrived."""
    statuses = [MPI.Status() for _ in specs]
    reqs = [comm.Irecv(spec, source, tag) for spec in specs]
    for req, status in zip(reqs, statuses):
        yield MPIWait([req], status)
    if any(failed(status, n, spec[-1]) for status, spec, n in zip(statuses, specs, sizes)):
        yield from receive_reason(comm, source, tag)
