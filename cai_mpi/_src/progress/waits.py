"""What a transfer step waits on: MPI requests, a device event, as ``Waitable``s a ``Request`` drives (the
transport's steps yield them; ``requests`` completes them)."""

from __future__ import annotations

from mpi4py import MPI

from ..runtime.base import Event

__all__ = ["EventWait", "MPIWait", "Waitable"]


class Waitable:
    __slots__ = ()
    #: True when this is a transfer's last step and nothing is left for cai_mpi to do but let MPI finish
    #: (the request then needs no driving by other waits: see ``driving.PENDING``).
    final = False
    #: True for a receive that has matched nothing yet, which a timeout may withdraw (``cancel``).
    cancellable = False

    def wait(self) -> None:
        raise NotImplementedError

    def test(self) -> bool:
        raise NotImplementedError

    def cancel(self) -> bool:
        """Withdraw a ``cancellable`` wait: True if withdrawn, False if it completed first."""
        raise NotImplementedError


class MPIWait(Waitable):
    """Completion of MPI requests; with ``status``, the (single) request's status is filled in.

    ``final``: the transfer has nothing left to do once these complete (see ``Waitable.final``);
    ``cancellable``: the (single) request receives a message's header, which nothing has matched yet.
    """

    __slots__ = ("cancellable", "final", "reqs", "status")

    def __init__(
        self, reqs: list[MPI.Request], status: MPI.Status | None = None, *, final: bool = False,
        cancellable: bool = False,
    ) -> None:
        self.reqs = reqs
        self.status = status
        self.final = final
        self.cancellable = cancellable

    def cancel(self) -> bool:
        """Withdraw the receive: True if it was cancelled (nothing consumed), False if a message matched it first
        (then it has completed, with ``status`` filled in)."""
        status = self.status if self.status is not None else MPI.Status()
        self.reqs[0].Cancel()
        self.reqs[0].Wait(status)
        return bool(status.Is_cancelled())

    def wait(self) -> None:
        if self.status is not None:
            self.reqs[0].Wait(self.status)
        else:
            MPI.Request.Waitall(self.reqs)

    def test(self) -> bool:
        if self.status is not None:
            return bool(self.reqs[0].Test(self.status))
        return bool(MPI.Request.Testall(self.reqs))


class EventWait(Waitable):
    __slots__ = ("event",)

    def __init__(self, event: Event) -> None:
        self.event = event

    def wait(self) -> None:
        self.event.synchronize()

    def test(self) -> bool:
        return self.event.query()
