"""Persistent channels: a stream of same-shaped arrays from one rank to another, described once.

The first message of a channel is an ordinary self-describing header (flag CHANNEL, docs/protocol.md)
followed by the payload on the channel's payload tag. Every later message is the payload alone, sent and
received through MPI persistent requests bound to the same memory on both sides: no header to build or
parse, no buffer to look up, nothing allocated per message.
"""

from __future__ import annotations

import atexit
import weakref
from collections.abc import Generator
from typing import Any

import numpy as np
from mpi4py import MPI

from .array import Array
from .buffers import Target, resolve_outgoing, resolve_target
from .comms import channels
from .config import config
from .errors import ProtocolError, RecvMismatchError
from .p2p import (
    PROC_NULL,
    _check_rank,
    _check_tag,
    _discard,
    _drive,
    _mismatch,
    _pick_device,
    _raw,
    _take_header_buffer,
)
from .p2p import _header_buffers as _free_header_buffers
from .runtime import get_runtime
from .runtime.base import MemoryKind
from .waitables import MPIWait, PostedRequest, Request, RequestWait, Waitable, _active, complete
from .wire import decode_header, encode_header, encode_meta

__all__ = ["RecvChannel", "SendChannel", "recv_channel", "send_channel"]

_BYTE = MPI.BYTE


def _free(req: MPI.Request) -> None:
    if MPI.Is_initialized() and not MPI.Is_finalized() and req != MPI.REQUEST_NULL:
        req.Free()


# Channels not closed yet: their persistent requests are freed before MPI finalizes (MPICH reports
# "freeing inactive persistent request" otherwise), or when a channel is garbage collected.
_open_channels: weakref.WeakSet[SendChannel | RecvChannel] = weakref.WeakSet()


@atexit.register
def _free_open_channels() -> None:
    # Registered after mpi4py's own exit hook (mpi4py is imported first), so this runs before MPI_Finalize.
    for ch in list(_open_channels):
        ch._release()


class _Channel:
    """What both ends share: one MPI persistent request, the message in flight, closing and freeing."""

    __slots__ = ("__weakref__", "_closed", "_fast", "_inflight", "_req")

    _closed: bool
    _fast: bool
    _req: MPI.Prequest | None
    _inflight: Request[Any] | None

    def _settle(self) -> None:
        """Wait for the message in flight (the persistent request is single)."""
        if self._inflight is not None:
            self._inflight.wait()
            self._inflight = None

    def close(self) -> None:
        """Wait for a message in flight and free the channel's MPI request (idempotent)."""
        if self._closed:
            return
        self._settle()
        self._closed, self._fast = True, False
        if self._req is not None:
            _free(self._req)

    def _release(self) -> None:
        """Free the MPI request without waiting (exit, garbage collection): no more messages."""
        if not getattr(self, "_closed", True):  # (a constructor that raised set nothing)
            self._closed, self._fast = True, False
            if self._req is not None:
                _free(self._req)

    def __del__(self) -> None:
        self._release()

    def __exit__(self, *exc: object) -> None:
        self.close()


