"""Persistent channels: a stream of same-shaped arrays from one rank to another, described once.

The first message of a channel is an ordinary self-describing header (flag CHANNEL, docs/protocol.md)
followed by the payload on the channel's payload tag; every later message is the payload alone. The wire is
the transport's (``transport.bound``: the persistent requests, their starts and frees); this module keeps what is
the channel's own: arguments, the producer's synchronization, ordering of messages in flight, closing.
"""

from __future__ import annotations

from collections.abc import Generator
from typing import Any

import numpy as np
from mpi4py import MPI

from ..arrays.array import Array, host_memory
from ..arrays.operands import DeviceSource, RecvTarget, proc_null_array, recv_target, send_source
from ..arrays.sync import sync_enabled, sync_unnamed
from ..config import config
from ..progress.deadlines import Awaited, deadline
from ..progress.driving import PENDING
from ..progress.requests import Request, RequestWait, settled, wait_until
from ..progress.waits import Waitable
from ..runtime import get_runtime
from ..transport import plan_send
from ..transport.bound import BoundRecv, BoundSend, NullRecv, NullSend
from .channel_ends import ChannelEnd, open_channel_count
from .validation import (
    ANY_SOURCE,
    ANY_TAG,
    PROC_NULL,
    Device,
    check_comm,
    check_rank,
    check_sync,
    check_tag,
    outgoing_meta,
    receive_device,
)

__all__ = ["RecvChannel", "SendChannel", "open_channel_count", "recv_channel", "send_channel"]

def _address(src: np.ndarray[Any, Any] | DeviceSource) -> int:
    return src.desc.ptr if isinstance(src, DeviceSource) else int(src.__array_interface__["data"][0])


