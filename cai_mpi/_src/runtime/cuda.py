"""The runtime of a rank with a GPU: cuda-python driver calls, with CuPy for pooled memory and packing."""

from __future__ import annotations

import weakref
from typing import TYPE_CHECKING, Any

from ..errors import CudaError, RuntimeUnavailableError
from .base import PINNED_SOURCES, DeviceBuffer, Location, MemoryKind, PinnedBuffer, Runtime, Stream
from .cudaalloc import CudaAllocation
from .cudacontexts import Driver
from .cudadriver import classify_pointer, load_cupy, load_driver
from .cudahandles import CudaEvent, CudaStream, Idle
from .cudamemory import CudaDeviceBuffer, Keep, RetiredBlocks
from .cudapack import as_cupy, byte_view
from .cudastreams import imported_torch, no_cupy, own_stream
from .cudastrided import pack_with_copies, unpack_with_copies

__all__ = ["CudaEvent", "CudaRuntime", "attribution_report", "device_attribution"]


if TYPE_CHECKING:
    from ..core.descriptor import CAIDescriptor

# -- the runtime --------------------------------------------------------------------


class CudaRuntime(CudaAllocation, Runtime):
    """Real GPUs through the CUDA driver API (cuda-python); CuPy, when importable, provides pooled
    device/pinned allocation and the kernels that pack strided arrays.

    ``ordinal`` is the rank's GPU (``choose_device``: local rank modulo visible GPUs, or CAI_MPI_DEVICE). The
    device rule: what a rank receives without ``device=`` lands on the device current in the calling thread (the
    one CuPy's ``Device``, ``torch.cuda.set_device`` or ``cudaSetDevice`` made current, where the user computes),
    and on ``ordinal`` in a thread where no device is current. Each driver call runs in the primary context of
    the device it concerns (a pointer's own GPU, say), pushed for the call and popped after it, so the caller's
    current context is the same after every call as before it; cai_mpi never binds a thread to a device.

    Its calls by concern: streams and events (``CudaStreams``), memory (``CudaAllocation``), and here devices,
    pointers and layout.
    """

    name = "cuda"

    def __init__(self, ordinal: int, driver: Any = None) -> None:
        """``driver``: the cuda-bindings driver module to call (default: imported), or a stand-in for it."""
        if not isinstance(ordinal, int) or isinstance(ordinal, bool) or ordinal < 0:
            raise ValueError(f"CudaRuntime: ordinal must be a non-negative int, got {ordinal!r}")
        try:
            drv = load_driver() if driver is None else driver
        except ImportError as exc:
            raise RuntimeUnavailableError(
                f"the CUDA runtime needs cuda-python ({exc}); pip install 'cai_mpi[cuda12]'"
            ) from None
        self.ordinal = ordinal
        self.driver = Driver(drv)
        self._count: int | None = None
        self._retired = RetiredBlocks(self._release_events)
        self.idle_streams = Idle(self.driver, "cuStreamDestroy")
        self.idle_events = Idle(self.driver, "cuEventDestroy")
        # CuPy calls the real driver: with a driver given (the double), its memory means nothing to CuPy.
        self._load_cupy = load_cupy if driver is None else no_cupy
        #: Where the caller's current streams come from (each: ordinal -> (CAI handle, its owner) or None).
        self._load_torch = imported_torch if driver is None else no_cupy
        self._stream_sources = (
            self._cupy_stream, self._torch_stream)
        self._handed = weakref.WeakValueDictionary()

    def __repr__(self) -> str:
        return f"<CudaRuntime GPU {self.ordinal}>"

    # -- devices --------------------------------------------------------------
    def device_count(self) -> int:
        if self._count is None:
            self.driver.init()
            (count,) = self.driver.check("cuDeviceGetCount")
            self._count = int(count)
        return self._count

    def current_device(self) -> int:
        """The device current in the calling thread, or the rank's (``ordinal``) where none is current."""
        self.driver.init()
        context = self.driver.current()
        return self.ordinal if int(context) == 0 else self.driver.context_ordinal(context)

    # -- pointers ----------------------------------------------------------
    def locate(self, ptr: int) -> Location:
        """Where ``ptr`` lives. Device and managed memory are placed by the pointer's context, not by the
        DEVICE_ORDINAL attribute alone (cuda-bindings 12.9.6-12.9.8 and 13.1.2-13.4.2 report 0 for every pointer);
        the query runs in the caller's context if one is current, else in this rank's."""
        if ptr == 0:  # zero-size arrays export NULL: they "live" where this rank works
            return Location(MemoryKind.DEVICE, self.ordinal)
        memory_type, is_managed, reported, host_pointer, context = self.driver.pointer_attributes(ptr, self.ordinal)
        ordinal = self.driver.pointer_ordinal(ptr, memory_type, is_managed, context, reported, self.device_count)
        where = classify_pointer(memory_type, is_managed, ordinal, self.ordinal)
        if where.kind is MemoryKind.HOST and host_pointer and host_pointer != ptr:
            # Mapped pinned or registered memory seen through its device alias: the host reads it elsewhere.
            return Location(MemoryKind.HOST, where.ordinal, host_pointer)
        return where

    # -- layout ---------------------------------------------------------------
    def pack(self, desc: CAIDescriptor, ordinal: int, stream: Stream) -> DeviceBuffer:
        """Gather into a new C-ordered buffer on ``stream``: CuPy's copy kernel (the result stays in CuPy's
        pool), or without CuPy driver copies through pinned memory (``_copy_strided``)."""
        s = own_stream(stream)
        cp = self._load_cupy()
        if desc.nbytes == 0:
            return CudaDeviceBuffer(0, 0, ordinal)
        if cp is None:
            out = self.alloc_device(desc.nbytes, ordinal, s)
            self._copy_strided(desc, out.ptr, s, pack=True)
            return out
        dtype, shape, strides = byte_view(desc.shape, desc.byte_strides, desc.itemsize, (desc.ptr,))
        with self._cupy_on(cp, ordinal, s):
            src = as_cupy(cp, desc.ptr, shape, dtype, strides, ordinal)
            out = cp.ascontiguousarray(src)  # a 0-d input comes back as shape (1,): same bytes
            if int(out.data.ptr) == desc.ptr:  # already C-ordered: still hand back a new buffer
                out = src.copy()
        buf = CudaDeviceBuffer(int(out.data.ptr), desc.nbytes, ordinal)
        buf.release_with(Keep(out))
        return buf

    def _copy_strided(self, desc: CAIDescriptor, packed: int, stream: CudaStream, *, pack: bool) -> None:
        """Between the strided array ``desc`` and C-ordered bytes at ``packed`` with driver copies CUDA documents as
        valid (``cudastrided``: through pinned memory, 2-D copies where the pitch rules allow); returns when done."""
        source = PINNED_SOURCES[0](self) if PINNED_SOURCES else None
        taken: list[tuple[PinnedBuffer, int]] = []

        def pinned(nbytes: int) -> PinnedBuffer:  # from the pinned pool, within CAI_MPI_PINNED_POOL_BYTES
            if source is None:
                return self.alloc_pinned(nbytes)
            taken.append(source.take(nbytes))
            return taken[-1][0]

        try:
            with self.on_gpu(stream.ordinal):
                if pack:
                    pack_with_copies(self.driver, stream, desc, packed, pinned)
                else:
                    unpack_with_copies(self.driver, stream, packed, desc, pinned)
        finally:  # (both return, or raise, only once the copies using the blocks are done)
            assert source is not None or not taken
            for block, cls in taken:
                source.give(block, cls)  # type: ignore[union-attr]

    def unpack(self, src: int, desc: CAIDescriptor, ordinal: int, stream: Stream) -> None:
        """Scatter C-ordered bytes at ``src`` into ``desc`` on ``stream`` (the caller synchronizes it): CuPy's
        copy kernel, or without CuPy driver copies through pinned memory (``_copy_strided``)."""
        s = own_stream(stream)
        cp = self._load_cupy()
        if desc.nbytes == 0:
            return
        if cp is None:
            self._copy_strided(desc, src, s, pack=False)
            return
        dtype, shape, strides = byte_view(desc.shape, desc.byte_strides, desc.itemsize, (desc.ptr, src))
        with self._cupy_on(cp, ordinal, s):
            dst = as_cupy(cp, desc.ptr, shape, dtype, strides, ordinal)
            packed = as_cupy(cp, src, shape, dtype, None, ordinal)
            cp.copyto(dst, packed)



