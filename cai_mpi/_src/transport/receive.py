"""The one receive pipeline: ``plan_recv`` decodes a header and decides where its payload lands."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
from mpi4py import MPI

from ..arrays.array import Array
from ..arrays.operands import RecvTarget, Target, describe_target, mismatch
from ..config import Config
from ..core.descriptor import CAIDescriptor
from ..core.header import HEADER_BUFFER_BYTES, HeaderMemo, MessageInfo
from ..errors import ProtocolError, RecvMismatchError, SenderFailedError
from ..progress.waits import EventWait, MPIWait
from ..runtime.base import DeviceBuffer, Event, Runtime
from .bigcount import INT_MAX
from .datatypes import describable, host_datatype_bytes, strided_type
from .failure import failed, receive_checked, receive_reason
from .pieces import BYTE, Steps, byte_chunks, chunks, device_landing, give_back, internal_stream, pinned_pool, raw
from .plans import NO_MESSAGES, RecvPlan
from .pool import host_receive_pool
from .privcomm import PrivateComms

__all__ = [
    "Destination", "Inbox", "destination", "give_back_inbox", "header_failure", "plan_recv", "take_inbox",
    "unpack_on_device",
]

# -- receiving ------------------------------------------------------------------------------------------------


class Inbox(HeaderMemo):
    """Where headers are received: a buffer any header fits in, its MPI message spec and status, the last
    header it held and a typed view of that header's inline payload (a stream of same-shaped small messages
    reuses both)."""

    __slots__ = ("_view", "_view_info", "hbuf", "msg", "status")

    def __init__(self) -> None:
        super().__init__()
        self.hbuf = bytearray(HEADER_BUFFER_BYTES)
        self.msg = [self.hbuf, BYTE]
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


_inboxes: list[Inbox] = []  # free list: a nonblocking receive holds its inbox until its header is decoded


def take_inbox() -> Inbox:
    """An inbox for one nonblocking header receive (give it back once the header is decoded)."""
    try:
        return _inboxes.pop()
    except IndexError:
        return Inbox()


def give_back_inbox(inbox: Inbox) -> None:
    _inboxes.append(inbox)


def header_failure(fn: str, exc: MPI.Exception, status: MPI.Status) -> Exception:
    """What to raise for a header receive that MPI failed: a message too long for the header buffer (MPI truncates
    it, consuming it whole) is no cai_mpi header, so a ProtocolError says so; other MPI errors stay as they are."""
    if exc.Get_error_class() != MPI.ERR_TRUNCATE:
        return exc
    return ProtocolError(
        f"{fn}: the message from rank {status.Get_source()} (tag {status.Get_tag()}) on cai_mpi's header communicator "
        f"is longer than any cai_mpi header ({HEADER_BUFFER_BYTES} bytes): is another library sending on cai_mpi's "
        "private communicator? It was dropped"
    )


def plan_recv(
    fn: str, inbox: Inbox, target: Target | None, ordinal: int | None, pc: PrivateComms, cfg: Config,
    rt: Runtime, *, channel: bool = False,
) -> RecvPlan:
    """Decode the header in ``inbox`` and plan where its payload lands: ``out=`` (``target``), host memory
    (``ordinal`` None) or new memory on GPU ``ordinal``. A header that does not fit is answered with a plan
    that receives and discards the payload, then raises."""
    status = inbox.status
    source, tag = status.Get_source(), status.Get_tag()
    info, ptag = inbox.decode(inbox.hbuf, status.Get_count(BYTE), cfg.max_payload_bytes)
    if not info.inline:
        _check_payload_messages(info, ptag, pc)
    if info.channel != channel or (target is not None and mismatch(target, info.shape, info.dtype) is not None):
        problem = _refusal(fn, info, source, tag, target, channel)
        assert problem is not None
        return RecvPlan(None, source, ptag, NO_MESSAGES, _discard(pc, info, source, ptag, problem))
    if type(target) is np.ndarray:  # (without building a Destination)
        result = Array.over_host(target, source, tag, info.meta)
        if info.inline:  # the payload is in the header buffer: copied into out= now, nothing left to post
            (target.T if info.fortran else target)[...] = inbox.inline_payload(info)
            return RecvPlan(result, source, 0, NO_MESSAGES, None)
        landing = _into_host(result, target.T if info.fortran else target, info, source, ptag, inbox, cfg)
    elif target is None and ordinal is None and info.inline:
        # The payload is in the header buffer, which the next receive overwrites: copy it out.
        arr = inbox.inline_payload(info).copy()
        return RecvPlan(Array.over_host(arr.T if info.fortran else arr, source, tag, info.meta), source, 0,
                        NO_MESSAGES, None)
    else:
        dest = destination(info, target, ordinal, source, tag, rt, direct=pc.aware.aware)
        if dest.host is not None:
            landing = _into_host(dest.result, dest.host, info, source, ptag, inbox, cfg)
        else:
            assert dest.wire is not None and dest.ordinal is not None
            landing = _into_device(dest.result, dest.wire, dest.ordinal, info, source, ptag, inbox, pc, rt)
    if channel and (landing.steps is not None or len(landing.payload) != 1):
        # A channel binds one persistent receive to the memory: nothing to stage, chunk or unpack per message.
        where = "out=" if target is not None else f"GPU {ordinal}"
        problem = (RecvMismatchError if target is not None else ValueError)(
            f"{fn}: the message from rank {source} (tag {tag}: {info.describe()}) cannot be received in place into "
            f"{where}: a channel takes host memory, or contiguous device memory through a CUDA-aware MPI (this one "
            f"is {'' if pc.aware.aware else 'not '}CUDA-aware, per {pc.aware.source}); pass device='host' or use "
            "recv_array. Its payload was received and discarded"
        )
        return RecvPlan(None, source, ptag, NO_MESSAGES, _discard(pc, info, source, ptag, problem))
    if info.may_fail:
        landing.steps = _checked(fn, tag, info, pc, source, ptag, landing.payload, landing.steps)
        landing.payload = NO_MESSAGES
    return landing


def _checked(
    fn: str, tag: int, info: MessageInfo, pc: PrivateComms, source: int, ptag: int, payload: Sequence[Any],
    steps: Steps | None,
) -> Steps:
    """A payload whose sender may fail after its header (FLAG_MAY_FAIL): its messages are received here with
    their lengths checked (a staged landing checks its own), and a failure is named as this receive's."""
    try:
        if payload:
            sizes = [n for _off, n in chunks(info.payload_nbytes, info.chunk_bytes)]
            assert len(sizes) == len(payload)
            yield from receive_checked(pc.payload, source, ptag, payload, sizes)
        if steps is not None:
            yield from steps
    except SenderFailedError as exc:
        raise SenderFailedError(
            f"{fn}: rank {source} failed after sending the header of its message (tag {tag}: {info.describe()}), "
            f"so the payload did not come: {exc.reason}. The rest of the message was received and dropped "
            "(out= may hold part of it); the communicator stays usable", source, tag, exc.reason
        ) from None


