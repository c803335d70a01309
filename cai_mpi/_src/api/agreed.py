"""What the persistent collectives share: the agreement at creation, waiting on started MPI requests, and finishing
abandoned ones in the background (the registry that frees what is still open at exit is ``lifecycle``'s)."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from mpi4py import MPI

from ..progress.requests import Request
from ..progress.waits import Waitable
from ..transport.agreement import Ballot, check_in_step, fingerprint, reason, vote
from ..transport.engine import verdict
from ..transport.privcomm import PrivateComms

__all__ = ["Started", "agree", "background"]


def agree(fn: str, pc: PrivateComms, due: Any, attempt: Callable[[], tuple[str, Any, bool]]) -> tuple[Any, bool]:
    """Every rank describes what it creates (``attempt()`` -> ``(description, value, on_device)``); one vote
    (``transport.agreement``) says whether all descriptions are equal and whether any rank holds device memory.
    Any difference, or a rank that failed, is an error on every rank (never a hang): the failed rank raises its
    own, the others ``CollectiveMismatchError`` naming what every rank had. Returns ``(value, any rank on
    device)``."""
    check_in_step(fn, pc)
    try:
        text, value, device = attempt()
        error: Exception | None = None
    except Exception as exc:
        text, value, device, error = reason(exc), None, False, exc
    ballot = vote(fn, pc, Ballot(fingerprint(text), failed=error is not None, device=device), due)
    verdict(fn, pc, ballot, due, text, error, "every rank must create it alike (same shape, dtype, op and root)")
    return value, ballot.device


class Started(Waitable):
    """Completion of started collectives, one request at a time: MPICH's ``MPI_Testall`` fails (MPI_ERR_IN_STATUS
    with a status error of 0) on a completed persistent collective request, where ``MPI_Test`` works."""

    __slots__ = ("reqs",)

    def __init__(self, reqs: Sequence[MPI.Request]) -> None:
        self.reqs = reqs

    def wait(self) -> None:
        for req in self.reqs:
            req.Wait()

    def test(self) -> bool:
        return all(req.Test() for req in self.reqs)


def _until(waitable: Waitable) -> Any:
    yield waitable


def background(reqs: list[MPI.Request], keep: Any, error: BaseException) -> Request[None]:
    """Started collectives nobody will wait for (dropped, timed out, at exit): MPI still owns their memory, so a
    Request keeps it (and them) until they complete, driven by every later cai_mpi wait."""
    req: Request[None] = Request(_until(Started(reqs)), keep=keep)
    req.abandon(error)
    return req
