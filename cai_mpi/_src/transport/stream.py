"""A described stream: the steady-state traffic of one edge between a pair of ranks, sender to receiver.

An item that differs from the one before travels self-described (the one path of every message: ``plan_object``,
``isend_plan``, ``ireceive``, on the data communicator's private duplicates). An item that keeps the
shape, dtype and ``meta`` of the last described one, in host memory of numbers in C order, to a receiver with no GPU
of its own, travels as a bare payload on the data communicator itself, into a ring of persistent receives the
receiver posts ahead in buffers of the known size (from the host receive pool); when an item differs again, the
sender first sends an empty message that says so (``SWITCH``), then the described item. Back-pressure: the receiver
sends back how many items it has received (a credit, on persistent requests on the control communicator); the sender
reads them (``acked``). When to credit and how far to run ahead is the owner's policy, not the stream's.

Ring buffers are reused by ownership, never by reference counts: a bare item is a new array over a lease of its
slot's buffer (``pool.lease``), and the slot is free again only once that lease is finalized (the item and every
view or export of it are gone). The buffers come from the host receive pool and go back to it when the ring ends and
no item refers to them, for the next stream (or receive) of their size.
"""

from __future__ import annotations

import json
from collections import deque
from collections.abc import Callable
from functools import partial
from typing import Any

import numpy as np
from mpi4py import MPI

from ..arrays.array import Array, host_memory
from ..config import config
from ..progress.driving import PENDING
from ..progress.posted import PostedRequest
from ..progress.requests import Request
from ..runtime import get_runtime
from .pool import host_receive_pool, lease
from .post import ireceive, isend_plan
from .privcomm import private_comms
from .send import plan_object

__all__ = [
    "DESCRIBED", "END", "FAST", "ITEM", "SWITCH", "StreamIn", "StreamOut", "bare_memory", "exchange_bare_ok",
]

# Tags on the data communicator. ITEM, END and DESCRIBED name self-described messages; DESCRIBED says bare payloads
# of the item's shape, dtype and meta may follow. While the receiver holds such a description, messages travel on
# the data communicator itself: FAST (a bare payload), SWITCH (empty: a self-described message comes next) and END
# (empty).
ITEM, END, DESCRIBED, FAST, SWITCH = range(5)
# Tags of the stream on the control communicator (its owner may use the others: a Pipeline's notices are 1, the
# chain's abandon message 3).
CREDIT, BARE_OK = 0, 2
_BARE_KINDS = frozenset("biufc")  # dtype kinds a bare payload carries (numbers: any buffer-protocol export)
_RING = 4  # the most buffers (and persistent receives) of a held description

# The owner's wait: until the test is true, or raise (for the next item; on leaving, for what the other end does).
Wait = Callable[[Callable[[], bool]], None]


def _tested(req: Request[Any]) -> bool:
    """Whether ``req`` is done (testing it drives it, and raises what it failed with)."""
    return req.test()[0]


def bare_memory(obj: Any) -> np.ndarray[Any, Any] | None:
    """``obj``'s memory when it may travel as a bare payload: a numpy array (not a subclass) or a host Array, of
    numbers, in C order; else None (it always travels self-described)."""
    host: np.ndarray[Any, Any] | None
    if type(obj) is np.ndarray:
        host = obj
    elif type(obj) is Array:
        host = host_memory(obj)
    else:
        return None
    return host if host is not None and host.flags.c_contiguous and host.dtype.kind in _BARE_KINDS else None


def exchange_bare_ok(control: MPI.Intracomm, source: int, dest: int, takes_bare: bool) -> bool:
    """Tell ``source`` whether this rank takes bare payloads (it receives into host memory); whether ``dest`` does.
    Either may be PROC_NULL (no edge there: False)."""
    mine = np.array([takes_bare], np.int64)
    theirs = np.zeros(1, np.int64)
    control.Sendrecv(mine, source, BARE_OK, theirs, dest, BARE_OK)
    return dest != MPI.PROC_NULL and bool(theirs[0])


