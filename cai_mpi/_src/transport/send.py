"""The one send pipeline: ``plan_send`` decides how a message travels."""

from __future__ import annotations

from typing import Any

import numpy as np
from mpi4py import MPI

from ..arrays.operands import DeviceSource, Target, replaces, send_source
from ..config import Config
from ..core.descriptor import CAIDescriptor
from ..core.header import encode_header, inline_message
from ..progress.waits import EventWait, MPIWait
from ..runtime import get_runtime
from ..runtime.base import DeviceBuffer, Event, PinnedBuffer, Runtime
from .datatypes import describable, host_datatype_bytes, strided_type
from .failure import PREPARED, announce_failure
from .pieces import Steps, byte_chunks, chunks, give_back, in_context_scope, internal_stream, pinned_pool, raw
from .plans import NO_MESSAGES, SendPlan
from .privcomm import PrivateComms

__all__ = ["pack_on_device", "plan_send", "staged_source"]


# -- sending --------------------------------------------------------------------------------------------------


def plan_send(
    src: np.ndarray[Any, Any] | DeviceSource, pc: PrivateComms, meta: bytes, cfg: Config, rt: Runtime | None, dest: int,
    *, channel: bool = False,
) -> SendPlan:
    """How the message carrying ``src`` travels; ``dest`` is needed only by staged device payloads, ``rt`` only by
    device memory."""
    if type(src) is np.ndarray:
        nbytes = src.nbytes
        if nbytes <= cfg.inline_bytes and not channel:
            return SendPlan(inline_message(src, meta), 0, NO_MESSAGES, None, True)
        return _plan_host(src, pc, meta, cfg, channel)
    assert isinstance(src, DeviceSource) and rt is not None  # (device memory came with its runtime)
    if src.desc.nbytes == 0 and not channel:  # nothing to read, wherever the (NULL) pointer lives
        return SendPlan(inline_message(np.empty(src.desc.shape, src.desc.dtype), meta), 0, NO_MESSAGES, None, True)
    return _plan_device(src, pc, meta, cfg, rt, dest, channel)


def _plan_host(arr: np.ndarray[Any, Any], pc: PrivateComms, meta: bytes, cfg: Config, channel: bool) -> SendPlan:
    ptag = pc.next_payload_tag()
    nbytes = arr.nbytes
    one_message = nbytes <= cfg.max_message_bytes
    chunk = 0 if one_message else cfg.max_message_bytes
    flags = arr.flags
    if flags.c_contiguous or flags.f_contiguous:
        fortran = not flags.c_contiguous
        header = encode_header(arr.dtype, arr.shape, fortran=fortran, payload_tag=ptag, chunk_bytes=chunk,
                               meta_bytes=meta, channel=channel)
        return SendPlan(header, ptag, byte_chunks(arr.T if fortran else arr, chunk), None, True)
    # (a channel's message is bound to the array's memory once: it always goes in place)
    if one_message and describable(arr.shape, arr.strides) and (channel or nbytes <= host_datatype_bytes(cfg)):
        # MPI gathers strided data in place through a derived datatype: no copy.
        datatype, low = strided_type(arr.shape, arr.strides, arr.itemsize)
        buf = MPI.buffer.fromaddress(arr.ctypes.data + low, datatype.Get_extent()[1], readonly=True)
        header = encode_header(arr.dtype, arr.shape, fortran=False, payload_tag=ptag, meta_bytes=meta, channel=channel)
        return SendPlan(header, ptag, [[buf, 1, datatype]], None, True)
    # Too large for one derived-datatype message, faster packed by numpy on this MPI, or a layout MPI datatypes
    # mishandle: a contiguous copy.
    packed = np.ascontiguousarray(arr)
    header = encode_header(arr.dtype, arr.shape, fortran=False, payload_tag=ptag, chunk_bytes=chunk, meta_bytes=meta,
                           channel=channel)
    return SendPlan(header, ptag, byte_chunks(packed, chunk), None, False)


def _plan_device(
    src: DeviceSource, pc: PrivateComms, meta: bytes, cfg: Config, rt: Runtime, dest: int, channel: bool
) -> SendPlan:
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
        return SendPlan(header, ptag, [[buf, 1, datatype]], None, True)
    direct = aware and contiguous
    # (A channel refuses a payload that needs steps before anything is prepared or posted.)
    header = encode_header(desc.dtype, desc.shape, fortran=fortran and contiguous, payload_tag=ptag,
                           chunk_bytes=chunk, meta_bytes=meta, channel=channel, may_fail=not direct and not channel)
    if direct:
        return SendPlan(header, ptag, [raw(desc.ptr + off, n, readonly=True) for off, n in chunks(nbytes, chunk)],
                        None, True)
    steps = in_context_scope(rt, _device_send_steps(src, contiguous, pc, rt, dest, ptag, chunk))
    return SendPlan(header, ptag, NO_MESSAGES, steps, False)