class SendChannel(ChannelEnd):
    """Sends the current contents of one array to one rank, again and again. Made by ``send_channel``.

    ``send()`` blocks like ``send_array``; ``isend()`` returns a Request. ``close()`` frees the
    channel's MPI request; a closed channel refuses to send. Context manager: closes on exit.
    """

    __slots__ = ("_obj", "_ptr", "_rt", "_sync", "_sync_each", "dest", "dtype", "shape", "tag")
    _wire: BoundSend

    def __init__(self, obj: Any, dest: int, tag: int, comm: MPI.Comm | None, sync: bool | None,
                 meta: dict[str, Any] | None) -> None:
        fn = "send_channel"
        pc = check_comm(fn, comm)
        self.dest = check_rank(fn, "dest", dest, pc, wildcard=False)
        self.tag = check_tag(fn, tag, pc, wildcard=False)
        meta_bytes = outgoing_meta(fn, obj, meta)
        rt = get_runtime()
        self._sync = check_sync(fn, sync)
        src = send_source(fn, obj, self._sync, rt)
        plan = plan_send(src, pc, meta_bytes, config(), rt, self.dest, channel=True)
        if plan.steps is not None or len(plan.payload) != 1 or not plan.in_place:
            raise ValueError(
                f"{fn}: a channel hands the array's memory to MPI in place, as one message: host memory of at "
                f"most CAI_MPI_MAX_MESSAGE_BYTES={config().max_message_bytes} bytes in a layout MPI can describe, "
                f"or contiguous device memory through a CUDA-aware MPI (this one is "
                f"{'' if pc.aware.aware else 'not '}CUDA-aware, per {pc.aware.source}). "
                "Use send_array, which packs, stages and splits"
            )
        # The header and the payload as persistent sends: the first message starts both, every later one the
        # payload's alone (the header's is freed once it has gone). To PROC_NULL, none: each message completes at
        # once (the plan is still made, so that an array a channel cannot take is refused at a wall too).
        self._wire = NullSend() if self.dest == PROC_NULL else BoundSend(plan, pc, self.dest, self.tag)
        self._rt, self._obj = rt, obj
        self._ptr = _address(src)
        self.shape: tuple[int, ...] = src.desc.shape if isinstance(src, DeviceSource) else src.shape
        self.dtype: np.dtype[Any] = src.desc.dtype if isinstance(src, DeviceSource) else src.dtype
        # CAI exporters (a producer stream) and device Arrays (work launched on them) are waited for before
        # every send; host arrays have nothing pending.
        self._sync_each = isinstance(src, DeviceSource) or (
            not isinstance(obj, (np.ndarray, Array)) and hasattr(obj, "__cuda_array_interface__"))
        self._closed = False
        self._inflight = None
        self._about = Awaited("SendChannel.send", True, self.dest, self.tag, pc.header)
        self._track()

    def _sync_producer(self) -> None:
        """CAI v3: the exporter's current stream is synchronized before every read of its memory."""
        now = send_source("send_channel", self._obj, self._sync, self._rt)
        shape = now.desc.shape if isinstance(now, DeviceSource) else now.shape
        if _address(now) != self._ptr or shape != self.shape:
            raise ValueError("send_channel: the channel's array was reallocated or reshaped since it was opened: "
                             "open a new channel")

    def _steps(self, previous: Request[Any] | None) -> Generator[Waitable, None, None]:
        """One message: after the previous one, the header (first message only), then the payload."""
        if previous is not None and not settled(previous):
            yield RequestWait(previous)
        yield from self._wire.message_steps()

    def send(self, timeout: float | None = None) -> None:
        """Send the array's current contents (the first send also carries the description).

        Args:
            timeout: seconds to wait at most (None: ``CAI_MPI_TIMEOUT``, off by default). Past it,
                ``TimeoutError``; the message stays posted and later ones queue behind it.
        """
        due = deadline("SendChannel.send", timeout)
        wire = self._wire
        if due is None and wire.opened and not self._sync_each and not self._closed and not self._queued() \
                and not PENDING:
            wire.send_now()  # the common case: one persistent send, nothing else
            return
        wait_until(self.isend(), due)

    def isend(self) -> Request[None]:
        """Start sending the array's current contents; modifying it before ``wait()`` is an error.

        While an earlier ``isend`` is in flight the new one queues behind it (it starts when that one
        completes, driven by any cai_mpi wait), so windows of isends never block.
        """
        self._check_open("send")
        if self._sync_each:
            self._sync_producer()
        about, wire = self._about, self._wire
        if wire.opened and not self._queued():
            req: Request[None] = wire.start(keep=(self, self._obj), about=about)
        else:
            req = Request(self._steps(self._inflight), keep=(self, self._obj, self._inflight), about=about)
        self._inflight = req
        return req

    def __enter__(self) -> SendChannel:
        return self

    def __repr__(self) -> str:
        state = "closed" if self._closed else ("open" if self._wire.opened else "not yet sent")
        return f"<cai_mpi.SendChannel to rank {self.dest} tag {self.tag} shape={self.shape} dtype={self.dtype} {state}>"


