"""The transport: one send pipeline and one receive pipeline, and the only module that posts payload MPI
operations.

Sending is ``plan_send``: it chooses, once, how the bytes travel (inline in the header; directly from host
or, through a CUDA-aware MPI, device memory; through a derived datatype; in chunks; packed on the device;
staged through pinned host memory) and returns an ``Outbound``: the header, the payload messages to post
at once, and the steps left to drive (device packing, staging). Receiving is ``plan_recv``: given a
header, it checks it against ``out=``, chooses where the bytes land and returns an ``Inbound`` the same
way. Blocking, nonblocking and channel calls differ only in how they post those messages (``Send`` or
``Isend``, ``Recv``/``Irecv`` or ``Recv_init``), as mpi4py's ``util.pkl5`` does with its ``send`` callback.
"""

from __future__ import annotations

import threading
import weakref
from collections.abc import Generator
from typing import Any

import numpy as np
from mpi4py import MPI

from .array import Array
from .config import Config
from .datatypes import describable, strided_type
from .errors import ProtocolError, RecvMismatchError
from .header import HEADER_BUFFER_BYTES, HeaderMemo, MessageInfo, encode_header, inline_message
from .operands import DeviceSource, RecvTarget, Target, describe_target, mismatch
from .pool import BlockPool, host_receive_pool
from .privcomm import PrivateComms
from .requests import EventWait, MPIWait, Waitable
from .runtime.base import DeviceBuffer, Event, PinnedBuffer, Runtime, Stream

__all__ = ["Inbound", "Inbox", "Outbound", "internal_stream", "plan_recv", "plan_send"]

_BYTE = MPI.BYTE
Steps = Generator[Waitable, None, None]


def _chunks(nbytes: int, chunk: int) -> list[tuple[int, int]]:
    """``(offset, length)`` of each message a payload of ``nbytes`` travels in (``chunk`` 0: one message)."""
    if not chunk or chunk >= nbytes:
        return [(0, nbytes)]
    return [(off, min(chunk, nbytes - off)) for off in range(0, nbytes, chunk)]


def _raw(ptr: int, nbytes: int, *, readonly: bool = False) -> list[Any]:
    """An MPI message spec over raw memory (device memory only ever reaches a CUDA-aware MPI this way)."""
    return [MPI.buffer.fromaddress(ptr, nbytes, readonly=readonly), nbytes, _BYTE]


def _byte_chunks(arr: np.ndarray[Any, Any], chunk: int) -> list[Any]:
    """Message specs covering the bytes of contiguous ``arr`` (in memory order) in messages of ``chunk``."""
    if not chunk or chunk >= arr.nbytes:
        return [[arr, _BYTE]]
    whole = MPI.buffer(arr.reshape(-1, order="A"))
    return [[whole[off : off + n], n, _BYTE] for off, n in _chunks(arr.nbytes, chunk)]


# -- per-thread device streams and the pinned staging pool ------------------------------------------------------

_tls = threading.local()
_pinned_pools: weakref.WeakKeyDictionary[Runtime, BlockPool[PinnedBuffer]] = weakref.WeakKeyDictionary()
_PINNED_POOL_BYTES = 256 << 20


def internal_stream(runtime: Runtime, ordinal: int) -> Stream:
    """cai_mpi's own stream for ``ordinal``, one per thread (the current device is per thread)."""
    streams: dict[tuple[int, int], Stream] | None = getattr(_tls, "streams", None)
    if streams is None:
        streams = _tls.streams = {}
    key = (id(runtime), ordinal)
    s = streams.get(key)
    if s is None:
        s = streams[key] = runtime.create_stream(ordinal)
    return s


def _pinned_pool(runtime: Runtime) -> BlockPool[PinnedBuffer]:
    pool = _pinned_pools.get(runtime)
    if pool is None:
        pool = _pinned_pools[runtime] = BlockPool(runtime.alloc_pinned, PinnedBuffer.free, budget=_PINNED_POOL_BYTES)
    return pool


