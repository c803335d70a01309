"""The CUDA driver double keeps CUDA's documented semantics, so that what runs on it would run on a GPU."""

from __future__ import annotations

import ctypes
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from typing import Any

import numpy as np
import pytest

from cai_mpi.testing import CudaDriverDouble

CUresult = CudaDriverDouble.CUresult
A = CudaDriverDouble.CUpointer_attribute
OK = CUresult.CUDA_SUCCESS


@pytest.fixture
def d() -> Iterator[CudaDriverDouble]:
    double = CudaDriverDouble(2)
    assert double.cuInit(0) == (OK,)
    yield double
    double.close()


def on(d: CudaDriverDouble, ordinal: int) -> Any:
    err, ctx = d.cuDevicePrimaryCtxRetain(ordinal)
    assert err == OK and d.cuCtxSetCurrent(ctx) == (OK,)
    return ctx


def test_calls_return_a_status_first_and_none_outputs_on_error() -> None:
    d = CudaDriverDouble(3)
    assert d.cuDeviceGetCount() == (CUresult.CUDA_ERROR_NOT_INITIALIZED, None)  # before cuInit
    assert d.cuInit(0) == (OK,)
    assert d.cuDeviceGetCount() == (OK, 3)
    assert d.cuDeviceGet(3) == (CUresult.CUDA_ERROR_INVALID_DEVICE, None)
    err, dev = d.cuDeviceGet(2)
    assert err == OK and int(dev) == 2 and isinstance(dev, d.CUdevice)
    assert d.cuGetErrorName(CUresult.CUDA_ERROR_NOT_READY) == (OK, b"CUDA_ERROR_NOT_READY")
    d.fail_next("cuDeviceGetCount", CUresult.CUDA_ERROR_NO_DEVICE)
    assert d.cuDeviceGetCount() == (CUresult.CUDA_ERROR_NO_DEVICE, None)
    assert d.cuDeviceGetCount() == (OK, 3)  # only the next call


def test_contexts_are_current_per_thread_with_push_pop_and_retain_counts(d: CudaDriverDouble) -> None:
    assert d.cuMemAlloc(8) == (CUresult.CUDA_ERROR_INVALID_CONTEXT, None)  # nothing current yet
    ctx0 = on(d, 0)
    _err, ctx1 = d.cuDevicePrimaryCtxRetain(1)
    assert d.retained(0) == d.retained(1) == 1
    assert d.cuCtxPushCurrent(ctx1) == (OK,)
    assert int(d.cuCtxGetDevice()[1]) == 1
    seen: list[Any] = []
    worker = threading.Thread(target=lambda: seen.append(d.cuCtxGetCurrent()[1]))
    worker.start()
    worker.join()
    assert int(seen[0]) == 0  # another thread has no current context
    assert d.cuCtxPopCurrent() == (OK, ctx1)
    assert d.cuCtxGetCurrent() == (OK, ctx0)
    assert d.cuDevicePrimaryCtxRelease(d.CUdevice(1)) == (OK,) and d.retained(1) == 0


def test_device_memory_faults_on_host_access() -> None:
    code = """
import ctypes
from cai_mpi.testing import CudaDriverDouble
d = CudaDriverDouble(1, device_memory_host_accessible={accessible})
d.cuInit(0); ctx = d.cuDevicePrimaryCtxRetain(0)[1]; d.cuCtxSetCurrent(ctx)
p = int(d.cuMemAlloc(64)[1])
d.write_device(p, b"abcd")
print(ctypes.string_at(p, 4))
"""
    faulting = subprocess.run([sys.executable, "-c", code.format(accessible=False)], capture_output=True, timeout=60)
    assert faulting.returncode == -11, faulting  # SIGSEGV, as a host read of GPU memory
    readable = subprocess.run([sys.executable, "-c", code.format(accessible=True)], capture_output=True, text=True,
                              timeout=60)
    assert readable.returncode == 0 and "b'abcd'" in readable.stdout, readable.stderr


def test_pointer_attributes_of_every_kind_of_memory(d: CudaDriverDouble) -> None:
    on(d, 1)
    dev = int(d.cuMemAlloc(100)[1])
    managed = int(d.cuMemAllocManaged(100, d.CU_MEM_ATTACH_GLOBAL)[1])
    pinned = d.cuMemHostAlloc(100, d.CU_MEMHOSTALLOC_PORTABLE | d.CU_MEMHOSTALLOC_DEVICEMAP)[1]
    alias = int(d.cuMemHostGetDevicePointer(pinned, 0)[1])
    pageable = np.zeros(4).ctypes.data
    three = [A.CU_POINTER_ATTRIBUTE_MEMORY_TYPE, A.CU_POINTER_ATTRIBUTE_IS_MANAGED,
             A.CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL]
    assert d.cuPointerGetAttributes(3, three, dev + 10) == (OK, [2, False, 1])
    assert d.cuPointerGetAttributes(3, three, managed) == (OK, [2, True, 1])
    assert d.cuPointerGetAttributes(3, three, pinned) == (OK, [1, False, 1])
    assert d.cuPointerGetAttributes(1, three, pageable) == (OK, [0])
    assert alias != pinned  # a device alias of mapped pinned memory; the host reads it elsewhere
    assert d.cuPointerGetAttribute(A.CU_POINTER_ATTRIBUTE_HOST_POINTER, alias + 8) == (OK, pinned + 8)
    assert d.cuPointerGetAttribute(A.CU_POINTER_ATTRIBUTE_MEMORY_TYPE, alias) == (OK, 1)
    assert d.cuPointerGetAttribute(A.CU_POINTER_ATTRIBUTE_MEMORY_TYPE, pageable) == (CUresult.CUDA_ERROR_INVALID_VALUE,
                                                                                     None)
    with pytest.raises(AttributeError):
        d.cuPointerGetAttribute(2, dev)  # type: ignore[arg-type]  # an int, as in cuda-bindings
    with pytest.raises(TypeError):
        d.cuPointerGetAttributes(1, [2], dev)  # type: ignore[list-item]


