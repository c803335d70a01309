"""A double of the CUDA driver API module (``cuda.bindings.driver``) with CUDA's documented semantics.

``CudaDriverDouble`` stands where cai_mpi's CUDA runtime expects the cuda-bindings driver module, so the
real ``cai_mpi._src.runtime.cuda`` and everything above it run on a machine without a GPU:

- the same call and return conventions: every function returns ``(_CUresult, outputs...)``, output slots
  are None on error, attributes must be enum members, handles are handle objects (``int(h)`` is the
  value) and plain ints are accepted where the real bindings accept them;
- several devices, a primary context each (retained and released), and a current context per thread
  (``cuCtxSetCurrent``/``Push``/``Pop``); calls that need a context fail with CUDA_ERROR_INVALID_CONTEXT;
- device memory the host can never touch: each allocation is a memfd mapped twice, ``PROT_NONE`` at the
  address handed out (a host read, or a non-CUDA-aware MPI, faults as on a GPU) and read-write at a twin
  address only the double's copies use. ``device_memory_host_accessible=True`` maps it read-write instead,
  for tests that model a CUDA-aware MPI;
- streams with a worker thread each (a destroyed stream's or event's handle is the next one created, as CUDA may
  reuse it); the legacy default stream (handles 0 and 1) is ordered against the
  blocking streams of its context but not the ``CU_STREAM_NON_BLOCKING`` ones; handle 2 is the calling
  thread's per-thread default stream; events; copies, 2-D copies and memsets in stream order;
- copies that run past the end of an allocation refused (CUDA_ERROR_INVALID_VALUE), even inside its last page,
  which the double maps whole;
- 2-D copies as strict as CUDA documents them (``_cuda_copy2d``): a struct with the real unsigned fields, each pitch
  at least its row, at most ``max_pitch`` (CU_DEVICE_ATTRIBUTE_MAX_PITCH), no device-to-device 2-D copy;
- a stream-ordered pool (``cuMemAllocAsync``) that reuses freed blocks as CUDA's default pool does: at once on the
  stream that freed them, and on another stream once the free has run or, before, with an inserted dependency
  (``reuse_internal_dependencies``);
- pinned host memory, counted (``pinned_bytes_outstanding``, ``pinned_bytes_peak``, ``pinned_allocations``);
- pointer attributes as UVA answers them from any context (type, CONTEXT, DEVICE_ORDINAL; CONTEXT is NULL for
  stream-ordered memory), context-relative ones refused where CUDA refuses them, and every query refused with no
  context current. ``ordinal_bug=True`` reads DEVICE_ORDINAL as cuda-bindings 12.9.6-12.9.8 and 13.1.2-13.4.2
  do: 0 for every pointer, in ``cuPointerGetAttribute`` and ``cuPointerGetAttributes`` alike.
- finite memory: each device holds ``device_memory_bytes`` (a constructor argument, 16 GiB by default, which a
  test may lower at any time); cuMemAlloc, cuMemAllocManaged and cuMemAllocAsync beyond it return
  CUDA_ERROR_OUT_OF_MEMORY, and freeing gives the bytes back (``device_memory_in_use``). Pinned memory is
  bounded likewise when ``pinned_memory_bytes`` is given;
- sticky errors: after ``fault(context_or_ordinal)``, or once a kernel launched with ``launch(..., fault=True)``
  has run, every call made in that context returns CUDA_ERROR_ILLEGAL_ADDRESS (700), as on hardware, until
  ``clear_fault`` (what a reset does); stream, event and context syncs that were waiting report it too.
  Context management (current, push, pop, retain, release) and device queries still answer.

Test hooks play the producer: ``launch`` and ``kernel_write`` enqueue a "kernel" on any stream,
``set_copy_delay`` makes copies slow, ``fail_next`` makes one call return an error, ``read_device`` and
``write_device`` look into device memory. It models no kernels of its own and no CuPy.
"""
from __future__ import annotations

import ctypes
import threading
from collections.abc import Callable
from typing import Any