class Destination:
    """Where a message's payload lands: ``result`` (the Array the receive returns) over host memory ``host``, or
    over device memory ``wire`` on GPU ``ordinal``; ``host`` and ``wire`` are viewed in wire order."""

    __slots__ = ("host", "ordinal", "result", "wire")

    def __init__(self, result: Array, host: np.ndarray[Any, Any] | None, wire: CAIDescriptor | None,
                 ordinal: int | None) -> None:
        self.result, self.host, self.wire, self.ordinal = result, host, wire, ordinal


def destination(info: MessageInfo, target: Target | None, ordinal: int | None, source: int, tag: int,
                rt: Runtime, *, direct: bool) -> Destination:
    """Where a payload described by ``info`` lands (point-to-point and collectives alike): ``out=`` (``target``,
    already checked against ``info``), new host memory (``ordinal`` None) or new memory on GPU ``ordinal`` (which a
    CUDA-aware MPI writes when ``direct``)."""
    if target is None:
        if ordinal is None:
            arr = host_receive_pool().take_array(info.shape, info.dtype, info.payload_nbytes, info.fortran)
            return Destination(Array.over_host(arr, source, tag, info.meta), arr.T if info.fortran else arr, None,
                               None)
        buffer = device_landing(rt, info.payload_nbytes, ordinal, direct=direct, handed_out=True)
        result = Array.from_device(buffer, info.shape, info.dtype, fortran=info.fortran, source=source, tag=tag,
                                   meta=info.meta)
        desc = result.descriptor
        return Destination(result, None, desc.transposed() if info.fortran else desc, ordinal)
    if type(target) is np.ndarray:
        return Destination(Array.over_host(target, source, tag, info.meta), target.T if info.fortran else target,
                           None, None)
    assert isinstance(target, RecvTarget)  # its producer was synchronized by recv_target, in the caller's thread
    if target.host is not None:
        return Destination(Array.over_host(target.host, source, tag, info.meta, target.owner),
                           target.host.T if info.fortran else target.host, None, None)
    assert target.desc is not None and target.ordinal is not None
    result = Array(target.desc.replace(stream=None), device=target.ordinal, owner=target.owner, source=source,
                   tag=tag, meta=info.meta)
    return Destination(result, None, target.desc.transposed() if info.fortran else target.desc, target.ordinal)


