"""The runtime of a rank with a GPU: cuda-python driver calls, with CuPy for pooled memory and packing."""

from __future__ import annotations

import contextlib
import ctypes
import importlib
import os
import threading
import weakref
from collections.abc import Iterator, Sequence
from typing import TYPE_CHECKING, Any

import numpy as np

from ..errors import CudaError, RuntimeUnavailableError, StreamError
from .base import HOST, DeviceBuffer, Event, Location, MemoryKind, PinnedBuffer, Runtime, Stream

if TYPE_CHECKING:
    from ..descriptor import CAIDescriptor

__all__ = ["CudaError", "CudaRuntime", "probe", "visible_device_count"]

# CUresult / CUmemorytype values (identical in cuda-bindings 12.x and 13.x).
_SUCCESS = 0
_NO_DEVICE = 100
_NOT_READY = 600
_MEMTYPE_HOST = 1
_MEMTYPE_DEVICE = 2
_MEMTYPE_ARRAY = 3
_MEMTYPE_UNIFIED = 4

_CUPY_HINT = "install cupy-cuda12x to send non-contiguous device arrays"


# -- loading the optional modules ---------------------------------------------------


def _load_driver() -> Any:
    """The cuda-python driver module: ``cuda.bindings.driver``, or ``cuda.cuda`` for cuda-python <= 12.6.0.

    Raises ImportError when cuda-python is not installed. Importing never needs a GPU driver.
    """
    try:
        return importlib.import_module("cuda.bindings.driver")
    except ImportError:
        # Only cuda-python <= 12.6.0 lacks cuda.bindings; there `cuda.cuda` does not warn.
        return importlib.import_module("cuda.cuda")


_cupy_lock = threading.Lock()
_cupy_state: list[Any] = []  # [module or None] once tried


def _load_cupy() -> Any | None:
    """CuPy when importable (for its memory pools and copy kernels), else None; imported once."""
    with _cupy_lock:
        if not _cupy_state:
            try:
                _cupy_state.append(importlib.import_module("cupy"))
            except Exception:  # a broken CuPy install must not break the driver-only path
                _cupy_state.append(None)
        return _cupy_state[0]


# -- status checking ----------------------------------------------------------------


def _error_text(drv: Any, status: Any) -> tuple[str, str]:
    """``(name, description)`` of a CUresult via cuGetErrorName/cuGetErrorString, or the enum's own name."""
    name = desc = ""
    with contextlib.suppress(Exception):  # these need the driver; the enum name does not
        err, raw = drv.cuGetErrorName(status)
        if int(err) == _SUCCESS and raw:
            name = raw.decode()
    with contextlib.suppress(Exception):
        err, raw = drv.cuGetErrorString(status)
        if int(err) == _SUCCESS and raw:
            desc = raw.decode()
    if not name:
        name = getattr(status, "name", None) or f"CUresult {int(status)}"
    return name, desc


def _raw_call(drv: Any, call: str, *args: Any) -> tuple[int, Any, tuple[Any, ...]]:
    """Run ``drv.<call>(*args)``: returns ``(code, status, outputs)``; raises CudaError if it cannot run.

    cuda-python returns ``(status, out...)`` tuples (a 1-tuple is always truthy, so the
    status must be read, never the tuple) and raises a RuntimeError subclass when the
    driver library or one of its functions is missing.
    """
    fn = getattr(drv, call, None)
    if fn is None:
        raise CudaError(f"{call} is not provided by this cuda-python: upgrade cuda-python", call)
    try:
        result = fn(*args)
    except RuntimeError as exc:
        raise CudaError(
            f"{call} could not run: {exc} (is the NVIDIA driver installed, and as new as cuda-python?)", call
        ) from exc
    status = result[0]
    return int(status), status, tuple(result[1:])


def _check(drv: Any, call: str, *args: Any) -> tuple[Any, ...]:
    """Run ``drv.<call>(*args)`` and return its outputs; any status but CUDA_SUCCESS raises CudaError."""
    code, status, outputs = _raw_call(drv, call, *args)
    if code != _SUCCESS:
        name, desc = _error_text(drv, status)
        detail = f": {desc}" if desc else ""
        raise CudaError(f"{call} failed with {name} ({code}){detail}", call, code, name)
    return outputs