def test_pointer_queries_from_a_context_of_another_device(d: CudaDriverDouble) -> None:
    """UVA: any context may ask where memory lives; what is relative to the asking context is refused."""
    ctx1 = on(d, 1)
    dev = int(d.cuMemAlloc(64)[1])
    where = [A.CU_POINTER_ATTRIBUTE_MEMORY_TYPE, A.CU_POINTER_ATTRIBUTE_CONTEXT, A.CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL]
    on(d, 0)
    err, values = d.cuPointerGetAttributes(3, where, dev + 8)
    assert err == OK and values is not None
    assert (values[0], int(values[1]), values[2]) == (2, int(ctx1), 1)
    assert d.cuPointerGetAttribute(A.CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL, dev) == (OK, 1)
    invalid = CUresult.CUDA_ERROR_INVALID_VALUE
    assert d.cuPointerGetAttribute(A.CU_POINTER_ATTRIBUTE_DEVICE_POINTER, dev) == (invalid, None)
    assert d.cuPointerGetAttributes(1, [A.CU_POINTER_ATTRIBUTE_DEVICE_POINTER], dev) == (invalid, None)
    assert d.cuPointerGetAttribute(A.CU_POINTER_ATTRIBUTE_HOST_POINTER, dev) == (invalid, None)  # no host address
    on(d, 1)
    assert int(d.cuPointerGetAttribute(A.CU_POINTER_ATTRIBUTE_DEVICE_POINTER, dev + 8)[1]) == dev + 8


def test_pointer_queries_need_a_current_context(d: CudaDriverDouble) -> None:
    """cupy/cupy#3991: a pointer query with no context current failed; CuPy now makes one current first."""
    on(d, 0)
    dev = int(d.cuMemAlloc(64)[1])
    assert d.cuCtxSetCurrent(0) == (OK,)
    no_context = CUresult.CUDA_ERROR_INVALID_CONTEXT
    assert d.cuPointerGetAttributes(1, [A.CU_POINTER_ATTRIBUTE_MEMORY_TYPE], dev) == (no_context, None)
    assert d.cuPointerGetAttribute(A.CU_POINTER_ATTRIBUTE_CONTEXT, dev) == (no_context, None)


def test_stream_ordered_memory_belongs_to_no_context(d: CudaDriverDouble) -> None:
    on(d, 1)
    p = d.cuMemAllocAsync(16, 1)[1]
    asked = [A.CU_POINTER_ATTRIBUTE_CONTEXT, A.CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL]
    err, values = d.cuPointerGetAttributes(2, asked, p)
    assert err == OK and values is not None and (int(values[0]), values[1]) == (0, 1)
    d.cuMemFreeAsync(p, 1)
    d.cuStreamSynchronize(1)


@pytest.mark.parametrize("bug", [False, True])
def test_ordinal_bug_reports_every_pointer_on_device_zero(bug: bool) -> None:
    """cuda-bindings 12.9.6-12.9.8 and 13.1.2-13.4.2 write DEVICE_ORDINAL to one field and read another, never
    written: 0 for every pointer, from both calls. CONTEXT is read right in every release."""
    with CudaDriverDouble(2, ordinal_bug=bug) as d:
        d.cuInit(0)
        ctx1 = on(d, 1)
        dev = int(d.cuMemAlloc(64)[1])
        expected = 0 if bug else 1
        assert d.cuPointerGetAttribute(A.CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL, dev) == (OK, expected)
        err, values = d.cuPointerGetAttributes(
            2, [A.CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL, A.CU_POINTER_ATTRIBUTE_CONTEXT], dev)
        assert err == OK and values is not None and (values[0], int(values[1])) == (expected, int(ctx1))
        assert d.bindings_version == ("12.9.6" if bug else "12.9.10")


def test_context_ids_are_per_context(d: CudaDriverDouble) -> None:
    ctx0 = on(d, 0)
    ctx1 = d.cuDevicePrimaryCtxRetain(1)[1]
    first, second = d.cuCtxGetId(ctx0), d.cuCtxGetId(ctx1)
    assert first[0] == second[0] == OK and first[1] != second[1]
    assert d.cuCtxGetId(0) == first  # NULL: the current context
    assert d.cuCtxSetCurrent(0) == (OK,)
    assert d.cuCtxGetId(0) == (CUresult.CUDA_ERROR_INVALID_CONTEXT, None)


