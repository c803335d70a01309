"""The life of a persistent collective, whatever it reduces or moves: ``start``, ``test`` and ``wait`` (with a
timeout), ``close`` (collective), the context manager, a dropped object finished in the background, and the exit
hook.

``PersistentLifecycle`` owns that bookkeeping and the errors of a misuse (used after ``close``, or after a wait
timed out; ``start`` twice; ``wait`` or ``test`` without ``start``; an input whose shape changed). A subclass says
only what differs: how a use begins (``_begin``: the MPI requests it started) and completes (``_done``: the
result), and which memory MPI uses while a dropped use finishes (``_memory``).
"""

from __future__ import annotations

import atexit
import weakref
from types import TracebackType
from typing import Any, TypeVar

from mpi4py import MPI

from ..progress.deadlines import collective_expired, deadline
from ..progress.driving import complete, complete_by, drive_others, idle
from ..progress.requests import keep_past_exit
from .agreed import Started, background

__all__ = ["PersistentLifecycle", "open_collectives"]

_Self = TypeVar("_Self", bound="PersistentLifecycle")


class PersistentLifecycle:
    """A collective used any number of times after its creation (see ``PersistentCollective`` and
    ``BucketedAllreduce`` for what a use does).

    ``_reqs`` are the MPI requests the object owns (freed by ``close``), ``_now`` those of the use in flight.
    A subclass's ``__init__`` calls ``_begin_life`` first (so that a failed creation is collected cleanly) and
    ``_open`` once it can be used.
    """

    __slots__ = ("__weakref__", "_closed", "_comm", "_expired", "_fn", "_now", "_reqs", "_started", "_what")

    _comm: MPI.Intracomm
    _expired: BaseException | None

    def _begin_life(self, fn: str, what: str) -> None:
        self._fn, self._what = fn, what
        self._reqs: list[MPI.Request] = []
        self._now: list[MPI.Request] = []
        self._closed, self._started, self._expired = True, False, None

    def _open(self) -> None:
        self._closed = False
        _open.add(self)

    # what a subclass says

    def _begin(self) -> list[MPI.Request]:
        """Start a use with the input's current contents; return the MPI requests now in flight."""
        raise NotImplementedError

    def _done(self) -> Any:
        """The result of the use whose requests completed."""
        raise NotImplementedError

    def _memory(self) -> Any:
        """What MPI reads or writes while a use is in flight (kept alive when the object is dropped)."""
        raise NotImplementedError

    def _shut(self) -> None:
        """Refuse any further use (the requests are kept: see ``close``)."""
        self._closed = True

    # the errors

    def _check(self, what: str) -> None:
        if self._closed:
            raise ValueError(f"{self._fn}: {what} on a closed {self._what}")
        if self._expired is not None:
            raise ValueError(f"{self._fn}: {what} after an earlier wait timed out (the collectives of this "
                             f"communicator are out of step): {self._expired}")

    def _changed(self, what: str, before: tuple[int, ...], now: tuple[int, ...]) -> ValueError:
        """The error for an input whose shape (or memory) is not the one agreed at creation."""
        return ValueError(f"{self._fn}: {what} since creation ({before} -> {now}): a persistent collective's "
                          f"shape is fixed; create a new one")

    # a use

    def start(self) -> None:
        """Begin a use with the input's current contents (its producer stream synchronized first, per ``sync``)."""
        self._check("start")
        if self._started:
            raise ValueError(f"{self._fn}: start() while a use is in flight: wait() for it first")
        self._now = self._begin()
        self._started = True

    def wait(self, timeout: float | None = None) -> Any:
        """Finish the use begun by ``start()``; return its result (overwritten by the next use).

        Args:
            timeout: seconds to wait at most (None: ``CAI_MPI_TIMEOUT``, off by default). Past it, ``TimeoutError``:
                MPI cannot withdraw a collective, so this communicator's collectives are out of step; the
                object refuses further use (close it, and end the job).
        """
        if not self._started:
            self._check("wait()")
            raise ValueError(f"{self._fn}: wait() without start()")
        reqs = self._now
        due = deadline(f"{self._fn}.wait", timeout)
        if due is None:
            if idle():
                for req in reqs:
                    req.Wait()
            else:
                complete(Started(reqs))
        elif not complete_by(Started(reqs), due):
            error = collective_expired(self._fn, self._comm, due)
            self._expired = error
            background(list(reqs), self, error)
            raise error
        self._started = False
        return self._done()

    def test(self) -> tuple[bool, Any]:
        """Make progress on the use begun by ``start()`` without blocking, as mpi4py's lowercase ``Request.test``:
        ``(True, result)`` once it completed (what ``wait()`` returns; the use is then over, and the next
        ``start()`` allowed), else ``(False, None)``.

        Example:
            >>> red.start()  # doctest: +SKIP
            >>> while not (done := red.test())[0]:  # doctest: +SKIP
            ...     work_on_something_else()
            >>> total = done[1]  # doctest: +SKIP
        """
        if not self._started:
            self._check("test()")
            raise ValueError(f"{self._fn}: test() without start()")
        drive_others(self)
        if not Started(self._now).test():
            return False, None
        self._started = False
        return True, self._done()

    def __call__(self, timeout: float | None = None) -> Any:
        """``start()`` then ``wait(timeout)``: one use, with the input's current contents."""
        self.start()
        return self.wait(timeout)

    # the end

    def close(self, timeout: float | None = None) -> None:
        """Finish a use still in flight, then free the MPI requests (idempotent; collective: call it on every rank).

        Args:
            timeout: for the use in flight, as in ``wait``.
        """
        if self._closed:
            return
        try:
            if self._started and self._expired is None:
                self.wait(timeout)
        finally:
            if self._started:  # timed out: MPI still owns the requests; they are freed with the object
                self._shut()
            else:
                self._free()

    def __enter__(self: _Self) -> _Self:
        return self

    def __exit__(self, kind: type[BaseException] | None, error: BaseException | None, tb: TracebackType | None) -> None:
        if error is None:
            self.close()
        elif not self._started:  # leaving on an error: waiting for the other ranks now could hang
            self._free()

    def _free(self) -> None:
        self._shut()
        reqs, self._reqs = self._reqs, []
        if reqs and MPI.Is_initialized() and not MPI.Is_finalized():
            for req in reqs:
                if req != MPI.REQUEST_NULL:
                    req.Free()

    def _at_exit(self) -> None:
        """At interpreter exit, before MPI finalizes (``agreed``'s registry calls it on every open object)."""
        if self._started:
            self._shut()  # (kept, with its requests, until the process ends)
            keep_past_exit(background(list(self._now), self, RuntimeError("in flight at exit")))
        else:
            self._free()

    def __del__(self) -> None:
        if not hasattr(self, "_started"):
            return
        if self._started and self._now and not MPI.Is_finalized():
            # dropped while in flight: MPI still owns the buffers; finish it in the background, then free it
            background(list(self._now), self._memory(), RuntimeError("dropped while in flight"))
            return
        self._free()

    def _state(self) -> str:
        return "closed" if self._closed else ("started" if self._started else "ready")


def open_collectives() -> weakref.WeakSet[PersistentLifecycle]:
    """Persistent collectives not closed yet (bucketed ones too: every one has ``_at_exit``)."""
    return _open


# Not closed yet: their MPI requests are freed before MPI finalizes (a started one is kept past exit instead).
_open: weakref.WeakSet[PersistentLifecycle] = weakref.WeakSet()


@atexit.register
def _free_open() -> None:
    for p in list(_open):
        p._at_exit()
