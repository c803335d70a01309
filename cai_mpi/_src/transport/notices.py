"""Notices: a short message any rank of a communicator may send every other one, and each reads whenever it waits
(a failing Pipeline stage tells the others so). One receive from any rank stays posted; leaving reads the rest of
what was sent, so nothing is left unmatched."""

from __future__ import annotations

from collections import deque
from collections.abc import Callable
from functools import partial

from mpi4py import MPI

from ..progress.posted import PostedRequest

__all__ = ["Notices"]


class Notices:
    """Notices of at most ``nbytes`` on ``comm`` with ``tag`` (a tag no other message on ``comm`` uses)."""

    def __init__(self, comm: MPI.Intracomm, tag: int, nbytes: int) -> None:
        self._comm, self._tag, self._nbytes = comm, tag, nbytes
        self._buf = bytearray(nbytes)
        self._status = MPI.Status()
        self._req: MPI.Request | None = comm.Irecv(self._buf, MPI.ANY_SOURCE, tag)
        self._sent: deque[MPI.Request] = deque()  # oldest first
        self.first: bytes | None = None  # the notice ``test`` read, if it read one

    def send_all(self, raw: bytes) -> None:
        """Send ``raw`` to every other rank."""
        comm = self._comm
        me = comm.Get_rank()
        for rank in range(comm.Get_size()):
            if rank != me:
                self._sent.append(comm.Isend(raw, rank, self._tag))

    def test(self) -> bytes | None:
        """The notice that came, if one did (the first only: one is enough to stop a wait)."""
        req = self._req
        if req is not None and self.first is None and req.Test(self._status):
            self.first = bytes(self._buf[: self._status.Get_count(MPI.BYTE)])
            return self.first
        return None

    def forget_sent(self) -> None:
        """Drop the notices sent, oldest first (they complete in order)."""
        sent = self._sent
        while sent and sent[0].Test():
            sent.popleft()

    def collect(self, expected: int, wait: Callable[[Callable[[], bool]], None]) -> list[bytes]:
        """On leaving, in step with every rank: the ``expected`` notices sent to this one (the first may have been
        read by ``test``), each awaited with ``wait``."""
        req, status = self._req, self._status
        assert req is not None
        found = []
        if self.first is not None or expected > 0:
            arrived = self.first is not None
            while True:  # (the receive stays this end's until it is done: ``abandon`` can withdraw it)
                if not arrived:
                    wait(partial(req.Test, status))
                found.append(bytes(self._buf[: status.Get_count(MPI.BYTE)]))
                if len(found) >= expected:
                    break
                self._req = req = self._comm.Irecv(self._buf, MPI.ANY_SOURCE, self._tag)
                arrived = False
        else:
            req.Cancel()
            req.Wait()
        self._req = None
        return found

    def finish(self, wait: Callable[[Callable[[], bool]], None]) -> None:
        """On leaving, last (a wait that may need the others to drive what this rank sent them first): wait (``wait``)
        until the notices this rank sent have gone."""
        sent = self._sent
        wait(lambda: MPI.Request.Testall(list(sent)))
        self._sent = deque()

    def abandon(self, error: BaseException) -> None:
        """Out of step: let the notices sent finish in the background; withdraw the receive."""
        if self._sent:
            PostedRequest(list(self._sent), None).abandon(error)
            self._sent = deque()
        req = self._req
        if req is not None and req != MPI.REQUEST_NULL:
            req.Cancel()
            req.Wait()
        self._req = None