def test_pinned_memory_is_counted(d: CudaDriverDouble) -> None:
    on(d, 0)
    blocks = [d.cuMemHostAlloc(n, d.CU_MEMHOSTALLOC_PORTABLE)[1] for n in (100, 5000, 20)]
    assert (d.pinned_bytes_outstanding, d.pinned_allocations) == (5120, 3)
    for p in blocks:
        assert d.cuMemFreeHost(p) == (OK,)
    assert (d.pinned_bytes_outstanding, d.pinned_allocations, d.pinned_bytes_peak) == (0, 0, 5120)
    assert d.cuMemFreeHost(blocks[0]) == (CUresult.CUDA_ERROR_INVALID_VALUE,)


def test_a_stream_runs_in_order_and_reports_pending_work(d: CudaDriverDouble) -> None:
    on(d, 0)
    s = d.cuStreamCreate(d.CUstream_flags.CU_STREAM_NON_BLOCKING)[1]
    log: list[int] = []
    gate = threading.Event()
    d.launch(s, lambda: gate.wait(10))  # pending until the gate opens, however slow this thread is
    d.launch(s, lambda: log.append(1), delay=0.1)  # (the delay: a stream that ran out of order would run 2 first)
    d.launch(s, lambda: log.append(2))
    assert d.cuStreamQuery(s) == (CUresult.CUDA_ERROR_NOT_READY,)
    gate.set()
    assert d.cuStreamSynchronize(s) == (OK,) and log == [1, 2]
    assert d.cuStreamQuery(s) == (OK,)
    assert d.cuStreamGetCtx(s)[1] == d.cuCtxGetCurrent()[1]
    assert d.cuStreamDestroy(s) == (OK,) and d.cuStreamSynchronize(s) == (CUresult.CUDA_ERROR_INVALID_HANDLE,)


def test_freeing_device_memory_waits_for_nothing(d: CudaDriverDouble) -> None:
    # CUDA documents no implicit synchronization in cuMemFree of stream-ordered memory and only a possible one
    # for the rest: the double frees at once, and a kernel still writing the memory writes a dead allocation.
    on(d, 0)
    s = d.cuStreamCreate(d.CUstream_flags.CU_STREAM_NON_BLOCKING)[1]
    dptr = d.cuMemAlloc(64)[1]
    done: list[str] = []
    gate = threading.Event()
    d.launch(s, lambda: gate.wait(10))  # the kernel stays pending until the gate opens
    d.kernel_write(s, dptr, b"x" * 64)
    d.launch(s, lambda: done.append("kernel"))
    assert d.cuMemFree(dptr) == (OK,) and done == []
    gate.set()
    assert d.cuStreamSynchronize(s) == (OK,) and done == ["kernel"]
    assert d.cuPointerGetAttributes(1, [A.CU_POINTER_ATTRIBUTE_MEMORY_TYPE], dptr) == (OK, [0])  # forgotten


def test_freeing_pinned_memory_waits_for_the_work_that_uses_it(d: CudaDriverDouble) -> None:
    on(d, 0)
    s = d.cuStreamCreate(d.CUstream_flags.CU_STREAM_NON_BLOCKING)[1]
    host = d.cuMemHostAlloc(64, 0)[1]
    done: list[str] = []
    d.launch(s, lambda: done.append("second"), delay=0.2)
    assert d.cuMemFreeHost(host) == (OK,) and done == ["second"]


def test_the_stream_ordered_pool_reuses_a_block_on_its_stream_at_once(d: CudaDriverDouble) -> None:
    # As CUDA's default memory pool and CuPy's pool: a block freed on stream S goes to the next allocation on S
    # at once (stream order makes that safe on S only); without internal dependencies, another stream gets it
    # only once the free has run.
    d.reuse_internal_dependencies = False
    on(d, 0)
    s = d.cuStreamCreate(d.CUstream_flags.CU_STREAM_NON_BLOCKING)[1]
    other = d.cuStreamCreate(d.CUstream_flags.CU_STREAM_NON_BLOCKING)[1]
    first = int(d.cuMemAllocAsync(4096, s)[1])
    gate = threading.Event()
    d.launch(s, lambda: gate.wait(10))  # work on s still using the block, until the gate opens
    assert d.cuMemFreeAsync(first, s) == (OK,)
    elsewhere = int(d.cuMemAllocAsync(4096, other)[1])
    assert elsewhere != first  # its free has not run yet
    assert int(d.cuMemAllocAsync(4096, s)[1]) == first
    gate.set()
    assert d.cuMemFreeAsync(elsewhere, other) == (OK,) and d.cuStreamSynchronize(other) == (OK,)
    assert int(d.cuMemAllocAsync(4096, s)[1]) == elsewhere  # freed and done: any stream may take it


