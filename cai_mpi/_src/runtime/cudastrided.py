"""Strided device arrays to and from C-ordered bytes with driver copies alone (no CuPy): only copies CUDA documents.

The CUDA driver API takes a 2-D copy (``cuMemcpy2DAsync``) only with unsigned pitches, each at least the row
(``WidthInBytes``) and at most ``CU_DEVICE_ATTRIBUTE_MAX_PITCH``, and documents that a device-to-device 2-D copy
"may fail for pitches not computed by cuMemAllocPitch()". A reversed axis (a negative stride), a broadcast one (stride
0), a self-overlapping view or a stride over the maximum pitch has no such description, so the bytes go through
pinned host memory:

- the array is walked upwards in memory: a reversed axis from its lowest address, a broadcast axis read once;
- device to host, one 2-D copy per block of rows where the pitch rules allow one, else one 1-D copy per row;
- on the host, numpy puts reversed axes back in order and repeats broadcast ones (only when there are any);
- one 1-D copy between the C-ordered bytes and the device buffer.

Unpacking is the same in the other direction. This path is right rather than fast: with CuPy installed, its copy
kernels pack every layout on the device.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator, Sequence
from typing import Any, NamedTuple, Protocol

import numpy as np

from ..core.descriptor import CAIDescriptor, may_self_overlap
from .base import PinnedBuffer
from .cudacontexts import Driver

__all__ = ["StridedPlan", "pack_with_copies", "plan_copies", "unpack_with_copies"]


class OwnStream(Protocol):
    """cai_mpi's stream the copies run on (``CudaStream``)."""

    handle: int
    ordinal: int

    def synchronize(self) -> None: ...


Copy = tuple[int, int, int, int, int]  # (device offset from the lowest address, host offset, width, height, pitch)


class StridedPlan(NamedTuple):
    """How an array's bytes move between device memory and ``host_shape``'s C-ordered bytes on the host."""

    low: int  # bytes from element 0 to the lowest address the array touches (reversed axes start below it)
    copies: list[Copy]
    host_shape: tuple[int, ...]  # the array's shape, walked upwards in memory, broadcast axes of length 1
    reversed_axes: tuple[bool, ...]
    reorders: bool  # the host bytes are not the array's C order (an axis is reversed or broadcast)


def plan_copies(shape: Sequence[int], strides: Sequence[int], itemsize: int) -> StridedPlan:
    """The copies that move ``(shape, strides)`` (bytes, any sign) to or from C-ordered bytes over ``host_shape``.

    Each copy is ``height`` rows of ``width`` contiguous bytes, ``pitch`` apart on the device and back to back on
    the host. The innermost axis is one row when its elements are adjacent (then the next axis gives the rows), else
    each element is a row; adjacent axes that step as one are merged first.
    """
    low, host_shape, up_strides, flips = 0, [], [], []
    for n, s in zip(shape, strides, strict=True):
        broadcast = n == 1 or s == 0
        flips.append(not broadcast and s < 0)
        if flips[-1]:
            low += s * (n - 1)
        host_shape.append(1 if broadcast else n)
        up_strides.append(0 if broadcast else abs(s))
    reorders = any(flips) or tuple(host_shape) != tuple(shape)
    if 0 in shape:
        return StridedPlan(low, [], tuple(host_shape), tuple(flips), reorders)
    dims: list[tuple[int, int]] = []  # outermost first, axes of length 1 dropped, merged where they step as one
    for n, s in zip(host_shape, up_strides, strict=True):
        if n > 1:
            dims.append((n, s))
    merged: list[tuple[int, int]] = []
    for n, s in reversed(dims):
        if merged and s == merged[-1][0] * merged[-1][1]:
            inner_n, inner_s = merged.pop()
            merged.append((n * inner_n, inner_s))
        else:
            merged.append((n, s))
    dims = merged[::-1]
    if dims and dims[-1][1] == itemsize:
        width = dims[-1][0] * itemsize
        height, pitch = dims[-2] if len(dims) > 1 else (1, width)
        outer = dims[:-2]
    elif dims:
        width = itemsize
        height, pitch = dims[-1]
        outer = dims[:-1]
    else:  # a single element
        width, height, pitch, outer = itemsize, 1, itemsize, []
    copies = []
    for packed, index in enumerate(np.ndindex(*[n for n, _ in outer])):
        offset = sum(i * s for i, (_, s) in zip(index, outer, strict=True))
        copies.append((offset, packed * width * height, width, height, pitch))
    return StridedPlan(low, copies, tuple(host_shape), tuple(flips), reorders)


