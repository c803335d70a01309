"""Requests and progress: what a transfer step waits on (MPI requests, device events), the Request that
drives the steps, and the rule that any cai_mpi wait drives every pending request of the process."""

from __future__ import annotations

import os
import threading
from collections.abc import Callable, Generator
from typing import Any, Generic, TypeVar

from mpi4py import MPI

from .runtime.base import Event

__all__ = [
    "EventWait", "MPIWait", "PostedRequest", "Request", "RequestWait", "Steps", "Waitable", "complete", "drive", "idle",
]

T = TypeVar("T")


class Waitable:
    __slots__ = ()
    #: True when this is a transfer's last step and nothing is left for cai_mpi to do but let MPI finish
    #: (the request then needs no driving by other waits: see ``_active``).
    final = False

    def wait(self) -> None:
        raise NotImplementedError

    def test(self) -> bool:
        raise NotImplementedError


class MPIWait(Waitable):
    """Completion of MPI requests; with ``status``, the (single) request's status is filled in.

    ``final``: the transfer has nothing left to do once these complete (see ``Waitable.final``).
    """

    __slots__ = ("final", "reqs", "status")

    def __init__(self, reqs: list[MPI.Request], status: MPI.Status | None = None, *, final: bool = False) -> None:
        self.reqs = reqs
        self.status = status
        self.final = final

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


class RequestWait(Waitable):
    """Completion of another cai_mpi Request (a step that must follow it, e.g. on a persistent channel)."""

    __slots__ = ("req",)

    def __init__(self, req: Request[Any]) -> None:
        self.req = req

    def wait(self) -> None:
        self.req._wait_quietly()

    def test(self) -> bool:
        req = self.req
        if not req.done and req not in _active:
            # A request with only final steps left is polled by nobody else. One still in the
            # progress set is poked there: poking it from here too would walk a queue of W
            # requests once per member, W^2 tests per round.
            req._poke()
        return req.done


_DONE = object()

# Requests that still need the library to act (post the payload receive once the header is in, stage the
# next chunk...). Any cai_mpi wait drives all of them, so "irecv_array then send_array" on two ranks, or a
# staged isend_array followed by a blocking recv_array, cannot deadlock. A request whose remaining step is
# final (all its MPI operations posted) leaves the set: MPI completes it without us, and a window of sends
# must not make every other wait poll each of them.
_active: set[Request[Any]] = set()


Steps = Generator["Waitable", None, T]


def idle() -> bool:
    """True when no request needs driving: a blocking MPI call cannot starve another cai_mpi transfer."""
    return not _active


def drive(steps: Generator[Waitable, None, T]) -> T:
    """Run a transfer's steps to the end in the calling thread (what a blocking call does). A wait that fails is
    raised inside the steps, so they clean up (their ``finally`` runs now) before the error reaches the caller."""
    try:
        waitable = next(steps)
        while True:
            try:
                complete(waitable)
            except BaseException as exc:
                waitable = steps.throw(exc)
                continue
            waitable = next(steps)
    except StopIteration as stop:
        return stop.value  # type: ignore[no-any-return]


def others_pending(me: object = None) -> bool:
    return bool(_active) and (len(_active) > 1 or me not in _active)


def _progress_others(me: object) -> None:
    for req in list(_active):
        if req is not me:
            req._poke()


def complete(waitable: Waitable, me: object = None) -> None:
    """Block until ``waitable`` completes, driving every other pending cai_mpi request meanwhile."""
    if not others_pending(me):
        waitable.wait()
        return
    while not waitable.test():
        _progress_others(me)
        if not others_pending(me):
            waitable.wait()
            return
        os.sched_yield()  # let other threads run (it releases the GIL; time.sleep(0) costs ~80 us of timer slack)