# -- probe --------------------------------------------------------------------------


def probe() -> tuple[bool, str]:
    """Whether CUDA is usable here: cuda-python importable, driver loads, cuInit succeeds, >= 1 GPU.

    Returns ``(usable, reason)``. Never raises and never creates a CUDA context
    (cuInit and device counting do not), so it is safe before device selection.
    """
    try:
        try:
            drv = _load_driver()
        except ImportError as exc:
            return False, f"cuda-python is not installed ({exc}); pip install 'cai_mpi[cuda12]'"
        try:
            code, status, _ = _raw_call(drv, "cuInit", 0)
        except CudaError as exc:
            cause = exc.__cause__ or exc
            return False, f"the NVIDIA driver library (libcuda) cannot be loaded: {cause}"
        if code == _NO_DEVICE:
            visible = os.environ.get("CUDA_VISIBLE_DEVICES")
            where = f" (CUDA_VISIBLE_DEVICES={visible!r})" if visible is not None else ""
            return False, f"the NVIDIA driver sees no CUDA device{where}"
        if code != _SUCCESS:
            name, desc = _error_text(drv, status)
            return False, f"cuInit failed with {name} ({code}){': ' + desc if desc else ''}"
        (count,) = _check(drv, "cuDeviceGetCount")
        if int(count) < 1:
            return False, "the NVIDIA driver reports 0 CUDA devices"
        version = ""
        with contextlib.suppress(Exception):
            (v,) = _check(drv, "cuDriverGetVersion")
            version = f", driver CUDA {int(v) // 1000}.{int(v) % 1000 // 10}"
        return True, f"{int(count)} CUDA device(s){version}"
    except Exception as exc:  # the promise is "never raises": report anything unforeseen as the reason
        return False, f"CUDA probe failed: {type(exc).__name__}: {exc}"


def visible_device_count() -> int:
    """GPUs the driver shows this process (after CUDA_VISIBLE_DEVICES), 0 if CUDA is unusable.

    Like probe(), it creates no context, so device selection (``choose_device(visible_count=...)``)
    can use it before anything binds a GPU.
    """
    try:
        drv = _load_driver()
        _check(drv, "cuInit", 0)
        (count,) = _check(drv, "cuDeviceGetCount")
        return int(count)
    except Exception:
        return 0


# -- pointer classification -----------------------------------------------------------


def classify_pointer(
    memory_type: int, is_managed: bool, device_ordinal: int, fallback_ordinal: int
) -> Location:
    """Turn cuPointerGetAttributes' (MEMORY_TYPE, IS_MANAGED, DEVICE_ORDINAL) into a Location.

    Memory type 0 means CUDA does not know the pointer (pageable host memory); managed
    memory reports DEVICE, so IS_MANAGED is checked first. ``fallback_ordinal`` is used
    when the driver gives no valid ordinal for managed memory.
    """
    memory_type = int(memory_type)
    if memory_type == 0:
        return HOST
    ordinal = int(device_ordinal)
    if bool(is_managed) or memory_type == _MEMTYPE_UNIFIED:
        return Location(MemoryKind.MANAGED, ordinal if ordinal >= 0 else fallback_ordinal)
    if memory_type == _MEMTYPE_HOST:
        return HOST
    if memory_type == _MEMTYPE_DEVICE:
        return Location(MemoryKind.DEVICE, ordinal)
    if memory_type == _MEMTYPE_ARRAY:
        raise CudaError(
            "the pointer is a CUDA array (texture memory), not linear memory a CAI exporter may describe",
            "cuPointerGetAttributes",
        )
    raise CudaError(
        f"cuPointerGetAttributes returned unknown memory type {memory_type}", "cuPointerGetAttributes"
    )


# -- contexts -------------------------------------------------------------------------


