"""The CUDA runtime's memory: device blocks from a caching pool, handed-out blocks retired behind the user's
streams when their Array dies, and page-locked host memory."""

from __future__ import annotations

import contextlib
import ctypes
import weakref
from collections.abc import Callable
from typing import Any

import numpy as np

from ..errors import CudaError
from .base import LEGACY_STREAM, PER_THREAD_STREAM, DeviceBuffer, Event, PinnedBuffer, Stream
from .cudadriver import OUT_OF_MEMORY
from .cudahandles import CudaStream
from .cudamemory import (
    UNTIL_IDLE,
    CudaDeviceBuffer,
    CudaPinnedBuffer,
    HostAllocation,
    Keep,
    OrderedFree,
    RetiredBlocks,
    UntilIdle,
)
from .cudastreams import CudaStreams, own_stream

__all__ = ["CudaAllocation"]


class CudaAllocation(CudaStreams):
    """The allocation calls of ``CudaRuntime`` (which sets these attributes up)."""

    _retired: RetiredBlocks
    _handed: weakref.WeakValueDictionary[int, CudaDeviceBuffer]

    def read_on(self, ptr: int, ordinal: int, stream: int) -> None:
        """A DLPack consumer's ``stream``, alive now (the consumer just named it), must be known at the Array's death
        without being recorded on then unless something keeps it alive till then: its owner among the caller's
        current streams (CuPy's, PyTorch's: the streams their ``from_dlpack`` names) is kept with the block; a
        blocking stream needs nothing (the legacy default stream's event at the death follows its work); any other
        one makes the block wait for the whole device, which only an allocation that needs the memory does."""
        buf = self._handed.get(ptr)
        if buf is None or buf.ordinal != ordinal or stream in (LEGACY_STREAM, PER_THREAD_STREAM):
            return
        if any(stream == h for h, _ in buf.consumers):
            return
        owner = next((o for h, o in self._current_streams(ordinal) if h == stream), None)
        if owner is None:
            if self._blocking(stream, ordinal):
                return
            owner = UNTIL_IDLE
        buf.consumers.append((stream, owner))

    def _blocking(self, handle: int, ordinal: int) -> bool:
        """Whether the live stream ``handle`` is a blocking one (False if the driver cannot say)."""
        try:
            with self.on_gpu(ordinal):
                (flags,) = self.driver.check("cuStreamGetFlags", handle)
        except CudaError:
            return False
        return not int(flags) & int(self.driver.drv.CUstream_flags.CU_STREAM_NON_BLOCKING)

    def alloc_device(
        self, nbytes: int, ordinal: int, stream: Stream | None = None, *, handed_out: bool = False
    ) -> DeviceBuffer:
        """``nbytes`` on GPU ``ordinal`` from a caching pool: CuPy's when present, else the driver's stream-ordered
        pool (cuMemAllocAsync). Both give a block freed on ``stream`` to the next allocation on it at once.

        A block ``handed_out`` (a received Array) is retired when the Array dies: events recorded then on the
        legacy default stream (which every blocking stream orders against: CuPy's, PyTorch's and Numba's defaults),
        on the caller's current streams at receive time (CuPy's, PyTorch's) and on each stream a DLPack consumer
        named (``read_on``) mark the user work that may still read it, and the block goes back to the pool once
        they have passed, so the next receive cannot overwrite it under a kernel. A user kernel on another
        non-blocking stream is the documented limit (docs/gpu-and-mpi.md).
        """
        own = None if stream is None else own_stream(stream)
        # The streams the user computes on now, with their objects: the Array names the first, and the buffer (so
        # the Array) keeps them alive, so that handle never names a destroyed (or reused) stream while it lives.
        consumers = self._current_streams(ordinal) if handed_out else []
        buf = CudaDeviceBuffer(0, nbytes, ordinal, (consumers[0][0] if consumers else LEGACY_STREAM)
                               if handed_out else None)
        buf.consumers = consumers
        if nbytes == 0:
            return buf
        self._retired.reap(ordinal)
        try:
            buf.ptr, give_back = self._allocate(nbytes, ordinal, own)
        except Exception as exc:
            # The pool lacks the memory: blocks retired behind user work are worth waiting for before failing.
            if not self._out_of_memory(exc) or not self._retired.drain(ordinal):
                raise
            buf.ptr, give_back = self._allocate(nbytes, ordinal, own)
        if handed_out:
            buf.release_with(self._retire, ordinal, consumers, give_back)
            self._handed[buf.ptr] = buf
        else:
            buf.release_with(give_back)
        return buf

    def _allocate(self, nbytes: int, ordinal: int, own: CudaStream | None) -> tuple[int, Callable[[], None]]:
        """A block from CuPy's pool (on ``own``, else CuPy's current stream) or the driver's, and what gives it back."""
        cp = self._load_cupy()
        if cp is None:
            return self._alloc_ordered(nbytes, ordinal, own)
        with self._cupy_on(cp, ordinal, own):
            mem = cp.cuda.alloc(nbytes)
        return int(mem.ptr), Keep(mem)

    def _out_of_memory(self, exc: Exception) -> bool:
        """Whether ``exc`` says the device (or CuPy's pool) has no room."""
        if isinstance(exc, CudaError):
            return exc.code == OUT_OF_MEMORY
        cp = self._load_cupy()
        return cp is not None and isinstance(exc, cp.cuda.memory.OutOfMemoryError)

    def _alloc_ordered(self, nbytes: int, ordinal: int, stream: CudaStream | None) -> tuple[int, Callable[[], None]]:
        """Device memory from the driver's stream-ordered pool on ``stream`` (None: the legacy default stream), and
        what frees it on the same stream (the stream object is kept alive until then)."""
        handle = LEGACY_STREAM if stream is None else stream.handle
        with self.on_gpu(ordinal):
            (dptr,) = self.driver.check("cuMemAllocAsync", nbytes, handle)
        ptr = int(dptr)
        return ptr, OrderedFree(self.driver, ordinal, ptr, handle, stream)

    def _retire(self, ordinal: int, consumers: list[tuple[int, Any]], give_back: Callable[[], None]) -> None:
        """A handed-out block's Array died (a finalizer: ``Driver.isolated``): retire the block (its events, the reap,
        the blocks going back) in one context. If even entering it fails (the driver gone at exit), ``hold`` finds
        out and never reuses it."""
        with self.driver.isolated(), contextlib.ExitStack() as scope:
            with contextlib.suppress(Exception):
                scope.enter_context(self.on_gpu(ordinal))
            self._retired.hold(ordinal, consumers, give_back)

    def _release_events(self, ordinal: int, consumers: list[tuple[int, Any]]) -> list[Event]:
        """Events recorded now on the streams user work on a handed-out block runs on (see ``alloc_device``): the
        legacy default stream and each of ``consumers`` whose object keeps it alive here; a consumer's stream that
        nothing kept alive (``read_on``) is recorded on by no one: the block waits for the device (``UntilIdle``).
        A failure is the block's loss (``RetiredBlocks.hold``), never a wait here: this runs in a finalizer."""
        events: list[Event] = [self.record_event_on(LEGACY_STREAM, ordinal)]
        idle = False
        for handle, owner in {handle: owner for handle, owner in consumers}.items():
            if owner is UNTIL_IDLE:
                idle = True
            elif handle not in (LEGACY_STREAM, PER_THREAD_STREAM):  # the per-thread default stream is blocking
                events.append(self.record_event_on(handle, ordinal))
        if idle:
            events.append(UntilIdle(lambda: self.sync_device(ordinal)))
        return events

    def alloc_pinned(self, nbytes: int) -> PinnedBuffer:
        """Portable page-locked memory (usable in every context), from the driver: cai_mpi's pinned pool
        (``transport.pool.pinned_pool``, bounded by CAI_MPI_PINNED_POOL_BYTES; the strided copies without CuPy take
        from it too, through ``PINNED_SOURCES``) is the only cache in front of it.
        (CuPy's pinned pool keeps every block it frees, so behind it the bound would bound nothing.)"""
        if nbytes == 0:
            return CudaPinnedBuffer(0, 0, np.empty(0, np.uint8))
        with self.on_gpu(self.ordinal):  # allocating needs a context: ours, not a fresh one on GPU 0
            (ptr,) = self.driver.check("cuMemHostAlloc", nbytes, self.driver.drv.CU_MEMHOSTALLOC_PORTABLE)
        ptr = int(ptr)
        owner = HostAllocation(self.driver, ptr, self.ordinal)
        raw = (ctypes.c_ubyte * nbytes).from_address(ptr)
        raw._cai_mpi_owner = owner  # type: ignore[attr-defined]  # the view's base keeps the block alive
        return CudaPinnedBuffer(ptr, nbytes, np.ctypeslib.as_array(raw))