def test_the_pool_hands_a_block_still_in_use_to_another_stream_which_waits_for_it(d: CudaDriverDouble) -> None:
    # CUDA's default (cudaMemPoolReuseAllowInternalDependencies): a block whose free is pending on S goes to an
    # allocation on another stream at once, and that stream's later work waits for the free. A host write to the
    # block is ordered by nothing: the previous user's pending kernel lands after it.
    on(d, 0)
    s = d.cuStreamCreate(d.CUstream_flags.CU_STREAM_NON_BLOCKING)[1]
    other = d.cuStreamCreate(d.CUstream_flags.CU_STREAM_NON_BLOCKING)[1]
    first = int(d.cuMemAllocAsync(4096, s)[1])
    gate = threading.Event()
    d.launch(s, lambda: gate.wait(10))
    d.kernel_write(s, first, b"old user")
    assert d.cuMemFreeAsync(first, s) == (OK,)
    again = int(d.cuMemAllocAsync(4096, other)[1])
    assert again == first
    assert d.cuStreamQuery(other) == (CUresult.CUDA_ERROR_NOT_READY,)  # it waits for the free on s
    d.write_device(again, b"host wrt")  # (a CUDA-aware MPI receiving into it now)
    gate.set()
    assert d.cuStreamSynchronize(other) == (OK,)
    assert d.read_device(again, 8) == b"old user"  # the earlier kernel ran after the write


def test_a_lazy_double_runs_work_only_when_something_waits_for_it() -> None:
    with CudaDriverDouble(lazy=30.0) as d:
        assert d.cuInit(0) == (OK,)
        on(d, 0)
        s = d.cuStreamCreate(d.CUstream_flags.CU_STREAM_NON_BLOCKING)[1]
        dptr = d.cuMemAlloc(8)[1]
        d.write_device(dptr, b"old-data")
        d.kernel_write(s, dptr, b"new-data")
        event = d.cuEventCreate(0)[1]
        assert d.cuEventRecord(event, s) == (OK,)
        time.sleep(0.2)
        assert d.cuEventQuery(event) == (CUresult.CUDA_ERROR_NOT_READY,)  # a query makes nothing run
        assert d.read_device(dptr, 8) == b"old-data"  # a read that skips its wait sees the old bytes
        waiter = d.cuStreamCreate(0)[1]
        assert d.cuStreamWaitEvent(waiter, event, 0) == (OK,)
        assert d.cuStreamSynchronize(waiter) == (OK,)  # a wait from another stream makes s run up to the event
        assert d.read_device(dptr, 8) == b"new-data" and d.cuEventQuery(event) == (OK,)


@pytest.mark.parametrize(("flags", "waits"), [(0, True), (1, False)], ids=["blocking", "non-blocking"])
def test_the_legacy_stream_orders_blocking_streams_only(d: CudaDriverDouble, flags: int, waits: bool) -> None:
    on(d, 0)
    s = d.cuStreamCreate(flags)[1]
    dev = int(d.cuMemAlloc(8)[1])
    d.write_device(dev, bytes(8))
    gate = threading.Event()
    d.launch(1, lambda: gate.wait(10))  # the legacy default stream is held until the gate opens
    d.kernel_write(1, dev, b"\x07" * 8, delay=0.2)  # a slow kernel: a copy that does not wait for it reads zeros
    host = np.zeros(8, np.uint8)
    d.cuMemcpyAsync(host.ctypes.data, dev, 8, s)
    if waits:
        assert d.cuStreamQuery(s) == (CUresult.CUDA_ERROR_NOT_READY,)  # the copy waits for the legacy stream
        gate.set()
        assert d.cuStreamSynchronize(s) == (OK,)
        assert (host == 7).all()
    else:
        assert d.cuStreamSynchronize(s) == (OK,)  # the legacy stream is still held: the copy did not wait for it
        assert (host == 0).all()
        gate.set()
    d.cuCtxSynchronize()


def test_work_on_a_blocking_stream_is_waited_for_by_the_legacy_stream(d: CudaDriverDouble) -> None:
    on(d, 0)
    s = d.cuStreamCreate(0)[1]
    log: list[str] = []
    d.launch(s, lambda: log.append("blocking stream"), delay=0.2)
    d.launch(1, lambda: log.append("legacy stream"))
    d.cuStreamSynchronize(1)
    assert log == ["blocking stream", "legacy stream"]


def test_per_thread_default_streams_are_per_thread(d: CudaDriverDouble) -> None:
    ctx = on(d, 0)
    log: list[str] = []
    gate = threading.Event()
    d.launch(2, lambda: gate.wait(10))  # this thread's per-thread stream is held until the gate opens
    d.launch(2, lambda: log.append("main"))

    def other() -> None:
        d.cuCtxSetCurrent(ctx)
        d.launch(2, lambda: log.append("other"))
        d.cuStreamSynchronize(2)  # this thread's own stream: does not wait for the main thread's

    t = threading.Thread(target=other)
    t.start()
    t.join()
    assert log == ["other"]
    gate.set()
    d.cuStreamSynchronize(2)
    assert log == ["other", "main"]


def test_events_and_stream_wait_event_order_two_streams(d: CudaDriverDouble) -> None:
    on(d, 0)
    producer, consumer = (d.cuStreamCreate(1)[1] for _ in range(2))
    ev = d.cuEventCreate(d.CUevent_flags.CU_EVENT_DISABLE_TIMING)[1]
    assert d.cuEventQuery(ev) == (OK,)  # never recorded: complete
    log: list[str] = []
    gate = threading.Event()
    d.launch(producer, lambda: gate.wait(10))  # the producer is held until the gate opens
    # (the delay: a consumer that did not wait for the event would run first)
    d.launch(producer, lambda: log.append("produced"), delay=0.2)
    assert d.cuEventRecord(ev, producer) == (OK,)
    assert d.cuEventQuery(ev) == (CUresult.CUDA_ERROR_NOT_READY,)
    assert d.cuStreamWaitEvent(consumer, ev, 0) == (OK,)
    d.launch(consumer, lambda: log.append("consumed"))
    assert d.cuStreamQuery(consumer) == (CUresult.CUDA_ERROR_NOT_READY,)  # it waits for the event
    gate.set()
    d.cuStreamSynchronize(consumer)
    assert log == ["produced", "consumed"]
    assert d.cuEventSynchronize(ev) == (OK,) and d.cuEventDestroy(ev) == (OK,)
    assert d.cuEventQuery(ev) == (CUresult.CUDA_ERROR_INVALID_HANDLE,)