# -- sending --------------------------------------------------------------------------------------------------


#: How one message is sent, as ``plan_send`` decides it: ``(header, payload_tag, payload, steps, in_place)``.
#: Post ``header`` on the header communicator, then every spec of ``payload`` on the payload communicator
#: with ``payload_tag``, then drive ``steps`` (None when nothing is left). ``in_place``: the payload specs
#: read the source's own memory, so a persistent request may reuse them. (A plain tuple: one is made per
#: message, and a tuple costs a quarter of a NamedTuple.)
Outbound = tuple[bytes, int, list[Any], "Steps | None", bool]


def plan_send(
    src: np.ndarray[Any, Any] | DeviceSource, pc: PrivateComms, meta: bytes, cfg: Config, rt: Runtime, dest: int,
    *, channel: bool = False,
) -> Outbound:
    """How the message carrying ``src`` travels; ``dest`` is needed only by staged device payloads."""
    if type(src) is np.ndarray:
        nbytes = src.nbytes
        if nbytes <= cfg.inline_bytes and not channel:
            return (inline_message(src, meta), 0, [], None, True)
        return _plan_host(src, pc, meta, cfg, channel)
    assert isinstance(src, DeviceSource)
    if src.desc.nbytes == 0 and not channel:  # nothing to read, wherever the (NULL) pointer lives
        return (inline_message(np.empty(src.desc.shape, src.desc.dtype), meta), 0, [], None, True)
    return _plan_device(src, pc, meta, cfg, rt, dest, channel)


def _plan_host(arr: np.ndarray[Any, Any], pc: PrivateComms, meta: bytes, cfg: Config, channel: bool) -> Outbound:
    ptag = pc.next_payload_tag()
    nbytes = arr.nbytes
    one_message = nbytes <= cfg.max_message_bytes
    chunk = 0 if one_message else cfg.max_message_bytes
    flags = arr.flags
    if flags.c_contiguous or flags.f_contiguous:
        fortran = not flags.c_contiguous
        header = encode_header(arr.dtype, arr.shape, fortran=fortran, payload_tag=ptag, chunk_bytes=chunk,
                               meta_bytes=meta, channel=channel)
        return (header, ptag, _byte_chunks(arr.T if fortran else arr, chunk), None, True)
    if one_message and describable(arr.shape, arr.strides):
        # MPI gathers strided data in place through a derived datatype: no copy.
        datatype, low = strided_type(arr.shape, arr.strides, arr.itemsize)
        buf = MPI.buffer.fromaddress(arr.ctypes.data + low, datatype.Get_extent()[1], readonly=True)
        header = encode_header(arr.dtype, arr.shape, fortran=False, payload_tag=ptag, meta_bytes=meta, channel=channel)
        return (header, ptag, [[buf, 1, datatype]], None, True)
    # Too large for one derived-datatype message, or a layout MPI datatypes mishandle: a contiguous copy.
    packed = np.ascontiguousarray(arr)
    header = encode_header(arr.dtype, arr.shape, fortran=False, payload_tag=ptag, chunk_bytes=chunk, meta_bytes=meta,
                           channel=channel)
    return (header, ptag, _byte_chunks(packed, chunk), None, False)


