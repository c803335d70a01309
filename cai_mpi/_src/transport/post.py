"""Posting: the one body per direction that puts a plan's MPI operations on the wire.

A send is ``post_send(plan, ..., poster)``: the header on the header communicator, then each payload message
on the payload communicator. A receive is the header received into an ``Inbox`` (``receive`` or
``receive_steps``), ``plan_recv``, then ``post_recv(plan, ..., poster)`` for the payload messages. The
``Poster`` says how each operation is posted, as mpi4py's ``util.pkl5`` passes ``comm.Send``/``comm.Isend``
to one ``_send`` body:

- ``BLOCKING``: ``Send``/``Recv``, done when the call returns (taken when nothing else needs driving and no
  deadline is set: the 8-byte path is the blocking one);
- ``NONBLOCKING``: ``Isend``/``Irecv``, completed through a ``Request`` (``isend_plan``/``ireceive``); a timeout is a
  deadline on that Request, the body is the same;
- ``PERSISTENT``: ``Send_init``/``Recv_init``, started by a channel each message.

The API calls ``post_send`` with ``BLOCKING`` for a send with nothing to drive and no deadline, else
``isend_plan`` (a Request over the same body); ``receive`` (blocking, or ``ireceive`` waited until a deadline)
and ``ireceive`` for receives. A Request wraps the posted operations and the plan's steps where something is left
to drive.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Generator, Sequence
from typing import Any

import numpy as np
from mpi4py import MPI

from ..arrays.array import Array
from ..arrays.operands import Target
from ..config import Config, config
from ..progress.deadlines import Deadline
from ..progress.driving import PENDING, drive
from ..progress.posted import PostedRequest
from ..progress.requests import Request, wait_until
from ..progress.waits import MPIWait, Waitable
from ..runtime.base import Runtime
from .failure import PREPARED
from .pieces import BYTE, Steps, in_context_scope
from .plans import NO_MESSAGES, RecvPlan, SendPlan
from .privcomm import PrivateComms
from .receive import Inbox, give_back_inbox, header_failure, plan_recv, take_inbox

__all__ = [
    "BLOCKING", "NONBLOCKING", "PERSISTENT", "Poster", "ireceive", "isend_plan", "post_recv", "post_send", "receive",
    "receive_steps",
]


class Poster:
    """How a plan's messages are posted: ``send(comm, spec, dest, tag)`` and ``recv(comm, spec, source, tag)`` are
    ``MPI.Comm``'s own methods. A blocking poster's calls return None once done; the others return requests
    (a persistent poster's inactive: the caller starts them)."""

    __slots__ = ("blocking", "name", "persistent", "recv", "send")

    def __init__(self, name: str, send: Callable[..., Any], recv: Callable[..., Any], *, blocking: bool = False,
                 persistent: bool = False) -> None:
        self.name, self.send, self.recv = name, send, recv
        self.blocking, self.persistent = blocking, persistent

    def __repr__(self) -> str:
        return f"<Poster {self.name}>"


BLOCKING = Poster("blocking", MPI.Comm.Send, MPI.Comm.Recv, blocking=True)
NONBLOCKING = Poster("nonblocking", MPI.Comm.Isend, MPI.Comm.Irecv)
PERSISTENT = Poster("persistent", MPI.Comm.Send_init, MPI.Comm.Recv_init, persistent=True)


# -- sending --------------------------------------------------------------------------------------------------


def post_send(plan: SendPlan, pc: PrivateComms, dest: int, tag: int, poster: Poster) -> list[Any]:
    """Post the header, then every payload message of ``plan``: the one body of every send. The requests, in that
    order (None each for a blocking poster)."""
    post = poster.send
    reqs = [post(pc.header, [plan.header, BYTE], dest, tag)]
    payload = plan.payload
    if payload:
        comm, ptag = pc.payload, plan.ptag
        for spec in payload:
            reqs.append(post(comm, spec, dest, ptag))
    return reqs


def isend_plan(fn: str, plan: SendPlan, pc: PrivateComms, dest: int, tag: int, keep: Any) -> Request[None]:
    """Post ``plan`` nonblocking: a Request that completes when its MPI operations (and steps) have."""
    about = (fn, True, dest, tag, pc.header)
    steps = plan.steps
    if steps is None:
        return PostedRequest(post_send(plan, pc, dest, tag, NONBLOCKING), None, keep=(keep, plan.payload),
                             about=about)
    return Request(_prepared_then_posted(steps, plan, pc, dest, tag), keep=(keep, plan.payload), about=about)


def _prepared_then_posted(steps: Steps, plan: SendPlan, pc: PrivateComms, dest: int, tag: int) -> Steps:
    """The steps run up to PREPARED first (allocations, the device pack, the first staging copy): a failure there
    raises before anything is posted. Then the messages go out and the steps go on; a failure from then on the
    steps announce to the receiver, and the header is still waited for."""
    if next(steps) is not PREPARED:
        raise AssertionError("a send's steps must yield PREPARED first")
    reqs = post_send(plan, pc, dest, tag, NONBLOCKING)
    try:
        yield from steps
    except Exception:
        yield MPIWait(reqs)
        raise
    yield MPIWait(reqs, final=True)


# -- receiving ------------------------------------------------------------------------------------------------

_tls = threading.local()  # a blocking receive uses its thread's own inbox


def post_recv(plan: RecvPlan, pc: PrivateComms, poster: Poster) -> Sequence[Any]:
    """Post every payload message of ``plan``: the one body of every receive's payload. The requests (None each
    for a blocking poster)."""
    payload = plan.payload
    if not payload:
        return NO_MESSAGES
    post, comm, source, ptag = poster.recv, pc.payload, plan.source, plan.ptag
    return [post(comm, spec, source, ptag) for spec in payload]


def receive(fn: str, pc: PrivateComms, source: int, tag: int, target: Target | None, ordinal: int | None, rt: Runtime,
            keep: Any, due: Deadline | None, cfg: Config) -> Array:
    """Receive a message and return its Array (``due``: give up then, withdrawing an unmatched receive). The caller
    holds the call's context scope (``Runtime.context_scope``), which its landing and the waits it drives share."""
    if due is not None or PENDING:
        return wait_until(ireceive(fn, pc, source, tag, target, ordinal, rt, keep), due)
    try:
        inbox = _tls.inbox
    except AttributeError:
        inbox = _tls.inbox = Inbox()
    try:
        pc.header.Recv(inbox.msg, source, tag, inbox.status)
    except MPI.Exception as exc:
        raise header_failure(fn, exc, inbox.status) from None
    plan = plan_recv(fn, inbox, target, ordinal, pc, cfg, rt)
    if plan.payload:
        post_recv(plan, pc, BLOCKING)
    if plan.steps is not None:
        drive(plan.steps)
    result = plan.result
    assert result is not None  # (a refused message's steps raised)
    return result


def ireceive(fn: str, pc: PrivateComms, source: int, tag: int, target: Target | None, ordinal: int | None, rt: Runtime,
          keep: Any) -> Request[Array]:
    """Post the header receive now: a Request that lands the message and returns its Array."""
    return _ReceiveRequest(fn, pc, source, tag, target, ordinal, rt, keep)


class _Phase:
    """A host receive's phase, kept as state where a generator would run steps: its header has not landed yet, or
    its payload's MPI receives are all that is left. Nothing to run or clean up (a withdrawn header receive leaves
    its inbox to the garbage collector)."""

    __slots__ = ()

    def close(self) -> None:
        pass


_HEADER_PHASE: Any = _Phase()
_PAYLOAD_PHASE: Any = _Phase()


# (Request["Array"], not Request[Array]: typing caches the alias Request[Array] with the module Request has when it is
# made, and this one would be made before cai_mpi's __init__ renames Request's module to cai_mpi, so the public
# signatures that name Request[Array] would show the private path)
class _ReceiveRequest(Request["Array"]):
    """``irecv_array``'s request: the header receive is its first wait, and landing the header is plain calls
    (``_land``), so a message that arrives whole in its header (an inline one) completes with no generator, and one
    whose payload lands in host memory waits for its payload receives as state (``_PAYLOAD_PHASE``). Only steps to
    drive (device copies, unpacking, a checked or discarded payload) continue as a generator (``_rest``)."""

    __slots__ = ("_landing",)

    def __init__(self, fn: str, pc: PrivateComms, source: int, tag: int, target: Target | None,
                 ordinal: int | None, rt: Runtime, keep: Any) -> None:
        self._begin(None, None, keep, (fn, False, source, tag, pc.header))  # (settled if posting fails)
        self._landing: tuple[str, Inbox, Target | None, int | None, PrivateComms, Runtime] | None = None
        inbox, hreq = _post_header(pc, source, tag)
        self._gen = _HEADER_PHASE
        self._landing = (fn, inbox, target, ordinal, pc, rt)
        self._first_wait(MPIWait([hreq], inbox.status, cancellable=True))

    def _finish(self, result: Any, error: BaseException | None) -> None:
        self._landing = None  # (a withdrawn receive lets go of out= and its inbox)
        super()._finish(result, error)

    def _advance(self, failure: BaseException | None = None) -> None:
        phase = self._gen
        if phase is _PAYLOAD_PHASE:  # the payload's receives completed: the result is known since the landing
            self._finish(self._result if failure is None else None, failure)
            if failure is not None:
                raise failure
            return
        if phase is not _HEADER_PHASE:
            super()._advance(failure)
            return
        landing = self._landing
        assert landing is not None
        fn, inbox, target, ordinal, pc, rt = landing
        self._landing = None
        try:
            if failure is not None:
                raise header_failure(fn, failure, inbox.status) if isinstance(failure, MPI.Exception) else failure
            if type(target) is np.ndarray or (target is None and ordinal is None):  # host memory: no device call
                plan, reqs = _land(fn, inbox, target, ordinal, pc, rt, NONBLOCKING, False)
            else:
                with rt.context_scope():  # (one context query for the landing's device calls)
                    plan, reqs = _land(fn, inbox, target, ordinal, pc, rt, NONBLOCKING, False)
        except BaseException as exc:
            self._finish(None, exc)
            raise
        if plan.steps is None:
            if not reqs:
                self._finish(plan.result, None)
                return
            self._gen = _PAYLOAD_PHASE
            self._result = plan.result
            self._pending = MPIWait(list(reqs), final=True)
            if self._expired is None:
                PENDING.discard(self)  # (final: MPI completes it without us, as Request._advance decides)
            return
        # (device copies or unpacking between the waits: each part in one context scope)
        self._gen = _array_of(in_context_scope(rt, _rest(plan, reqs)))
        super()._advance()


def _post_header(pc: PrivateComms, source: int, tag: int) -> tuple[Inbox, MPI.Request]:
    """Post a header receive into an inbox of the free list (held until the header is decoded)."""
    inbox = take_inbox()
    try:
        return inbox, pc.header.Irecv(inbox.msg, source, tag)
    except BaseException:
        give_back_inbox(inbox)
        raise


def _land(fn: str, inbox: Inbox, target: Target | None, ordinal: int | None, pc: PrivateComms, rt: Runtime,
          poster: Poster, channel: bool) -> tuple[RecvPlan, Sequence[Any]]:
    """A header has landed in ``inbox``: plan its payload's landing and post the payload with ``poster`` (a
    persistent one's requests are started). The inbox goes back to the free list."""
    try:
        plan = plan_recv(fn, inbox, target, ordinal, pc, config(), rt, channel=channel)
    finally:
        give_back_inbox(inbox)
    reqs = post_recv(plan, pc, poster) if plan.payload else NO_MESSAGES
    if poster.persistent and reqs:
        MPI.Prequest.Startall(list(reqs))
    return plan, reqs


def _rest(plan: RecvPlan, reqs: Sequence[Any]) -> Generator[Waitable, None, RecvPlan]:
    """What is left of a receive once its payload is posted: the payload's completion, then the plan's steps."""
    steps = plan.steps
    if reqs:
        yield MPIWait(list(reqs), final=steps is None)
    if steps is not None:
        yield from steps
    return plan


def _array_of(steps: Generator[Waitable, None, RecvPlan]) -> Generator[Waitable, None, Array]:
    plan = yield from steps
    assert plan.result is not None
    return plan.result


def receive_steps(
    fn: str, pc: PrivateComms, source: int, tag: int, target: Target | None, ordinal: int | None, rt: Runtime,
    poster: Poster, *, channel: bool = False, posted: Callable[[RecvPlan, Sequence[Any]], None] | None = None,
) -> Generator[Waitable, None, RecvPlan]:
    """A receive driven by a Request (a channel's): post the header receive (a Request runs this up to its first
    wait when it is made, so the header receive is posted then), wait for the header, land it with ``poster``
    (``posted`` is told the payload's requests at once: a channel keeps them), then wait for the rest."""
    inbox, hreq = _post_header(pc, source, tag)
    try:
        yield MPIWait([hreq], inbox.status, cancellable=True)
    except MPI.Exception as exc:
        error = header_failure(fn, exc, inbox.status)  # (reads the status before another receive may reuse it)
        give_back_inbox(inbox)
        raise error from None
    except BaseException:
        give_back_inbox(inbox)
        raise
    plan, reqs = _land(fn, inbox, target, ordinal, pc, rt, poster, channel)
    if posted is not None and plan.result is not None:
        posted(plan, reqs)
    return (yield from _rest(plan, reqs))