def test_a_copy_without_a_wait_can_read_stale_data(d: CudaDriverDouble) -> None:
    """The double exposes races: a copy on another non-blocking stream does not wait for a kernel."""
    on(d, 0)
    producer, other = (d.cuStreamCreate(1)[1] for _ in range(2))
    dev = int(d.cuMemAlloc(8)[1])
    d.write_device(dev, bytes(8))
    gate = threading.Event()
    d.launch(producer, lambda: gate.wait(10))  # the kernel stays pending until the gate opens
    d.kernel_write(producer, dev, b"\x05" * 8)
    stale, fresh = np.zeros(8, np.uint8), np.zeros(8, np.uint8)
    d.cuMemcpyAsync(stale.ctypes.data, dev, 8, other)
    d.cuMemcpyAsync(fresh.ctypes.data, dev, 8, producer)
    assert d.cuStreamSynchronize(other) == (OK,)  # the copy on the other stream ran, while the kernel is pending
    assert (stale == 0).all()
    gate.set()
    d.cuCtxSynchronize()
    assert (stale == 0).all() and (fresh == 5).all()


def test_2d_copies_gather_strided_rows(d: CudaDriverDouble) -> None:
    on(d, 0)
    src = np.arange(48, dtype=np.uint8)
    dev = int(d.cuMemAlloc(48)[1])
    d.write_device(dev, src.tobytes())
    out = np.zeros(12, np.uint8)
    c = d.CUDA_MEMCPY2D()
    c.srcMemoryType, c.srcDevice, c.srcXInBytes, c.srcPitch = d.CUmemorytype.CU_MEMORYTYPE_DEVICE, dev, 2, 8
    c.dstMemoryType, c.dstHost, c.dstPitch = d.CUmemorytype.CU_MEMORYTYPE_HOST, out.ctypes.data, 2
    c.WidthInBytes, c.Height = 2, 6
    assert d.cuMemcpy2DAsync(c, 1) == (OK,)
    d.cuStreamSynchronize(1)
    assert out.tolist() == [v for row in src.reshape(6, 8) for v in row[2:4]]


def copy_2d(d: CudaDriverDouble, src: tuple[str, int, int], dst: tuple[str, int, int], width: int,
            height: int) -> Any:
    """A CUDA_MEMCPY2D from ``(memory type, address, pitch)`` to another."""
    c = d.CUDA_MEMCPY2D()
    for side, (kind, address, pitch) in (("src", src), ("dst", dst)):
        setattr(c, f"{side}MemoryType", d.CUmemorytype[f"CU_MEMORYTYPE_{kind}"])
        setattr(c, f"{side}Host" if kind == "HOST" else f"{side}Device", address)
        setattr(c, f"{side}Pitch", pitch)
    c.WidthInBytes, c.Height = width, height
    return c


def test_the_2d_copy_struct_has_cudas_unsigned_fields(d: CudaDriverDouble) -> None:
    """Defect: a negative pitch (a reversed axis) was accepted; the real struct's size_t fields refuse it."""
    c = d.CUDA_MEMCPY2D()
    for field in ("srcXInBytes", "srcY", "srcPitch", "dstXInBytes", "dstY", "dstPitch", "WidthInBytes", "Height"):
        with pytest.raises(OverflowError, match="negative"):
            setattr(c, field, -8)
        with pytest.raises(OverflowError, match="too large"):
            setattr(c, field, 1 << 64)
        with pytest.raises(TypeError):
            setattr(c, field, "8")
        setattr(c, field, (1 << 64) - 1)
        assert getattr(c, field) == (1 << 64) - 1
    with pytest.raises(OverflowError):
        c.srcDevice = -1
    with pytest.raises(TypeError):
        c.dstHost = -1
    c.srcMemoryType = 9  # taken as the C enum's bits, as cuda-bindings does, and refused when read
    with pytest.raises(ValueError, match="not a valid CUmemorytype"):
        c.srcMemoryType  # noqa: B018
    c.srcDevice = 4096
    assert isinstance(c.srcDevice, d.CUdeviceptr) and int(c.srcDevice) == 4096