from ._cuda_copy2d import MAX_PITCH, copy_2d_rows, refusal_2d
from ._cuda_faults import DEFAULT_DEVICE_MEMORY_BYTES, Faults
from ._cuda_memory import Memory
from ._cuda_stream_calls import StreamCalls
from ._cuda_streams import Fence, Stream
from ._cuda_types import CUDA_MEMCPY2D as _CUDA_MEMCPY2D
from ._cuda_types import Block as _Block
from ._cuda_types import CUcontext as _CUcontext
from ._cuda_types import CUdevice as _CUdevice
from ._cuda_types import CUdevice_attribute as _CUdevice_attribute
from ._cuda_types import CUdeviceptr as _CUdeviceptr
from ._cuda_types import CUevent as _CUevent
from ._cuda_types import CUevent_flags as _CUevent_flags
from ._cuda_types import CUmemorytype as _CUmemorytype
from ._cuda_types import CUpointer_attribute as _CUpointer_attribute
from ._cuda_types import CUresult as _CUresult
from ._cuda_types import CUstream as _CUstream
from ._cuda_types import CUstream_flags as _CUstream_flags
from ._cuda_types import value as _value

__all__ = ["CudaDriverDouble", "host_accessible_double", "ordinal_bug_double"]


class CudaDriverDouble(Faults, StreamCalls, Memory):
    """The double of ``cuda.bindings.driver``: pass it where the CUDA runtime takes its driver module."""

    CUresult, CUpointer_attribute, CUmemorytype = _CUresult, _CUpointer_attribute, _CUmemorytype
    CUstream_flags, CUevent_flags, CUDA_MEMCPY2D = _CUstream_flags, _CUevent_flags, _CUDA_MEMCPY2D
    CUdeviceptr, CUstream, CUevent, CUcontext, CUdevice = _CUdeviceptr, _CUstream, _CUevent, _CUcontext, _CUdevice
    CU_MEMHOSTALLOC_PORTABLE, CU_MEMHOSTALLOC_DEVICEMAP, CU_MEMHOSTALLOC_WRITECOMBINED = 1, 2, 4
    CU_MEM_ATTACH_GLOBAL = 1
    CUdevice_attribute = _CUdevice_attribute
    CU_STREAM_LEGACY, CU_STREAM_PER_THREAD = 1, 2
    CUDA_VERSION = 12090

    def __init__(
        self, devices: int = 2, *, device_memory_host_accessible: bool = False,
        device_memory_bytes: int = DEFAULT_DEVICE_MEMORY_BYTES, pinned_memory_bytes: int | None = None,
        ordinal_bug: bool = False, lazy: float = 0.0, eager: bool = False,
    ) -> None:
        self.devices = devices
        self.host_accessible = device_memory_host_accessible
        self.ordinal_bug = ordinal_bug
        # The cuda-bindings release whose pointer-attribute reading this double plays (read by cai_mpi's checks).
        self.bindings_version = "12.9.6" if ordinal_bug else "12.9.10"
        self.lazy = lazy
        self.eager = eager  # every operation has run when its call returns (see ``Stream``): for counting calls
        self._lock = threading.RLock()
        self._tls = threading.local()
        self._initialized = False
        self._retains = [0] * devices
        self._blocks: dict[int, _Block] = {}  # address -> block (device, managed, pinned, alias)
        self._starts: list[int] = []
        self._streams: dict[int, Stream] = {}
        self._legacy: dict[int, Stream] = {}  # context -> its legacy default stream
        self._events: dict[int, Fence] = {}
        self._event_contexts: dict[int, int] = {}
        self._destroyed_streams: list[int] = []  # handed out again first, as CUDA may (see ``_reused``)
        self._destroyed_events: list[int] = []
        self._next_handle = 0x5EED_0000
        self._fail: dict[str, _CUresult] = {}
        self._pool: list[tuple[_Block, Stream, Fence]] = []  # the stream-ordered allocator's freed blocks
        # CUDA's default pool may hand a block whose free is pending on another stream to an allocation, making the
        # allocating stream wait for it (cudaMemPoolReuseAllowInternalDependencies, on by default); a test may
        # turn it off
        self.reuse_internal_dependencies = True
        self._graveyard: list[_Block] = []  # freed blocks still mapped until no stream has work queued
        self.copy_delay = 0.0
        self.max_pitch = MAX_PITCH  # CU_DEVICE_ATTRIBUTE_MAX_PITCH; a test may lower it
        self.refused: list[tuple[str, str]] = []  # (function, why) of every copy refused as CUDA would
        self.pinned_bytes_outstanding = self.pinned_bytes_peak = self.pinned_allocations = 0
        self.calls: list[tuple[str, int]] = []  # (function, current context) of every call, for tests
        self._init_faults(device_memory_bytes, pinned_memory_bytes)

    # -- conventions -----------------------------------------------------------------------------------------

    def _enter(self, name: str, *, needs_init: bool = True, needs_context: bool = False) -> _CUresult | None:
        """The status a call fails with before doing anything, or None."""
        self.calls.append((name, self._current()))
        failure = self._fail.pop(name, None)
        if failure is not None:
            return failure
        if needs_init and not self._initialized:
            return _CUresult.CUDA_ERROR_NOT_INITIALIZED
        if needs_context and not self._current():
            return _CUresult.CUDA_ERROR_INVALID_CONTEXT
        return self._sticky(name)

    def _handle(self) -> int:
        with self._lock:
            self._next_handle += 0x10
            return self._next_handle

    def fail_next(self, name: str, result: _CUresult) -> None:
        """The next call of ``name`` returns ``result`` and does nothing."""
        self._fail[name] = result

    # -- errors, devices, contexts ------------------------------------------------------------------------------

    def cuGetErrorName(self, error: Any) -> tuple[_CUresult, bytes | None]:
        try:
            return _CUresult.CUDA_SUCCESS, _CUresult(int(error)).name.encode()
        except ValueError:
            return _CUresult.CUDA_ERROR_INVALID_VALUE, None

    def cuGetErrorString(self, error: Any) -> tuple[_CUresult, bytes | None]:
        return _CUresult.CUDA_SUCCESS, f"(driver double) status {int(error)}".encode()

    def cuInit(self, Flags: int) -> tuple[_CUresult]:
        failure = self._enter("cuInit", needs_init=False)
        if failure is None:
            self._initialized = True
        return (failure or _CUresult.CUDA_SUCCESS,)

    def cuDriverGetVersion(self) -> tuple[_CUresult, int | None]:
        failure = self._enter("cuDriverGetVersion", needs_init=False)
        return (failure, None) if failure else (_CUresult.CUDA_SUCCESS, self.CUDA_VERSION)

    def cuDeviceGetCount(self) -> tuple[_CUresult, int | None]:
        failure = self._enter("cuDeviceGetCount")
        return (failure, None) if failure else (_CUresult.CUDA_SUCCESS, self.devices)

    def cuDeviceGet(self, ordinal: int) -> tuple[_CUresult, _CUdevice | None]:
        failure = self._enter("cuDeviceGet")
        if failure is None and not 0 <= int(ordinal) < self.devices:
            failure = _CUresult.CUDA_ERROR_INVALID_DEVICE
        return (failure, None) if failure else (_CUresult.CUDA_SUCCESS, _CUdevice(ordinal))

    def cuDeviceGetAttribute(self, attrib: Any, dev: Any) -> tuple[_CUresult, int | None]:
        """CU_DEVICE_ATTRIBUTE_MAX_PITCH (``max_pitch``) only: other attributes are CUDA_ERROR_INVALID_VALUE here."""
        failure = self._enter("cuDeviceGetAttribute")
        if failure is None and not 0 <= _value(dev) < self.devices:
            failure = _CUresult.CUDA_ERROR_INVALID_DEVICE
        if failure is None and attrib is not _CUdevice_attribute.CU_DEVICE_ATTRIBUTE_MAX_PITCH:
            failure = _CUresult.CUDA_ERROR_INVALID_VALUE
        return (failure, None) if failure else (_CUresult.CUDA_SUCCESS, self.max_pitch)

    def context_of(self, ordinal: int) -> int:
        """The handle of GPU ``ordinal``'s primary context (what ``cuDevicePrimaryCtxRetain`` gives for it): tests
        push it, or compare what the library made current with it."""
        return 0xC0DE_0000 + ordinal

    def ordinal_of(self, context: int) -> int:
        """The GPU whose primary context ``context`` is (``context_of``'s inverse)."""
        return context - 0xC0DE_0000

    def cuDevicePrimaryCtxRetain(self, dev: Any) -> tuple[_CUresult, _CUcontext | None]:
        failure = self._enter("cuDevicePrimaryCtxRetain")
        ordinal = _value(dev)
        if failure is None and not 0 <= ordinal < self.devices:
            failure = _CUresult.CUDA_ERROR_INVALID_DEVICE
        if failure:
            return failure, None
        with self._lock:
            self._retains[ordinal] += 1
        return _CUresult.CUDA_SUCCESS, _CUcontext(self.context_of(ordinal))

    def cuDevicePrimaryCtxRelease(self, dev: Any) -> tuple[_CUresult]:
        failure = self._enter("cuDevicePrimaryCtxRelease")
        ordinal = _value(dev)
        if failure is None and not (0 <= ordinal < self.devices and self._retains[ordinal] > 0):
            failure = _CUresult.CUDA_ERROR_INVALID_CONTEXT
        if failure is None:
            with self._lock:
                self._retains[ordinal] -= 1
        return (failure or _CUresult.CUDA_SUCCESS,)

    def retained(self, ordinal: int) -> int:
        """How many retains of ``ordinal``'s primary context are outstanding."""
        return self._retains[ordinal]

    def _stack(self) -> list[int]:
        stack: list[int] | None = getattr(self._tls, "stack", None)
        if stack is None:
            stack = self._tls.stack = []
        return stack

    def _current(self) -> int:
        stack = self._stack()
        return stack[-1] if stack else 0

    def _valid_context(self, ctx: int) -> bool:
        return ctx == 0 or (0 <= self.ordinal_of(ctx) < self.devices and self._retains[self.ordinal_of(ctx)] > 0)

    def cuCtxGetCurrent(self) -> tuple[_CUresult, _CUcontext | None]:
        failure = self._enter("cuCtxGetCurrent")
        return (failure, None) if failure else (_CUresult.CUDA_SUCCESS, _CUcontext(self._current()))

    def cuCtxSetCurrent(self, ctx: Any) -> tuple[_CUresult]:
        failure = self._enter("cuCtxSetCurrent")
        value = _value(ctx)
        if failure is None and not self._valid_context(value):
            failure = _CUresult.CUDA_ERROR_INVALID_CONTEXT
        if failure is None:
            stack = self._stack()
            if value == 0:
                stack.clear()
            elif stack:
                stack[-1] = value
            else:
                stack.append(value)
        return (failure or _CUresult.CUDA_SUCCESS,)

    def cuCtxPushCurrent(self, ctx: Any) -> tuple[_CUresult]:
        failure = self._enter("cuCtxPushCurrent")
        value = _value(ctx)
        if failure is None and (value == 0 or not self._valid_context(value)):
            failure = _CUresult.CUDA_ERROR_INVALID_CONTEXT
        if failure is None:
            self._stack().append(value)
        return (failure or _CUresult.CUDA_SUCCESS,)

    def cuCtxPopCurrent(self) -> tuple[_CUresult, _CUcontext | None]:
        failure = self._enter("cuCtxPopCurrent", needs_context=True)
        return (failure, None) if failure else (_CUresult.CUDA_SUCCESS, _CUcontext(self._stack().pop()))

    def cuCtxGetDevice(self) -> tuple[_CUresult, _CUdevice | None]:
        failure = self._enter("cuCtxGetDevice", needs_context=True)
        return (failure, None) if failure else (_CUresult.CUDA_SUCCESS, _CUdevice(self.ordinal_of(self._current())))

    def cuCtxGetId(self, ctx: Any) -> tuple[_CUresult, int | None]:
        """A context's id, unique for the life of the process (a handle may be reused by a later context)."""
        failure = self._enter("cuCtxGetId")
        value = _value(ctx) or self._current()
        if failure is None and (value == 0 or not self._valid_context(value)):
            failure = _CUresult.CUDA_ERROR_INVALID_CONTEXT
        return (failure, None) if failure else (_CUresult.CUDA_SUCCESS, self.ordinal_of(value) + 1)

    def cuCtxSynchronize(self) -> tuple[_CUresult]:
        failure = self._enter("cuCtxSynchronize", needs_context=True)
        if failure is None:
            ctx = self._current()
            for stream in [s for s in self._all_streams() if s.context == ctx]:
                stream.tail.wait()
            failure = self._poisoned_after_wait()
        return (failure or _CUresult.CUDA_SUCCESS,)

    # -- copies --------------------------------------------------------------------------------------------------

    def _twin(self, address: int) -> int:
        """Where the double reads or writes ``address``: the twin of device memory, host memory as it is."""
        block = self._find(address) or self._freed(address)
        if block is None:
            return address  # pageable host memory
        return block.twin + (address - block.address)

    def _freed(self, address: int) -> _Block | None:
        """The freed block ``address`` falls into, while work queued before the free may still use it."""
        with self._lock:
            for block in [*self._graveyard, *(b for b, _, _ in self._pool)]:
                if block.address <= address < block.address + max(block.nbytes, 1):
                    return block
        return None

    def _copy_op(self, dst: int, src: int, nbytes: int) -> Callable[[], None]:
        def copy() -> None:
            ctypes.memmove(self._twin(dst), self._twin(src), nbytes)

        return copy

    def _refused_range(self, call: str, ranges: list[tuple[int, int]]) -> bool:
        """Whether a copy touching ``ranges`` (address, bytes) is refused: a range running past the end of its
        allocation (CUDA_ERROR_INVALID_VALUE, nothing copied; on a GPU it may silently hit a neighbour)."""
        for address, nbytes in ranges:
            why = self._past_the_end(address, nbytes)
            if why is not None:
                self.refused.append((call, why))
                return True
        return False

    def cuMemcpyAsync(self, dst: Any, src: Any, ByteCount: int, hStream: Any) -> tuple[_CUresult]:
        failure, stream = self._on_stream("cuMemcpyAsync", hStream)
        n = int(ByteCount)
        if failure is None and self._refused_range("cuMemcpyAsync", [(_value(dst), n), (_value(src), n)]):
            failure = _CUresult.CUDA_ERROR_INVALID_VALUE
        if failure is None:
            assert stream is not None
            stream.enqueue(self._copy_op(_value(dst), _value(src), int(ByteCount)), self._implicit(stream),
                           self.copy_delay)
        return (failure or _CUresult.CUDA_SUCCESS,)

    def cuMemcpy2DAsync(self, pCopy: _CUDA_MEMCPY2D, hStream: Any) -> tuple[_CUresult]:
        """CUDA's documented limits (``_cuda_copy2d``): pitches of at least the row, at most MAX_PITCH, never
        device to device; a refused copy is CUDA_ERROR_INVALID_VALUE and copies nothing."""
        failure, stream = self._on_stream("cuMemcpy2DAsync", hStream)
        if failure is None:
            assert stream is not None
            why = refusal_2d(pCopy, self.max_pitch, self._is_device_memory)
            if why is not None:
                self.refused.append(("cuMemcpy2DAsync", why))
                return (_CUresult.CUDA_ERROR_INVALID_VALUE,)
            rows, width = copy_2d_rows(pCopy), pCopy.WidthInBytes
            if self._refused_range("cuMemcpy2DAsync", [(a, width) for row in rows for a in row]):
                return (_CUresult.CUDA_ERROR_INVALID_VALUE,)

            def copy_rows() -> None:
                for d, s in rows:
                    ctypes.memmove(self._twin(d), self._twin(s), width)

            stream.enqueue(copy_rows, self._implicit(stream), self.copy_delay)
        return (failure or _CUresult.CUDA_SUCCESS,)

    def _is_device_memory(self, address: int) -> bool:
        block = self._find(address)
        return block is not None and block.kind in ("device", "async", "managed")

    def cuMemsetD8Async(self, dstDevice: Any, uc: int, N: int, hStream: Any) -> tuple[_CUresult]:
        failure, stream = self._on_stream("cuMemsetD8Async", hStream)
        if failure is None and self._refused_range("cuMemsetD8Async", [(_value(dstDevice), int(N))]):
            failure = _CUresult.CUDA_ERROR_INVALID_VALUE
        if failure is None:
            assert stream is not None
            address, value, n = _value(dstDevice), int(uc), int(N)
            stream.enqueue(lambda: ctypes.memset(self._twin(address), value, n) and None, self._implicit(stream))
        return (failure or _CUresult.CUDA_SUCCESS,)

    # -- test hooks ----------------------------------------------------------------------------------------------

    def launch(self, stream: Any, fn: Callable[[], Any], *, delay: float = 0.0, fault: bool = False) -> None:
        """Enqueue ``fn`` as a "kernel" on ``stream`` (any handle, 1 and 2 included, of the current context);
        ``fault``: once it has run, its context has a sticky error (see ``fault``)."""
        s = self._stream(stream)
        if s is None:
            raise ValueError(f"launch: no stream {_value(stream):#x} here (is a context current?)")
        context = s.context

        def kernel() -> None:
            try:
                fn()
            finally:
                if fault:
                    self.fault(context)

        s.enqueue(kernel if fault else fn, self._implicit(s), delay)

    def kernel_write(self, stream: Any, dptr: Any, data: bytes, *, delay: float = 0.0) -> None:
        """Enqueue a "kernel" that writes ``data`` at device address ``dptr`` on ``stream``."""
        payload = bytes(data)
        self.launch(stream, lambda: ctypes.memmove(self._twin(_value(dptr)), payload, len(payload)), delay=delay)

    def set_copy_delay(self, seconds: float) -> None:
        """Every later async copy waits ``seconds`` before it runs."""
        self.copy_delay = seconds

    def read_device(self, ptr: Any, nbytes: int) -> bytes:
        """The bytes at device address ``ptr`` now (a test's look; no stream order)."""
        return ctypes.string_at(self._twin(_value(ptr)), nbytes)

    def write_device(self, ptr: Any, data: bytes) -> None:
        """Write ``data`` at device address ``ptr`` now (a test's setup; no stream order)."""
        ctypes.memmove(self._twin(_value(ptr)), bytes(data), len(data))

    def close(self) -> None:
        """Stop every worker (after the work it has) and unmap every allocation."""
        streams = self._all_streams()
        for stream in streams:
            stream.close()
        for stream in streams:
            stream.join(timeout=30)
        with self._lock:
            blocks = [b for b in self._blocks.values() if b.kind != "alias"]
            blocks += [*self._graveyard, *(b for b, _, _ in self._pool)]
            self._graveyard.clear()
            self._pool.clear()
            self._blocks.clear()
            self._starts.clear()
        for block in blocks:
            self._drop(block)

    def __enter__(self) -> CudaDriverDouble:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def host_accessible_double() -> CudaDriverDouble:
    """A double whose device memory the host (so a CUDA-aware MPI) can read and write: the factory for
    ``CAI_MPI_TEST_CUDA_DRIVER=cai_mpi.testing.cuda_driver:host_accessible_double`` with ``CAI_MPI_CUDA_AWARE=1``."""
    return CudaDriverDouble(device_memory_host_accessible=True)


def ordinal_bug_double() -> CudaDriverDouble:
    """A double that reads DEVICE_ORDINAL as the broken cuda-bindings releases do (0 for every pointer): the factory
    for ``CAI_MPI_TEST_CUDA_DRIVER=cai_mpi.testing.cuda_driver:ordinal_bug_double``."""
    return CudaDriverDouble(ordinal_bug=True)
