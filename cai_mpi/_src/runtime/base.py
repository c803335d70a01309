"""The device-runtime interface: the only contract between cai_mpi and CUDA (real or simulated)."""

from __future__ import annotations

import abc
import contextlib
import dataclasses
import enum
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, Protocol

if TYPE_CHECKING:
    import numpy as np

    from ..core.descriptor import CAIDescriptor

__all__ = [
    "DeviceBuffer",
    "Event",
    "Location",
    "MemoryKind",
    "PINNED_SOURCES",
    "PinnedBuffer",
    "PinnedSource",
    "Runtime",
    "Stream",
    "LEGACY_STREAM",
    "PER_THREAD_STREAM",
]

#: CAI v3 / CUDA special stream handles.
LEGACY_STREAM = 1
PER_THREAD_STREAM = 2


_NO_SCOPE = contextlib.nullcontext()  # (reusable: it holds no state)

class MemoryKind(enum.Enum):
    HOST = "host"  # pageable, pinned or registered host memory: MPI reads it directly
    DEVICE = "device"  # device memory: only a CUDA-aware MPI may read it
    MANAGED = "managed"  # unified memory: host-accessible, MPI reads it directly


@dataclasses.dataclass(frozen=True)
class Location:
    """Where a pointer lives. ``ordinal`` is the GPU for DEVICE/MANAGED memory; for HOST memory, the GPU whose
    context knows it (pinned, registered or mapped memory, which a kernel may write), None for pageable memory.

    ``host_address``: for host memory CUDA maps at another address (a device alias of mapped pinned or
    registered memory), where the host reads what the pointer points at; None when it is the pointer itself.
    """

    kind: MemoryKind
    ordinal: int | None = None
    host_address: int | None = None


HOST = Location(MemoryKind.HOST)


class DeviceBuffer(abc.ABC):
    """An owned device allocation; freed by ``free()`` or when garbage collected.

    ``stream``: for memory handed to the user (``alloc_device(..., handed_out=True)``), the CAI v3 handle of the
    stream its data is ready on, which the received Array exports; None for cai_mpi's own buffers.
    """

    ptr: int
    nbytes: int
    ordinal: int
    stream: int | None = None

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


class PinnedSource(Protocol):
    """Where a runtime takes the page-locked memory its own copies pass through: ``transport.pool``'s pinned pool of
    that runtime (one per runtime, at most CAI_MPI_PINNED_POOL_BYTES idle), registered in ``PINNED_SOURCES``."""

    def take(self, nbytes: int) -> tuple[PinnedBuffer, int]: ...

    def give(self, block: PinnedBuffer, cls: int) -> None: ...


#: The pinned pool of a runtime (``transport.pool.pinned_pool`` registers itself here when imported: the runtime
#: sits below the transport, so it is told where the pool is rather than importing it).
PINNED_SOURCES: list[Callable[[Runtime], PinnedSource]] = []


class Runtime(abc.ABC):
    """One implementation per world: ``cuda`` (real GPUs), ``host`` (no GPU), ``simulated`` (tests).

    Everything cai_mpi needs from CUDA goes through these methods, so the
    transfer logic (routing, staging, packing) runs unchanged on a GPU-free
    machine against the simulated runtime.
    """

    name: str

    # -- devices ---------------------------------------------------------
    @abc.abstractmethod
    def device_count(self) -> int:
        """GPUs usable by this process (honours CUDA_VISIBLE_DEVICES); 0 without a GPU."""

    @abc.abstractmethod
    def current_device(self) -> int | None:
        """Where a receive without ``out=`` or ``device=`` lands: the GPU current in the calling thread (else the
        rank's), or None without GPUs (host memory)."""

    def context_scope(self) -> contextlib.AbstractContextManager[None]:
        """A block that runs one message's device calls in this thread (a runtime with contexts asks which one is
        current once inside it, not per call). Never held across a step's yield: enter it per synchronous part. A call
        that drives steps to their end in this thread (a blocking receive, ``waitall``) may hold one around them all,
        since the user cannot switch contexts inside the call; a step that moves to another GPU keeps it right."""
        return _NO_SCOPE

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
    def sync_legacy(self, ordinal: int | None) -> None:
        """Block until the work queued so far on ``ordinal``'s legacy default stream has completed, and with it
        the work of every blocking stream of that context queued before (an event recorded on the legacy stream
        waits for them: CUDA's legacy default stream semantics). What a producer that names no stream gets."""

    @abc.abstractmethod
    def sync_device(self, ordinal: int | None) -> None:
        """Block until all work on ``ordinal`` has completed, on every stream (the opt-in CAI_MPI_SYNC=device)."""

    @abc.abstractmethod
    def stream_wait_event(self, handle: int, event: Event, ordinal: int | None) -> None:
        """Make the producer's stream ``handle`` wait for ``event`` (CAI v3 consumer rule)."""

    # -- allocation -------------------------------------------------------
    @abc.abstractmethod
    def alloc_device(
        self, nbytes: int, ordinal: int, stream: Stream | None = None, *, handed_out: bool = False
    ) -> DeviceBuffer:
        """``nbytes`` on GPU ``ordinal``, from a caching pool's share for cai_mpi's ``stream`` (None: the legacy
        default stream, as a user's allocation): a block freed on that stream is reused by the next allocation on
        it at once, which stream order makes safe for work on that stream only.

        ``handed_out``: the memory becomes a received Array. The user's kernels may still read it when the Array
        dies, on the streams users compute on, so it goes back to the pool only once those are idle; ``stream`` of
        the buffer is then the caller's current stream (where its data is ready for the user)."""

    def read_on(self, ptr: int, ordinal: int, stream: int) -> None:
        """A consumer reads the device memory at ``ptr`` on GPU ``ordinal`` on CAI stream ``stream`` (a DLPack
        consumer's): a handed-out block there is held back until that stream's work at its Array's death has
        passed. Runtimes that hand out no device memory ignore it."""
        return None

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

    @abc.abstractmethod
    def record_event_on(self, handle: int, ordinal: int) -> Event:
        """An event recorded now on CAI stream ``handle`` of GPU ``ordinal`` (1 and 2: that GPU's default streams;
        else a stream of the user's), for another stream to wait on."""

    # -- layout -------------------------------------------------------------
    @abc.abstractmethod
    def pack(self, desc: CAIDescriptor, ordinal: int, stream: Stream) -> DeviceBuffer:
        """Gather a strided device array into a new C-ordered contiguous device buffer.

        The copy is enqueued on ``stream``; the caller synchronizes it.
        """

    @abc.abstractmethod
    def unpack(self, src: int, desc: CAIDescriptor, ordinal: int, stream: Stream) -> None:
        """Scatter C-ordered contiguous device bytes at ``src`` into the strided array ``desc``."""