def test_2d_copies_refuse_what_cuda_refuses(d: CudaDriverDouble) -> None:
    """cuMemcpy2D's documented limits: each pitch at least WidthInBytes plus the X offset, no pitch over
    CU_DEVICE_ATTRIBUTE_MAX_PITCH, and no device-to-device copy with pitches cuMemAllocPitch did not give. A refused
    copy returns CUDA_ERROR_INVALID_VALUE and writes nothing."""
    on(d, 0)
    dev = int(d.cuMemAlloc(1 << 16)[1])
    other = int(d.cuMemAlloc(1 << 16)[1])
    host = np.zeros(1 << 16, np.uint8)
    h = host.ctypes.data
    d.write_device(dev, bytes(range(256)) * 256)
    invalid = (CUresult.CUDA_ERROR_INVALID_VALUE,)
    assert d.cuDeviceGetAttribute(d.CUdevice_attribute.CU_DEVICE_ATTRIBUTE_MAX_PITCH, 0) == (OK, (1 << 31) - 1)
    d.max_pitch = 4096
    assert d.cuDeviceGetAttribute(d.CUdevice_attribute.CU_DEVICE_ATTRIBUTE_MAX_PITCH, d.cuDeviceGet(0)[1]) == (OK,
                                                                                                              4096)
    assert d.cuMemcpy2DAsync(copy_2d(d, ("DEVICE", dev, 4), ("HOST", h, 8), 8, 4), 1) == invalid  # src pitch < width
    assert d.cuMemcpy2DAsync(copy_2d(d, ("DEVICE", dev, 0), ("HOST", h, 8), 8, 4), 1) == invalid  # broadcast rows
    assert d.cuMemcpy2DAsync(copy_2d(d, ("DEVICE", dev, 16), ("HOST", h, 4), 8, 4), 1) == invalid  # dst pitch < width
    c = copy_2d(d, ("DEVICE", dev, 16), ("HOST", h, 16), 8, 4)
    c.srcXInBytes = 9
    assert d.cuMemcpy2DAsync(c, 1) == invalid  # the X offset counts against the pitch
    assert d.cuMemcpy2DAsync(copy_2d(d, ("DEVICE", dev, 8192), ("HOST", h, 8), 8, 4), 1) == invalid  # > max pitch
    assert d.cuMemcpy2DAsync(copy_2d(d, ("DEVICE", dev, 16), ("DEVICE", other, 8), 8, 4), 1) == invalid  # intra-device
    assert d.cuMemcpy2DAsync(copy_2d(d, ("DEVICE", dev, 16), ("UNIFIED", other, 8), 8, 4), 1) == invalid
    c = d.CUDA_MEMCPY2D()  # the destination's memory type never set: the real struct starts with type 0
    c.srcMemoryType, c.srcDevice, c.srcPitch, c.dstHost, c.dstPitch = d.CUmemorytype.CU_MEMORYTYPE_DEVICE, dev, 8, h, 8
    c.WidthInBytes, c.Height = 8, 4
    assert d.cuMemcpy2DAsync(c, 1) == invalid
    d.cuCtxSynchronize()
    assert not host.any() and d.read_device(other, 64) == bytes(64)
    assert d.cuMemcpy2DAsync(copy_2d(d, ("DEVICE", dev, 4096), ("HOST", h, 8), 8, 4), 1) == (OK,)  # at the limit
    d.cuCtxSynchronize()
    assert host[:32].tolist() == [b for r in range(4) for b in range(r * 4096 % 256, r * 4096 % 256 + 8)]


def test_memset_and_stream_ordered_allocation(d: CudaDriverDouble) -> None:
    on(d, 0)
    s = d.cuStreamCreate(1)[1]
    p = d.cuMemAllocAsync(16, s)[1]
    assert d.cuMemsetD8Async(p, 9, 16, s) == (OK,)
    d.cuStreamSynchronize(s)
    assert d.read_device(p, 16) == b"\x09" * 16
    assert d.cuMemFreeAsync(p, s) == (OK,)
    d.cuStreamSynchronize(s)
    assert d.cuPointerGetAttributes(1, [A.CU_POINTER_ATTRIBUTE_MEMORY_TYPE], p) == (OK, [0])  # gone


def test_a_slow_copy_delay_applies_to_every_async_copy(d: CudaDriverDouble) -> None:
    on(d, 0)
    d.set_copy_delay(0.2)
    a, b = np.ones(4), np.zeros(4)
    gate = threading.Event()
    d.launch(1, lambda: gate.wait(10))  # the copy cannot start before the gate opens
    d.cuMemcpyAsync(b.ctypes.data, a.ctypes.data, 32, 1)
    assert (b == 0).all()  # asynchronous: nothing copied at the call
    t0 = time.monotonic()
    gate.set()
    d.cuStreamSynchronize(1)
    assert (b == 1).all() and time.monotonic() - t0 >= 0.2  # the copy waited its delay once it could start
    ctypes.memset(b.ctypes.data, 0, 32)


