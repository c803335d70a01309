"""A simulated GPU for tests: device memory that MPI must not read, copies and packing on simulated streams.

Installed as an instance, like any runtime (``use_runtime(SimulatedRuntime())``, ``use_runtime("simulated")``,
or ``python -m cai_mpi run --simulated-gpu`` for a whole program): the library, its transport and its real
runtimes know nothing of it.
"""

from __future__ import annotations

import bisect
import ctypes
import threading
import weakref
from typing import Any

import numpy as np

from .._src.core.descriptor import CAIDescriptor
from .._src.errors import StreamError
from .._src.runtime.base import HOST, DeviceBuffer, Event, Location, MemoryKind, PinnedBuffer, Runtime, Stream
from ._streams import SimulatedEvent, SimulatedStream, all_streams, resolve_stream

__all__ = ["SimulatedDeviceBuffer", "SimulatedRuntime", "simulated_device_memory"]


class _DeviceMemoryMap:
    """Address ranges of simulated device allocations, looked up by bisection."""

    def __init__(self) -> None:
        self._starts: list[int] = []
        self._ranges: dict[int, tuple[int, int]] = {}  # start -> (end, ordinal)
        self._lock = threading.Lock()

    def add(self, start: int, nbytes: int, ordinal: int) -> None:
        with self._lock:
            bisect.insort(self._starts, start)
            self._ranges[start] = (start + max(nbytes, 1), ordinal)

    def remove(self, start: int) -> None:
        with self._lock:
            i = bisect.bisect_left(self._starts, start)
            if i < len(self._starts) and self._starts[i] == start:
                del self._starts[i]
                del self._ranges[start]

    def lookup(self, ptr: int) -> int | None:
        with self._lock:
            i = bisect.bisect_right(self._starts, ptr) - 1
            if i < 0:
                return None
            end, ordinal = self._ranges[self._starts[i]]
            return ordinal if ptr < end else None


simulated_device_memory = _DeviceMemoryMap()


class SimulatedDeviceBuffer(DeviceBuffer):
    """Host memory registered as simulated device memory, which only a CUDA-aware MPI may be handed."""

    def __init__(self, nbytes: int, ordinal: int) -> None:
        self._array = np.empty(max(nbytes, 1), np.uint8)
        self.ptr = self._array.ctypes.data if nbytes else 0
        self.nbytes = nbytes
        self.ordinal = ordinal
        if nbytes:
            simulated_device_memory.add(self.ptr, nbytes, ordinal)
            self._finalizer = weakref.finalize(self, simulated_device_memory.remove, self.ptr)

    @property
    def host_array(self) -> np.ndarray[Any, Any]:
        """The bytes, for tests to inspect (a real GPU buffer has no such view)."""
        return self._array[: self.nbytes]

    def free(self) -> None:
        if self.nbytes:
            self._finalizer()


class SimulatedPinnedBuffer(PinnedBuffer):
    """Ordinary host memory standing in for pinned memory."""

    def __init__(self, nbytes: int) -> None:
        self._array = np.empty(nbytes, np.uint8)
        self.ptr = self._array.ctypes.data
        self.nbytes = nbytes

    @property
    def array(self) -> np.ndarray[Any, Any]:
        return self._array

    def free(self) -> None:
        pass


class SimulatedStreamAdapter(Stream):
    """A runtime-owned Stream backed by a SimulatedStream."""

    def __init__(self, ordinal: int) -> None:
        self.sim = SimulatedStream("cai_mpi-internal")
        self.handle = self.sim.handle
        self.ordinal = ordinal

    def synchronize(self) -> None:
        self.sim.synchronize()


class SimulatedRuntime(Runtime):
    """A GPU-free stand-in for the CUDA runtime with ``devices`` simulated GPUs.

    Device memory is host memory registered in a map, so ``locate`` tells it apart; CAI stream handles
    resolve to ``SimulatedStream`` objects (1 and 2 to the simulated legacy and per-thread default streams).
    """

    name = "simulated"

    def __init__(self, devices: int = 1, current: int = 0) -> None:
        self.devices = devices
        self.current = current
        self.default_device = current if devices else None

    def device_count(self) -> int:
        return self.devices

    def current_device(self) -> int | None:
        return self.default_device

    def locate(self, ptr: int) -> Location:
        ordinal = simulated_device_memory.lookup(ptr)
        return HOST if ordinal is None else Location(MemoryKind.DEVICE, ordinal)

    def sync_stream(self, handle: int, ordinal: int | None) -> None:
        stream = resolve_stream(handle)
        if stream is not None:
            stream.synchronize()
        elif handle not in (1, 2):
            raise StreamError(
                f"__cuda_array_interface__ stream handle {handle:#x} cannot be synchronized: no simulated stream "
                "has that handle (create it with cai_mpi.testing.SimulatedStream)"
            )

    def sync_legacy(self, ordinal: int | None) -> None:
        self.sync_device(ordinal)  # (simulated streams have no legacy-stream order: all of them)

    def sync_device(self, ordinal: int | None) -> None:
        for stream in all_streams():
            stream.synchronize()

    def stream_wait_event(self, handle: int, event: Event, ordinal: int | None) -> None:
        stream = resolve_stream(handle)
        if stream is not None:
            stream.wait_event(event)

    def alloc_device(
        self, nbytes: int, ordinal: int, stream: Stream | None = None, *, handed_out: bool = False
    ) -> DeviceBuffer:
        return SimulatedDeviceBuffer(nbytes, ordinal)

    def alloc_pinned(self, nbytes: int) -> PinnedBuffer:
        return SimulatedPinnedBuffer(nbytes)

    def create_stream(self, ordinal: int) -> Stream:
        return SimulatedStreamAdapter(ordinal)

    def copy_async(self, dst: int, src: int, nbytes: int, stream: Stream) -> None:
        assert isinstance(stream, SimulatedStreamAdapter)
        if nbytes:
            stream.sim.enqueue(ctypes.memmove, dst, src, nbytes)

    def record_event(self, stream: Stream) -> Event:
        assert isinstance(stream, SimulatedStreamAdapter)
        return stream.sim.record_event()

    def record_event_on(self, handle: int, ordinal: int) -> Event:
        stream = resolve_stream(handle)
        if stream is not None:
            return stream.record_event()
        self.sync_stream(handle, ordinal)  # the simulated default streams: nothing queued on them stays pending
        done = SimulatedEvent()
        done._done.set()
        return done

    def pack(self, desc: CAIDescriptor, ordinal: int, stream: Stream) -> DeviceBuffer:
        from .._src.arrays.operands import host_view  # (imported here: see unpack)

        assert isinstance(stream, SimulatedStreamAdapter)
        out = SimulatedDeviceBuffer(desc.nbytes, ordinal)
        if desc.nbytes:
            stream.sim.enqueue(_copy, host_view(desc.replace(ptr=out.ptr, strides=None)), host_view(desc))
        return out

    def unpack(self, src: int, desc: CAIDescriptor, ordinal: int, stream: Stream) -> None:
        # (imported here: cai_mpi.testing is imported by the CUDA driver double, which CAI_MPI_BIND_DEVICE=1 loads
        # before MPI is initialized, and arrays imports mpi4py.MPI, which initializes it)
        from .._src.arrays.operands import host_view

        assert isinstance(stream, SimulatedStreamAdapter)
        if desc.nbytes:
            stream.sim.enqueue(_copy, host_view(desc, readonly=False), host_view(desc.replace(ptr=src, strides=None)))


def _copy(dst: np.ndarray[Any, Any], src: np.ndarray[Any, Any]) -> None:
    np.copyto(dst, src, casting="no")