class RecvChannel(ChannelEnd):
    """Receives the arrays of one ``SendChannel``. Made by ``recv_channel``.

    The first ``recv()`` takes the channel's description (from ``source``/``tag``, wildcards allowed;
    the channel is then bound to the sender found) and allocates the receive buffer, or checks ``out=``.
    Every ``recv()`` returns the same ``Array`` over that buffer, overwritten by each message: copy what
    you keep.
    """

    __slots__ = ("_array", "_ordinal", "_out", "_pc", "_rt", "_sync_target", "_target", "dtype", "meta", "shape",
                 "source", "tag")
    _wire: BoundRecv

    def __init__(self, source: int, tag: int, comm: MPI.Comm | None, out: Any, device: Any) -> None:
        fn = "recv_channel"
        pc = check_comm(fn, comm)
        self.source = check_rank(fn, "source", source, pc, wildcard=True)
        self.tag = check_tag(fn, tag, pc, wildcard=True)
        rt = get_runtime()
        self._target = recv_target(fn, out, rt) if out is not None else None
        # Memory the user may still be working on is waited for before every message lands in it: an out=
        # with a producer to synchronize, or (once open) the channel's own Array on a GPU.
        self._sync_target = isinstance(self._target, RecvTarget) and self._target.producer is not None
        self._ordinal = None if out is not None else receive_device(fn, device, rt)
        self._pc, self._rt, self._out = pc, rt, out
        self._wire = BoundRecv()
        self._array: Array | None = None
        self._inflight = None
        self._closed = False
        self._about = Awaited("RecvChannel.recv", False, self.source, self.tag, pc.header)
        self._track()
        self.shape: tuple[int, ...] | None = None
        self.dtype: np.dtype[Any] | None = None
        self.meta: dict[str, Any] | None = None
        if self.source == PROC_NULL:  # nothing will come: bound now to what a receive from PROC_NULL gives
            self._wire = NullRecv()
            self._bind(proc_null_array(self._target))
            self._sync_target = False  # (nothing is ever written into it)

    def _bind(self, array: Array) -> None:
        """The first message's payload receive is posted (and started): keep what the header said."""
        self._array = array
        self._sync_target = self._sync_target or host_memory(array) is None
        self.source, self.tag, self.shape, self.dtype, self.meta = array.source, array.tag, array.shape, \
            array.dtype, array.meta
        self._about = Awaited("RecvChannel.recv", False, self.source, self.tag, self._pc.header)

    def _steps(self, previous: Request[Any] | None) -> Generator[Waitable, None, Array]:
        """One message: after the previous one has settled (the persistent request is single; one abandoned by a
        timeout may still be in flight), start and wait."""
        if previous is not None and not settled(previous):
            yield RequestWait(previous)
        wire = self._wire
        if not wire.bound:  # the first message: its header says what the channel carries
            return (yield from wire.open_steps(self._pc, self.source, self.tag, self._target, self._ordinal, self._rt,
                                               self._bind))
        yield from wire.message_steps()
        return self._array  # type: ignore[return-value]

    def recv(self, timeout: float | None = None) -> Array:
        """Receive the next array of the channel (the same Array object, overwritten, every time).

        Args:
            timeout: seconds to wait at most (None: ``CAI_MPI_TIMEOUT``, off by default). Past it,
                ``TimeoutError``, and the receive is withdrawn: the late message is the next ``recv()``'s.
        """
        self._check_open("recv")
        due = deadline("RecvChannel.recv", timeout)
        if self._sync_target:
            self._wait_for_users()
        wire = self._wire
        if due is None and wire.bound and not self._queued() and not PENDING:
            wire.receive_now()  # the common case: one persistent receive, nothing else
            return self._array  # type: ignore[return-value]
        return wait_until(self._post(), due)

    def irecv(self) -> Request[Array]:
        """Start receiving the next array; ``wait()`` returns the channel's Array.

        While an earlier ``irecv`` is pending the new one queues behind it, so a window of irecvs never
        blocks; each completes with the buffer holding its own message, until the next one lands there.
        """
        self._check_open("recv")
        self._wait_for_users()
        return self._post()

    def _post(self) -> Request[Array]:
        about, wire = self._about, self._wire
        if wire.bound and not self._queued():
            assert self._array is not None
            req: Request[Array] = wire.start(self._array, keep=(self,), about=about)
        else:
            req = Request(self._steps(self._inflight), keep=(self, self._out, self._inflight), about=about)
        self._inflight = req
        return req

    def _wait_for_users(self) -> None:
        """Before the next message lands, wait for work the user may still have on the memory: in the caller's
        thread (a per-thread default stream belongs to it), as for any receive into ``out=``."""
        if not self._sync_target:
            return
        if isinstance(self._target, RecvTarget):
            self._target.sync_before_write(self._rt)
        elif self._array is not None and sync_enabled(None):
            sync_unnamed(int(self._array.device), self._rt)  # kernels still reading the previous message

    @property
    def array(self) -> Array | None:
        """The Array every ``recv`` returns (None before the first message)."""
        return self._array

    def __enter__(self) -> RecvChannel:
        return self

    def __repr__(self) -> str:
        if self.shape is None:
            state = "closed" if self._closed else "not yet opened"
            return f"<cai_mpi.RecvChannel from rank {self.source} tag {self.tag}, {state}>"
        return (f"<cai_mpi.RecvChannel from rank {self.source} tag {self.tag} shape={self.shape} "
                f"dtype={self.dtype}{' closed' if self._closed else ''}>")