def test_device_memory_is_finite_per_device_and_freeing_gives_it_back() -> None:
    d = CudaDriverDouble(2, device_memory_bytes=1 << 20)
    assert d.cuInit(0) == (OK,)
    try:
        on(d, 0)
        err, a = d.cuMemAlloc(768 << 10)
        assert err == OK and d.device_memory_in_use(0) == 768 << 10
        assert d.cuMemAlloc(512 << 10) == (CUresult.CUDA_ERROR_OUT_OF_MEMORY, None)  # over the capacity
        assert d.cuMemAllocManaged(512 << 10, d.CU_MEM_ATTACH_GLOBAL) == (CUresult.CUDA_ERROR_OUT_OF_MEMORY, None)
        assert d.cuMemAllocAsync(512 << 10, 0) == (CUresult.CUDA_ERROR_OUT_OF_MEMORY, None)
        err, b = d.cuMemAlloc(256 << 10)  # exactly what is left
        assert err == OK
        on(d, 1)  # each device has its own memory
        err, c = d.cuMemAlloc(1 << 20)
        assert err == OK and d.device_memory_in_use(1) == 1 << 20
        assert d.cuMemFree(c) == (OK,)
        on(d, 0)
        assert d.cuMemFree(a) == (OK,) and d.device_memory_in_use(0) == 256 << 10
        err, s = d.cuStreamCreate(0)
        err, e = d.cuMemAllocAsync(768 << 10, s)
        assert err == OK
        assert d.cuMemFreeAsync(e, s) == (OK,) and d.cuStreamSynchronize(s) == (OK,)
        assert d.device_memory_in_use(0) == 1 << 20  # the pool keeps the freed block: still in use on the device
        err, f = d.cuMemAlloc(512 << 10)  # does not fit beside it: the pool gives back its idle block first
        assert err == OK and d.device_memory_in_use(0) == (256 + 512) << 10
        assert d.cuMemFree(f) == (OK,) and d.cuMemFree(b) == (OK,) and d.device_memory_in_use(0) == 0
    finally:
        d.close()


def test_pinned_memory_is_finite_when_a_capacity_is_given() -> None:
    d = CudaDriverDouble(1, pinned_memory_bytes=64 << 10)
    assert d.cuInit(0) == (OK,)
    try:
        on(d, 0)
        err, p = d.cuMemHostAlloc(48 << 10, 0)
        assert err == OK
        assert d.cuMemHostAlloc(32 << 10, 0) == (CUresult.CUDA_ERROR_OUT_OF_MEMORY, None)
        assert d.cuMemFreeHost(p) == (OK,)
        err, p = d.cuMemHostAlloc(64 << 10, 0)
        assert err == OK and d.cuMemFreeHost(p) == (OK,)
    finally:
        d.close()
    assert CudaDriverDouble(1).pinned_memory_bytes is None  # unbounded unless asked
    assert CudaDriverDouble(1).device_memory_bytes > 0  # finite by default


def test_a_sticky_error_poisons_its_context_until_it_is_cleared(d: CudaDriverDouble) -> None:
    ctx0 = on(d, 0)
    err, ptr = d.cuMemAlloc(64)
    err, s = d.cuStreamCreate(0)
    err, ev = d.cuEventCreate(0)
    d.fault(ctx0)
    bad = CUresult.CUDA_ERROR_ILLEGAL_ADDRESS
    assert d.cuMemAlloc(64) == (bad, None)
    assert d.cuMemcpyAsync(ptr, ptr, 8, s) == (bad,)
    assert d.cuEventRecord(ev, s) == (bad,)
    assert d.cuEventSynchronize(ev) == (bad,) and d.cuEventQuery(ev) == (bad,)
    assert d.cuStreamSynchronize(s) == (bad,) and d.cuCtxSynchronize() == (bad,)
    assert d.cuMemFree(ptr) == (bad,)
    assert d.cuCtxGetCurrent() == (OK, ctx0)  # context management still works, as on hardware
    on(d, 1)  # another device's context is not touched
    err, other = d.cuMemAlloc(64)
    assert err == OK and d.cuMemFree(other) == (OK,)
    d.clear_fault(0)  # what a reset does (the primary context of device 0)
    on(d, 0)
    assert d.cuMemFree(ptr) == (OK,)


def test_a_faulting_kernel_is_reported_by_the_syncs_after_it(d: CudaDriverDouble) -> None:
    on(d, 0)
    err, s = d.cuStreamCreate(0)
    err, before = d.cuEventCreate(0)
    assert d.cuEventRecord(before, s) == (OK,)
    gate = threading.Event()
    d.launch(s, lambda: gate.wait(10))  # the faulting kernel cannot run before the gate opens
    d.launch(s, lambda: None, delay=0.05, fault=True)  # (the delay: a sync that did not wait would see no fault)
    err, after = d.cuEventCreate(0)
    assert d.cuEventRecord(after, s) == (OK,)  # the fault has not happened yet: the call succeeds
    gate.set()
    bad = CUresult.CUDA_ERROR_ILLEGAL_ADDRESS
    assert d.cuEventSynchronize(after) == (bad,)  # the wait ends with the kernel's error
    assert d.cuStreamSynchronize(s) == (bad,)
    err, dead = d.cuMemAlloc(8)
    assert (err, dead) == (bad, None)


def test_an_event_is_recorded_only_on_a_stream_of_its_context_and_waited_on_from_any(d: CudaDriverDouble) -> None:
    # cuEventRecord: event and stream from the same context; cuStreamWaitEvent: "hEvent may be from a different
    # context or device than hStream" (CUDA driver API).
    on(d, 0)
    event = d.cuEventCreate(0)[1]
    s0 = d.cuStreamCreate(0)[1]
    on(d, 1)
    s1 = d.cuStreamCreate(0)[1]
    assert d.cuEventRecord(event, s1) == (CUresult.CUDA_ERROR_INVALID_HANDLE,)
    assert d.cuEventRecord(event, 1) == (CUresult.CUDA_ERROR_INVALID_HANDLE,)  # the legacy stream of GPU 1
    assert d.cuEventRecord(event, s0) == (OK,)
    assert d.cuStreamWaitEvent(s1, event, 0) == (OK,) and d.cuStreamSynchronize(s1) == (OK,)


