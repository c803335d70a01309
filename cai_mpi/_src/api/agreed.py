"""What the persistent collectives share: the agreement at creation, waiting on started MPI requests, finishing
abandoned ones in the background, and the registry that frees what is still open when the interpreter exits."""

from __future__ import annotations

import atexit
import hashlib
import weakref
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np
from mpi4py import MPI

from ..errors import CollectiveMismatchError
from ..progress.requests import Request
from ..progress.waits import Waitable
from ..transport.agreement import joined

__all__ = ["Started", "agree", "background", "open_collectives"]


def _fingerprint(text: str) -> int:
    return int.from_bytes(hashlib.blake2b(text.encode(), digest_size=8).digest(), "little", signed=True)


def agree(fn: str, comm: MPI.Intracomm, due: Any, attempt: Callable[[], tuple[str, Any, bool]]) -> tuple[Any, bool]:
    """Every rank describes what it creates (``attempt()`` -> ``(description, value, on_device)``); one Allreduce
    says whether all descriptions are equal and whether any rank holds device memory. Any difference, or a rank
    that failed, is an error on every rank (never a hang): the failed rank raises its own, the others
    ``CollectiveMismatchError`` naming what every rank had. Returns ``(value, any rank on device)``."""
    try:
        text, value, device = attempt()
        error: Exception | None = None
    except Exception as exc:
        text, value, device, error = f"could not take part ({type(exc).__name__}: {exc})", None, False, exc
    fp = _fingerprint(text)
    votes = np.array([fp, -fp, -int(error is not None), -int(device)], np.int64)
    joined(fn, comm, due, "Allreduce", MPI.IN_PLACE, votes, MPI.MIN)
    if votes[0] == -votes[1] and votes[2] == 0:
        return value, bool(votes[3])
    texts = comm.allgather(text)  # (the error path only: pickled strings are fine)
    if error is not None:
        raise error
    had = "; ".join(f"rank {r}: {t}" for r, t in enumerate(texts))
    raise CollectiveMismatchError(f"{fn}: every rank must create it alike (same shape, dtype, op and root), but {had}")


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
    req._abandon(error)
    return req


def open_collectives() -> weakref.WeakSet[Any]:
    """Persistent collectives not closed yet (bucketed ones register here too: see ``_at_exit``)."""
    return _open


# Not closed yet: their MPI requests are freed before MPI finalizes (a started one is kept past exit instead).
_open: weakref.WeakSet[Any] = weakref.WeakSet()  # (bucketed ones too: all have _at_exit)


@atexit.register
def _free_open() -> None:
    for p in list(_open):
        p._at_exit()