def unpack_on_device(tmp: DeviceBuffer, wire: CAIDescriptor, ordinal: int, rt: Runtime) -> Event:
    """Scatter the contiguous bytes of ``tmp`` into strided device memory ``wire`` on cai_mpi's stream."""
    stream = internal_stream(rt, ordinal)
    rt.unpack(tmp.ptr, wire, ordinal, stream)
    return rt.record_event(stream)


def _check_payload_messages(info: MessageInfo, ptag: int, pc: PrivateComms) -> None:
    """Refuse a header whose payload no cai_mpi sender could have posted (it would fail inside MPI, or wait for
    ever): a tag over this MPI's TAG_UB, or one message over 2**31-1 bytes."""
    if ptag > pc.tag_ub:
        raise ProtocolError(f"header announces payload tag {ptag}, over this MPI's TAG_UB of {pc.tag_ub}")
    largest = min(info.chunk_bytes or info.payload_nbytes, info.payload_nbytes)
    if largest > INT_MAX:
        raise ProtocolError(
            f"header announces its payload in one message of {largest} bytes, over the "
            f"{INT_MAX} a cai_mpi sender puts in one message"
        )


def _refusal(
    fn: str, info: MessageInfo, source: int, tag: int, target: Target | None, channel: bool
) -> Exception | None:
    """The error for a message this receive cannot take, or None."""
    if info.channel != channel:
        error: type[Exception] = ProtocolError
        why = ("opens a persistent channel (send_channel): receive it with recv_channel" if info.channel
               else "was sent with send_array, not through a send_channel")
    else:
        assert target is not None
        problem = mismatch(target, info.shape, info.dtype)
        if problem is None:
            return None
        error, why = RecvMismatchError, f"does not fit out= ({describe_target(target)}): {problem}"
    return error(f"{fn}: the message from rank {source} (tag {tag}: {info.describe()}) {why}; "
                 "its payload was received and discarded")


def _into_host(
    result: Array, dst: np.ndarray[Any, Any], info: MessageInfo, source: int, ptag: int, inbox: Inbox, cfg: Config
) -> RecvPlan:
    """Land the payload in host array ``dst``, viewed in wire order (C-ordered, or strided ``out=``)."""
    if info.inline:  # (same dtype: the receive checked it)
        dst[...] = inbox.inline_payload(info)
        return RecvPlan(result, source, ptag, NO_MESSAGES, None)
    if info.payload_nbytes == 0 and not info.channel:  # (a channel's first payload is one message, even empty)
        return RecvPlan(result, source, ptag, NO_MESSAGES, None)
    if dst.flags.c_contiguous:
        return RecvPlan(result, source, ptag, byte_chunks(dst, info.chunk_bytes), None)
    if info.nchunks == 1 and describable(dst.shape, dst.strides) and (
            info.channel or info.payload_nbytes <= host_datatype_bytes(cfg)):
        datatype, low = strided_type(dst.shape, dst.strides, dst.itemsize)
        buf = MPI.buffer.fromaddress(dst.ctypes.data + low, datatype.Get_extent()[1])
        return RecvPlan(result, source, ptag, [[buf, 1, datatype]], None)
    tmp = np.empty(dst.shape, dst.dtype)
    return RecvPlan(result, source, ptag, byte_chunks(tmp, info.chunk_bytes), _copy_steps(dst, tmp))


def _copy_steps(dst: np.ndarray[Any, Any], tmp: np.ndarray[Any, Any]) -> Steps:
    np.copyto(dst, tmp, casting="no")
    yield from ()


