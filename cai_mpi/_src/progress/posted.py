"""The Request whose MPI operations are all posted and whose result is known in advance (``PostedRequest``): no
steps to drive, so it is cheaper to make and to complete than a ``requests.Request`` over a generator."""

from __future__ import annotations

from typing import Any, TypeVar

from mpi4py import MPI

from .deadlines import Deadline
from .driving import PENDING, complete, complete_by, drive_others
from .requests import CLAIMING, About, Request
from .waits import MPIWait

__all__ = ["PostedRequest"]

T = TypeVar("T")


class PostedRequest(Request[T]):
    """A Request whose MPI operations are all posted and whose result is known in advance.

    Completing the MPI requests is all that is left, so there is no generator to drive: the
    common nonblocking sends (a contiguous host array, a small one inline) and started channel
    messages, which are cheaper to create and complete this way than through a generator.
    Its waits still drive the other pending cai_mpi requests, like any Request's.

    ``cancellable``: the single request is a receive a timeout may withdraw (a channel's next message).
    """

    __slots__ = ("_cancellable", "_reqs")

    def __init__(
        self, reqs: list[MPI.Request], result: T, keep: Any = None, about: About = None,
        cancellable: bool = False,
    ) -> None:
        self._begin(None, result, keep, about)  # (not Request.__init__: there are no steps to advance)
        self._reqs: list[MPI.Request] | None = reqs
        self._cancellable = cancellable

    @property
    def done(self) -> bool:
        return self._reqs is None or self._expired is not None

    @property
    def _settled(self) -> bool:
        return self._reqs is None

    def __del__(self) -> None:
        if self._reqs is None or self._mpi_finalized():
            return
        if self._cancellable:
            try:
                MPIWait(self._reqs).cancel()  # withdrawn, or completed by a message meanwhile: either way settled
                return
            except Exception:
                pass
        self.abandon(self._dropped)

    def _complete(self) -> None:
        """Block until the MPI requests complete (the caller has taken the request)."""
        reqs = self._reqs
        if reqs is not None:
            if PENDING:
                complete(MPIWait(reqs), self)
            else:
                MPI.Request.Waitall(reqs)
            self._reqs = self._keep = None
            PENDING.discard(self)  # (it is there only if a timeout abandoned it)

    def _test(self) -> bool:
        """Complete the MPI requests if they can be without blocking (the caller has taken the request)."""
        reqs = self._reqs
        if reqs is not None and MPI.Request.Testall(reqs):
            self._reqs = self._keep = None
            if self._expired is not None:
                PENDING.discard(self)  # finished in the background after a timeout
        return self._reqs is None

    def _wait_until(self, due: Deadline | None) -> T:
        with CLAIMING:  # (_take, inline: every wait takes its request)
            shared, self._busy = self._busy, True
        if shared:
            self._take()
        try:
            if due is None:
                self._complete()
            elif self._reqs is not None and self._expired is None:
                waiting = MPIWait(self._reqs)
                if complete_by(waiting, due, self):
                    self._reqs = self._keep = None
                else:
                    about = self._awaited(not self._cancellable)
                    if not self._cancellable:
                        self.abandon(about.expired(due, cancelled=False))
                    else:
                        if waiting.cancel():
                            self._expired = about.expired(due, cancelled=True)
                        self._reqs = self._keep = None  # cancelled, or a message completed it meanwhile
        finally:
            self._busy = False
        if self._expired is not None:
            raise self._expired
        result: T = self._result  # known in advance
        return result

    def _wait_quietly(self) -> None:
        self._take()
        try:
            self._complete()  # nothing is raised later: there are no steps of ours to fail
        finally:
            self._busy = False

    def _poke(self) -> None:
        if self._claim():
            try:
                self._test()
            finally:
                self._busy = False

    def test(self) -> tuple[bool, T | None]:
        drive_others(self)
        self._take()
        try:
            if not (self._test() or self._expired is not None):
                return False, None
        finally:
            self._busy = False
        return True, self._outcome()

    def cancel(self) -> bool:
        self._take()
        try:
            reqs = self._reqs
            if reqs is None or self._expired is not None or not self._cancellable:
                return False
            withdrawn = MPIWait(reqs).cancel()
            if withdrawn:
                self._result = None  # (typed T: a cancelled receive's wait() returns None, as documented)
            self._reqs = self._keep = None  # withdrawn, or completed by a message meanwhile: settled either way
            return withdrawn
        finally:
            self._busy = False