class _Driver:
    """The driver module plus this process's retained primary contexts (one per device)."""

    def __init__(self, drv: Any) -> None:
        self.drv = drv
        self._lock = threading.Lock()
        self._initialized = False
        self._contexts: dict[int, Any] = {}

    def check(self, call: str, *args: Any) -> tuple[Any, ...]:
        return _check(self.drv, call, *args)

    def init(self) -> None:
        """cuInit(0) once per process: every other driver call fails with NOT_INITIALIZED before it."""
        if not self._initialized:
            with self._lock:
                if not self._initialized:
                    self.check("cuInit", 0)
                    self._initialized = True

    def primary(self, ordinal: int) -> Any:
        """The primary context of ``ordinal``, retained once for the life of the process.

        The primary context is the one the CUDA runtime, CuPy, PyTorch and Numba use, so
        memory and streams are shared with them. It is never released: libraries that
        share it may still hold memory in it at interpreter exit.
        """
        ctx = self._contexts.get(ordinal)
        if ctx is not None:
            return ctx
        self.init()
        with self._lock:
            ctx = self._contexts.get(ordinal)
            if ctx is None:
                try:
                    (dev,) = self.check("cuDeviceGet", ordinal)
                except CudaError as exc:
                    raise CudaError(
                        f"GPU {ordinal} is not usable by this process: {exc} "
                        "(check CAI_MPI_DEVICE and CUDA_VISIBLE_DEVICES)",
                        exc.call,
                        exc.code,
                        exc.name,
                    ) from exc
                (ctx,) = self.check("cuDevicePrimaryCtxRetain", dev)
                self._contexts[ordinal] = ctx
        return ctx

    @contextlib.contextmanager
    def on(self, ordinal: int) -> Iterator[None]:
        """Make ``ordinal``'s primary context current for the block, restoring the caller's afterwards."""
        target = self.primary(ordinal)
        (current,) = self.check("cuCtxGetCurrent")
        if int(current) == int(target):
            yield
            return
        self.check("cuCtxSetCurrent", target)
        try:
            yield
        finally:
            self.check("cuCtxSetCurrent", current)

    def release(self, ordinal: int, call: str, *args: Any) -> None:
        """Free a resource from a finalizer: in its own context, from any thread, never raising."""
        # At interpreter exit the driver may be gone already: leaking then is harmless.
        with contextlib.suppress(Exception), self.on(ordinal):
            self.check(call, *args)


# -- owned resources ------------------------------------------------------------------


class CudaDeviceBuffer(DeviceBuffer):
    """Device memory from CuPy's pool (``owner`` keeps the block) or cuMemAlloc (``finalizer`` frees it)."""

    def __init__(
        self,
        ptr: int,
        nbytes: int,
        ordinal: int,
        owner: Any = None,
        finalizer: weakref.finalize[Any, Any] | None = None,
    ) -> None:
        self.ptr = ptr
        self.nbytes = nbytes
        self.ordinal = ordinal
        self._owner = owner
        self._finalizer = finalizer

    def free(self) -> None:
        """Release now: the pool block goes back to CuPy's pool, raw memory to the driver."""
        self._owner = None
        if self._finalizer is not None:
            self._finalizer()


class CudaPinnedBuffer(PinnedBuffer):
    """Page-locked host memory; ``array`` views keep it alive, so ``free()`` never leaves one dangling."""

    def __init__(self, ptr: int, nbytes: int, array: np.ndarray[Any, Any]) -> None:
        self.ptr = ptr
        self.nbytes = nbytes
        self._array: np.ndarray[Any, Any] | None = array

    @property
    def array(self) -> np.ndarray[Any, Any]:
        if self._array is None:
            raise ValueError("pinned buffer already freed")
        return self._array

    def free(self) -> None:
        """Drop this buffer's hold; the memory is released once no view of ``array`` remains."""
        self._array = None


class _HostAllocation:
    """Owner of one cuMemHostAlloc block; frees it when the last numpy view is collected."""

    def __init__(self, driver: _Driver, ptr: int, ordinal: int) -> None:
        self.ptr = ptr
        weakref.finalize(self, driver.release, ordinal, "cuMemFreeHost", ptr)


class CudaStream(Stream):
    """A non-blocking stream owned by cai_mpi, destroyed when garbage collected."""

    def __init__(self, runtime: CudaRuntime, handle: int, ordinal: int) -> None:
        self.handle = handle
        self.ordinal = ordinal
        self._runtime = runtime
        weakref.finalize(self, runtime._driver.release, ordinal, "cuStreamDestroy", handle)

    def synchronize(self) -> None:
        self._runtime.sync_stream(self.handle, self.ordinal)

    def __repr__(self) -> str:
        return f"<CudaStream {self.handle:#x} on GPU {self.ordinal}>"