class SendChannel(_Channel):
    """Sends the current contents of one array to one rank, again and again. Made by ``send_channel``.

    ``send()`` blocks like ``send_array``; ``isend()`` returns a Request. A send
    started while the previous ``isend`` is still in flight waits for it first
    (the channel's buffer is bound to one MPI persistent request). ``close()``
    frees the request; a closed channel refuses to send. Context manager: closes on exit.
    """

    __slots__ = (
        "_chans",
        "_header",
        "_host_src",
        "_obj",
        "_opened",
        "_ptr",
        "_rt",
        "_stage",
        "_sync",
        "_sync_each",
        "dest",
        "dtype",
        "shape",
        "tag",
    )

    def __init__(self, obj: Any, dest: int, tag: int, comm: MPI.Comm | None, sync: bool | None,
                 meta: dict[str, Any] | None) -> None:
        chans = channels(comm)
        self.dest = _check_rank("dest", dest, chans, wildcard=False)
        if self.dest == PROC_NULL:
            raise ValueError("a channel needs a real destination rank, not PROC_NULL")
        self.tag = _check_tag(tag, chans, wildcard=False)
        meta_bytes = encode_meta(meta)
        rt = get_runtime()
        if isinstance(obj, Array) and obj.is_host:
            obj = obj.numpy()
        out = resolve_outgoing(obj, sync, rt)
        if out.nbytes > config().max_message_bytes:
            raise ValueError(
                f"a channel sends each array as one MPI message; {out.nbytes} bytes is over "
                f"CAI_MPI_MAX_MESSAGE_BYTES={config().max_message_bytes}: use send_array"
            )
        fortran = out.fortran
        self._stage: np.ndarray[Any, Any] | None = None
        if out.host is not None:
            if out.contiguous or fortran:
                wire: Any = [out.host.T if fortran else out.host, _BYTE]
            else:
                # A strided host array is copied into a private contiguous buffer before each send.
                self._stage = np.empty(out.shape, out.dtype)
                wire = [self._stage, _BYTE]
        elif out.location.kind is MemoryKind.DEVICE and chans.aware.aware and (out.contiguous or fortran):
            wire = [_raw(out.ptr, out.nbytes, chans, rt, readonly=True), out.nbytes, _BYTE]
        else:
            raise ValueError(
                "a channel hands the array's memory to MPI in place: host memory, or contiguous device "
                f"memory through a CUDA-aware MPI (this one is not, per {chans.aware.source}). "
                "Use send_array, which packs and stages"
            )
        ptag = chans.next_payload_tag()
        self.shape, self.dtype = out.shape, out.dtype
        self._header = encode_header(
            out.dtype, out.shape, fortran=fortran, payload_tag=ptag, meta_bytes=meta_bytes, channel=True
        )
        self._req: MPI.Prequest = chans.payload.Send_init(wire, self.dest, ptag)
        self._chans, self._rt, self._obj, self._sync, self._ptr = chans, rt, obj, sync, out.ptr
        self._host_src = out.host
        # Only CAI exporters have a producer stream to synchronize before every send.
        self._sync_each = type(obj) is not np.ndarray and out.desc is not None
        self._opened = self._closed = False
        self._inflight = None
        # Opened, host memory read in place, nothing in flight: send() is one persistent Start + Wait.
        self._fast = False
        _open_channels.add(self)

    def _sync_producer(self) -> None:
        if self._closed:
            raise ValueError("send on a closed channel")
        if self._sync_each:
            # CAI v3: the exporter's current stream must be synchronized before every read.
            now = resolve_outgoing(self._obj, self._sync, self._rt)
            if now.ptr != self._ptr or now.shape != self.shape or now.dtype != self.dtype:
                raise ValueError(
                    "the channel's array was reallocated or reshaped since send_channel: open a new channel"
                )

    def _steps(self, previous: Request[None] | None) -> Generator[Waitable, None, None]:
        """One message: after the previous one (the persistent request is single), stage, start, wait."""
        if previous is not None and not previous.done:
            yield RequestWait(previous)
        if self._stage is not None:
            assert self._host_src is not None
            np.copyto(self._stage, self._host_src)
        reqs: list[MPI.Request] = [self._req]
        if not self._opened:
            self._opened = True
            reqs.append(self._chans.header.Isend([self._header, _BYTE], self.dest, self.tag))
        self._req.Start()
        yield MPIWait(reqs, final=True)

    def send(self) -> None:
        """Send the array's current contents (the first send also carries the description)."""
        if self._fast:
            req = self._req  # the hot path: one persistent send, nothing else
            req.Start()
            if _active:
                complete(MPIWait([req]))
            else:
                req.Wait()
            return
        self._settle()
        self._sync_producer()
        _drive(self._steps(None))
        self._fast = not self._sync_each and self._stage is None

    def isend(self) -> Request[None]:
        """Start sending the array's current contents; modifying it before ``wait()`` is an error.

        While an earlier ``isend`` is in flight the new one queues behind it (it starts when that
        one completes, driven by any cai_mpi wait), so windows of isends never block.
        """
        self._sync_producer()
        previous = self._inflight
        if self._opened and not self._sync_each and self._stage is None and (previous is None or previous.done):
            # Nothing to stage or queue behind: start the persistent send now, nothing to drive later.
            self._req.Start()
            req: Request[None] = PostedRequest([self._req], None, keep=(self, self._obj))
        else:
            req = Request(self._steps(previous), keep=(self, self._obj, previous))
        self._inflight = req
        self._fast = False
        return req

    def __enter__(self) -> SendChannel:
        return self

    def __repr__(self) -> str:
        state = "closed" if self._closed else ("open" if self._opened else "not yet sent")
        return f"<cai_mpi.SendChannel to rank {self.dest} tag {self.tag} shape={self.shape} dtype={self.dtype} {state}>"


