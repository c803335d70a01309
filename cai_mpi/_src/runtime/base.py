"""The device-runtime interface: the only contract between cai_mpi and CUDA (real or simulated)."""

from __future__ import annotations

import abc
import dataclasses
import enum
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import numpy as np

    from ..descriptor import CAIDescriptor

__all__ = [
    "DeviceBuffer",
    "Event",
    "Location",
    "MemoryKind",
    "PinnedBuffer",
    "Runtime",
    "Stream",
    "LEGACY_STREAM",
    "PER_THREAD_STREAM",
]

#: CAI v3 / CUDA special stream handles.
LEGACY_STREAM = 1
PER_THREAD_STREAM = 2


class MemoryKind(enum.Enum):
    HOST = "host"  # pageable, pinned or registered host memory: MPI reads it directly
    DEVICE = "device"  # device memory: only a CUDA-aware MPI may read it
    MANAGED = "managed"  # unified memory: host-accessible, MPI reads it directly


@dataclasses.dataclass(frozen=True)
class Location:
    """Where a pointer lives. ``ordinal`` is the GPU for DEVICE/MANAGED memory, else None.

    ``host_address``: for host memory CUDA maps at another address (a device alias of mapped pinned or
    registered memory), where the host reads what the pointer points at; None when it is the pointer itself.
    """

    kind: MemoryKind
    ordinal: int | None = None
    host_address: int | None = None


HOST = Location(MemoryKind.HOST)


class DeviceBuffer(abc.ABC):
    """An owned device allocation; freed by ``free()`` or when garbage collected."""

    ptr: int
    nbytes: int
    ordinal: int

    @abc.abstractmethod
    def free(self) -> None: ...


class PinnedBuffer(abc.ABC):
    """An owned page-locked host allocation, viewable as a numpy uint8 array."""

    ptr: int
    nbytes: int

    @property
    @abc.abstractmethod
    def array(self) -> np.ndarray[Any, Any]:
        """A 1-D uint8 numpy view of the whole buffer (valid while the buffer lives)."""

    @abc.abstractmethod
    def free(self) -> None: ...


class Stream(abc.ABC):
    """A stream owned by cai_mpi (for staging copies and packing)."""

    handle: int
    ordinal: int

    @abc.abstractmethod
    def synchronize(self) -> None: ...


class Event(abc.ABC):
    """A marker recorded on a stream."""

    @abc.abstractmethod
    def synchronize(self) -> None: ...

    @abc.abstractmethod
    def query(self) -> bool:
        """True when all work before the record point has completed."""


class Runtime(abc.ABC):
    """One implementation per world: ``cuda`` (real GPUs), ``host`` (no GPU), ``simulated`` (tests).

    Everything cai_mpi needs from CUDA goes through these methods, so the
    transfer logic (routing, staging, packing) runs unchanged on a GPU-free
    machine against the simulated runtime.
    """

    name: str
    #: Where a receive without ``out=`` or ``device=`` lands: this rank's GPU, or None (host memory).
    default_device: int | None = None

    # -- devices ---------------------------------------------------------
    @abc.abstractmethod
    def device_count(self) -> int:
        """GPUs usable by this process (honours CUDA_VISIBLE_DEVICES); 0 without a GPU."""

    @abc.abstractmethod
    def current_device(self) -> int | None:
        """The ordinal this rank works on (received device arrays land there), None without GPUs."""

    # -- pointers and streams -------------------------------------------
    @abc.abstractmethod
    def locate(self, ptr: int) -> Location:
        """Classify a pointer: host (incl. pinned/unregistered), device (with ordinal) or managed."""

    @abc.abstractmethod
    def sync_stream(self, handle: int, ordinal: int | None) -> None:
        """Block until all work queued on CAI stream ``handle`` has completed.

        ``handle`` 1 is the legacy default stream and 2 the per-thread default
        stream of ``ordinal``'s context (made current first); other values
        are stream addresses. Raises StreamError if the handle cannot be used.
        """

    @abc.abstractmethod
    def sync_device(self, ordinal: int | None) -> None:
        """Conservative synchronization for exporters that give no stream (CAI v0-v2)."""

    @abc.abstractmethod
    def stream_wait_event(self, handle: int, event: Event, ordinal: int | None) -> None:
        """Make the producer's stream ``handle`` wait for ``event`` (CAI v3 consumer rule)."""

    # -- allocation -------------------------------------------------------
    @abc.abstractmethod
    def alloc_device(self, nbytes: int, ordinal: int, stream: Stream | None = None) -> DeviceBuffer:
        """``nbytes`` on GPU ``ordinal``; pooled allocators take the block from ``stream``'s share of the pool
        (cai_mpi's own stream: a block freed on another stream may still be in use there)."""

    @abc.abstractmethod
    def alloc_pinned(self, nbytes: int) -> PinnedBuffer: ...

    # -- copies on cai_mpi's own streams --------------------------------
    @abc.abstractmethod
    def create_stream(self, ordinal: int) -> Stream: ...

    @abc.abstractmethod
    def copy_async(self, dst: int, src: int, nbytes: int, stream: Stream) -> None:
        """Copy ``nbytes`` between any two pointers (direction inferred), ordered on ``stream``."""

    @abc.abstractmethod
    def record_event(self, stream: Stream) -> Event: ...

    # -- layout -------------------------------------------------------------
    @abc.abstractmethod
    def pack(self, desc: CAIDescriptor, ordinal: int, stream: Stream) -> DeviceBuffer:
        """Gather a strided device array into a new C-ordered contiguous device buffer.

        The copy is enqueued on ``stream``; the caller synchronizes it.
        """

    @abc.abstractmethod
    def unpack(self, src: int, desc: CAIDescriptor, ordinal: int, stream: Stream) -> None:
        """Scatter C-ordered contiguous device bytes at ``src`` into the strided array ``desc``."""
