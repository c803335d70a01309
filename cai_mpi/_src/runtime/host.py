"""The runtime of a rank with no GPU: all memory is host memory, and nothing runs on a device."""

from __future__ import annotations

from typing import TYPE_CHECKING

from ..errors import RuntimeUnavailableError, StreamError
from .base import HOST, DeviceBuffer, Event, Location, PinnedBuffer, Runtime, Stream

if TYPE_CHECKING:
    from ..core.descriptor import CAIDescriptor

__all__ = ["HostRuntime"]

_NO_GPU = "no usable GPU on this rank (runtime 'host')"


class HostRuntime(Runtime):
    """No GPU: every pointer is host memory and the default streams have nothing pending. Any other stream
    handle cannot belong to this process, and device work cannot be asked for."""

    name = "host"

    def device_count(self) -> int:
        return 0

    def current_device(self) -> int | None:
        return None

    def locate(self, ptr: int) -> Location:
        return HOST

    def sync_stream(self, handle: int, ordinal: int | None) -> None:
        if handle not in (1, 2):
            raise StreamError(
                f"__cuda_array_interface__ stream handle {handle:#x} cannot be synchronized: {_NO_GPU}. "
                "On a GPU node, check that cuda-python can see the GPU (python -m cai_mpi info)"
            )

    def sync_legacy(self, ordinal: int | None) -> None:
        """Nothing can be pending without a GPU."""

    def sync_device(self, ordinal: int | None) -> None:
        """Nothing can be pending without a GPU."""

    def stream_wait_event(self, handle: int, event: Event, ordinal: int | None) -> None:
        raise RuntimeUnavailableError(f"no stream can wait on a device event: {_NO_GPU}")

    def alloc_device(
        self, nbytes: int, ordinal: int, stream: Stream | None = None, *, handed_out: bool = False
    ) -> DeviceBuffer:
        raise RuntimeUnavailableError(f"cannot allocate device memory: {_NO_GPU}; receive with device='host'")

    def alloc_pinned(self, nbytes: int) -> PinnedBuffer:
        raise RuntimeUnavailableError(f"nothing to stage through pinned memory: {_NO_GPU}")

    def create_stream(self, ordinal: int) -> Stream:
        raise RuntimeUnavailableError(f"cannot create a stream: {_NO_GPU}")

    def copy_async(self, dst: int, src: int, nbytes: int, stream: Stream) -> None:
        raise RuntimeUnavailableError(f"cannot copy on a stream: {_NO_GPU}")

    def record_event(self, stream: Stream) -> Event:
        raise RuntimeUnavailableError(f"cannot record an event: {_NO_GPU}")

    def record_event_on(self, handle: int, ordinal: int) -> Event:
        raise RuntimeUnavailableError(f"cannot record an event: {_NO_GPU}")

    def pack(self, desc: CAIDescriptor, ordinal: int, stream: Stream) -> DeviceBuffer:
        raise RuntimeUnavailableError(f"no device memory to pack: {_NO_GPU}")

    def unpack(self, src: int, desc: CAIDescriptor, ordinal: int, stream: Stream) -> None:
        raise RuntimeUnavailableError(f"no device memory to unpack: {_NO_GPU}")
