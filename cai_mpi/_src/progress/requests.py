"""Requests: the Request that drives a transfer's steps (each waits on a ``waits.Waitable``), and what keeps a
pending request's memory alive until MPI is done with it (dropped, timed out, or at interpreter exit). The rule
that any wait drives every pending request of the process is ``driving``'s."""

from __future__ import annotations

import atexit
import ctypes
import threading
from collections.abc import Callable, Generator
from typing import Any, ClassVar, Generic, TypeVar

from mpi4py import MPI

from ..errors import TimeoutError
from .backoff import Backoff
from .deadlines import Awaited, Deadline, deadline
from .driving import PENDING, Driven, complete, complete_by, drive_others
from .waits import Waitable

__all__ = [
    "CLAIMING", "Request", "RequestWait", "delivered", "keep_past_exit", "outcome", "outcomes", "settled",
    "wait_quietly", "wait_until",
]

T = TypeVar("T")


class RequestWait(Waitable):
    """Completion of another cai_mpi Request (a step that must follow it, e.g. on a persistent channel)."""

    __slots__ = ("req",)

    def __init__(self, req: Request[Any]) -> None:
        self.req = req

    def wait(self) -> None:
        self.req._wait_quietly()

    def test(self) -> bool:
        req = self.req
        if not req._settled and req not in PENDING:
            # A request with only final steps left is polled by nobody else. One still in the
            # progress set is poked there: poking it from here too would walk a queue of W
            # requests once per member, W^2 tests per round.
            req._poke()
        return req._settled


_DONE = object()
_DROPPED = RuntimeError("the request was dropped before it completed")

# Threads that share a request are the rare case, so no request has a lock of its own: a thread takes a request
# (``Request._claim``) under this one lock, held only while it marks the request taken, never while it waits.
CLAIMING = threading.Lock()

#: What a request says it waited for when a timeout fires: an ``Awaited``, or the arguments that make one (a tuple
#: costs no call to build; the text is built only when a timeout fires).
About = Awaited | tuple[str, bool, int, int, MPI.Comm] | None

# Interpreter exit: mpi4py finalizes MPI from Py_AtExit, after Python's teardown has freed what it could, in an order
# nobody controls. MPI may read or write a pending request's memory until MPI_Finalize, so from cai_mpi's atexit hook
# on, pending requests go to ``Request._outliving_teardown``, a list that teardown cannot free (the end of the
# process reclaims it).


def keep_past_exit(req: Request[Any]) -> None:
    """Keep ``req``, and the memory it holds, until the process ends (MPI still owns that memory at exit)."""
    Request._outliving_teardown.append(req)


@atexit.register
def _keep_pending_past_exit() -> None:
    Request._exiting = True  # requests freed from now on are pending ones dropped by teardown: see Request.abandon
    # (a copy first: a thread that completes a request meanwhile would change the set under a Python loop)
    Request._outliving_teardown.extend(req for req in list(PENDING) if isinstance(req, Request))


