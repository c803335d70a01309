"""Pipeline: a chain of ranks passing self-describing arrays downstream, with back-pressure and errors
that reach every stage.

Stage ``r`` of ``comm`` receives from ``r - 1`` and sends to ``r + 1``. Items travel with
``isend_array``/``irecv_array`` on a private duplicate of ``comm`` (their headers and payloads on cai_mpi's own
duplicates of it), except a run of items that keep the shape, dtype and ``meta`` of the one before, in host
memory in C order: once an item has described them, the next ones travel as bare payloads, posted ahead by the
receiving stage into buffers of the known size (the way a channel moves its messages), until an item that
differs (the sender first sends an empty message that says so, and the described item after it). A second
duplicate carries the control messages: credits (how many items a stage has received, sent back upstream once
per half window, ``depth // 2`` items, so a stream of small items does not cost a control message per item) and failure
notices (sent by a failing stage to every other one). A sender never has more than ``depth`` items sent and
not yet received downstream. Leaving the ``with`` block is collective: the stages agree on whether any of
them failed, receive whatever is still in flight, and free the duplicates, so nothing is left unmatched.
"""

from __future__ import annotations

import ctypes
import json
import time
from collections import deque
from collections.abc import Callable, Iterator
from typing import Any

import numpy as np
from mpi4py import MPI

from ..arrays.array import Array
from ..config import config
from ..errors import TimeoutError
from ..progress.deadlines import deadline
from ..progress.driving import PENDING
from ..progress.requests import Request
from ..runtime import get_runtime
from ..transport.privcomm import private_comms
from .p2p import irecv_array, isend_array
from .pipeline_leave import Leaving, wait_pauses
from .pipeline_wire import (
    CREDIT,
    DESCRIBED,
    END,
    FAST,
    HOST,
    ITEM,
    NOTICE,
    NOTICE_BYTES,
    SWITCH,
    bare_memory,
    failure_from,
)
from .validation import check_meta, receive_device

__all__ = ["Pipeline"]

_RING = 4  # the most buffers (and persistent receives) of a held description
# Buffers of rings that ended with no item in them held, for the next ring of the same shape and dtype (a new
# Pipeline for every batch of items would otherwise fault in fresh pages for every ring); at most _KEPT_BYTES, and
# no more than CAI_MPI_POOL_BYTES (the receive pool's budget of idle memory).
_kept: dict[tuple[tuple[int, ...], np.dtype[Any]], list[np.ndarray[Any, Any]]] = {}
_KEPT_BYTES = 64 << 20
_SPIN = 20e-6  # seconds a wait polls before it pauses (yields, then sleeps) between polls


class _Slot:
    """A buffer of the ring and its persistent receive. ``busy`` from the receive's start until the item that
    landed there, and every view of it, is gone: the item's memory is a lease (``_lease``) whose finalization
    frees the slot, so a slot is reused only once cai_mpi knows nothing refers to it."""

    __slots__ = ("address", "buf", "busy", "req")

    def __init__(self, buf: np.ndarray[Any, Any], req: MPI.Prequest) -> None:
        self.buf, self.req, self.busy = buf, req, False
        self.address = int(buf.ctypes.data)

    def lend(self, shape: tuple[int, ...], dtype: np.dtype[Any]) -> np.ndarray[Any, Any]:
        """The item that landed here: a new array over a lease of the buffer (which frees the slot when it dies)."""
        lease = _lease(self.buf.nbytes).from_address(self.address)
        lease._slot, lease._keep = self, self.buf  # type: ignore[attr-defined]  # (a ctypes type made at run time)
        flat: np.ndarray[Any, Any] = np.frombuffer(lease, dtype)  # type: ignore[call-overload]
        return flat.reshape(shape)


_leases: dict[int, type[ctypes.Array[ctypes.c_ubyte]]] = {}