def send_channel(
    obj: Any,
    dest: int,
    tag: int = 0,
    comm: MPI.Comm | None = None,
    *,
    sync: bool | None = None,
    meta: dict[str, Any] | None = None,
) -> SendChannel:
    """Open a persistent channel that sends ``obj``'s contents to ``dest``, as often as you call ``send()``.

    The array's memory is bound to an MPI persistent request: change its contents between sends, not its
    shape or allocation. The first send carries the description (shape, dtype, ``meta``); later ones only
    the data, at nearly raw MPI cost. Pair it with ``recv_channel`` on ``dest``. Opening is local:
    nothing is sent until the first ``send()``.

    Args:
        obj: host memory of any layout MPI can describe (up to CAI_MPI_MAX_MESSAGE_BYTES), or contiguous
            device memory when MPI is CUDA-aware (``send_array`` covers the rest).
        dest: the receiving rank in ``comm``; ``PROC_NULL`` (a wall of a non-periodic grid): every send completes
            at once and sends nothing, as MPI's persistent sends to it.
        tag: 0..MPI.TAG_UB; the ``recv_channel`` may match it or use ANY_TAG.
        comm: None for COMM_WORLD; the first use of any other communicator is collective over it.
        sync: None follows ``CAI_MPI_SYNC`` (default on); False skips the producer synchronization that
            otherwise precedes every send.
        meta: a small JSON dict, sent with the first message (the description) and delivered as ``Array.meta``
            (None: a forwarded Array's own ``meta``; ``{}`` sends none).

    Returns:
        A SendChannel (a context manager: closes on exit).

    Raises:
        TypeError, ValueError: a bad argument, or memory a channel cannot hand to MPI in place.

    Example:
        >>> with send_channel(x, dest=1) as tx:  # doctest: +SKIP
        ...     for step in range(n):
        ...         x[:] = step
        ...         tx.send()
    """
    return SendChannel(obj, dest, tag, comm, sync, meta)


def recv_channel(
    source: int = ANY_SOURCE,
    tag: int = ANY_TAG,
    comm: MPI.Comm | None = None,
    *,
    out: Any = None,
    device: Device = None,
) -> RecvChannel:
    """Open the receiving end of a ``send_channel``; each ``recv()`` returns the next array.

    ``out=`` receives in place (checked against the description on the first ``recv``); without it a
    buffer is allocated once, on ``device`` (as in ``recv_array``). Opening is local: the description
    is matched by the first ``recv()``.

    Args:
        source: the sending rank, or ANY_SOURCE (the channel is then bound to the sender found); ``PROC_NULL``
            (a wall of a non-periodic grid): every receive completes at once with no data, returning what
            ``recv_array`` from PROC_NULL returns (an Array over ``out=``, its contents untouched, or an empty
            uint8 host Array; ``source`` PROC_NULL, ``tag`` ANY_TAG, ``meta`` None).
        tag: the tag to match, or ANY_TAG.
        comm: None for COMM_WORLD; the first use of another communicator is collective.
        out: a writable CAI object or host array to receive every message into (a host one in any layout: C or
            Fortran order, or strided), checked against the description on the first ``recv()``.
        device: without ``out=``: None (a GPU when this rank has one, else host), "host", or a GPU ordinal.

    Returns:
        A RecvChannel (a context manager: closes on exit).

    Raises:
        TypeError, ValueError: a bad argument. The first ``recv()`` raises RecvMismatchError or
            ProtocolError for a message the channel cannot take (its payload is discarded).

    Example:
        >>> with recv_channel(source=0) as rx:  # doctest: +SKIP
        ...     for step in range(n):
        ...         a = rx.recv()  # the same Array every time, holding the newest data
    """
    return RecvChannel(source, tag, comm, out, device)