class Request(Driven, Generic[T]):
    """A nonblocking cai_mpi operation: ``wait()`` returns its result, ``test()`` returns ``(flag, result)``,
    ``cancel()`` withdraws a receive no message has matched yet.

    The request holds every object whose memory the transfer uses (the
    source object, temporaries, the receive buffer) until it completes, so
    dropping your own references right after ``isend_array`` is safe.
    Modifying a send buffer, or reading a receive buffer, before ``wait()``
    returns is an error, as with any MPI nonblocking call. Progress happens
    inside cai_mpi calls that wait (any wait or test, and a blocking send or
    receive, drives every pending request of the process; posting one with
    ``isend_array`` or ``irecv_array`` does not).

    ``wait(timeout)`` gives up with ``cai_mpi.TimeoutError``: a receive whose
    message has not arrived is cancelled (nothing consumed); anything already
    under way is finished in the background, its memory kept alive, its
    result dropped. Either way the request is then done.

    Not an ``MPI.Request`` (a transfer is several MPI operations and steps Python drives): complete several
    with ``cai_mpi.waitall``, ``waitany`` and ``testall``, not MPI's.
    """

    __slots__ = ("__weakref__", "_about", "_busy", "_delivered", "_error", "_expired", "_gen", "_keep", "_pending",
                 "_result")
    # What keeps memory safe in __del__ during teardown, which may have cleared this module's globals already
    # (withdrawing a receive may then fail: the request is kept instead).
    _exiting: ClassVar[bool] = False
    _outliving_teardown: ClassVar[list[Request[Any]]] = []
    _mpi_finalized = staticmethod(MPI.Is_finalized)
    _dropped: ClassVar[BaseException] = _DROPPED

    def __init__(self, gen: Generator[Waitable, None, T], keep: Any = None, about: About = None) -> None:
        self._begin(gen, _DONE, keep, about)
        self._advance()
        pending = self._pending
        if pending is not None and not pending.final:
            PENDING.add(self)

    def _begin(self, gen: Generator[Waitable, None, T] | None, result: Any, keep: Any, about: About) -> None:
        """The state every request starts with (``PostedRequest`` too, which has no steps to advance)."""
        self._gen: Generator[Waitable, None, T] | None = gen
        self._result: Any = result
        self._keep = keep
        self._about = about
        self._expired: BaseException | None = None
        self._error: BaseException | None = None
        self._pending: Waitable | None = None
        self._busy = False  # a thread drives it now (see _claim)
        self._delivered = False  # its result (or error) was returned once: waitany skips it, as MPI skips null requests

    def _first_wait(self, first: Waitable) -> None:
        """Start at ``first`` (for a subclass that posts its first operation itself instead of running steps)."""
        self._pending = first
        if not first.final:
            PENDING.add(self)

    def _advance(self, failure: BaseException | None = None) -> None:
        """Run the steps to their next wait; ``failure``: the pending wait failed, raise it inside the steps so
        they clean up (their ``finally`` runs now, not when the generator is collected)."""
        assert self._gen is not None
        try:
            self._pending = pending = next(self._gen) if failure is None else self._gen.throw(failure)
            if pending.final and self._expired is None:
                PENDING.discard(self)
        except StopIteration as stop:
            self._finish(stop.value, None)
        except BaseException as exc:
            self._finish(None, exc)
            raise

    def _complete_pending(self) -> None:
        """Block until the pending wait completes (driving the others meanwhile), then advance; a failure goes into
        the steps."""
        assert self._pending is not None
        try:
            complete(self._pending, self)
        except BaseException as exc:
            self._advance(exc)
            return
        self._advance()

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
        self._error = error if self._expired is None else self._expired
        self._gen = None
        self._pending = None
        self._keep = None
        PENDING.discard(self)

    def _claim(self) -> bool:
        """Take this request to drive it: False while a thread (another, or this one further up) drives it. The
        taker gives it back with ``_busy = False``."""
        with CLAIMING:
            if self._busy:
                return False
            self._busy = True
            return True

    def _take(self) -> None:
        """Take this request, waiting while another thread drives it (a request shared by threads)."""
        with CLAIMING:
            shared, self._busy = self._busy, True
        if shared:
            pauses = Backoff()
            while not self._claim():
                pauses.pause()

    def _poke(self) -> None:
        """Advance without blocking; errors are kept for this request's own wait()."""
        if not self._claim():
            return  # a thread is driving it
        try:
            while self._gen is not None:
                assert self._pending is not None
                if not self._step(self._pending.test):
                    return
        except BaseException:
            pass  # recorded by _finish; raised by wait()
        finally:
            self._busy = False

    @property
    def done(self) -> bool:
        """True once the request completed (or its ``wait(timeout)`` gave up); never drives it: see ``test()``."""
        return self._gen is None or self._expired is not None

    @property
    def _settled(self) -> bool:
        """Nothing of it is left under way (unlike ``done``, which a timeout makes true at once)."""
        return self._gen is None

    def wait(self, timeout: float | None = None) -> T:
        """Block until the operation completes; return its result (the Array for receives, else None).

        Args:
            timeout: seconds to wait at most (None: ``CAI_MPI_TIMEOUT``, off by default).

        Raises:
            TimeoutError: ``timeout`` passed (see the class docstring for what happens to the operation).
        """
        due = deadline("Request.wait", timeout)
        try:
            return self._wait_until(due)
        finally:
            self._delivered = True

    def _outcome(self) -> T:
        """The result of a request that is done, or the error it ended with; it counts as returned."""
        self._delivered = True
        if self._expired is not None:
            raise self._expired
        if self._error is not None:
            raise self._error
        result: T = self._result  # what the steps returned
        return result

    def _wait_until(self, due: Deadline | None) -> T:
        with CLAIMING:  # (_take, inline: every wait takes its request)
            shared, self._busy = self._busy, True
        if shared:
            self._take()
        try:
            while self._gen is not None and self._expired is None:
                assert self._pending is not None
                if due is None:
                    self._complete_pending()
                else:
                    due = self._step_until(due)
        finally:
            self._busy = False
        if self._expired is not None:
            raise self._expired
        if self._error is not None:
            raise self._error
        result: T = self._result  # what the steps returned
        return result

    def _step_until(self, due: Deadline) -> Deadline:
        """One step, giving up at ``due``: then an unmatched receive is cancelled, anything else abandoned to
        finish in the background. A header that matched gives the rest of the transfer a timeout of its own."""
        pending = self._pending
        assert pending is not None
        if self._step(lambda: complete_by(pending, due, self)):
            return due.renewed() if pending.cancellable else due
        about = self._awaited(False)
        if pending.cancellable:
            try:
                withdrawn = pending.cancel()
            except BaseException as exc:
                self._advance(exc)
                return due
            if not withdrawn:  # the message matched after all: receive it, with time of its own
                self._advance()
                return due.renewed()
            assert self._gen is not None
            self._gen.close()  # its cleanup runs now
            self._finish(None, about.expired(due, cancelled=True))
            return due
        self.abandon(about.expired(due, cancelled=False, matched=True))
        return due

    def _awaited(self, sends: bool) -> Awaited:
        """What this request waited for, for a timeout's error (``sends``: what a request that says nothing does)."""
        about = self._about
        if about is None:
            return Awaited("Request.wait", sends, -1, -1, MPI.COMM_NULL)
        return about if isinstance(about, Awaited) else Awaited(*about)

    def abandon(self, error: BaseException) -> None:
        """Give the caller ``error`` now; MPI still owns this request's memory, so keep it and finish it later (at
        exit: keep it until the process ends)."""
        self._expired = error
        if self._exiting:
            self._outliving_teardown.append(self)
        else:
            PENDING.add(self)

    def __del__(self) -> None:
        """Dropped before it completed: MPI must not be left with memory that is about to be freed (mpi4py frees an
        active request, and MPI would go on reading or writing its buffer). A receive that matched nothing is
        withdrawn, so it cannot swallow a later message; anything else is kept, and finished by later waits."""
        if self._gen is None or self._mpi_finalized():  # (settled)
            return
        pending = self._pending
        if pending is not None and pending.cancellable and self._gen is not None:
            try:
                if pending.cancel():
                    self._gen.close()
                    return
            except Exception:
                pass
        self.abandon(self._dropped)

    def _wait_quietly(self) -> None:
        """Block until completed, even in the background after a timeout; an error stays for ``wait()`` to raise."""
        self._take()
        try:
            while self._gen is not None:
                assert self._pending is not None
                try:
                    self._complete_pending()
                except BaseException:
                    return
        finally:
            self._busy = False

    def test(self) -> tuple[bool, T | None]:
        """Make progress without blocking: ``(True, result)`` once completed (what ``wait()`` returns, or raises),
        else ``(False, None)``, as mpi4py's lowercase ``Request.test``."""
        drive_others(self)
        self._take()
        try:
            while self._gen is not None and self._expired is None:
                assert self._pending is not None
                if not self._step(self._pending.test):
                    return False, None
        finally:
            self._busy = False
        return True, self._outcome()

    def cancel(self) -> bool:
        """Withdraw a receive that no message has matched yet, as ``MPI_Cancel`` does: a cancelled receive takes
        no message (the next one goes to a later receive) and writes nothing into ``out=``.

        Returns:
            True when withdrawn: the request is then complete, ``wait()`` returns None and ``test()``
            ``(True, None)``. False when nothing was withdrawn and the request completes as usual: its message
            matched already, it completed, or it is a send (cai_mpi never withdraws a send; MPI deprecated it).
        """
        self._take()
        try:
            pending = self._pending
            if self._gen is None or self._expired is not None or pending is None or not pending.cancellable:
                return False
            try:
                withdrawn = pending.cancel()
            except BaseException as exc:
                self._advance(exc)
                return False
            if not withdrawn:  # a message matched it meanwhile: the receive goes on
                self._advance()
                return False
            assert self._gen is not None
            self._gen.close()  # its cleanup runs now
            self._finish(None, None)
            return True
        finally:
            self._busy = False

    def __repr__(self) -> str:
        return f"<cai_mpi.Request {'done' if self.done else 'pending'}>"


