"""Payloads as one contiguous piece of bytes, for MPI's collectives.

A collective moves each rank's payload as one piece: ``outgoing`` gives the source's bytes in wire
order (packed first if strided) in memory the MPI library may read, and ``Landing``/``Gathered`` give
where received bytes go and how they become Arrays. The routing is point-to-point's: host memory
directly, device memory directly through a CUDA-aware MPI, otherwise through pinned host memory (one
buffer for the whole piece; a collective is blocking, so there is nothing to double-buffer against).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from ..arrays.array import Array
from ..arrays.operands import DeviceSource, Target
from ..core.descriptor import CAIDescriptor
from ..core.header import MessageInfo
from ..runtime.base import Runtime
from .pieces import device_landing, host_address, internal_stream, pinned_pool
from .pool import host_receive_pool
from .receive import destination, unpack_on_device
from .send import pack_on_device

__all__ = ["ALIGN", "Gathered", "Landing", "Outgoing", "host_block", "host_pieces", "host_view", "outgoing"]

ALIGN = 64  # bytes: where each rank's piece starts in a gathered buffer (any dtype's alignment)
_BYTES = np.dtype(np.uint8)


class Outgoing:
    """One rank's payload for a collective: ``nbytes`` at ``address`` in wire order (F order if ``fortran``)."""

    __slots__ = ("_keep", "_release", "address", "fortran", "nbytes")

    def __init__(self, address: int, nbytes: int, fortran: bool, keep: Any, release: Callable[[], None] | None = None):
        self.address, self.nbytes, self.fortran = address, nbytes, fortran
        self._keep, self._release = keep, release

    def release(self) -> None:
        """The collective is done with the bytes: give back a staging buffer."""
        if self._release is not None:
            self._release()
            self._release = None


def outgoing(src: np.ndarray[Any, Any] | DeviceSource, rt: Runtime, *, direct: bool, c_order: bool = False) -> Outgoing:
    """The bytes ``src`` contributes, where the MPI library may read them: device memory stays where it is
    when ``direct`` (a CUDA-aware MPI), else it is staged through pinned host memory. With ``c_order`` the
    bytes are in C order whatever the layout (F-contiguous arrays are otherwise sent as they lie)."""
    if isinstance(src, np.ndarray):
        flags = src.flags
        keep_layout = flags.c_contiguous or (flags.f_contiguous and not c_order)
        arr = src if keep_layout else np.ascontiguousarray(src)
        fortran = not arr.flags.c_contiguous
        return Outgoing(host_address(arr), arr.nbytes, fortran, arr)
    with rt.context_scope():  # (its pack, copy and waits ask which context is current once)
        return _device_outgoing(src, rt, direct, c_order)


def _device_outgoing(src: DeviceSource, rt: Runtime, direct: bool, c_order: bool) -> Outgoing:
    """``outgoing`` of device memory."""
    desc, ordinal = src.desc, src.ordinal
    nbytes = desc.nbytes
    fortran = not desc.is_c_contiguous and desc.is_f_contiguous and not c_order
    ptr, keep = desc.ptr, src.owner
    if nbytes and not (desc.is_c_contiguous or fortran):
        packed, event = pack_on_device(desc, ordinal, rt)  # (the pack point-to-point sends use)
        event.synchronize()
        ptr, keep, fortran = packed.ptr, (keep, packed), False
    if direct or nbytes == 0:
        return Outgoing(ptr, nbytes, fortran, keep)
    pool = pinned_pool(rt)
    staging, cls = pool.take(nbytes)
    stream = internal_stream(rt, ordinal)
    rt.copy_async(staging.ptr, ptr, nbytes, stream)
    rt.record_event(stream).synchronize()
    return Outgoing(staging.ptr, nbytes, fortran, (keep, staging), lambda: pool.give(staging, cls))