def _plan_device(
    src: DeviceSource, pc: PrivateComms, meta: bytes, cfg: Config, rt: Runtime, dest: int, channel: bool
) -> Outbound:
    desc = src.desc
    nbytes = desc.nbytes
    ptag = pc.next_payload_tag()
    aware = pc.aware.aware
    contiguous = desc.is_c_contiguous or desc.is_f_contiguous
    fortran = not desc.is_c_contiguous and desc.is_f_contiguous
    # A CUDA-aware MPI takes the payload whole up to the message limit; staging moves it in chunks.
    chunk = (cfg.max_message_bytes if nbytes > cfg.max_message_bytes else 0) if aware else min(cfg.chunk_bytes, nbytes)
    if aware and not contiguous and cfg.device_datatypes and nbytes <= cfg.max_message_bytes \
            and describable(desc.shape, desc.byte_strides):
        # Strided device data through a derived datatype only on request (CAI_MPI_DEVICE_DATATYPES=1):
        # CUDA-aware MPIs differ widely in how fast they handle device datatypes; packing is the default.
        datatype, low = strided_type(desc.shape, desc.byte_strides, desc.itemsize)
        buf = MPI.buffer.fromaddress(desc.ptr + low, datatype.Get_extent()[1], readonly=True)
        header = encode_header(desc.dtype, desc.shape, fortran=False, payload_tag=ptag, meta_bytes=meta,
                               channel=channel)
        return (header, ptag, [[buf, 1, datatype]], None, True)
    header = encode_header(desc.dtype, desc.shape, fortran=fortran and contiguous, payload_tag=ptag,
                           chunk_bytes=chunk, meta_bytes=meta, channel=channel)
    if aware and contiguous:
        return (header, ptag, [_raw(desc.ptr + off, n, readonly=True) for off, n in _chunks(nbytes, chunk)],
                        None, True)
    return (header, ptag, [], _device_send_steps(src, contiguous, pc, rt, dest, ptag, chunk), False)


def _device_send_steps(
    src: DeviceSource, contiguous: bool, pc: PrivateComms, rt: Runtime, dest: int, ptag: int, chunk: int
) -> Steps:
    """Pack strided device data on the device if needed, then send it directly (CUDA-aware) or staged."""
    desc, ordinal = src.desc, src.ordinal
    ptr = desc.ptr
    packed: DeviceBuffer | None = None
    if not contiguous:
        stream = internal_stream(rt, ordinal)
        packed = rt.pack(desc, ordinal, stream)
        packed_event = rt.record_event(stream)
        if desc.stream is not None:
            # CAI v3: the producer's stream must not run ahead into the data before the pack is done.
            rt.stream_wait_event(desc.stream, packed_event, ordinal)
        yield EventWait(packed_event)
        ptr = packed.ptr
    if pc.aware.aware:
        pieces = _chunks(desc.nbytes, chunk)
        reqs = [pc.payload.Isend(_raw(ptr + off, n, readonly=True), dest, ptag) for off, n in pieces]
        yield MPIWait(reqs, final=True)
    else:
        yield from _staged_send(rt, pc.payload, dest, ptag, ptr, desc.nbytes, chunk, ordinal)
    del packed  # held until the last byte left


def _staged_send(
    rt: Runtime, comm: MPI.Comm, dest: int, tag: int, src: int, nbytes: int, chunk: int, ordinal: int
) -> Steps:
    """Device memory at ``src`` through two pinned buffers: the copy of chunk k+1 runs while chunk k is sent."""
    stream = internal_stream(rt, ordinal)
    pieces = _chunks(nbytes, chunk)
    pool = _pinned_pool(rt)
    slots = [pool.take(chunk) for _ in range(min(2, len(pieces)))]
    sends: list[MPI.Request | None] = [None] * len(slots)
    copied: list[Event | None] = [None] * len(slots)

    def stage(k: int) -> None:
        off, n = pieces[k]
        slot = k % len(slots)
        rt.copy_async(slots[slot][0].ptr, src + off, n, stream)
        copied[slot] = rt.record_event(stream)

    try:
        stage(0)
        for k, (_off, n) in enumerate(pieces):
            slot = k % len(slots)
            if k + 1 < len(pieces):
                following = (k + 1) % len(slots)
                previous = sends[following]
                if previous is not None:  # that buffer still carries chunk k-1
                    yield MPIWait([previous])
                    sends[following] = None
                stage(k + 1)
            event = copied[slot]
            assert event is not None
            yield EventWait(event)
            sends[slot] = comm.Isend(_raw(slots[slot][0].ptr, n, readonly=True), dest, tag)
        pending = [r for r in sends if r is not None]
        if pending:
            yield MPIWait(pending)
    finally:
        for buf, cls in slots:
            pool.give(buf, cls)


