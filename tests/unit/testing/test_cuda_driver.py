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
    d.launch(s, lambda: log.append(1), delay=0.1)
    d.launch(s, lambda: log.append(2))
    assert d.cuStreamQuery(s) == (CUresult.CUDA_ERROR_NOT_READY,)
    assert d.cuStreamSynchronize(s) == (OK,) and log == [1, 2]
    assert d.cuStreamQuery(s) == (OK,)
    assert d.cuStreamGetCtx(s)[1] == d.cuCtxGetCurrent()[1]
    assert d.cuStreamDestroy(s) == (OK,) and d.cuStreamSynchronize(s) == (CUresult.CUDA_ERROR_INVALID_HANDLE,)


def test_freeing_memory_waits_for_the_work_that_uses_it(d: CudaDriverDouble) -> None:
    # cuMemFree / cuMemFreeHost synchronize, as cudaFree does: a kernel still writing is not cut off.
    on(d, 0)
    s = d.cuStreamCreate(d.CUstream_flags.CU_STREAM_NON_BLOCKING)[1]
    dptr = d.cuMemAlloc(64)[1]
    host = d.cuMemHostAlloc(64, 0)[1]
    done: list[str] = []
    d.kernel_write(s, dptr, b"x" * 64, delay=0.2)
    d.launch(s, lambda: done.append("kernel"))
    assert d.cuMemFree(dptr) == (OK,) and done == ["kernel"]
    d.launch(s, lambda: done.append("second"), delay=0.2)
    assert d.cuMemFreeHost(host) == (OK,) and done == ["kernel", "second"]


@pytest.mark.parametrize(("flags", "waits"), [(0, True), (1, False)], ids=["blocking", "non-blocking"])
def test_the_legacy_stream_orders_blocking_streams_only(d: CudaDriverDouble, flags: int, waits: bool) -> None:
    on(d, 0)
    s = d.cuStreamCreate(flags)[1]
    dev = int(d.cuMemAlloc(8)[1])
    d.write_device(dev, bytes(8))
    d.kernel_write(1, dev, b"\x07" * 8, delay=0.2)  # a slow kernel on the legacy default stream
    host = np.zeros(8, np.uint8)
    d.cuMemcpyAsync(host.ctypes.data, dev, 8, s)
    d.cuStreamSynchronize(s)
    assert (host == 7).all() if waits else (host == 0).all()
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
    d.launch(2, lambda: log.append("main"), delay=0.3)

    def other() -> None:
        d.cuCtxSetCurrent(ctx)
        d.launch(2, lambda: log.append("other"))
        d.cuStreamSynchronize(2)  # this thread's own stream: does not wait for the main thread's

    t = threading.Thread(target=other)
    t.start()
    t.join()
    assert log == ["other"]
    d.cuStreamSynchronize(2)
    assert log == ["other", "main"]


def test_events_and_stream_wait_event_order_two_streams(d: CudaDriverDouble) -> None:
    on(d, 0)
    producer, consumer = (d.cuStreamCreate(1)[1] for _ in range(2))
    ev = d.cuEventCreate(d.CUevent_flags.CU_EVENT_DISABLE_TIMING)[1]
    assert d.cuEventQuery(ev) == (OK,)  # never recorded: complete
    log: list[str] = []
    d.launch(producer, lambda: log.append("produced"), delay=0.2)
    assert d.cuEventRecord(ev, producer) == (OK,)
    assert d.cuEventQuery(ev) == (CUresult.CUDA_ERROR_NOT_READY,)
    assert d.cuStreamWaitEvent(consumer, ev, 0) == (OK,)
    d.launch(consumer, lambda: log.append("consumed"))
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
    d.kernel_write(producer, dev, b"\x05" * 8, delay=0.2)
    stale, fresh = np.zeros(8, np.uint8), np.zeros(8, np.uint8)
    d.cuMemcpyAsync(stale.ctypes.data, dev, 8, other)
    d.cuMemcpyAsync(fresh.ctypes.data, dev, 8, producer)
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
    t0 = time.monotonic()
    d.cuMemcpyAsync(b.ctypes.data, a.ctypes.data, 32, 1)
    assert (b == 0).all()
    d.cuStreamSynchronize(1)
    assert (b == 1).all() and time.monotonic() - t0 >= 0.2
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
        assert d.device_memory_in_use(0) == 256 << 10  # a stream-ordered free gives it back once it has run
        assert d.cuMemFree(b) == (OK,) and d.device_memory_in_use(0) == 0
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
    d.launch(s, lambda: None, delay=0.05, fault=True)
    err, after = d.cuEventCreate(0)
    assert d.cuEventRecord(after, s) == (OK,)  # the fault has not happened yet: the call succeeds
    bad = CUresult.CUDA_ERROR_ILLEGAL_ADDRESS
    assert d.cuEventSynchronize(after) == (bad,)  # the wait ends with the kernel's error
    assert d.cuStreamSynchronize(s) == (bad,)
    err, dead = d.cuMemAlloc(8)
    assert (err, dead) == (bad, None)
