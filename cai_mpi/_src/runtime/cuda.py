"""The runtime of a rank with a GPU: cuda-python driver calls, with CuPy for pooled memory and packing."""

from __future__ import annotations

import contextlib
import ctypes
import sys
import weakref
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING, Any

import numpy as np

from ..errors import CudaError, RuntimeUnavailableError, StreamError
from .base import (
    LEGACY_STREAM,
    PER_THREAD_STREAM,
    PINNED_SOURCES,
    DeviceBuffer,
    Event,
    Location,
    MemoryKind,
    PinnedBuffer,
    Runtime,
    Stream,
)
from .cudadriver import (
    OUT_OF_MEMORY,
    Driver,
    classify_pointer,
    load_cupy,
    load_driver,
)
from .cudahandles import CudaEvent, CudaStream, CudaStreamRef, Idle
from .cudamemory import CudaDeviceBuffer, CudaPinnedBuffer, HostAllocation, Keep, OrderedFree, RetiredBlocks
from .cudapack import as_cupy, byte_view
from .cudastrided import pack_with_copies, unpack_with_copies

__all__ = ["CudaRuntime", "attribution_report", "device_attribution"]


if TYPE_CHECKING:
    from ..core.descriptor import CAIDescriptor

# -- the runtime --------------------------------------------------------------------