class Landing:
    """Where one received piece goes: MPI writes ``nbytes`` at ``address`` (device memory when ``device``);
    ``finish()`` makes the Array, ``discard()`` drops what MPI wrote (``out=`` untouched, staging given back)."""

    __slots__ = ("_discard", "_finish", "address", "device", "nbytes")

    def __init__(self, address: int, nbytes: int, finish: Callable[[], Array], device: bool = False,
                 discard: Callable[[], None] | None = None) -> None:
        self.address, self.nbytes, self._finish, self.device = address, nbytes, finish, device
        self._discard = discard

    def finish(self) -> Array:
        return self._finish()

    def discard(self) -> None:
        if self._discard is not None:
            self._discard()

    @classmethod
    def plan(
        cls, info: MessageInfo, target: Target | None, ordinal: int | None, source: int, tag: int, rt: Runtime,
        *, direct: bool, held: bool = False,
    ) -> Landing:
        """Where a piece described by ``info`` lands: ``out=`` (``target``), host memory (``ordinal`` None) or
        new memory on GPU ``ordinal``; device memory is written directly when ``direct`` (a CUDA-aware MPI),
        else through pinned host memory. ``held``: MPI's write may complete after the call gave up on it (a
        timeout) or be discarded (a vote that did not agree), so it never lands in ``out=`` itself: in memory of
        the same kind, copied into ``out=`` by ``finish()`` (on an error ``out=`` keeps what it held)."""
        nbytes = info.payload_nbytes
        dest = destination(info, target, ordinal, source, tag, rt, direct=direct)  # (where point-to-point lands too)
        result = dest.result
        held = held and target is not None
        if dest.host is None:
            assert dest.wire is not None and dest.ordinal is not None
            return _on_device(result, dest.wire, dest.ordinal, nbytes, rt, direct, held)
        dst = dest.host
        if dst.flags.c_contiguous and not held:
            return cls(host_address(dst) if nbytes else 0, nbytes, lambda: result)
        tmp = np.empty(dst.shape, dst.dtype)

        def copy_out() -> Array:
            np.copyto(dst, tmp, casting="no")
            return result

        return cls(host_address(tmp) if nbytes else 0, nbytes, copy_out)


def _on_device(result: Array, wire: CAIDescriptor, ordinal: int, nbytes: int, rt: Runtime, direct: bool,
               held: bool) -> Landing:
    """Land ``nbytes`` in device memory described by ``wire`` (the target in wire order); MPI writes straight into
    it only when ``direct`` and not ``held`` (``Landing.plan``)."""
    if nbytes == 0:
        return Landing(0, 0, lambda: result)
    contiguous = wire.is_c_contiguous and not (direct and held)
    tmp = None if contiguous else device_landing(rt, nbytes, ordinal, direct=direct)
    dptr = wire.ptr if tmp is None else tmp.ptr
    staging, cls = (None, 0) if direct else pinned_pool(rt).take(nbytes)

    def give_back() -> None:
        if staging is not None:
            pinned_pool(rt).give(staging, cls)

    def finish() -> Array:
        with rt.context_scope():  # (its copy, unpack and wait ask which context is current once)
            stream = internal_stream(rt, ordinal)
            if staging is not None:
                rt.copy_async(dptr, staging.ptr, nbytes, stream)
            if tmp is not None and not wire.is_c_contiguous:
                unpack_on_device(tmp, wire, ordinal, rt).synchronize()  # (after the copy: one stream)
            else:
                if tmp is not None:  # (held: out= is written only now)
                    rt.copy_async(wire.ptr, tmp.ptr, nbytes, stream)
                rt.record_event(stream).synchronize()
        give_back()
        return result

    return Landing(dptr if staging is None else staging.ptr, nbytes, finish, device=staging is None,
                   discard=give_back)