class RecvChannel(_Channel):
    """Receives the arrays of one ``SendChannel``. Made by ``recv_channel``.

    The first ``recv()`` takes the channel's description (from ``source``/``tag``,
    wildcards allowed; the channel is then bound to the sender found) and allocates
    the receive buffer, or checks ``out=``. Every ``recv()`` returns the same
    ``Array`` over that buffer, overwritten by each message: copy what you keep.
    """

    __slots__ = ("_array", "_chans", "_device", "_rt", "_target", "_target_sync", "dtype", "meta", "shape",
                 "source", "tag")

    def __init__(self, source: int, tag: int, comm: MPI.Comm | None, out: Any, device: Any) -> None:
        chans = channels(comm)
        self.source = _check_rank("source", source, chans, wildcard=True)
        self.tag = _check_tag(tag, chans, wildcard=True)
        rt = get_runtime()
        self._target: Target | None = resolve_target(out, rt) if out is not None else None
        self._target_sync = self._target is not None and self._target.stream_desc is not None
        self._chans, self._rt, self._device = chans, rt, device
        self._req: MPI.Prequest | None = None
        self._array: Array | None = None
        self._inflight = None
        self._closed = False
        self._fast = False  # opened, nothing in flight, no out= stream to sync: recv() is Start + Wait
        _open_channels.add(self)
        self.shape: tuple[int, ...] | None = None
        self.dtype: np.dtype[Any] | None = None
        self.meta: dict[str, Any] | None = None

    def _open(self) -> Generator[Waitable, None, Array]:
        chans, rt = self._chans, self._rt
        hbuf = _take_header_buffer()
        status = MPI.Status()
        try:
            yield MPIWait([chans.header.Irecv([hbuf, _BYTE], self.source, self.tag)], status)
            source, tag = status.Get_source(), status.Get_tag()
            h = decode_header(hbuf, status.Get_count(_BYTE), max_payload_bytes=config().max_payload_bytes)
        finally:
            _free_header_buffers.append(hbuf)
        where = f"the message from rank {source} (tag {tag}: {h.describe()})"
        problem = None if h.channel else "it was sent with send_array, not through a send_channel"
        target = self._target
        if problem is None and target is not None:
            problem = _mismatch(h, target)
            wire = (target.host.T if h.fortran else target.host) if target.host is not None else None
            if problem is None and wire is not None and not wire.flags.c_contiguous:
                problem = "a channel receives in place, and out= is not contiguous in the sender's order"
            if problem is None and target.host is None and not (
                chans.aware.aware and (target.desc.transposed() if h.fortran else target.desc).is_c_contiguous  # type: ignore[union-attr]
            ):
                problem = "device out= needs a CUDA-aware MPI and a contiguous buffer for a channel"
        if problem is not None:
            yield from _discard(chans.payload, h, source)
            raise (RecvMismatchError if h.channel else ProtocolError)(
                f"recv_channel: {where} cannot open this channel: {problem}; its payload was discarded"
            )
        nbytes = h.payload_nbytes
        if target is not None:
            target.sync_before_write(rt)  # CAI v3: the buffer's producer may still be using it
            if target.host is not None:
                buf: Any = [target.host.T if h.fortran else target.host, _BYTE]
                array = Array.from_host(target.host, owner=target.owner, source=source, tag=tag, meta=h.meta)
            else:
                assert target.desc is not None and target.ordinal is not None
                buf = [_raw(target.desc.ptr, nbytes, chans, rt), nbytes, _BYTE]
                array = Array(target.desc.replace(stream=None), device=target.ordinal, owner=target.owner,
                              source=source, tag=tag, meta=h.meta)
        else:
            ordinal = _pick_device(self._device, rt)
            if ordinal is None:
                arr = np.empty(h.shape, h.dtype, order="F" if h.fortran else "C")
                buf = [arr.T if h.fortran else arr, _BYTE]
                array = Array.from_host(arr, source=source, tag=tag, meta=h.meta)
            elif chans.aware.aware:
                dbuf = rt.alloc_device(nbytes, ordinal)
                buf = [_raw(dbuf.ptr, nbytes, chans, rt), nbytes, _BYTE]
                array = Array.from_device(dbuf, h.shape, h.dtype, fortran=h.fortran, source=source, tag=tag,
                                          meta=h.meta)
            else:
                yield from _discard(chans.payload, h, source)
                raise ValueError(
                    f"recv_channel: {where}: a channel receives into device memory only through a CUDA-aware "
                    f"MPI (this one is not, per {chans.aware.source}); pass device='host', or use recv_array. "
                    "Its payload was discarded"
                )
        req = chans.payload.Recv_init(buf, source, h.payload_tag)
        req.Start()
        self._req, self._array = req, array
        self.source, self.tag, self.shape, self.dtype, self.meta = source, tag, h.shape, h.dtype, h.meta
        yield MPIWait([req], final=True)
        return array

    def _steps(self, previous: Request[Array] | None) -> Generator[Waitable, None, Array]:
        """One message: after the previous one (the persistent request is single), start and wait."""
        if previous is not None and not previous.done:
            yield RequestWait(previous)
        if self._req is None:
            return (yield from self._open())
        if self._target_sync:
            self._target.sync_before_write(self._rt)  # type: ignore[union-attr]
        self._req.Start()
        yield MPIWait([self._req], final=True)
        return self._array  # type: ignore[return-value]

    def recv(self) -> Array:
        """Receive the next array of the channel (the same Array object, overwritten, every time)."""
        if self._fast:
            req: Any = self._req
            req.Start()  # the hot path: one persistent receive, nothing else
            if _active:
                complete(MPIWait([req]))
            else:
                req.Wait()
            return self._array  # type: ignore[return-value]
        if self._closed:
            raise ValueError("recv on a closed channel")
        self._settle()
        array = _drive(self._steps(None))
        self._fast = not self._target_sync
        return array

    def irecv(self) -> Request[Array]:
        """Start receiving the next array; ``wait()`` returns the channel's Array.

        While an earlier ``irecv`` is pending the new one queues behind it, so a window of
        irecvs never blocks; each completes with the buffer holding its own message, until the
        next one lands there.
        """
        if self._closed:
            raise ValueError("recv on a closed channel")
        previous = self._inflight
        array = self._array
        if array is not None and self._req is not None and not self._target_sync and (
            previous is None or previous.done
        ):
            self._req.Start()  # opened, nothing to queue behind: post the persistent receive now
            req: Request[Array] = PostedRequest([self._req], array, keep=(self,))
        else:
            req = Request(self._steps(previous), keep=(self, previous))
        self._inflight = req
        self._fast = False
        return req

    @property
    def array(self) -> Array | None:
        """The Array every ``recv`` returns (None before the first message)."""
        return self._array

    def __enter__(self) -> RecvChannel:
        return self

    def __repr__(self) -> str:
        if self._req is None:
            return f"<cai_mpi.RecvChannel from rank {self.source} tag {self.tag}, not yet opened>"
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

    The array's memory is bound to an MPI persistent request: change its
    contents between sends, not its shape or allocation. The first send
    carries the description (shape, dtype, ``meta``); later ones only the
    data, at nearly raw MPI cost. Pair it with ``recv_channel`` on ``dest``.
    Host arrays of any layout; device arrays when MPI is CUDA-aware and the
    array is contiguous (``send_array`` covers the rest). Opening is local:
    nothing is sent until the first ``send()``.

    Example:
        >>> with send_channel(x, dest=1) as tx:  # doctest: +SKIP
        ...     for step in range(n):
        ...         x[:] = step
        ...         tx.send()
    """
    return SendChannel(obj, dest, tag, comm, sync, meta)


def recv_channel(
    source: int = MPI.ANY_SOURCE,
    tag: int = MPI.ANY_TAG,
    comm: MPI.Comm | None = None,
    *,
    out: Any = None,
    device: str | int | None = None,
) -> RecvChannel:
    """Open the receiving end of a ``send_channel``; each ``recv()`` returns the next array.

    ``out=`` receives in place (checked against the description on the first
    ``recv``); without it a buffer is allocated once, on ``device`` (as in
    ``recv_array``). Opening is local: the description is matched by the first ``recv()``.

    Example:
        >>> with recv_channel(source=0) as rx:  # doctest: +SKIP
        ...     for step in range(n):
        ...         a = rx.recv()  # the same Array every time, holding the newest data
    """
    return RecvChannel(source, tag, comm, out, device)
