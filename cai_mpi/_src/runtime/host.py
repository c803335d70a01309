"""The runtime of a rank with no GPU: all memory is host memory; only simulated streams resolve."""

from __future__ import annotations

import ctypes
from typing import TYPE_CHECKING, Any

import numpy as np

from ..errors import RuntimeUnavailableError, StreamError
from ..hostmem import host_view
from .base import HOST, DeviceBuffer, Event, Location, PinnedBuffer, Runtime, Stream
from .simstream import SimulatedStream, all_streams, resolve_stream

if TYPE_CHECKING:
    from ..descriptor import CAIDescriptor

__all__ = ["HostRuntime", "HostPinnedBuffer", "SimulatedStreamAdapter"]


class HostPinnedBuffer(PinnedBuffer):
    """Ordinary host memory standing in for pinned memory (nothing to pin without a GPU)."""

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
    """A cai_mpi-owned Stream backed by a SimulatedStream."""

    def __init__(self, ordinal: int) -> None:
        self.sim = SimulatedStream("cai_mpi-internal")
        self.handle = self.sim.handle
        self.ordinal = ordinal

    def synchronize(self) -> None:
        self.sim.synchronize()


class HostRuntime(Runtime):
    """No GPU: every pointer is host memory, the legacy/per-thread handles have nothing pending
    unless simulated work was queued on them, and any other handle must be a SimulatedStream."""

    name = "host"

    def device_count(self) -> int:
        return 0

    def current_device(self) -> int | None:
        return None

    def locate(self, ptr: int) -> Location:
        return HOST

    def sync_stream(self, handle: int, ordinal: int | None) -> None:
        stream = resolve_stream(handle)
        if stream is not None:
            stream.synchronize()
        elif handle not in (1, 2):
            raise StreamError(
                f"__cuda_array_interface__ stream handle {handle:#x} cannot be synchronized: this rank "
                f"has no usable GPU (runtime {self.name!r}) and no simulated stream has that handle. "
                "On a GPU node, check that CuPy/cuda-python can see the GPU (python -m cai_mpi info); "
                "in tests, create the stream with cai_mpi.testing.SimulatedStream"
            )

    def sync_device(self, ordinal: int | None) -> None:
        for stream in all_streams():
            stream.synchronize()

    def stream_wait_event(self, handle: int, event: Event, ordinal: int | None) -> None:
        stream = resolve_stream(handle)
        if stream is not None:
            stream.wait_event(event)

    def alloc_device(self, nbytes: int, ordinal: int) -> DeviceBuffer:
        raise RuntimeUnavailableError(
            "cannot allocate device memory: no usable GPU on this rank (runtime 'host'); "
            "receive with device='host'"
        )

    def alloc_pinned(self, nbytes: int) -> PinnedBuffer:
        return HostPinnedBuffer(nbytes)

    def create_stream(self, ordinal: int) -> Stream:
        return SimulatedStreamAdapter(ordinal)

    def copy_async(self, dst: int, src: int, nbytes: int, stream: Stream) -> None:
        assert isinstance(stream, SimulatedStreamAdapter)
        if nbytes:
            stream.sim.enqueue(ctypes.memmove, dst, src, nbytes)

    def record_event(self, stream: Stream) -> Event:
        assert isinstance(stream, SimulatedStreamAdapter)
        return stream.sim.record_event()

    def pack(self, desc: CAIDescriptor, ordinal: int, stream: Stream) -> DeviceBuffer:
        raise RuntimeUnavailableError("no device memory to pack on runtime 'host'")

    def unpack(self, src: int, desc: CAIDescriptor, ordinal: int, stream: Stream) -> None:
        raise RuntimeUnavailableError("no device memory to unpack on runtime 'host'")


def _copy_into(dst: np.ndarray[Any, Any], src: np.ndarray[Any, Any]) -> None:
    np.copyto(dst, src, casting="no")


def host_pack_into(dst_ptr: int, desc: CAIDescriptor) -> None:
    """Gather the strided array ``desc`` into C-ordered bytes at ``dst_ptr`` (used by simulation)."""
    src = host_view(desc, readonly=False)
    dst = host_view(desc.replace(ptr=dst_ptr, strides=None))
    _copy_into(dst, src)


def host_unpack_from(src_ptr: int, desc: CAIDescriptor) -> None:
    """Scatter C-ordered bytes at ``src_ptr`` into the strided array ``desc``."""
    dst = host_view(desc, readonly=False)
    src = host_view(desc.replace(ptr=src_ptr, strides=None))
    _copy_into(dst, src)