class StreamOut:
    """The sending end of a described stream to ``dest``.

    ``fn`` names the owner's call in errors about an item. ``bare``: the receiver takes bare payloads. ``window``:
    how many sends of a kind may be in flight before the completed ones are forgotten (sooner while requests need
    driving).
    Counts: ``sent`` (messages, the end included), ``bare_sent``, ``acked`` (the most items the receiver said it
    received), ``credits_read``.
    """

    def __init__(self, data: MPI.Intracomm, control: MPI.Intracomm, dest: int, *, bare: bool, window: int,
                 fn: str) -> None:
        self._data, self.dest, self._bare_ok, self._fn = data, dest, bare, fn
        self._comms = private_comms(data)  # (made collectively by the stream's owner: here, a look-up)
        self._limit = config().max_message_bytes
        self.sent = self.bare_sent = self.acked = self.credits_read = 0
        # What the receiver holds as the description of bare payloads: (shape, dtype, meta as its header encoding).
        self._told: tuple[tuple[int, ...], np.dtype[Any], bytes] | None = None
        self._sends: deque[Request[None]] = deque()  # self-described messages in flight, oldest first
        self._bare_sends: deque[MPI.Request] = deque()  # bare payloads and empty messages, oldest first
        self._window = window  # how many sends of each kind may pile up before the completed ones are forgotten
        # Credits arrive on a persistent receive (a start costs a fraction of an Irecv).
        self._credit = np.zeros(1, np.int64)
        self._credit_req: MPI.Prequest | None = control.Recv_init(self._credit, dest, CREDIT)
        self._credit_req.Start()
        self._control = control

    def send(self, obj: Any, meta: bytes) -> None:
        """Send ``obj`` (anything a send takes) with ``meta`` (its header encoding, checked by the owner): bare when
        the receiver holds its description, else described."""
        host = bare_memory(obj) if self._bare_ok else None
        if host is not None and host.nbytes <= self._limit:
            told = self._told
            if told is not None and host.shape == told[0] and host.dtype == told[1] and meta == told[2]:
                bare = self._bare_sends
                bare.append(self._data.Isend([host, MPI.BYTE], self.dest, FAST))
                self.sent += 1
                self.bare_sent += 1
                if len(bare) > self._window or PENDING:
                    self.reap()
                return
            self._switch()
            self._sends.append(self._describe(obj, DESCRIBED, meta))
            self._told = (host.shape, host.dtype, meta)
        else:
            self._switch()
            self._sends.append(self._describe(obj, ITEM, meta))
        self.sent += 1
        if len(self._sends) > self._window or PENDING:
            self.reap()

    def _describe(self, obj: Any, tag: int, meta: bytes) -> Request[None]:
        """A self-described message, by the one send path (the producer synchronized, planned, posted)."""
        if type(obj) is np.ndarray:  # host memory: no device call to scope
            return self._post(obj, tag, meta)
        with get_runtime().context_scope():  # (as isend_array's: the producer's check, the plan, the first steps)
            return self._post(obj, tag, meta)

    def _post(self, obj: Any, tag: int, meta: bytes) -> Request[None]:
        plan, src = plan_object(self._fn, obj, self._comms, self.dest, None, meta, config())
        assert plan is not None  # (an edge's ends are ranks, never PROC_NULL)
        return isend_plan(self._fn, plan, self._comms, self.dest, tag, (obj, src))

    def _switch(self) -> None:
        """The receiver holds a description: tell it that a self-described message comes next."""
        if self._told is not None:
            self._told = None
            self._bare_sends.append(self._data.Isend([b"", MPI.BYTE], self.dest, SWITCH))

    def close(self) -> None:
        """End the stream: the receiver's ``recv`` returns None after the items sent before."""
        self.end()
        self.sent += 1

    def end(self) -> None:
        """An empty END message (also what matches a receive posted ahead that nothing else will), bare while the
        receiver holds a description."""
        if self._told is not None:
            self._bare_sends.append(self._data.Isend([b"", MPI.BYTE], self.dest, END))
        else:
            self._sends.append(self._describe(np.empty(0, np.uint8), END, b""))

    def read_credits(self) -> None:
        """Take the credits that came: ``acked`` is the last count the receiver sent."""
        req = self._credit_req
        while req is not None and req.Test():
            self.acked = max(self.acked, int(self._credit[0]))
            self.credits_read += 1
            req.Start()

    def reap(self) -> None:
        """Read credits; forget completed sends (testing them also drives every cai_mpi request)."""
        self.read_credits()
        sends = self._sends
        while sends and sends[0].test()[0]:  # (test raises what a failed send raises)
            sends.popleft()
        bare = self._bare_sends
        while bare and bare[0].Test():  # (they complete in order)
            bare.popleft()

    def settle(self, credits_sent: int, wait: Wait) -> None:
        """On leaving, in step with the receiver: receive the rest of the ``credits_sent`` credits it sent, then wait
        (``wait``) until everything sent has been received."""
        missing = credits_sent - self.credits_read
        req = self._credit_req
        assert req is not None
        if missing > 0:
            while True:  # (the receive stays this end's until freed: ``abandon`` can withdraw it)
                wait(req.Test)
                missing -= 1
                if not missing:
                    break
                req.Start()
        else:
            req.Cancel()
            req.Wait()
        req.Free()
        self._credit_req = None
        sends = self._sends
        while sends:
            first = sends[0]
            wait(partial(_tested, first))  # (test raises what a failed send raises)
            sends.popleft()
        bare = self._bare_sends
        wait(lambda: MPI.Request.Testall(list(bare)))
        self._bare_sends = deque()

    def abandon(self, error: BaseException) -> None:
        """Out of step with the receiver: let the bare sends finish in the background; withdraw the credit receive."""
        if self._bare_sends:
            PostedRequest(list(self._bare_sends), None).abandon(error)
            self._bare_sends = deque()
        req = self._credit_req
        if req is not None:
            req.Cancel()
            req.Wait()
            req.Free()
        self._credit_req = None