class CudaEvent(Event):
    """An event created with DISABLE_TIMING and recorded on a stream; destroyed when garbage collected."""

    def __init__(self, runtime: CudaRuntime, handle: int, ordinal: int) -> None:
        self.handle = handle
        self.ordinal = ordinal
        self._runtime = runtime
        weakref.finalize(self, runtime._driver.release, ordinal, "cuEventDestroy", handle)

    def synchronize(self) -> None:
        with self._runtime._on(self.ordinal):
            self._runtime._driver.check("cuEventSynchronize", self.handle)

    def query(self) -> bool:
        drv = self._runtime._driver.drv
        with self._runtime._on(self.ordinal):
            code, status, _ = _raw_call(drv, "cuEventQuery", self.handle)
        if code == _NOT_READY:
            return False
        if code != _SUCCESS:
            name, desc = _error_text(drv, status)
            raise CudaError(f"cuEventQuery failed with {name} ({code}): {desc}", "cuEventQuery", code, name)
        return True


class _CudaStreamRef:
    """The CUDA stream protocol (``__cuda_stream__``) for a raw handle, for CuPy 14's Stream.from_external."""

    def __init__(self, handle: int) -> None:
        self.handle = int(handle)

    def __cuda_stream__(self) -> tuple[int, int]:
        return (0, self.handle)


# -- CuPy views of raw device memory --------------------------------------------------