class Request(Generic[T]):
    """A nonblocking cai_mpi operation: ``wait()`` returns its result, ``test()`` says if it completed.

    The request holds every object whose memory the transfer uses (the
    source object, temporaries, the receive buffer) until it completes, so
    dropping your own references right after ``isend_array`` is safe.
    Modifying a send buffer, or reading a receive buffer, before ``wait()``
    returns is an error, as with any MPI nonblocking call. Progress happens
    inside cai_mpi calls (any wait, test, send or receive drives every
    pending request of the process).
    """

    __slots__ = ("__weakref__", "_error", "_gen", "_keep", "_lock", "_pending", "_result")

    def __init__(self, gen: Generator[Waitable, None, T], keep: Any = None) -> None:
        self._gen: Generator[Waitable, None, T] | None = gen
        self._keep = keep
        self._result: Any = _DONE
        self._error: BaseException | None = None
        self._pending: Waitable | None = None
        self._lock = threading.Lock()
        self._advance()
        pending = self._pending
        if pending is not None and not pending.final:
            _active.add(self)

    def _advance(self, failure: BaseException | None = None) -> None:
        """Run the steps to their next wait; ``failure``: the pending wait failed, raise it inside the steps so
        they clean up (their ``finally`` runs now, not when the generator is collected)."""
        assert self._gen is not None
        try:
            self._pending = pending = next(self._gen) if failure is None else self._gen.throw(failure)
            if pending.final:
                _active.discard(self)
        except StopIteration as stop:
            self._finish(stop.value, None)
        except BaseException as exc:
            self._finish(None, exc)
            raise

    def _complete_pending(self) -> bool:
        assert self._pending is not None
        complete(self._pending, self)
        return True

    def _step(self, done: Callable[[], bool]) -> bool:
        """If ``done()`` (a test or a wait of the pending step) says so, advance; a failure goes into the steps."""
        try:
            if not done():
                return False
        except BaseException as exc:
            self._advance(exc)
            return True
        self._advance()
        return True

    def _finish(self, result: Any, error: BaseException | None) -> None:
        self._result = result
        self._error = error
        self._gen = None
        self._pending = None
        self._keep = None
        _active.discard(self)

    def _poke(self) -> None:
        """Advance without blocking; errors are kept for this request's own wait()."""
        if not self._lock.acquire(blocking=False):
            return  # another thread is driving it
        try:
            while self._gen is not None:
                assert self._pending is not None
                if not self._step(self._pending.test):
                    return
        except BaseException:
            pass  # recorded by _finish; raised by wait()
        finally:
            self._lock.release()

    @property
    def done(self) -> bool:
        return self._gen is None

    def wait(self) -> T:
        """Block until the operation completes; return its result (the Array for receives, else None)."""
        with self._lock:
            while self._gen is not None:
                assert self._pending is not None
                self._step(self._complete_pending)
        if self._error is not None:
            raise self._error
        return self._result  # type: ignore[no-any-return]

    def _wait_quietly(self) -> None:
        """Block until completed; an error stays for this request's own ``wait()`` to raise."""
        with self._lock:
            while self._gen is not None:
                assert self._pending is not None
                try:
                    self._step(self._complete_pending)
                except BaseException:
                    return

    def test(self) -> bool:
        """Make progress without blocking; True once the operation has completed (then ``wait()`` returns)."""
        _progress_others(self)
        with self._lock:
            while self._gen is not None:
                assert self._pending is not None
                if not self._step(self._pending.test):
                    return False
        return True

    def __repr__(self) -> str:
        return f"<cai_mpi.Request {'done' if self.done else 'pending'}>"


class PostedRequest(Request[T]):
    """A Request whose MPI operations are all posted and whose result is known in advance.

    Completing the MPI requests is all that is left, so there is no generator to drive: the
    common nonblocking sends (a contiguous host array, a small one inline) and started channel
    messages. Creating and completing one costs about a third of a generator-driven Request.
    Its waits still drive the other pending cai_mpi requests, like any Request's.
    """

    __slots__ = ("_reqs",)

    def __init__(self, reqs: list[MPI.Request], result: T, keep: Any = None) -> None:
        self._reqs: list[MPI.Request] | None = reqs
        self._result = result
        self._keep = keep
        self._error = None
        self._gen = None
        self._pending = None
        self._lock = threading.Lock()

    @property
    def done(self) -> bool:
        return self._reqs is None

    def _complete(self) -> None:
        """Block until the MPI requests complete (the caller holds the lock)."""
        reqs = self._reqs
        if reqs is not None:
            if _active:
                complete(MPIWait(reqs), self)
            else:
                MPI.Request.Waitall(reqs)
            self._reqs = self._keep = None

    def _test(self) -> bool:
        """Complete the MPI requests if they can be without blocking (the caller holds the lock)."""
        reqs = self._reqs
        if reqs is not None and MPI.Request.Testall(reqs):
            self._reqs = self._keep = None
        return self._reqs is None

    def wait(self) -> T:
        with self._lock:
            self._complete()
        return self._result  # type: ignore[no-any-return]

    def _wait_quietly(self) -> None:
        self.wait()  # nothing is raised later: there are no steps of ours to fail

    def _poke(self) -> None:
        if self._lock.acquire(blocking=False):
            try:
                self._test()
            finally:
                self._lock.release()

    def test(self) -> bool:
        _progress_others(self)
        with self._lock:
            return self._test()