def _lease(nbytes: int) -> type[ctypes.Array[ctypes.c_ubyte]]:
    """A ctypes array type over ``nbytes`` that frees its slot when it dies: numpy keeps the exporter of a buffer
    as the base of every array made from it (views included), so the lease lives as long as the last of them."""
    lease_type = _leases.get(nbytes)
    if lease_type is None:

        def __del__(self: Any) -> None:
            self._slot.busy = False

        lease_type = _leases[nbytes] = type(f"_RingLease{nbytes}", (ctypes.c_ubyte * nbytes,), {"__del__": __del__})
    return lease_type


class Pipeline(Leaving):
    """A chain of the ranks of ``comm``: stage ``r`` receives from ``r - 1`` and sends to ``r + 1``.

    Constructing one is collective over ``comm``, and so is leaving its ``with`` block. ``send`` blocks
    only when ``depth`` items are sent and not yet received by the next stage; ``recv`` (and iteration,
    which receives the next item while you work on this one) returns None at the end of the stream.
    ``send`` keeps a reference to what it sends until MPI is done with it: dropping yours is safe,
    modifying the array in place before then is an error, as with any nonblocking send.

    ``timeout``: seconds a ``send`` or ``recv`` waits at most for a credit or an item (None:
    ``CAI_MPI_TIMEOUT``, off by default); past it, ``TimeoutError`` on that stage, which the others
    then see as its failure (``PipelineError``) on leaving the ``with`` block. Leaving waits for every
    stage to leave, at most ``timeout`` once per stage and item that may still be in flight
    (``timeout * size * (depth + 1)``); past it, ``TimeoutError``, and the pipeline is abandoned
    (its pending messages finish in the background; ``comm`` stays usable).

    A failing stage's error reaches the others as ``PipelineError`` at their next wait (for an item, a credit,
    or on leaving); items it sent before it failed are not withdrawn, so a later stage may still receive some of
    them first (how many depends on timing). Items reach the next stage in the order sent, each once. See
    docs/reliability.md, "A failing Pipeline stage".

    Args:
        comm: the ranks of the chain, in order (None for COMM_WORLD); any intracommunicator.
        depth: the most items a stage may have sent and the next not yet received (an int >= 1).
        timeout: seconds a ``send`` or ``recv`` waits at most (None: ``CAI_MPI_TIMEOUT``, off by default).

    Attributes:
        stage: this rank's stage: its rank in ``comm``.
        first: True on stage 0, which only sends.
        last: True on the last stage, which only receives.
        depth: the ``depth`` it was made with.

    Example:
        >>> with cai_mpi.Pipeline() as pipe:  # doctest: +SKIP
        ...     if pipe.first:
        ...         for batch in batches:
        ...             pipe.send(batch, meta={"id": batch_id})
        ...     else:
        ...         for item in pipe:
        ...             if not pipe.last:
        ...                 pipe.send(work(item))  # keeps item.meta
    """

    def __init__(self, comm: MPI.Comm | None = None, *, depth: int = 2, timeout: float | None = None) -> None:
        self._timeout = timeout
        deadline("Pipeline", timeout)  # a bad timeout fails here, not at the first wait
        comm = MPI.COMM_WORLD if comm is None else comm
        if not isinstance(comm, MPI.Intracomm) or comm == MPI.COMM_NULL:
            raise TypeError(f"Pipeline: comm must be an mpi4py intracommunicator or None, got {comm!r}")
        if isinstance(depth, bool) or not isinstance(depth, (int, np.integer)) or depth < 1:
            raise ValueError(f"Pipeline: depth must be an int >= 1, got {depth!r}")
        self.depth = int(depth)
        self.stage, self._size = comm.Get_rank(), comm.Get_size()
        self.first, self.last = self.stage == 0, self.stage == self._size - 1
        self._data = comm.Dup()
        self._ctl = comm.Dup()
        self._data.Set_name(f"cai_mpi-pipeline-data({comm.Get_name()})")
        self._ctl.Set_name(f"cai_mpi-pipeline-control({comm.Get_name()})")
        private_comms(self._data)  # collective on first use: make it now, while every stage is here
        # Bare payloads go only to a stage that receives into host memory (no GPU of its own): it says so once.
        host = np.array([self.first or receive_device("Pipeline", None, get_runtime()) is None], np.int64)
        downstream = np.zeros(1, np.int64)
        self._ctl.Sendrecv(host, MPI.PROC_NULL if self.first else self.stage - 1, HOST,
                           downstream, MPI.PROC_NULL if self.last else self.stage + 1, HOST)
        self._fast_edge = not self.last and bool(downstream[0])
        self._fast_limit = config().max_message_bytes
        # What the next stage holds (sender) / this stage holds (receiver) as the description of bare payloads:
        # (shape, dtype, meta) -- meta as its header encoding on the sender, as JSON text (or None) on the receiver.
        self._told: tuple[tuple[int, ...], np.dtype[Any], bytes] | None = None
        self._held: tuple[tuple[int, ...], np.dtype[Any], str | None] | None = None
        self._bare_sends: deque[MPI.Request] = deque()
        self._bare: MPI.Request | None = None  # the bare payload receive posted ahead
        self._bare_into: _Slot | np.ndarray[Any, Any] | None = None  # where the bare payload posted ahead lands
        # Buffers of the held description with a persistent receive each, reused once the item that landed there is
        # gone (``_Slot``).
        self._ring: list[_Slot] = []
        self._bare_status = MPI.Status()
        self._fast_sent = self._fast_received = 0
        self._sent = self._acked = self._received = self._credits_sent = self._credits_read = self._credited = 0
        # Credits go back once per half window, not per item. The bound holds as before (a credit is a count of
        # items received, and the sender stays within depth of the last one it read); a sender blocked at depth
        # items always gets one, since every <= depth items received send it.
        self._credit_every = max(1, self.depth // 2)
        self._closed = self.last  # the last stage has no stream to close
        self._ended = self.first  # the first stage has no stream to receive
        self._sends: deque[Request[None]] = deque()
        self._control: deque[MPI.Request] = deque()  # credits and notices in flight, oldest first
        self._prefetch: Request[Array] | None = None
        self._meta: dict[str, Any] | None = None  # of the item this stage works on, for failure reports
        # Credits travel on persistent requests (a start costs a fraction of an Isend or Irecv): one receive, and one
        # send whose buffer is rewritten once the previous credit has gone (else a credit goes as its own Isend).
        self._credit = np.zeros(1, np.int64)
        self._credit_req = None if self.last else self._ctl.Recv_init(self._credit, self.stage + 1, CREDIT)
        if self._credit_req is not None:
            self._credit_req.Start()
        self._credit_out = np.zeros(1, np.int64)
        self._credit_send = None if self.first else self._ctl.Send_init(self._credit_out, self.stage - 1, CREDIT)
        self._notice = bytearray(NOTICE_BYTES)
        self._notice_status = MPI.Status()
        self._notice_req = self._ctl.Irecv(self._notice, MPI.ANY_SOURCE, NOTICE)
        self._notices_received = 0
        self._left = False

    # -- the stream ------------------------------------------------------------------------------------------

    def send(self, obj: Any, *, meta: dict[str, Any] | None = None) -> None:
        """Send ``obj`` (anything ``send_array`` takes) to the next stage; a forwarded Array keeps its meta.

        Blocks while ``depth`` items are sent and not yet received downstream. An item with the shape, dtype
        and ``meta`` of the one this stage sent before (host memory of numbers in C order, to a stage without
        a GPU of its own) goes without its description, at about the cost of a raw ``Isend``.
        """
        if self.last:
            raise ValueError(f"Pipeline.send: stage {self.stage} is the last stage: there is no next stage")
        if self._closed:
            raise ValueError(f"Pipeline.send: stage {self.stage} already closed its stream")
        if self._sent - self._acked >= self.depth:
            self._wait(self._room, "a credit from the next stage")
        if meta is None and isinstance(obj, Array):
            meta = obj.meta
        host = bare_memory(obj) if self._fast_edge else None
        told = self._told
        if host is not None and host.nbytes <= self._fast_limit:
            if told is not None and host.shape == told[0] and host.dtype == told[1] and (
                    told[2] == b"" if meta is None else check_meta("Pipeline.send", meta) == told[2]):
                bare = self._bare_sends
                bare.append(self._data.Isend([host, MPI.BYTE], self.stage + 1, FAST))
                self._sent += 1
                self._fast_sent += 1
                if len(bare) > self.depth or PENDING:
                    self._reap()
                return
            self._switch()
            self._sends.append(isend_array(obj, self.stage + 1, DESCRIBED, self._data, meta=meta))
            self._told = (host.shape, host.dtype, check_meta("Pipeline.send", meta))
        else:
            self._switch()
            self._sends.append(isend_array(obj, self.stage + 1, ITEM, self._data, meta=meta))
        self._sent += 1
        if len(self._sends) > self.depth or PENDING:  # forget completed sends; drive the requests that need it
            self._reap()

    def _switch(self) -> None:
        """The next stage holds a description: tell it that a self-describing message comes next."""
        if self._told is not None:
            self._told = None
            self._bare_sends.append(self._data.Isend([b"", MPI.BYTE], self.stage + 1, SWITCH))

    def recv(self) -> Array | None:
        """The next item from the previous stage, or None at the end of the stream."""
        if self.first:
            raise ValueError(f"Pipeline.recv: stage {self.stage} is the first stage: there is no previous stage")
        if self._ended:
            return None
        bare = self._bare
        if bare is not None:  # this stage holds a description: a bare payload (or an empty message) comes next
            status = self._bare_status
            if not bare.Test(status):
                self._wait(lambda: bare.Test(status), "an item from the previous stage")
            self._bare = None
            tag = status.Get_tag()
            if tag == FAST:
                held, into = self._held, self._bare_into
                assert held is not None and into is not None
                data = into.lend(held[0], held[1]) if isinstance(into, _Slot) else into
                item = Array.over_host(data, self.stage - 1, ITEM, None if held[2] is None else json.loads(held[2]))
                self._fast_received += 1
                return self._arrived(item)
            if tag == END:
                self._received += 1
                self._ended = True
                return None
            self._unhold()  # SWITCH: a self-describing message comes next
        if self._prefetch is None:
            self._prefetch = irecv_array(self.stage - 1, MPI.ANY_TAG, self._data)
        pending = self._prefetch
        arrived, got = pending.test()
        if not arrived:
            self._wait(lambda: pending.test()[0], "an item from the previous stage")
            got = pending.wait()
        assert got is not None
        self._prefetch = None
        if got.tag == END:
            self._received += 1
            self._ended = True
            return None
        if got.tag == DESCRIBED:  # bare payloads of its shape, dtype and meta may follow
            got.tag = ITEM
            self._held = (got.shape, got.dtype, None if got.meta is None else json.dumps(got.meta))
        return self._arrived(got)

    def _arrived(self, item: Array) -> Array:
        """Count an item in, credit it when a half window is in, and post the next receive, while you work."""
        self._received += 1
        if self._received - self._credited >= self._credit_every:
            self._credit_back()
        self._post_next()
        self._meta = item.meta
        return item

    def _post_next(self) -> None:
        held = self._held
        if held is None:
            self._prefetch = irecv_array(self.stage - 1, MPI.ANY_TAG, self._data)
            return
        ring = self._ring
        for slot in ring:  # a buffer no item, view or export of an item refers to any more
            if not slot.busy:
                break
        else:
            slot = None
            if len(ring) < _RING and np.prod(held[0]) > 0:
                kept = _kept.get(held[:2])
                buf = kept.pop() if kept else np.empty(held[0], held[1])
                slot = _Slot(buf, self._data.Recv_init([buf, MPI.BYTE], self.stage - 1, MPI.ANY_TAG))
                ring.append(slot)
        if slot is None:  # every buffer of the ring is still in use (or the items are empty): a buffer of its own
            self._bare_into = buf = np.empty(held[0], held[1])
            self._bare = self._data.Irecv([buf, MPI.BYTE], self.stage - 1, MPI.ANY_TAG)
            return
        slot.busy = True
        self._bare_into = slot
        self._bare = slot.req
        slot.req.Start()

    def _unhold(self) -> None:
        """No description held any more: free the ring's requests (none is active: the last one took the SWITCH)."""
        self._held = self._bare_into = None
        budget = min(_KEPT_BYTES, config().pool_bytes) if self._ring else 0
        for slot in self._ring:
            slot.req.Free()
            buf = slot.buf
            if not slot.busy and sum(b.nbytes for k in _kept.values() for b in k) + buf.nbytes <= budget:
                _kept.setdefault((buf.shape, buf.dtype), []).append(buf)
        self._ring = []

    def __iter__(self) -> Iterator[Array]:
        while (item := self.recv()) is not None:
            yield item

    def close(self) -> None:
        """End the stream: the next stage's ``recv`` returns None after the items sent before. Idempotent; does
        nothing on the last stage."""
        if not self._closed:
            self._closed = True
            self._send_end()
            self._sent += 1

    def _send_end(self) -> None:
        """The end of the stream (or an empty message for a receive posted downstream that nothing else matches),
        bare while the next stage holds a description."""
        if self._told is not None:
            self._bare_sends.append(self._data.Isend([b"", MPI.BYTE], self.stage + 1, END))
        else:
            self._sends.append(isend_array(np.empty(0, np.uint8), self.stage + 1, END, self._data))

    # -- waiting, credits and failures ---------------------------------------------------------------------

    def _wait(self, done: Callable[[], bool], what: str) -> None:
        """Until ``done()``, keep everything moving and watch for a failure anywhere; past the timeout (``what``
        did not come), TimeoutError, which reaches the other stages as this stage's failure.

        Between polls, ``wait_pauses``.
        """
        stop = time.perf_counter() + _SPIN
        while True:  # polls only what it waits for (and requests that need driving): most waits end within microseconds
            if PENDING:
                self._reap()
            if done():
                return
            if time.perf_counter() >= stop:
                break
        due = deadline("Pipeline", self._timeout)
        backoff = wait_pauses(due)
        while True:
            self._reap()  # first: a credit read here ends the wait without another pause
            if done():
                return
            self._check_notice()
            if not backoff.pause():
                assert due is not None
                raise TimeoutError(f"Pipeline: stage {self.stage} waited {due.seconds:g} s for {what}", due.seconds,
                                   False)

    def _room(self) -> bool:
        """Whether the window has room for another item, once the credits that came are read."""
        self._read_credits()
        return self._sent - self._acked < self.depth

    def _read_credits(self) -> None:
        req = self._credit_req
        while req is not None and req.Test():
            self._acked = max(self._acked, int(self._credit[0]))
            self._credits_read += 1
            req.Start()

    def _reap(self) -> None:
        """Account returned credits; forget completed sends (testing them also drives every cai_mpi request)."""
        self._read_credits()
        sends = self._sends
        while sends and sends[0].test()[0]:  # (test raises what a failed send raises)
            sends.popleft()
        bare = self._bare_sends
        while bare and bare[0].Test():  # (they complete in order)
            bare.popleft()
        self._forget_sent_control()

    def _credit_back(self) -> None:
        """Tell the previous stage how many items this one has received (one message per ``_credit_every``)."""
        req = self._credit_send
        assert req is not None
        if req.Test():  # (an inactive persistent request tests complete)
            self._credit_out[0] = self._received
            req.Start()
        else:
            self._forget_sent_control()
            self._control.append(self._ctl.Isend(np.array([self._received], np.int64), self.stage - 1, CREDIT))
        self._credits_sent += 1
        self._credited = self._received

    def _forget_sent_control(self) -> None:
        """Drop the control messages sent, oldest first (they complete in order; testing only the oldest keeps
        this constant time when the previous stage is slow to read its credits)."""
        control = self._control
        while control and control[0].Test():
            control.popleft()

    def _check_notice(self) -> None:
        if self._notice_req.Test(self._notice_status):
            self._notices_received += 1
            raise failure_from(self._notice[: self._notice_status.Get_count(MPI.BYTE)])

    def __enter__(self) -> Pipeline:
        return self

    def __repr__(self) -> str:
        return (f"<cai_mpi.Pipeline stage {self.stage} of {self._size}, depth {self.depth}, "
                f"{self._sent} sent, {self._received} received>")