def byte_view(
    shape: Sequence[int], strides: Sequence[int], itemsize: int, pointers: Sequence[int]
) -> tuple[np.dtype[Any], tuple[int, ...], tuple[int, ...]]:
    """An unsigned-int dtype, shape and byte strides describing the same bytes as the array.

    Packing only moves bytes, so it runs on u1/u2/u4/u8 elements: CuPy copies them
    bit-exactly and refuses none (it refuses structured, big-endian and other
    dtypes). The widest word that divides the itemsize, every stride that is
    stepped and every pointer is used (misaligned wide loads fault); an itemsize
    wider than the word becomes a trailing axis.
    """
    stepped = [s for n, s in zip(shape, strides, strict=True) if n > 1]
    for word in (8, 4, 2, 1):
        if (
            itemsize % word == 0
            and all(s % word == 0 for s in stepped)
            and all(p % word == 0 for p in pointers)
        ):
            break
    dtype = np.dtype(f"u{word}")
    if word == itemsize:
        return dtype, tuple(shape), tuple(strides)
    return dtype, (*shape, itemsize // word), (*strides, word)


def _as_cupy(
    cp: Any,
    ptr: int,
    shape: tuple[int, ...],
    dtype: np.dtype[Any],
    strides: tuple[int, ...] | None,
    ordinal: int,
) -> Any:
    """A cupy.ndarray over raw device memory (no copy, no pointer query, no ownership).

    ``ptr`` addresses element 0; strides are bytes and may be negative, so the
    UnownedMemory spans the whole extent and the MemoryPointer offset points at element 0.
    Passing ``device_id`` spares CuPy a pointer-attribute query.
    """
    low = high = 0
    if strides is not None:
        for n, s in zip(shape, strides, strict=True):
            if s < 0:
                low += s * (n - 1)
            else:
                high += s * (n - 1)
        high += dtype.itemsize
    else:
        high = int(np.prod(shape, dtype=np.int64)) * dtype.itemsize
    mem = cp.cuda.UnownedMemory(ptr + low, high - low, None, ordinal)
    memptr = cp.cuda.MemoryPointer(mem, -low)
    return cp.ndarray(shape, dtype, memptr=memptr, strides=strides)


# -- the runtime --------------------------------------------------------------------


class CudaRuntime(Runtime):
    """Real GPUs through the CUDA driver API (cuda-python); CuPy, when importable, provides pooled
    device/pinned allocation and the kernels that pack strided arrays.

    Every thread that calls in is bound to GPU ``ordinal`` on first use (its primary
    context is made current, as ``cudaSetDevice`` would), because the current device is
    per thread and an unbound thread silently works on GPU 0. Operations on another
    device switch to that device's primary context and switch back.
    """

    name = "cuda"

    def __init__(self, ordinal: int) -> None:
        if not isinstance(ordinal, int) or isinstance(ordinal, bool) or ordinal < 0:
            raise ValueError(f"CudaRuntime: ordinal must be a non-negative int, got {ordinal!r}")
        try:
            drv = _load_driver()
        except ImportError as exc:
            raise RuntimeUnavailableError(
                f"the CUDA runtime needs cuda-python ({exc}); pip install 'cai_mpi[cuda12]'"
            ) from None
        self.ordinal = ordinal
        self.default_device = ordinal
        self._driver = _Driver(drv)
        self._local = threading.local()
        self._count: int | None = None

    def __repr__(self) -> str:
        return f"<CudaRuntime GPU {self.ordinal}>"

    # -- contexts -----------------------------------------------------------
    def _bind_thread(self) -> None:
        """First call from this thread: make our GPU's primary context current, and leave it so."""
        if not getattr(self._local, "bound", False):
            self._driver.check("cuCtxSetCurrent", self._driver.primary(self.ordinal))
            self._local.bound = True

    def _on(self, ordinal: int | None) -> contextlib.AbstractContextManager[None]:
        self._bind_thread()
        return self._driver.on(self.ordinal if ordinal is None else ordinal)

    # -- devices --------------------------------------------------------------
    def device_count(self) -> int:
        if self._count is None:
            self._driver.init()
            (count,) = self._driver.check("cuDeviceGetCount")
            self._count = int(count)
        return self._count

    def current_device(self) -> int:
        return self.ordinal

    # -- pointers and streams ---------------------------------------------
    def locate(self, ptr: int) -> Location:
        if ptr == 0:  # zero-size arrays export NULL: they "live" where this rank works
            return Location(MemoryKind.DEVICE, self.ordinal)
        drv = self._driver.drv
        attrs = [
            drv.CUpointer_attribute.CU_POINTER_ATTRIBUTE_MEMORY_TYPE,
            drv.CUpointer_attribute.CU_POINTER_ATTRIBUTE_IS_MANAGED,
            drv.CUpointer_attribute.CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL,
        ]
        with self._on(self.ordinal):  # the query can fail with no current context (cupy#3991)
            try:
                (values,) = self._driver.check("cuPointerGetAttributes", len(attrs), attrs, ptr)
            except CudaError as exc:
                message = f"cannot classify pointer {ptr:#x}: {exc}"
                raise CudaError(message, exc.call, exc.code, exc.name) from exc
        memory_type, is_managed, device_ordinal = values
        return classify_pointer(memory_type, is_managed, device_ordinal, self.ordinal)

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
    def alloc_device(self, nbytes: int, ordinal: int) -> DeviceBuffer:
        """Device memory on ``ordinal``: from CuPy's pool when present, so freed buffers are reused."""
        if nbytes == 0:
            return CudaDeviceBuffer(0, 0, ordinal)
        cp = _load_cupy()
        with self._on(ordinal):
            if cp is not None:
                with cp.cuda.Device(ordinal):
                    mem = cp.cuda.alloc(nbytes)
                return CudaDeviceBuffer(int(mem.ptr), nbytes, ordinal, owner=mem)
            (dptr,) = self._driver.check("cuMemAlloc", nbytes)
        ptr = int(dptr)
        buf = CudaDeviceBuffer(ptr, nbytes, ordinal)
        buf._finalizer = weakref.finalize(buf, self._driver.release, ordinal, "cuMemFree", ptr)
        return buf

    def alloc_pinned(self, nbytes: int) -> PinnedBuffer:
        """Portable page-locked memory (usable in every context): CuPy's pinned pool, else cuMemHostAlloc."""
        if nbytes == 0:
            return CudaPinnedBuffer(0, 0, np.empty(0, np.uint8))
        cp = _load_cupy()
        with self._on(self.ordinal):  # allocating needs a context: ours, not a fresh one on GPU 0
            if cp is not None:
                pmem = cp.cuda.alloc_pinned_memory(nbytes)
                # frombuffer holds pmem, so the pool block outlives every view of it.
                return CudaPinnedBuffer(int(pmem.ptr), nbytes, np.frombuffer(pmem, np.uint8, nbytes))
            (ptr,) = self._driver.check("cuMemHostAlloc", nbytes, self._driver.drv.CU_MEMHOSTALLOC_PORTABLE)
        ptr = int(ptr)
        owner = _HostAllocation(self._driver, ptr, self.ordinal)
        raw = (ctypes.c_ubyte * nbytes).from_address(ptr)
        raw._cai_mpi_owner = owner  # type: ignore[attr-defined]  # the view's base keeps the block alive
        return CudaPinnedBuffer(ptr, nbytes, np.ctypeslib.as_array(raw))

    # -- copies on cai_mpi's own streams --------------------------------------
    def create_stream(self, ordinal: int) -> Stream:
        flags = self._driver.drv.CUstream_flags.CU_STREAM_NON_BLOCKING
        with self._on(ordinal):
            (handle,) = self._driver.check("cuStreamCreate", flags)
        return CudaStream(self, int(handle), ordinal)

    def copy_async(self, dst: int, src: int, nbytes: int, stream: Stream) -> None:
        s = _own_stream(stream)
        if nbytes == 0:
            return
        with self._on(s.ordinal):  # unified addressing: the driver infers the direction
            self._driver.check("cuMemcpyAsync", dst, src, nbytes, s.handle)

    def record_event(self, stream: Stream) -> Event:
        s = _own_stream(stream)
        flags = self._driver.drv.CUevent_flags.CU_EVENT_DISABLE_TIMING
        with self._on(s.ordinal):
            (handle,) = self._driver.check("cuEventCreate", flags)
            event = CudaEvent(self, int(handle), s.ordinal)
            self._driver.check("cuEventRecord", event.handle, s.handle)
        return event

    # -- layout ---------------------------------------------------------------
    @contextlib.contextmanager
    def _cupy_on(self, cp: Any, ordinal: int, stream: CudaStream) -> Iterator[None]:
        """CuPy's current device and stream set to ``ordinal`` and cai_mpi's ``stream`` for the block."""
        with self._on(ordinal), cp.cuda.Device(ordinal):
            if hasattr(cp.cuda.Stream, "from_external"):  # CuPy >= 14; ExternalStream is deprecated there
                cupy_stream = cp.cuda.Stream.from_external(_CudaStreamRef(stream.handle))
            else:
                cupy_stream = cp.cuda.ExternalStream(stream.handle, ordinal)
            with cupy_stream:
                yield

    def pack(self, desc: CAIDescriptor, ordinal: int, stream: Stream) -> DeviceBuffer:
        """Gather with CuPy's copy kernel on ``stream``; the result stays in CuPy's pool."""
        s = _own_stream(stream)
        cp = _load_cupy()
        if cp is None:
            raise RuntimeUnavailableError(
                f"cannot pack a non-contiguous device array of shape {desc.shape}: {_CUPY_HINT}"
            )
        if desc.nbytes == 0:
            return CudaDeviceBuffer(0, 0, ordinal)
        dtype, shape, strides = byte_view(desc.shape, desc.byte_strides, desc.itemsize, (desc.ptr,))
        with self._cupy_on(cp, ordinal, s):
            src = _as_cupy(cp, desc.ptr, shape, dtype, strides, ordinal)
            out = cp.ascontiguousarray(src)  # a 0-d input comes back as shape (1,): same bytes
            if int(out.data.ptr) == desc.ptr:  # already C-ordered: still hand back a new buffer
                out = src.copy()
        return CudaDeviceBuffer(int(out.data.ptr), desc.nbytes, ordinal, owner=out)

    def unpack(self, src: int, desc: CAIDescriptor, ordinal: int, stream: Stream) -> None:
        """Scatter with CuPy's copy kernel on ``stream`` (the caller synchronizes it)."""
        s = _own_stream(stream)
        cp = _load_cupy()
        if cp is None:
            raise RuntimeUnavailableError(
                f"cannot unpack into a non-contiguous device array of shape {desc.shape}: {_CUPY_HINT}"
            )
        if desc.nbytes == 0:
            return
        dtype, shape, strides = byte_view(desc.shape, desc.byte_strides, desc.itemsize, (desc.ptr, src))
        with self._cupy_on(cp, ordinal, s):
            dst = _as_cupy(cp, desc.ptr, shape, dtype, strides, ordinal)
            packed = _as_cupy(cp, src, shape, dtype, None, ordinal)
            cp.copyto(dst, packed)


# -- helpers ------------------------------------------------------------------------


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
