"""Completing several cai_mpi requests together: ``waitall``, ``waitany`` and ``testall``, mpi4py's lowercase forms.

A cai_mpi ``Request`` is not an ``MPI.Request``: one transfer is a header message, one or more payload messages and,
for device or strided data, copies and packing steps that Python drives between them (``requests.py``). MPI's own
``Waitall`` cannot run those steps, so these functions drive every listed request together, with every other
pending cai_mpi request of the process, and block in MPI only once nothing is left for cai_mpi to do: ``waitall``
waits for each in list order, and each wait drives all the others (the progress rule, ``progress/driving.py``);
``waitany`` and ``testall`` poll them all in one loop.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from typing import Any

from mpi4py import MPI

from ..errors import TimeoutError
from ..progress.backoff import Backoff
from ..progress.deadlines import deadline
from ..progress.driving import PENDING, drive_others, poke
from ..progress.requests import Request, delivered, outcome, outcomes, wait_until
from ..runtime import get_runtime

__all__ = ["testall", "waitall", "waitany"]


def _requests(fn: str, requests: Iterable[Request[Any] | None]) -> list[Request[Any] | None]:
    """The requests as a list (None entries stand for nothing, as MPI.REQUEST_NULL does), or TypeError."""
    try:
        reqs = list(requests)
    except TypeError:
        raise TypeError(f"{fn}: requests must be a list of cai_mpi Requests, got {type(requests).__name__}") from None
    for i, req in enumerate(reqs):
        if req is not None and not isinstance(req, Request):
            hint = (": complete mpi4py's requests with MPI.Request.waitall, cai_mpi's with cai_mpi." + fn
                    if isinstance(req, MPI.Request) else "")
            raise TypeError(f"{fn}: requests[{i}] is a {type(req).__name__}, not a cai_mpi Request{hint}")
    return reqs


def _poll(pending: list[Request[Any]]) -> None:
    """One round of progress, without blocking, on every pending cai_mpi request and on each of ``pending``."""
    drive_others(None)
    for req in pending:
        if req not in PENDING:  # (those were driven just now)
            poke(req)


def waitall(requests: Iterable[Request[Any] | None], timeout: float | None = None) -> list[Any]:
    """Complete every request, driving all of them together; their results in order (mpi4py's ``waitall``).

    Use it instead of ``MPI.Request.waitall``, which cannot take cai_mpi requests (see ``Request``). Sends and
    receives may be mixed; ``None`` entries give ``None``. Any other pending cai_mpi request of the process makes
    progress meanwhile, as in every cai_mpi wait.

    Args:
        requests: cai_mpi Requests (from ``isend_array``, ``irecv_array``, channels), or None.
        timeout: seconds to wait at most for all of them (None: ``CAI_MPI_TIMEOUT``, off by default).

    Returns:
        One result per request: the Array of a receive, None for a send.

    Raises:
        TimeoutError: ``timeout`` passed; each request not complete was treated as ``Request.wait(timeout)`` treats
            it (a receive that matched nothing is cancelled, the rest finishes in the background), and the message
            names how many and the first.
        RecvMismatchError, ProtocolError...: what a request's own ``wait()`` raises, the first in list order, once
            every request has completed.

    Example:
        >>> recv = cai_mpi.irecv_array(left)  # doctest: +SKIP
        >>> send = cai_mpi.isend_array(x, right)  # doctest: +SKIP
        >>> got, _ = cai_mpi.waitall([recv, send])  # doctest: +SKIP
    """
    # Each request's own wait drives every other pending one (the progress rule), so completing them in list order
    # completes them all, whatever order they finish in.
    # (one context query for every device step the waits drive: the user cannot switch contexts inside this call)
    with get_runtime().context_scope():
        return outcomes("waitall", _requests("waitall", requests), deadline("waitall", timeout))


def waitany(requests: Iterable[Request[Any] | None], timeout: float | None = None) -> tuple[int, Any]:
    """Wait until one request completes, driving all of them together: ``(index, result)`` (mpi4py's ``waitany``).

    As MPI skips inactive requests, requests whose result was already returned (by ``waitany``, ``waitall``,
    ``testall``, ``wait()`` or ``test()``) and ``None`` entries are skipped, so calling it again with the same list
    returns the next one to complete; when none is left it returns ``(MPI.UNDEFINED, None)``.

    Args:
        requests: cai_mpi Requests, or None.
        timeout: seconds to wait at most (None: ``CAI_MPI_TIMEOUT``, off by default).

    Returns:
        The index of a completed request and its result (the Array of a receive, None for a send).

    Raises:
        TimeoutError: none completed within ``timeout``; each was then treated as ``Request.wait(timeout)`` treats
            it (one that completed at the last moment keeps its result for its own ``wait()``).
        RecvMismatchError, ProtocolError...: what the completed request's ``wait()`` raises.

    Example:
        >>> reqs = [cai_mpi.irecv_array(r) for r in peers]  # doctest: +SKIP
        >>> for _ in reqs:  # doctest: +SKIP
        ...     i, got = cai_mpi.waitany(reqs)  # the first to arrive, then the next...
    """
    reqs = _requests("waitany", requests)
    due = deadline("waitany", timeout)
    candidates = [(i, req) for i, req in enumerate(reqs) if req is not None and not delivered(req)]
    if not candidates:
        return MPI.UNDEFINED, None
    pauses = Backoff(until=math.inf if due is None else due.at)
    while True:
        for i, req in candidates:
            if req.done:
                return i, outcome(req)
        _poll([req for _, req in candidates])
        if not pauses.pause():
            break
    assert due is not None
    cancelled = True
    for _, req in candidates:
        if not req.done:
            try:
                wait_until(req, due)  # (past due: withdrawn, or left to finish in the background, as wait() does)
            except TimeoutError as exc:
                cancelled &= exc.cancelled
            except Exception:
                pass  # it completed at the last moment, with an error its own wait() raises
    raise TimeoutError(f"waitany: none of {len(candidates)} requests completed within {due.seconds:g} s (each one "
                       "not complete was treated as Request.wait(timeout) treats it)", due.seconds, cancelled)


def testall(requests: Iterable[Request[Any] | None]) -> tuple[bool, list[Any] | None]:
    """Make progress on every request without blocking: ``(True, results)`` if all have completed, else
    ``(False, None)`` (mpi4py's ``testall``).

    Args:
        requests: cai_mpi Requests, or None (its result is None).

    Returns:
        ``(True, [result of each request])`` once all completed, else ``(False, None)``.

    Raises:
        RecvMismatchError, ProtocolError, TimeoutError...: once all completed, what the first failed request's
            ``wait()`` raises.
    """
    reqs = _requests("testall", requests)
    pending = [req for req in reqs if req is not None and not req.done]
    if pending:
        _poll(pending)
        if not all(req.done for req in pending):
            return False, None
    return True, outcomes("testall", reqs, None)