class _Slot:
    """A buffer of the ring and its persistent receive. ``busy`` from the receive's start until the item that
    landed there, and every view of it, is gone: the item's memory is a lease whose finalization frees the slot, so
    a slot is reused only once cai_mpi knows nothing refers to it."""

    __slots__ = ("address", "buf", "busy", "req")

    def __init__(self, buf: np.ndarray[Any, Any], req: MPI.Prequest) -> None:
        self.buf, self.req, self.busy = buf, req, False
        self.address = int(buf.ctypes.data)

    def lend(self, shape: tuple[int, ...], dtype: np.dtype[Any]) -> np.ndarray[Any, Any]:
        """The item that landed here: a new array over a lease of the buffer (which frees the slot when it dies;
        the slot keeps the buffer alive until then)."""
        lent = lease(self.address, self.buf.nbytes, _free, self)
        flat: np.ndarray[Any, Any] = np.frombuffer(lent, dtype)  # type: ignore[call-overload]
        return flat.reshape(shape)


def _free(slot: _Slot) -> None:
    slot.busy = False


class StreamIn:
    """The receiving end of a described stream from ``source``.

    ``fn`` names the owner's call in errors about an item. Counts: ``received`` (messages, the end included),
    ``bare_received``, ``credits_sent``.
    """

    def __init__(self, data: MPI.Intracomm, control: MPI.Intracomm, source: int, *, fn: str) -> None:
        self._data, self._control, self.source, self._fn = data, control, source, fn
        self._comms = private_comms(data)  # (made collectively by the stream's owner: here, a look-up)
        self.received = self.bare_received = self.credits_sent = 0
        # The description of bare payloads this end holds: (shape, dtype, meta as JSON text or None).
        self._held: tuple[tuple[int, ...], np.dtype[Any], str | None] | None = None
        self._prefetch: Request[Array] | None = None  # the self-described receive posted ahead
        self._bare: MPI.Request | None = None  # the bare payload receive posted ahead
        self._bare_into: _Slot | np.ndarray[Any, Any] | None = None  # where it lands
        self._bare_status = MPI.Status()
        self._ring: list[_Slot] = []
        # Credits go on a persistent send whose buffer is rewritten once the previous credit has gone (else a
        # credit goes as its own Isend, kept in _credits_in_flight).
        self._credit_out = np.zeros(1, np.int64)
        self._credit_send: MPI.Prequest | None = control.Send_init(self._credit_out, source, CREDIT)
        self._credits_in_flight: deque[MPI.Request] = deque()

    @property
    def posted(self) -> bool:
        """Whether a receive is posted ahead (the sender owes it a message, on leaving)."""
        return self._prefetch is not None or self._bare is not None

    def recv(self, wait: Wait) -> Array | None:
        """The next item, or None at the end of the stream; the next receive is posted before it returns."""
        bare = self._bare
        if bare is not None:  # a description is held: a bare payload (or an empty message) comes next
            status = self._bare_status
            if not bare.Test(status):
                wait(lambda: bare.Test(status))
            self._bare = None
            tag = status.Get_tag()
            if tag == FAST:
                held, into = self._held, self._bare_into
                assert held is not None and into is not None
                data = into.lend(held[0], held[1]) if isinstance(into, _Slot) else into
                item = Array.over_host(data, self.source, ITEM, None if held[2] is None else json.loads(held[2]))
                self.bare_received += 1
                return self._arrived(item)
            if tag == END:
                self.received += 1
                return None
            self._unhold()  # SWITCH: a self-described message comes next
        if self._prefetch is None:
            self._prefetch = self._receive(False)
        pending = self._prefetch
        arrived, got = pending.test()
        if not arrived:
            wait(lambda: pending.test()[0])
            got = pending.wait()
        assert got is not None
        self._prefetch = None
        if got.tag == END:
            self.received += 1
            return None
        if got.tag == DESCRIBED:  # bare payloads of its shape, dtype and meta may follow
            got.tag = ITEM
            self._held = (got.shape, got.dtype, None if got.meta is None else json.dumps(got.meta))
        return self._arrived(got)

    def _receive(self, host: bool) -> Request[Array]:
        """Post a self-described receive, by the one receive path: onto this rank's GPU when it has one, unless
        ``host`` (on leaving: what is drained needs no GPU)."""
        rt = get_runtime()
        with rt.context_scope():  # (as irecv_array's: the device it lands on and what the receive does at once)
            ordinal = None if host else rt.current_device()
            return ireceive(self._fn, self._comms, self.source, MPI.ANY_TAG, None, ordinal, rt, None)

    def _arrived(self, item: Array) -> Array:
        self.received += 1
        self._post_next()
        return item

    def _post_next(self) -> None:
        held = self._held
        if held is None:
            self._prefetch = self._receive(False)
            return
        ring = self._ring
        for slot in ring:  # a buffer no item, view or export of an item refers to any more
            if not slot.busy:
                break
        else:
            slot = None
            if len(ring) < _RING:
                shape, dtype = held[0], held[1]
                buf = host_receive_pool().take_array(shape, dtype, int(np.prod(shape)) * dtype.itemsize)
                slot = _Slot(buf, self._data.Recv_init([buf, MPI.BYTE], self.source, MPI.ANY_TAG))
                ring.append(slot)
        if slot is None:  # every buffer of the ring is still in use: a buffer of its own
            self._bare_into = buf = np.empty(held[0], held[1])
            self._bare = self._data.Irecv([buf, MPI.BYTE], self.source, MPI.ANY_TAG)
            return
        slot.busy = True
        self._bare_into = slot
        self._bare = slot.req
        slot.req.Start()

    def _unhold(self) -> None:
        """No description held any more: free the ring's requests (none is active: the last one took the SWITCH).
        Each buffer goes back to the receive pool once no item refers to it."""
        self._held = self._bare_into = None
        for slot in self._ring:
            slot.req.Free()
        self._ring = []

    def credit(self) -> None:
        """Tell the sender how many items this end has received."""
        req = self._credit_send
        assert req is not None
        if req.Test():  # (an inactive persistent request tests complete)
            self._credit_out[0] = self.received
            req.Start()
        else:
            self.forget_sent()
            self._credits_in_flight.append(self._control.Isend(np.array([self.received], np.int64), self.source,
                                                               CREDIT))
        self.credits_sent += 1

    def forget_sent(self) -> None:
        """Drop the credits sent, oldest first (they complete in order; testing only the oldest keeps this constant
        time when the sender is slow to read them)."""
        sent = self._credits_in_flight
        while sent and sent[0].Test():
            sent.popleft()

    def drain(self, count: int, wait: Wait) -> None:
        """On leaving: receive (and drop) the next ``count`` messages still in flight to this end, waiting with
        ``wait``."""
        for _ in range(count):
            self._drain_one(wait)

    def _drain_one(self, wait: Wait) -> None:
        while True:
            if self._bare is None and self._prefetch is None and self._held is not None:
                self._post_next()
            bare, status = self._bare, self._bare_status
            if bare is not None:
                wait(partial(bare.Test, status))
                self._bare = None
                if status.Get_tag() != SWITCH:
                    return
                self._unhold()
                continue
            if self._prefetch is None:
                self._prefetch = self._receive(True)
            pending = self._prefetch
            wait(partial(_tested, pending))
            got = pending.wait()
            self._prefetch = None
            if got.tag == DESCRIBED:
                self._held = (got.shape, got.dtype, None)
            return

    def settle(self, wait: Wait) -> None:
        """On leaving, once drained: wait (``wait``) until the credits sent have gone; free the ring."""
        credits = self._credits_in_flight
        wait(lambda: MPI.Request.Testall(list(credits)))
        self._credits_in_flight = deque()
        sending = self._credit_send
        if sending is not None:
            wait(sending.Test)
            sending.Free()
            self._credit_send = None
        self._unhold()

    def abandon(self, error: BaseException) -> None:
        """Out of step with the sender: withdraw the receives posted ahead (one that matched meanwhile finishes in
        the background), let the credits in flight finish in the background, free the ring."""
        if self._prefetch is not None:
            self._prefetch.cancel()
        if self._credits_in_flight:
            PostedRequest(list(self._credits_in_flight), None).abandon(error)
            self._credits_in_flight = deque()
        bare = self._bare
        if bare is not None and bare != MPI.REQUEST_NULL:
            bare.Cancel()
            bare.Wait()
        sending = self._credit_send
        if sending is not None and not sending.Test():
            PostedRequest([sending], None, keep=self._credit_out).abandon(error)  # (not freed: MPI still sends it)
        elif sending is not None:
            sending.Free()
        self._credit_send = self._bare = None
        self._unhold()