# -- receiving ------------------------------------------------------------------------------------------------


class Inbox(HeaderMemo):
    """Where headers are received: a buffer any header fits in, its MPI message spec and status, the last
    header it held and a typed view of that header's inline payload (a stream of same-shaped small messages
    reuses both)."""

    __slots__ = ("_view", "_view_info", "hbuf", "msg", "status")

    def __init__(self) -> None:
        super().__init__()
        self.hbuf = bytearray(HEADER_BUFFER_BYTES)
        self.msg = [self.hbuf, _BYTE]
        self.status = MPI.Status()
        self._view_info: MessageInfo | None = None
        self._view: np.ndarray[Any, Any] = np.empty(0, np.uint8)

    def inline_payload(self, info: MessageInfo) -> np.ndarray[Any, Any]:
        """The inline payload of the header in ``hbuf``, typed and shaped in wire order (a view: copy it)."""
        if self._view_info is not info:
            shape = info.shape[::-1] if info.fortran else info.shape
            count = info.payload_nbytes // info.dtype.itemsize
            self._view = np.frombuffer(self.hbuf, info.dtype, count, info.header_nbytes).reshape(shape)
            self._view_info = info
        return self._view


#: What a received header asks for, as ``plan_recv`` decides it: ``(result, source, payload_tag, payload,
#: steps)``. Post every spec of ``payload`` on the payload communicator (from ``source``, with
#: ``payload_tag``), then drive ``steps``; the receive then returns ``result``.
Inbound = tuple[Array, int, int, list[Any], "Steps | None"]


def plan_recv(
    fn: str, inbox: Inbox, target: Target | None, ordinal: int | None, pc: PrivateComms, cfg: Config,
    rt: Runtime, *, channel: bool = False,
) -> Inbound:
    """Decode the header in ``inbox`` and plan where its payload lands: ``out=`` (``target``), host memory
    (``ordinal`` None) or new memory on GPU ``ordinal``. A header that does not fit is answered with a plan
    that receives and discards the payload, then raises."""
    status = inbox.status
    source, tag = status.Get_source(), status.Get_tag()
    info, ptag = inbox.decode(inbox.hbuf, status.Get_count(_BYTE), cfg.max_payload_bytes)
    if target is not None or info.channel != channel:
        problem = _refusal(fn, info, source, tag, target, channel)
        if problem is not None:
            return None, source, ptag, [], _discard(pc, info, source, ptag, problem)  # type: ignore[return-value]
    landing: Inbound
    if target is None:
        if ordinal is None:
            if info.inline:  # the payload is in the header buffer, which the next receive overwrites: copy it out
                arr = (inbox._view if inbox._view_info is info else inbox.inline_payload(info)).copy()
                return Array._over_host(arr.T if info.fortran else arr, source, tag, info.meta), source, 0, [], None
            arr = host_receive_pool().take_array(info.shape, info.dtype, info.payload_nbytes, info.fortran)
            result = Array._over_host(arr, source, tag, info.meta)
            landing = _into_host(result, arr.T if info.fortran else arr, info, source, ptag, inbox)
        else:
            buffer = rt.alloc_device(info.payload_nbytes, ordinal)
            result = Array.from_device(buffer, info.shape, info.dtype, fortran=info.fortran, source=source, tag=tag,
                                       meta=info.meta)
            desc = result.descriptor
            landing = _into_device(result, desc.transposed() if info.fortran else desc, ordinal, info, source, ptag,
                                   inbox, pc, rt)
    elif type(target) is np.ndarray:
        result = Array._over_host(target, source, tag, info.meta)
        landing = _into_host(result, target.T if info.fortran else target, info, source, ptag, inbox)
    else:
        assert isinstance(target, RecvTarget)
        target.sync_before_write(rt)
        if target.host is not None:
            result = Array._over_host(target.host, source, tag, info.meta, target.owner)
            landing = _into_host(result, target.host.T if info.fortran else target.host, info, source, ptag, inbox)
        else:
            assert target.desc is not None and target.ordinal is not None
            result = Array(target.desc.replace(stream=None), device=target.ordinal, owner=target.owner,
                           source=source, tag=tag, meta=info.meta)
            landing = _into_device(result, target.desc.transposed() if info.fortran else target.desc,
                                   target.ordinal, info, source, ptag, inbox, pc, rt)
    if channel and (landing[4] is not None or len(landing[3]) != 1):
        # A channel binds one persistent receive to the memory: nothing to stage, chunk or unpack per message.
        where = "out=" if target is not None else f"GPU {ordinal}"
        problem = (RecvMismatchError if target is not None else ValueError)(
            f"{fn}: the message from rank {source} (tag {tag}: {info.describe()}) cannot be received in place into "
            f"{where}: a channel takes host memory, or contiguous device memory through a CUDA-aware MPI (this one "
            f"is {'' if pc.aware.aware else 'not '}CUDA-aware, per {pc.aware.source}); pass device='host' or use "
            "recv_array. Its payload was received and discarded"
        )
        return None, source, ptag, [], _discard(pc, info, source, ptag, problem)  # type: ignore[return-value]
    return landing