def _into_device(
    result: Array, wire: Any, ordinal: int, info: MessageInfo, source: int, ptag: int, inbox: Inbox,
    pc: PrivateComms, rt: Runtime,
) -> RecvPlan:
    """Land the payload in device memory described by ``wire`` (the target viewed in wire order)."""
    nbytes = info.payload_nbytes
    if nbytes == 0 and not info.channel:
        return RecvPlan(result, source, ptag, NO_MESSAGES, None)
    if wire.is_c_contiguous:
        if info.inline:
            inline = inbox.inline_payload(info).copy()  # the header buffer is reused at once
            return RecvPlan(result, source, ptag, NO_MESSAGES, _upload_steps(rt, wire.ptr, inline, ordinal))
        if pc.aware.aware:
            specs = [raw(wire.ptr + off, n) for off, n in chunks(nbytes, info.chunk_bytes)]
            return RecvPlan(result, source, ptag, specs, None)
        steps = _staged_recv(rt, pc.payload, source, ptag, wire.ptr, nbytes, info.chunk_bytes or nbytes, ordinal)
        return RecvPlan(result, source, ptag, NO_MESSAGES, steps)
    # A strided device out=: into a contiguous temporary, then scattered on the device.
    tmp = device_landing(rt, nbytes, ordinal, direct=pc.aware.aware)
    landing = _into_device(result, wire.replace(ptr=tmp.ptr, strides=None), ordinal, info, source, ptag, inbox, pc, rt)
    landing.steps = _unpack_steps(landing.steps, rt, tmp, wire, ordinal)
    return landing


def _upload_steps(rt: Runtime, ptr: int, data: np.ndarray[Any, Any], ordinal: int) -> Steps:
    stream = internal_stream(rt, ordinal)
    rt.copy_async(ptr, data.ctypes.data, data.nbytes, stream)
    yield EventWait(rt.record_event(stream))


def _unpack_steps(before: Steps | None, rt: Runtime, tmp: DeviceBuffer, wire: CAIDescriptor, ordinal: int) -> Steps:
    if before is not None:
        yield from before
    yield EventWait(unpack_on_device(tmp, wire, ordinal, rt))
    del tmp


def _staged_recv(
    rt: Runtime, comm: MPI.Comm, source: int, tag: int, dst: int, nbytes: int, chunk: int, ordinal: int
) -> Steps:
    """Chunks into two pinned buffers, each copied to device memory at ``dst`` while the next one arrives."""
    stream = internal_stream(rt, ordinal)
    pieces = chunks(nbytes, chunk)
    pool = pinned_pool(rt)
    slots = [pool.take(chunk) for _ in range(min(2, len(pieces)))]
    recvs: list[MPI.Request | None] = [None] * len(slots)
    statuses = [MPI.Status() for _ in slots]
    last: Event | None = None  # the latest copy out of a slot (copies run in order on the stream)

    def post(k: int) -> None:
        _off, n = pieces[k]
        slot = k % len(slots)
        recvs[slot] = comm.Irecv(raw(slots[slot][0].ptr, n), source, tag)

    failure = False  # a chunk came as the sender's failure marker: nothing more is copied
    try:
        for k in range(len(slots)):
            post(k)
        for k, (off, n) in enumerate(pieces):
            slot = k % len(slots)
            req = recvs[slot]
            assert req is not None
            yield MPIWait([req], statuses[slot])
            if failure or failed(statuses[slot], n):
                failure = True
                if k + len(slots) < len(pieces):
                    post(k + len(slots))
                continue
            rt.copy_async(dst + off, slots[slot][0].ptr, n, stream)
            last = rt.record_event(stream)
            if k + len(slots) < len(pieces):
                yield EventWait(last)  # the slot is free again once its copy is done
                post(k + len(slots))
        if last is not None:
            yield EventWait(last)
        if failure:
            yield from receive_reason(comm, source, tag)
    finally:  # on an error or an abandoned request, a block still in use is held back until it is not
        for slot, (buf, cls) in enumerate(slots):
            give_back(pool, buf, cls, [recvs[slot]], [last])


def _discard(pc: PrivateComms, info: MessageInfo, source: int, ptag: int, error: Exception) -> Steps:
    """Receive and drop a payload chunk by chunk so nothing stays unmatched, then raise ``error``."""
    if info.nchunks:
        nbytes = info.payload_nbytes
        scratch = np.empty(min(info.chunk_bytes or nbytes, nbytes), np.uint8)
        status = MPI.Status()
        marked = False  # the sender failed: its error follows the last chunk
        for _off, n in chunks(nbytes, info.chunk_bytes):  # (a channel's first payload is one message, even empty)
            yield MPIWait([pc.payload.Irecv([scratch, n, BYTE], source, ptag)], status)
            marked = marked or (info.may_fail and failed(status, n))
        if marked:
            try:
                yield from receive_reason(pc.payload, source, ptag)
            except SenderFailedError:
                pass  # this receive's own refusal is what it raises
    raise error