class _Copier:
    """Issues one direction's copies on a stream, 2-D where CUDA's pitch rules allow, else one 1-D copy per row."""

    def __init__(self, driver: Driver, stream_handle: int, ordinal: int) -> None:
        self.driver, self.stream_handle = driver, stream_handle
        self.max_pitch = driver.max_pitch(ordinal)

    def run(self, copies: list[Copy], device: int, host: int, *, to_host: bool) -> None:
        for dev_offset, host_offset, width, height, pitch in copies:
            d, h = device + dev_offset, host + host_offset
            if height > 1 and width <= pitch <= self.max_pitch:
                self._copy_2d(d, h, width, height, pitch, to_host=to_host)
                continue
            for row in range(height):  # rows that overlap, or are farther apart than any 2-D copy reaches
                dst, src = (h + row * width, d + row * pitch) if to_host else (d + row * pitch, h + row * width)
                self.copy_1d(dst, src, width)

    def copy_1d(self, dst: int, src: int, nbytes: int) -> None:
        if nbytes:
            self.driver.check("cuMemcpyAsync", dst, src, nbytes, self.stream_handle)

    def _copy_2d(self, device: int, host: int, width: int, height: int, pitch: int, *, to_host: bool) -> None:
        drv = self.driver.drv
        c = drv.CUDA_MEMCPY2D()
        c.WidthInBytes, c.Height = width, height
        on_device, on_host = drv.CUmemorytype.CU_MEMORYTYPE_DEVICE, drv.CUmemorytype.CU_MEMORYTYPE_HOST
        if to_host:
            c.srcMemoryType, c.srcDevice, c.srcPitch = on_device, device, pitch
            c.dstMemoryType, c.dstHost, c.dstPitch = on_host, host, width
        else:
            c.srcMemoryType, c.srcHost, c.srcPitch = on_host, host, width
            c.dstMemoryType, c.dstDevice, c.dstPitch = on_device, device, pitch
        self.driver.check("cuMemcpy2DAsync", c, self.stream_handle)


@contextlib.contextmanager
def _settled(stream: OwnStream) -> Iterator[None]:
    """On an error, wait for the copies already queued: they must not outlive the pinned memory they use."""
    try:
        yield
    except BaseException:
        with contextlib.suppress(Exception):
            stream.synchronize()
        raise


def _elements(buffer: PinnedBuffer, shape: Sequence[int], itemsize: int) -> np.ndarray[Any, Any]:
    """The pinned bytes as an array of ``shape`` elements, each ``itemsize`` bytes on a trailing axis."""
    return buffer.array[: int(np.prod(shape, dtype=np.int64)) * itemsize].reshape(*shape, itemsize)


def _flip(plan: StridedPlan) -> tuple[slice, ...]:
    return tuple(slice(None, None, -1) if f else slice(None) for f in plan.reversed_axes)


def pack_with_copies(
    driver: Driver, stream: OwnStream, desc: CAIDescriptor, packed: int, alloc_pinned: Callable[[int], PinnedBuffer]
) -> None:
    """Gather ``desc`` into the C-ordered device buffer at ``packed``; returns once ``stream`` has done it (the
    pinned memory in between is free again). ``stream``'s context is current."""
    plan = plan_copies(desc.shape, desc.byte_strides, desc.itemsize)
    copier = _Copier(driver, stream.handle, stream.ordinal)
    gathered = alloc_pinned(int(np.prod(plan.host_shape, dtype=np.int64)) * desc.itemsize)
    with _settled(stream):
        copier.run(plan.copies, desc.ptr + plan.low, gathered.ptr, to_host=True)
        source = gathered
        if plan.reorders:
            stream.synchronize()  # numpy reads the gathered bytes next
            source = alloc_pinned(desc.nbytes)
            upward = _elements(gathered, plan.host_shape, desc.itemsize)[_flip(plan)]
            whole = np.broadcast_to(upward, (*desc.shape, desc.itemsize))
            np.copyto(_elements(source, desc.shape, desc.itemsize), whole)
        copier.copy_1d(packed, source.ptr, desc.nbytes)
        stream.synchronize()  # the pinned blocks may be reused once this returns


def unpack_with_copies(
    driver: Driver, stream: OwnStream, src: int, desc: CAIDescriptor, alloc_pinned: Callable[[int], PinnedBuffer]
) -> None:
    """Scatter the C-ordered device bytes at ``src`` into ``desc``, writing no byte outside its elements; returns
    once ``stream`` has done it."""
    if may_self_overlap(desc.shape, desc.byte_strides, desc.itemsize):
        raise ValueError(
            f"CudaRuntime.unpack: the destination's elements share memory (shape {desc.shape}, strides "
            f"{desc.byte_strides}), so which value lands is undefined; receive into an array without repeated or "
            "overlapping elements"
        )
    plan = plan_copies(desc.shape, desc.byte_strides, desc.itemsize)
    copier = _Copier(driver, stream.handle, stream.ordinal)
    packed = alloc_pinned(desc.nbytes)
    with _settled(stream):
        copier.copy_1d(packed.ptr, src, desc.nbytes)
        source = packed
        if plan.reorders:
            stream.synchronize()  # numpy reads the packed bytes next
            source = alloc_pinned(desc.nbytes)
            upward = _elements(source, plan.host_shape, desc.itemsize)
            upward[_flip(plan)] = _elements(packed, desc.shape, desc.itemsize)
        copier.run(plan.copies, desc.ptr + plan.low, source.ptr, to_host=False)
        stream.synchronize()  # the pinned blocks may be reused once this returns