# -- issue 33, section 3: as strict as CUDA where the double was more lenient ----------------------------------------


def test_destroyed_stream_and_event_handles_are_handed_out_again(d: CudaDriverDouble) -> None:
    # CUDA calls a destroyed handle undefined and may give it to the next stream or event created: code that keeps
    # using one then works on someone else's stream, which the double makes happen every time.
    on(d, 0)
    s = d.cuStreamCreate(0)[1]
    assert d.cuStreamDestroy(s) == (OK,)
    assert d.cuStreamQuery(s) == (CUresult.CUDA_ERROR_INVALID_HANDLE,)  # until the handle is reused
    t = d.cuStreamCreate(1)[1]
    assert int(t) == int(s) and d.cuStreamQuery(s) == (OK,)  # the old handle now names the new stream
    e = d.cuEventCreate(0)[1]
    assert d.cuEventDestroy(e) == (OK,)
    assert d.cuEventQuery(e) == (CUresult.CUDA_ERROR_INVALID_HANDLE,)
    f = d.cuEventCreate(0)[1]
    assert int(f) == int(e)
    assert d.cuStreamDestroy(t) == (OK,) and d.cuEventDestroy(f) == (OK,)


@pytest.mark.parametrize("synced", ["legacy", "blocking"])
def test_synchronizing_a_stream_waits_for_the_work_in_that_stream_only(synced: str) -> None:
    # cuStreamSynchronize "waits until the device has completed all operations in the stream"; the legacy default
    # stream orders itself after the blocking streams when an action is queued on it (a launch, an event wait), and
    # a blocking stream's action after the legacy stream's work queued before it. A synchronize queues no action:
    # work queued on the other stream after the last ordering point is not waited for.
    with CudaDriverDouble(1, lazy=600.0) as d:
        assert d.cuInit(0) == (OK,)
        on(d, 0)
        s = d.cuStreamCreate(0)[1]
        log: list[str] = []
        first, other = (1, s) if synced == "legacy" else (s, 1)
        d.launch(first, lambda: log.append("in the stream"))
        d.launch(other, lambda: log.append("on the other stream, after it"))
        assert d.cuStreamSynchronize(first) == (OK,)
        assert log == ["in the stream"]
        assert d.cuCtxSynchronize() == (OK,)
        assert log == ["in the stream", "on the other stream, after it"]


def test_copies_past_the_end_of_an_allocation_are_refused_inside_its_last_page(d: CudaDriverDouble) -> None:
    # The double maps whole pages, so bytes past an allocation's end read and write without a fault; a copy that
    # touches them is refused (CUDA_ERROR_INVALID_VALUE, nothing copied), where a GPU may corrupt a neighbour.
    on(d, 0)
    s = d.cuStreamCreate(0)[1]
    dev = int(d.cuMemAlloc(100)[1])
    pinned = int(d.cuMemHostAlloc(100, 0)[1])
    host = np.zeros(256, np.uint8)
    bad = CUresult.CUDA_ERROR_INVALID_VALUE
    assert d.cuMemcpyAsync(host.ctypes.data, dev, 101, s) == (bad,)  # reads one byte past the end
    assert d.cuMemcpyAsync(dev + 50, host.ctypes.data, 51, s) == (bad,)  # writes one byte past it
    assert d.cuMemcpyAsync(dev + 100, host.ctypes.data, 1, s) == (bad,)  # starts past it, inside the page
    assert d.cuMemcpyAsync(dev, pinned, 101, s) == (bad,)  # past the end of pinned memory
    assert d.cuMemsetD8Async(dev + 90, 7, 11, s) == (bad,)
    rows = ("DEVICE", dev, 31), ("HOST", host.ctypes.data, 10)  # rows at 0, 31, 62, 93: the fourth ends at 103
    assert d.cuMemcpy2DAsync(copy_2d(d, *rows, 10, 4), s) == (bad,)
    assert d.cuMemcpy2DAsync(copy_2d(d, *rows, 10, 3), s) == (OK,)
    assert d.cuMemcpyAsync(dev, host.ctypes.data, 100, s) == (OK,)  # the whole allocation, exactly
    assert d.cuMemsetD8Async(dev + 90, 7, 10, s) == (OK,)
    assert d.cuStreamSynchronize(s) == (OK,)
    assert len(d.refused) == 6 and all("past the end" in why for _call, why in d.refused)


def test_an_eager_double_has_run_every_operation_when_its_call_returns() -> None:
    with CudaDriverDouble(1, eager=True) as d:
        assert d.cuInit(0) == (OK,)
        on(d, 0)
        s = d.cuStreamCreate(1)[1]
        log: list[str] = []
        d.launch(s, lambda: log.append("kernel"), delay=0.05)
        assert log == ["kernel"] and d.cuStreamQuery(s) == (OK,)
        e = d.cuEventCreate(0)[1]
        assert d.cuEventRecord(e, s) == (OK,) and d.cuEventQuery(e) == (OK,)  # a query never finds work pending