def _refusal(
    fn: str, info: MessageInfo, source: int, tag: int, target: Target | None, channel: bool
) -> Exception | None:
    """The error for a message this receive cannot take, or None."""
    if info.channel != channel:
        error: type[Exception] = ProtocolError
        why = ("it opens a persistent channel (send_channel): receive it with recv_channel" if info.channel
               else "it was sent with send_array, not through a send_channel")
    else:
        assert target is not None
        problem = mismatch(target, info.shape, info.dtype)
        if problem is None:
            return None
        error, why = RecvMismatchError, f"it does not fit out= ({describe_target(target)}): {problem}"
    return error(f"{fn}: the message from rank {source} (tag {tag}: {info.describe()}) {why}; "
                 "its payload was received and discarded")


def _into_host(
    result: Array, dst: np.ndarray[Any, Any], info: MessageInfo, source: int, ptag: int, inbox: Inbox
) -> Inbound:
    """Land the payload in host array ``dst``, viewed in wire order (C-ordered, or strided ``out=``)."""
    if info.inline:
        dst[...] = inbox.inline_payload(info)  # (same dtype: the receive checked it)
        return (result, source, ptag, [], None)
    if info.payload_nbytes == 0 and not info.channel:  # (a channel's first payload is one message, even empty)
        return (result, source, ptag, [], None)
    if dst.flags.c_contiguous:
        return (result, source, ptag, _byte_chunks(dst, info.chunk_bytes), None)
    if info.nchunks == 1 and describable(dst.shape, dst.strides):
        datatype, low = strided_type(dst.shape, dst.strides, dst.itemsize)
        buf = MPI.buffer.fromaddress(dst.ctypes.data + low, datatype.Get_extent()[1])
        return (result, source, ptag, [[buf, 1, datatype]], None)
    tmp = np.empty(dst.shape, dst.dtype)
    return (result, source, ptag, _byte_chunks(tmp, info.chunk_bytes), _copy_steps(dst, tmp))


def _copy_steps(dst: np.ndarray[Any, Any], tmp: np.ndarray[Any, Any]) -> Steps:
    np.copyto(dst, tmp, casting="no")
    yield from ()