def plan_object(fn: str, obj: Any, pc: PrivateComms, dest: int, sync: bool | None, meta: bytes, cfg: Config,
                out: Target | None = None, receives: bool = False,
                ) -> tuple[SendPlan | None, np.ndarray[Any, Any] | DeviceSource]:
    """The one way an object (anything a send takes) becomes a message to ``dest``: its plan (None for
    ``PROC_NULL``) and its source, read through the runtime with its producer synchronized as ``sync`` says (a numpy
    array is planned as it is: host memory needs no runtime). ``out``: the receive buffer of the same call, which may
    be the object itself (a copy is then sent when the call ``receives``) and may share no other byte with it."""
    rt = None if type(obj) is np.ndarray else get_runtime()
    src = obj if rt is None else send_source(fn, obj, sync, rt)
    if out is not None and replaces(fn, src, out) and receives and dest != MPI.PROC_NULL:
        src = staged_source(src, rt)
    if dest == MPI.PROC_NULL:
        return None, src
    return plan_send(src, pc, meta, cfg, rt, dest), src


def staged_source(src: np.ndarray[Any, Any] | DeviceSource, rt: Runtime | None) -> np.ndarray[Any, Any] | DeviceSource:
    """A copy of ``src`` to send from, complete when this returns: the memory itself may then be received into at
    once (``sendrecv_array``'s ``out=`` the array sent), whatever route either message takes."""
    if type(src) is np.ndarray:
        return np.array(src, order="A")  # (F order stays F order; any other layout becomes C order)
    assert isinstance(src, DeviceSource) and rt is not None
    with rt.context_scope():
        packed, event = pack_on_device(src.desc, src.ordinal, rt)
        event.synchronize()  # a CUDA-aware receive writes the memory as soon as it is posted
    desc = CAIDescriptor.for_new_buffer(packed.ptr, src.desc.shape, src.desc.dtype)
    return DeviceSource(desc, src.ordinal, packed)


def pack_on_device(desc: CAIDescriptor, ordinal: int, rt: Runtime) -> tuple[DeviceBuffer, Event]:
    """Strided device data packed contiguous on cai_mpi's stream (point-to-point and collectives alike), and the
    event of the pack. CAI v3: the producer's stream must not run ahead into the data before the pack is done."""
    stream = internal_stream(rt, ordinal)
    packed = rt.pack(desc, ordinal, stream)
    event = rt.record_event(stream)
    if desc.stream is not None:
        rt.stream_wait_event(desc.stream, event, ordinal)
    return packed, event


def _device_send_steps(
    src: DeviceSource, contiguous: bool, pc: PrivateComms, rt: Runtime, dest: int, ptag: int, chunk: int
) -> Steps:
    """Pack strided device data on the device if needed, then send it directly (CUDA-aware) or staged. The pack
    (its allocation and launch) runs before ``PREPARED``, so running out of device memory posts nothing."""
    desc, ordinal = src.desc, src.ordinal
    ptr = desc.ptr
    packed: DeviceBuffer | None = None
    packed_event: Event | None = None
    if not contiguous:
        packed, packed_event = pack_on_device(desc, ordinal, rt)
        ptr = packed.ptr
    if pc.aware.aware:
        yield PREPARED
        pieces = chunks(desc.nbytes, chunk)
        if packed_event is not None:
            try:
                yield EventWait(packed_event)  # where an error of the pack kernel or copies shows
            except Exception as exc:
                yield MPIWait(announce_failure(pc.payload, dest, ptag, len(pieces), exc))
                raise
        reqs = [pc.payload.Isend(raw(ptr + off, n, readonly=True), dest, ptag) for off, n in pieces]
        yield MPIWait(reqs, final=True)
    else:
        # The staging copies run on the stream the pack ran on (this thread's), so after it: no wait between.
        yield from _staged_send(rt, pc.payload, dest, ptag, ptr, desc.nbytes, chunk, ordinal)
    del packed  # held until the last byte left


def _staged_send(
    rt: Runtime, comm: MPI.Comm, dest: int, tag: int, src: int, nbytes: int, chunk: int, ordinal: int
) -> Steps:
    """Device memory at ``src`` through two pinned buffers: the copy of chunk k+1 runs while chunk k is sent.

    The buffers are taken and the first copy is enqueued before ``PREPARED``; a copy that fails later (its event
    reports it) ends the send with the receiver told: the chunks not sent go as failure markers."""
    stream = internal_stream(rt, ordinal)
    pieces = chunks(nbytes, chunk)
    pool = pinned_pool(rt)
    slots: list[tuple[PinnedBuffer, int]] = []
    sends: list[MPI.Request | None] = [None] * min(2, len(pieces))
    copied: list[Event | None] = [None] * len(sends)

    def stage(k: int) -> None:
        off, n = pieces[k]
        slot = k % len(slots)
        rt.copy_async(slots[slot][0].ptr, src + off, n, stream)
        copied[slot] = rt.record_event(stream)

    try:
        while len(slots) < len(sends):
            slots.append(pool.take(chunk))
        stage(0)
        yield PREPARED
        sent = 0  # chunks handed to MPI
        try:
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
                sends[slot] = comm.Isend(raw(slots[slot][0].ptr, n, readonly=True), dest, tag)
                sent = k + 1
            pending = [r for r in sends if r is not None]
            if pending:
                yield MPIWait(pending)
        except Exception as exc:
            if sent < len(pieces):
                yield MPIWait(announce_failure(comm, dest, tag, len(pieces) - sent, exc))
            raise
    finally:  # on an error or an abandoned request, a block still in use is held back until it is not
        for slot, (buf, cls) in enumerate(slots):
            give_back(pool, buf, cls, [sends[slot]], [copied[slot]])