ctypes.pythonapi.Py_IncRef(ctypes.py_object(Request._outliving_teardown))  # a reference nobody drops


# -- what the library's other modules ask of a Request beyond its public methods --------------------------------


def wait_until(req: Request[T], due: Deadline | None) -> T:
    """Block until ``req`` completes and return its result, or give up at ``due`` as ``Request.wait(timeout)`` does
    (every blocking call with a deadline waits this way)."""
    return req._wait_until(due)


def wait_quietly(req: Request[Any]) -> None:
    """Block until ``req`` completed, even in the background after a timeout; an error stays for ``wait()``."""
    req._wait_quietly()


def settled(req: Request[Any]) -> bool:
    """Nothing of ``req`` is left under way (unlike ``done``, which a timeout makes true at once)."""
    return req._settled


def outcome(req: Request[Any]) -> Any:
    """The result of a request that is done, or the error it ended with; it counts as returned."""
    return req._outcome()


def delivered(req: Request[Any]) -> bool:
    """Whether ``req``'s result (or error) was returned once (``waitany`` skips it, as MPI skips null requests)."""
    return req._delivered


def outcomes(fn: str, reqs: list[Request[Any] | None], due: Deadline | None) -> list[Any]:
    """Each request's result, in list order, waiting (until ``due``) for those not complete (``waitall``,
    ``testall``: ``fn``). Every request is completed, or treated as ``Request.wait(timeout)`` treats it, before the
    first error (in list order) is raised."""
    results: list[Any] = []
    first: tuple[int, Exception] | None = None
    expired: list[TimeoutError] = []
    for i, req in enumerate(reqs):
        if req is None:
            results.append(None)
            continue
        try:
            results.append(req._outcome() if req.done else req._wait_until(due))
        except Exception as exc:  # (an interrupt ends the call at once)
            results.append(None)
            first = first or (i, exc)
            if isinstance(exc, TimeoutError):
                expired.append(exc)
        finally:
            req._delivered = True
    if first is None:
        return results
    index, error = first
    if isinstance(error, TimeoutError):
        count = sum(req is not None for req in reqs)
        raise TimeoutError(
            f"{fn}: {len(expired)} of {count} requests did not complete within {error.seconds:g} s; the first, "
            f"requests[{index}]: {error}", error.seconds, all(e.cancelled for e in expired),
        ) from None
    raise error