class CudaRuntime(Runtime):
    """Real GPUs through the CUDA driver API (cuda-python); CuPy, when importable, provides pooled
    device/pinned allocation and the kernels that pack strided arrays.

    ``ordinal`` is the rank's GPU (``choose_device``: local rank modulo visible GPUs, or CAI_MPI_DEVICE). The
    device rule: what a rank receives without ``device=`` lands on the device current in the calling thread (the
    one CuPy's ``Device``, ``torch.cuda.set_device`` or ``cudaSetDevice`` made current, where the user computes),
    and on ``ordinal`` in a thread where no device is current. Each driver call runs in the primary context of
    the device it concerns (a pointer's own GPU, say), pushed for the call and popped after it, so the caller's
    current context is the same after every call as before it; cai_mpi never binds a thread to a device.
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
        self._driver = Driver(drv)
        self._count: int | None = None
        self._retired = RetiredBlocks(self._release_events)
        self._idle_streams = Idle(self._driver, "cuStreamDestroy")
        self._idle_events = Idle(self._driver, "cuEventDestroy")
        # CuPy calls the real driver: with a driver given (the double), its memory means nothing to CuPy.
        self._load_cupy = load_cupy if driver is None else _no_cupy
        #: Where the caller's current streams come from (each: ordinal -> (CAI handle, its owner) or None).
        self._load_torch = _imported_torch if driver is None else _no_cupy
        self._stream_sources: tuple[Callable[[int], tuple[int, Any] | None], ...] = (
            self._cupy_stream, self._torch_stream)
        self._handed: weakref.WeakValueDictionary[int, CudaDeviceBuffer] = weakref.WeakValueDictionary()

    def __repr__(self) -> str:
        return f"<CudaRuntime GPU {self.ordinal}>"

    # -- contexts -----------------------------------------------------------
    def _on(self, ordinal: int | None) -> contextlib.AbstractContextManager[None]:
        """``ordinal``'s primary context current for one call; the caller's context is back afterwards (a
        thread's current device is the caller's business: CuPy and PyTorch allocate on it)."""
        return self._driver.on(self.ordinal if ordinal is None else ordinal)

    def context_scope(self) -> contextlib.AbstractContextManager[None]:
        """The current context asked once for the calls inside (``Driver.scope``)."""
        return self._driver.scope()

    # -- devices --------------------------------------------------------------
    def device_count(self) -> int:
        if self._count is None:
            self._driver.init()
            (count,) = self._driver.check("cuDeviceGetCount")
            self._count = int(count)
        return self._count

    def current_device(self) -> int:
        """The device current in the calling thread, or the rank's (``ordinal``) where none is current."""
        self._driver.init()
        context = self._driver.current()
        return self.ordinal if int(context) == 0 else self._driver.context_ordinal(context)

    # -- pointers and streams ---------------------------------------------
    def locate(self, ptr: int) -> Location:
        """Where ``ptr`` lives. Device and managed memory are placed by the pointer's context, not by the
        DEVICE_ORDINAL attribute alone (cuda-bindings 12.9.6-12.9.8 and 13.1.2-13.4.2 report 0 for every pointer);
        the query runs in the caller's context if one is current, else in this rank's."""
        if ptr == 0:  # zero-size arrays export NULL: they "live" where this rank works
            return Location(MemoryKind.DEVICE, self.ordinal)
        memory_type, is_managed, reported, host_pointer, context = self._driver.pointer_attributes(ptr, self.ordinal)
        ordinal = self._driver.pointer_ordinal(ptr, memory_type, is_managed, context, reported, self.device_count)
        where = classify_pointer(memory_type, is_managed, ordinal, self.ordinal)
        if where.kind is MemoryKind.HOST and host_pointer and host_pointer != ptr:
            # Mapped pinned or registered memory seen through its device alias: the host reads it elsewhere.
            return Location(MemoryKind.HOST, where.ordinal, host_pointer)
        return where

    def sync_stream(self, handle: int, ordinal: int | None) -> None:
        if isinstance(handle, bool) or not isinstance(handle, int) or handle <= 0:
            raise StreamError(
                f"stream handle {handle!r} cannot be synchronized: CAI v3 handles are positive ints "
                "(1 legacy default, 2 per-thread default, else a cudaStream_t address)"
            )
        try:
            with self._on(ordinal):
                self._driver.check("cuStreamSynchronize", handle)
        except CudaError as exc:
            raise StreamError(_stream_failure("synchronized", handle, ordinal, exc)) from exc

    def sync_legacy(self, ordinal: int | None) -> None:
        gpu = self.ordinal if ordinal is None else ordinal
        try:
            with self._on(gpu):  # (one context query for both calls)
                self.record_event_on(LEGACY_STREAM, gpu).synchronize()
        except CudaError as exc:
            raise StreamError(
                f"the legacy default stream of GPU {gpu} cannot be synchronized: {exc}. A kernel that faulted "
                "leaves the CUDA context unusable; run the producer under compute-sanitizer to find it"
            ) from exc

    def sync_device(self, ordinal: int | None) -> None:
        try:
            with self._on(ordinal):
                self._driver.check("cuCtxSynchronize")
        except CudaError as exc:
            gpu = self.ordinal if ordinal is None else ordinal
            raise StreamError(
                f"GPU {gpu} cannot be synchronized: {exc}. A kernel that faulted leaves the CUDA context "
                "unusable; run the producer under compute-sanitizer to find it"
            ) from exc

    def stream_wait_event(self, handle: int, event: Event, ordinal: int | None) -> None:
        ev = _own_event(event)
        if isinstance(handle, bool) or not isinstance(handle, int) or handle <= 0:
            raise StreamError(f"stream handle {handle!r} cannot wait on an event: not a CAI v3 stream handle")
        try:
            with self._on(ordinal):
                self._driver.check("cuStreamWaitEvent", handle, ev.handle, 0)
        except CudaError as exc:
            message = _stream_failure("made to wait on cai_mpi's event", handle, ordinal, exc)
            raise StreamError(message) from exc

    # -- allocation -----------------------------------------------------------
    def current_stream(self, ordinal: int) -> int:
        """The calling thread's current stream on ``ordinal`` as a CAI v3 handle: CuPy's current stream (where
        CuPy work the user launches next runs), else the legacy default stream (1)."""
        streams = self._current_streams(ordinal)
        return streams[0][0] if streams else LEGACY_STREAM

    def _current_streams(self, ordinal: int) -> list[tuple[int, Any]]:
        """The calling thread's current streams on ``ordinal`` in the libraries users compute with, each as its CAI
        handle and the object that keeps it alive (``_stream_sources``)."""
        found = []
        for source in self._stream_sources:
            stream = source(ordinal)
            if stream is not None:
                found.append(stream)
        return found

    def _cupy_stream(self, ordinal: int) -> tuple[int, Any] | None:
        """CuPy's current stream on ``ordinal`` (its null stream: the legacy one), or None without CuPy."""
        cp = self._load_cupy()
        if cp is None:
            return None
        stream = cp.cuda.get_current_stream(ordinal)
        return int(stream.ptr) or LEGACY_STREAM, stream

    def _torch_stream(self, ordinal: int) -> tuple[int, Any] | None:
        """PyTorch's current stream on ``ordinal`` (``with torch.cuda.stream(s):`` runs on side streams), or None
        where PyTorch is not imported or has not initialized CUDA (asking must not initialize it)."""
        torch = self._load_torch()
        if torch is None or not torch.cuda.is_initialized():
            return None
        stream = torch.cuda.current_stream(ordinal)
        return int(stream.cuda_stream) or LEGACY_STREAM, stream

    def read_on(self, ptr: int, ordinal: int, stream: int) -> None:
        buf = self._handed.get(ptr)
        if buf is not None and buf.ordinal == ordinal and all(stream != h for h, _ in buf.consumers):
            buf.consumers.append((stream, None))  # (the consumer keeps its stream alive while it uses it)

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
        own = None if stream is None else _own_stream(stream)
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
        with self._on(ordinal):
            (dptr,) = self._driver.check("cuMemAllocAsync", nbytes, handle)
        ptr = int(dptr)
        return ptr, OrderedFree(self._driver, ordinal, ptr, handle, stream)

    def _retire(self, ordinal: int, consumers: list[tuple[int, Any]], give_back: Callable[[], None]) -> None:
        """A handed-out block's Array died: retire the block (its events, the reap, the blocks going back) in one
        context scope. If even entering it fails (the driver gone at exit), ``hold`` finds out and never reuses it."""
        with contextlib.ExitStack() as scope:
            with contextlib.suppress(Exception):
                scope.enter_context(self._on(ordinal))
            self._retired.hold(ordinal, consumers, give_back)

    def _release_events(self, ordinal: int, consumers: list[tuple[int, Any]]) -> list[Event]:
        """Events recorded now on the streams user work on a handed-out block runs on (see ``alloc_device``):
        the legacy default stream and each of ``consumers`` (their objects still alive here)."""
        events: list[Event] = [self.record_event_on(LEGACY_STREAM, ordinal)]
        for handle in {handle for handle, _owner in consumers}:
            if handle in (LEGACY_STREAM, PER_THREAD_STREAM):  # the per-thread default stream is a blocking one
                continue
            try:
                events.append(self.record_event_on(handle, ordinal))
            except CudaError:  # the user's stream is gone: what ran on it is ordered by nothing we can see
                self.sync_device(ordinal)
        return events

    def alloc_pinned(self, nbytes: int) -> PinnedBuffer:
        """Portable page-locked memory (usable in every context), from the driver: cai_mpi's pinned pool
        (``transport.pool.pinned_pool``, bounded by CAI_MPI_PINNED_POOL_BYTES; the strided copies without CuPy take
        from it too, through ``PINNED_SOURCES``) is the only cache in front of it.
        (CuPy's pinned pool keeps every block it frees, so behind it the bound would bound nothing.)"""
        if nbytes == 0:
            return CudaPinnedBuffer(0, 0, np.empty(0, np.uint8))
        with self._on(self.ordinal):  # allocating needs a context: ours, not a fresh one on GPU 0
            (ptr,) = self._driver.check("cuMemHostAlloc", nbytes, self._driver.drv.CU_MEMHOSTALLOC_PORTABLE)
        ptr = int(ptr)
        owner = HostAllocation(self._driver, ptr, self.ordinal)
        raw = (ctypes.c_ubyte * nbytes).from_address(ptr)
        raw._cai_mpi_owner = owner  # type: ignore[attr-defined]  # the view's base keeps the block alive
        return CudaPinnedBuffer(ptr, nbytes, np.ctypeslib.as_array(raw))

    # -- copies on cai_mpi's own streams --------------------------------------
    def create_stream(self, ordinal: int) -> Stream:
        # A blocking stream: ordered after work on the legacy default stream, where exporters that give no
        # stream (Numba's default, CAI v0-v2) and users who never chose a stream leave their kernels. One whose
        # object died is used again (``Idle``): work queued on it before stays ahead of the new work.
        handle = self._idle_streams.take(ordinal)
        if handle is None:
            flags = self._driver.drv.CUstream_flags.CU_STREAM_DEFAULT
            with self._on(ordinal):
                (raw,) = self._driver.check("cuStreamCreate", flags)
            handle = int(raw)
        return CudaStream(self, handle, ordinal)

    def copy_async(self, dst: int, src: int, nbytes: int, stream: Stream) -> None:
        s = _own_stream(stream)
        if nbytes == 0:
            return
        with self._on(s.ordinal):  # unified addressing: the driver infers the direction
            self._driver.check("cuMemcpyAsync", dst, src, nbytes, s.handle)

    def record_event(self, stream: Stream) -> Event:
        s = _own_stream(stream)
        return self.record_event_on(s.handle, s.ordinal)

    def record_event_on(self, handle: int, ordinal: int) -> CudaEvent:
        """An event recorded now on CAI stream ``handle`` (1 and 2: the default streams of ``ordinal``'s context)."""
        with self._on(ordinal):
            idle = self._idle_events.take(ordinal)
            if idle is None:
                (raw,) = self._driver.check("cuEventCreate", self._driver.drv.CUevent_flags.CU_EVENT_DISABLE_TIMING)
                idle = int(raw)
            event = CudaEvent(self, idle, ordinal)
            self._driver.check("cuEventRecord", event.handle, handle)
        return event

    # -- layout ---------------------------------------------------------------
    @contextlib.contextmanager
    def _cupy_on(self, cp: Any, ordinal: int, stream: CudaStream | None) -> Iterator[None]:
        """CuPy's current device and stream set to ``ordinal`` and cai_mpi's ``stream`` for the block (None:
        CuPy's current stream stays)."""
        with self._on(ordinal), cp.cuda.Device(ordinal):
            if stream is None:
                yield
                return
            if hasattr(cp.cuda.Stream, "from_external"):  # CuPy >= 14; ExternalStream is deprecated there
                cupy_stream = cp.cuda.Stream.from_external(CudaStreamRef(stream.handle))
            else:
                cupy_stream = cp.cuda.ExternalStream(stream.handle, ordinal)
            with cupy_stream:
                yield

    def pack(self, desc: CAIDescriptor, ordinal: int, stream: Stream) -> DeviceBuffer:
        """Gather into a new C-ordered buffer on ``stream``: CuPy's copy kernel (the result stays in CuPy's
        pool), or without CuPy driver copies through pinned memory (``_copy_strided``)."""
        s = _own_stream(stream)
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
            with self._on(stream.ordinal):
                if pack:
                    pack_with_copies(self._driver, stream, desc, packed, pinned)
                else:
                    unpack_with_copies(self._driver, stream, packed, desc, pinned)
        finally:  # (both return, or raise, only once the copies using the blocks are done)
            assert source is not None or not taken
            for block, cls in taken:
                source.give(block, cls)  # type: ignore[union-attr]

    def unpack(self, src: int, desc: CAIDescriptor, ordinal: int, stream: Stream) -> None:
        """Scatter C-ordered bytes at ``src`` into ``desc`` on ``stream`` (the caller synchronizes it): CuPy's
        copy kernel, or without CuPy driver copies through pinned memory (``_copy_strided``)."""
        s = _own_stream(stream)
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