# -- device attribution, for ``python -m cai_mpi info`` -------------------------------------


def attribution_report(runtime: CudaRuntime) -> dict[str, Any]:
    """The cuda-bindings release in use and ``device_attribution``'s findings, for ``python -m cai_mpi info``."""
    from .cudadriver import bindings_version

    return {"bindings": bindings_version(runtime.driver.drv), "gpus": device_attribution(runtime)}


def device_attribution(runtime: CudaRuntime) -> list[dict[str, Any]]:
    """For each visible GPU: a small buffer allocated in its primary context, where ``locate`` places it
    (``located``), and the DEVICE_ORDINAL the bindings report for it (``reported``); ``error`` if either failed."""
    found: list[dict[str, Any]] = []
    for gpu in range(runtime.device_count()):
        entry: dict[str, Any] = {"gpu": gpu, "located": None, "reported": None}
        try:  # context-bound memory, as the default allocators of CuPy and PyTorch make (not a stream-ordered pool)
            with runtime.on_gpu(gpu):
                (dptr,) = runtime.driver.check("cuMemAlloc", 256)
            try:
                entry["located"] = runtime.locate(int(dptr)).ordinal
                entry["reported"] = runtime.driver.pointer_attributes(int(dptr), gpu)[2]
            finally:
                runtime.driver.release(gpu, "cuMemFree", dptr)
        except CudaError as exc:
            entry["error"] = str(exc)
        found.append(entry)
    return found
