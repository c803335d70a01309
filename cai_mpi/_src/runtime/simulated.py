"""A simulated GPU for tests: device memory that MPI must not read, copies and packing on simulated streams."""

from __future__ import annotations

import bisect
import threading
import weakref
from typing import TYPE_CHECKING, Any

import numpy as np

from .base import HOST, DeviceBuffer, Location, MemoryKind, Stream
from .host import HostRuntime, SimulatedStreamAdapter, host_pack_into, host_unpack_from

if TYPE_CHECKING:
    from ..descriptor import CAIDescriptor

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
    """Host memory registered as simulated device memory: the transfer layer must never hand it
    to a non-CUDA-aware MPI (the runtime's ``mpi_touches`` log proves it in tests)."""

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


class SimulatedRuntime(HostRuntime):
    """A GPU-free stand-in for CudaRuntime with ``devices`` simulated GPUs."""

    name = "simulated"

    def __init__(self, devices: int = 1, current: int = 0) -> None:
        self.devices = devices
        self.current = current

    def device_count(self) -> int:
        return self.devices

    def current_device(self) -> int | None:
        return self.current if self.devices else None

    def locate(self, ptr: int) -> Location:
        ordinal = simulated_device_memory.lookup(ptr)
        if ordinal is None:
            return HOST
        return Location(MemoryKind.DEVICE, ordinal)

    def alloc_device(self, nbytes: int, ordinal: int) -> DeviceBuffer:
        return SimulatedDeviceBuffer(nbytes, ordinal)

    def pack(self, desc: CAIDescriptor, ordinal: int, stream: Stream) -> DeviceBuffer:
        assert isinstance(stream, SimulatedStreamAdapter)
        out = SimulatedDeviceBuffer(desc.nbytes, ordinal)
        if desc.nbytes:
            stream.sim.enqueue(host_pack_into, out.ptr, desc)
        return out

    def unpack(self, src: int, desc: CAIDescriptor, ordinal: int, stream: Stream) -> None:
        assert isinstance(stream, SimulatedStreamAdapter)
        if desc.nbytes:
            stream.sim.enqueue(host_unpack_from, src, desc)