class Gathered:
    """The pieces of every rank received into one buffer, each at an ``ALIGN``-ed offset, then made Arrays."""

    __slots__ = ("_device", "_host", "_staging", "address", "displacements", "infos", "ordinal", "total")

    def __init__(self, infos: list[MessageInfo], ordinal: int | None, rt: Runtime, *, direct: bool,
                 packed: bool = False, stride: int = 0) -> None:
        """``packed``: pieces all alike, back to back (each still aligned for its dtype), for MPI's Gather and
        Allgather, or each at the start of a record of ``stride`` bytes; otherwise each at an ``ALIGN``-ed
        offset."""
        self.infos, self.ordinal = infos, ordinal
        self.displacements: Sequence[int]
        if packed:
            step = stride or infos[0].payload_nbytes
            offset = step * len(infos)
            self.displacements = range(0, offset, step) if step else [0] * len(infos)  # (a range: no list of P)
        else:
            places: list[int] = []
            offset = 0
            for info in infos:
                places.append(offset)
                offset += -(-info.payload_nbytes // ALIGN) * ALIGN
            self.displacements = places
        self.total = offset
        self._host: np.ndarray[Any, Any] | None = None
        self._device: Any = None
        self._staging: Any = None
        if ordinal is None:
            self._host = host_block(max(offset, 1))
            self.address = host_address(self._host)
        elif direct:
            self._device = device_landing(rt, offset, ordinal, direct=True, handed_out=True)
            self.address = self._device.ptr
        else:
            self._staging = pinned_pool(rt).take(max(offset, 1))
            self.address = self._staging[0].ptr

    def discard(self, rt: Runtime) -> None:
        """Drop what MPI wrote, making no Arrays (staging given back)."""
        if self._staging is not None:
            pinned_pool(rt).give(*self._staging)
            self._staging = None

    def finish(self, rt: Runtime, tag: int) -> list[Array]:
        """The Arrays, one per rank: views of the one buffer (host, or device through a CUDA-aware MPI), or
        device copies of the staged pieces."""
        if self._host is not None:
            return host_pieces(self._host, self.infos, self.displacements, tag)
        assert self.ordinal is not None
        out = []
        stream = internal_stream(rt, self.ordinal)
        for rank, (info, off) in enumerate(zip(self.infos, self.displacements, strict=True)):
            if self._device is not None:
                desc = CAIDescriptor.for_new_buffer(self.address + off if info.payload_nbytes else 0, info.shape,
                                                    info.dtype, fortran=info.fortran, stream=self._device.stream)
                out.append(Array(desc, device=self.ordinal, owner=self._device, source=rank, tag=tag, meta=info.meta))
                continue
            buffer = rt.alloc_device(info.payload_nbytes, self.ordinal, stream, handed_out=True)
            rt.copy_async(buffer.ptr, self.address + off, info.payload_nbytes, stream)
            out.append(Array.from_device(buffer, info.shape, info.dtype, fortran=info.fortran, source=rank, tag=tag,
                                         meta=info.meta))
        rt.record_event(stream).synchronize()
        if self._staging is not None:
            pinned_pool(rt).give(*self._staging)
            self._staging = None
        return out


def host_block(nbytes: int) -> np.ndarray[Any, Any]:
    """``nbytes`` of host memory for a collective to receive into: a pooled block (fresh memory would page-fault on
    every call), given back when nothing refers to it any more (the Arrays made over it by ``host_pieces`` do)."""
    return host_receive_pool().take_array((nbytes,), _BYTES, nbytes)


def host_pieces(block: np.ndarray[Any, Any], infos: Sequence[MessageInfo], displacements: Sequence[int],
                tag: int) -> list[Array]:
    """One Array per rank over host memory ``block``: rank r's piece, as ``infos[r]`` describes it, at
    ``displacements[r]`` bytes (views: the Arrays keep ``block`` alive). A plain loop: every steady-state gather
    makes one Array per rank here, and a comprehension or zip costs more than the loop's body."""
    out = []
    for rank, offset in enumerate(displacements):
        info = infos[rank]
        piece = host_view(block, info.dtype, info.shape, offset, info.fortran)
        out.append(Array.over_host(piece, rank, tag, info.meta))
    return out


def host_view(block: Any, dtype: np.dtype[Any], shape: tuple[int, ...], offset: int,
              fortran: bool = False) -> np.ndarray[Any, Any]:
    """An array of ``shape`` and ``dtype`` (C or F order) at ``offset`` bytes into host memory ``block`` (a buffer),
    as a view. (Positional: numpy's constructor parses a keyword ``order=`` slowly; docs/benchmarks-history.md.)"""
    return np.ndarray(shape, dtype, block, offset, None, "F" if fortran else "C")