# -- helpers ------------------------------------------------------------------------


def _no_cupy() -> None:
    return None


def _imported_torch() -> Any | None:
    """PyTorch if the program imported it (cai_mpi never imports it: that costs seconds)."""
    return sys.modules.get("torch")


def _own_stream(stream: Stream) -> CudaStream:
    if not isinstance(stream, CudaStream):
        raise TypeError(f"the CUDA runtime needs a stream from create_stream(), got {type(stream).__name__}")
    return stream


def _own_event(event: Event) -> CudaEvent:
    if not isinstance(event, CudaEvent):
        raise TypeError(f"the CUDA runtime needs an event from record_event(), got {type(event).__name__}")
    return event


_INVALID_STREAM_CODES = {1, 201, 400}  # INVALID_VALUE, INVALID_CONTEXT, INVALID_HANDLE


def _stream_failure(what: str, handle: int, ordinal: int | None, exc: CudaError) -> str:
    """The StreamError text: which handle, the CUDA error, and the likely cause."""
    where = f" on GPU {ordinal}" if ordinal is not None else ""
    special = {1: " (the legacy default stream)", 2: " (the per-thread default stream)"}.get(handle, "")
    text = f"__cuda_array_interface__ stream {handle:#x}{special}{where} cannot be {what}: {exc}"
    if exc.call not in ("cuStreamSynchronize", "cuStreamWaitEvent") or exc.code is None:
        return text
    if exc.code in _INVALID_STREAM_CODES:
        text += (
            ". The handle is not a live stream of this process: the exporter destroyed the stream "
            "(it must outlive the array), or the handle came from another process"
        )
    elif 700 <= exc.code < 800:  # launch / execution errors, sticky for the context
        text += ". Work queued on the stream failed; the CUDA context is now unusable"
    return text