def _into_device(
    result: Array, wire: Any, ordinal: int, info: MessageInfo, source: int, ptag: int, inbox: Inbox,
    pc: PrivateComms, rt: Runtime,
) -> Inbound:
    """Land the payload in device memory described by ``wire`` (the target viewed in wire order)."""
    nbytes = info.payload_nbytes
    if nbytes == 0 and not info.channel:
        return (result, source, ptag, [], None)
    if wire.is_c_contiguous:
        if info.inline:
            inline = inbox.inline_payload(info).copy()  # the header buffer is reused at once
            return (result, source, ptag, [], _upload_steps(rt, wire.ptr, inline, ordinal))
        if pc.aware.aware:
            specs = [_raw(wire.ptr + off, n) for off, n in _chunks(nbytes, info.chunk_bytes)]
            return (result, source, ptag, specs, None)
        steps = _staged_recv(rt, pc.payload, source, ptag, wire.ptr, nbytes, info.chunk_bytes or nbytes, ordinal)
        return (result, source, ptag, [], steps)
    # A strided device out=: into a contiguous temporary, then scattered on the device.
    tmp = rt.alloc_device(nbytes, ordinal)
    result, source, ptag, payload, landed = _into_device(
        result, wire.replace(ptr=tmp.ptr, strides=None), ordinal, info, source, ptag, inbox, pc, rt
    )
    return result, source, ptag, payload, _unpack_steps(landed, rt, tmp, wire, ordinal)


def _upload_steps(rt: Runtime, ptr: int, data: np.ndarray[Any, Any], ordinal: int) -> Steps:
    stream = internal_stream(rt, ordinal)
    rt.copy_async(ptr, data.ctypes.data, data.nbytes, stream)
    yield EventWait(rt.record_event(stream))


def _unpack_steps(before: Steps | None, rt: Runtime, tmp: DeviceBuffer, wire: Any, ordinal: int) -> Steps:
    if before is not None:
        yield from before
    stream = internal_stream(rt, ordinal)
    rt.unpack(tmp.ptr, wire, ordinal, stream)
    yield EventWait(rt.record_event(stream))
    del tmp


def _staged_recv(
    rt: Runtime, comm: MPI.Comm, source: int, tag: int, dst: int, nbytes: int, chunk: int, ordinal: int
) -> Steps:
    """Chunks into two pinned buffers, each copied to device memory at ``dst`` while the next one arrives."""
    stream = internal_stream(rt, ordinal)
    pieces = _chunks(nbytes, chunk)
    pool = _pinned_pool(rt)
    slots = [pool.take(chunk) for _ in range(min(2, len(pieces)))]
    recvs: list[MPI.Request | None] = [None] * len(slots)

    def post(k: int) -> None:
        _off, n = pieces[k]
        slot = k % len(slots)
        recvs[slot] = comm.Irecv(_raw(slots[slot][0].ptr, n), source, tag)

    try:
        for k in range(len(slots)):
            post(k)
        last: Event | None = None
        for k, (off, n) in enumerate(pieces):
            slot = k % len(slots)
            req = recvs[slot]
            assert req is not None
            yield MPIWait([req])
            rt.copy_async(dst + off, slots[slot][0].ptr, n, stream)
            last = rt.record_event(stream)
            if k + len(slots) < len(pieces):
                yield EventWait(last)  # the slot is free again once its copy is done
                post(k + len(slots))
        if last is not None:
            yield EventWait(last)
    finally:
        for buf, cls in slots:
            pool.give(buf, cls)


def _discard(pc: PrivateComms, info: MessageInfo, source: int, ptag: int, error: Exception) -> Steps:
    """Receive and drop a payload chunk by chunk so nothing stays unmatched, then raise ``error``."""
    if info.nchunks:
        nbytes = info.payload_nbytes
        scratch = np.empty(min(info.chunk_bytes or nbytes, nbytes), np.uint8)
        for _off, n in _chunks(nbytes, info.chunk_bytes):  # (a channel's first payload is one message, even empty)
            yield MPIWait([pc.payload.Irecv([scratch, n, _BYTE], source, ptag)])
    raise error