# -- device attribution, for ``python -m cai_mpi info`` -------------------------------------


def attribution_report(runtime: CudaRuntime) -> dict[str, Any]:
    """The cuda-bindings release in use and ``device_attribution``'s findings, for ``python -m cai_mpi info``."""
    from .cudadriver import bindings_version

    return {"bindings": bindings_version(runtime._driver.drv), "gpus": device_attribution(runtime)}


def device_attribution(runtime: CudaRuntime) -> list[dict[str, Any]]:
    """For each visible GPU: a small buffer allocated in its primary context, where ``locate`` places it
    (``located``), and the DEVICE_ORDINAL the bindings report for it (``reported``); ``error`` if either failed."""
    found: list[dict[str, Any]] = []
    for gpu in range(runtime.device_count()):
        entry: dict[str, Any] = {"gpu": gpu, "located": None, "reported": None}
        try:  # context-bound memory, as the default allocators of CuPy and PyTorch make (not a stream-ordered pool)
            with runtime._on(gpu):
                (dptr,) = runtime._driver.check("cuMemAlloc", 256)
            try:
                entry["located"] = runtime.locate(int(dptr)).ordinal
                entry["reported"] = runtime._driver.pointer_attributes(int(dptr), gpu)[2]
            finally:
                runtime._driver.release(gpu, "cuMemFree", dptr)
        except CudaError as exc:
            entry["error"] = str(exc)
        found.append(entry)
    return found
