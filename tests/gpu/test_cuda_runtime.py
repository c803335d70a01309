"""CudaRuntime on a real GPU: pointer classification, stream sync, allocation, copies and packing."""

from __future__ import annotations

import threading
import warnings
from collections.abc import Iterator
from typing import Any

import numpy as np
import pytest

from cai_mpi._src.core.descriptor import CAIDescriptor, describe
from cai_mpi._src.runtime import cuda as cuda_rt
from cai_mpi._src.runtime import cudadriver
from cai_mpi._src.runtime.base import HOST, DeviceBuffer, Location, MemoryKind
from cai_mpi._src.runtime.cuda import CudaRuntime
from cai_mpi._src.runtime.cudadriver import probe

USABLE, REASON = probe()

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not USABLE, reason=f"no usable CUDA GPU: {REASON}"),
]

DEVICE0 = Location(MemoryKind.DEVICE, 0)
PINNED0 = Location(MemoryKind.HOST, 0)  # pinned host memory, allocated against GPU 0


def _import(name: str) -> Any:
    """importorskip, with import-time warnings of third-party GPU stacks kept out of filterwarnings=error."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return pytest.importorskip(name)


@pytest.fixture(params=["cupy", "driver"])
def alloc_rt(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> Iterator[CudaRuntime]:
    """The runtime once with CuPy's pools and once with plain cuMemAlloc / cuMemHostAlloc."""
    if request.param == "cupy":
        _import("cupy")
    else:
        monkeypatch.setattr(cuda_rt, "load_cupy", lambda: None)
    yield CudaRuntime(0)


def _as_cupy(cp: Any, buf: DeviceBuffer, shape: tuple[int, ...], dtype: Any) -> Any:
    mem = cp.cuda.UnownedMemory(buf.ptr, buf.nbytes, buf, buf.ordinal)
    return cp.ndarray(shape, dtype, memptr=cp.cuda.MemoryPointer(mem, 0))


def _host_bytes(arr: np.ndarray[Any, Any]) -> bytes:
    return np.ascontiguousarray(arr).tobytes()


# -- devices and pointers --------------------------------------------------------------


def test_probe_and_device_count(rt: CudaRuntime) -> None:
    assert USABLE, REASON
    assert rt.device_count() >= 1
    assert rt.current_device() == 0


def test_locate_cupy_device_array(rt: CudaRuntime, cp: Any) -> None:
    a = cp.arange(16, dtype=cp.float64)
    assert rt.locate(a.data.ptr) == DEVICE0
    assert rt.locate(a.data.ptr + 8) == DEVICE0  # interior pointers too
    assert rt.locate(describe(a).ptr) == DEVICE0


def test_locate_host_memory(rt: CudaRuntime) -> None:
    host = np.arange(16)
    assert rt.locate(host.ctypes.data) == HOST  # pageable: unknown to CUDA
    pinned = rt.alloc_pinned(4096)
    assert rt.locate(pinned.ptr) == PINNED0  # pinned: known to GPU 0's context, which a kernel may write through


def test_locate_cupy_pinned_and_managed(rt: CudaRuntime, cp: Any) -> None:
    cupyx = _import("cupyx")
    pinned = cupyx.empty_pinned((16,), np.float32)
    assert rt.locate(pinned.ctypes.data) == PINNED0
    managed = cp.cuda.malloc_managed(4096)
    assert rt.locate(managed.ptr) == Location(MemoryKind.MANAGED, 0)


def test_locate_null_pointer(rt: CudaRuntime) -> None:
    assert rt.locate(0) == DEVICE0


def test_locate_on_a_second_gpu(rt: CudaRuntime, cp: Any) -> None:
    if rt.device_count() < 2:
        pytest.skip("needs two GPUs")
    with cp.cuda.Device(1):
        b = cp.zeros(4)
    assert rt.locate(b.data.ptr) == Location(MemoryKind.DEVICE, 1)


def test_calls_from_other_threads_leave_no_context_behind(rt: CudaRuntime, cp: Any) -> None:
    a = cp.zeros(8)
    drv = cudadriver.load_driver()
    seen: list[Any] = []

    def worker() -> None:  # a fresh thread has no current context, and must have none afterwards
        seen.append(rt.locate(a.data.ptr))
        seen.append(int(cudadriver.check(drv, "cuCtxGetCurrent")[0]))

    t = threading.Thread(target=worker)
    t.start()
    t.join()
    assert seen == [DEVICE0, 0]


def test_the_callers_device_stays_current(rt: CudaRuntime, cp: Any) -> None:
    if rt.device_count() < 2:
        pytest.skip("needs two GPUs")
    with cp.cuda.Device(1):
        rt.alloc_device(64, 0).free()
        rt.sync_device(0)
        assert cp.cuda.Device().id == 1 and cp.zeros(1).device.id == 1


# -- streams and events ----------------------------------------------------------------


def test_sync_stream_on_special_handles_and_real_streams(rt: CudaRuntime) -> None:
    rt.sync_stream(1, 0)
    rt.sync_stream(2, 0)
    rt.sync_stream(1, None)
    s = rt.create_stream(0)
    rt.sync_stream(s.handle, 0)
    s.synchronize()


def test_sync_stream_waits_for_pending_work(rt: CudaRuntime, cp: Any) -> None:
    producer = cp.cuda.Stream(non_blocking=True)
    with producer:
        a = cp.ones(1 << 22, dtype=cp.float32)
        for _ in range(50):
            a = a * 1.0000001
    rt.sync_stream(producer.ptr, 0)
    assert producer.done
    rt.sync_device(0)
    rt.sync_device(None)


def test_stream_wait_event(rt: CudaRuntime, cp: Any) -> None:
    s = rt.create_stream(0)
    ev = rt.record_event(s)
    consumer = cp.cuda.Stream(non_blocking=True)
    rt.stream_wait_event(consumer.ptr, ev, 0)
    rt.stream_wait_event(1, ev, 0)
    consumer.synchronize()
    assert ev.query()
    ev.synchronize()


# -- allocation and copies ---------------------------------------------------------------


def test_device_and_pinned_round_trip(alloc_rt: CudaRuntime) -> None:
    rt = alloc_rt
    n = (1 << 20) + 3
    src = rt.alloc_pinned(n)
    src.array[:] = np.random.default_rng(1).integers(0, 256, n, dtype=np.uint8)
    dev = rt.alloc_device(n, 0)
    dst = rt.alloc_pinned(n)
    dst.array[:] = 0
    assert rt.locate(dev.ptr) == DEVICE0
    assert rt.locate(src.ptr) == PINNED0
    s = rt.create_stream(0)
    rt.copy_async(dev.ptr, src.ptr, n, s)
    rt.copy_async(dst.ptr, dev.ptr, n, s)
    ev = rt.record_event(s)
    ev.synchronize()
    assert ev.query()
    assert np.array_equal(dst.array, src.array)
    dev.free()
    src.free()
    dst.free()


def test_pageable_host_copies(rt: CudaRuntime) -> None:
    host = np.arange(1000, dtype=np.int64)
    back = np.zeros_like(host)
    dev = rt.alloc_device(host.nbytes, 0)
    s = rt.create_stream(0)
    rt.copy_async(dev.ptr, host.ctypes.data, host.nbytes, s)
    rt.copy_async(back.ctypes.data, dev.ptr, host.nbytes, s)
    s.synchronize()
    assert np.array_equal(back, host)


def test_zero_byte_allocations(alloc_rt: CudaRuntime) -> None:
    rt = alloc_rt
    dev = rt.alloc_device(0, 0)
    pinned = rt.alloc_pinned(0)
    assert (dev.ptr, dev.nbytes, pinned.ptr, pinned.array.size) == (0, 0, 0, 0)
    rt.copy_async(dev.ptr, pinned.ptr, 0, rt.create_stream(0))
    dev.free()


def test_freed_device_buffers_are_reused_from_cupys_pool(rt: CudaRuntime, cp: Any) -> None:
    pool = cp.get_default_memory_pool()
    buf = rt.alloc_device(1 << 20, 0)
    used, total = pool.used_bytes(), pool.total_bytes()
    buf.free()
    assert pool.used_bytes() == used - (1 << 20)  # back in the pool, not in use
    again = rt.alloc_device(1 << 20, 0)
    assert pool.total_bytes() == total  # served from the pool: no new cudaMalloc
    assert pool.used_bytes() == used
    again.free()


# -- packing ----------------------------------------------------------------------------


def _strided_cases(cp: Any) -> dict[str, Any]:
    base = cp.arange(60, dtype=cp.float64).reshape(5, 12)
    return {
        "negative strides": base[::-1, ::2],
        "F order": cp.asfortranarray(cp.arange(24, dtype=cp.int32).reshape(4, 6)),
        "complex, reversed": (cp.arange(30) + 1j * cp.arange(30)).astype(cp.complex128)[::-3],
        "bool, stepped": (cp.arange(20) % 3 == 0)[::2],
        "float16, transposed": cp.arange(12, dtype=cp.float16).reshape(3, 4).T,
        "broadcast": cp.broadcast_to(cp.arange(4, dtype=cp.int16), (3, 4)),
        "0-d": cp.array(3.5),
        "contiguous": cp.arange(10, dtype=cp.uint8),
    }


CASES = [
    "negative strides",
    "F order",
    "complex, reversed",
    "bool, stepped",
    "float16, transposed",
    "broadcast",
    "0-d",
    "contiguous",
]


@pytest.mark.parametrize("case", CASES)
def test_pack_matches_cupy(rt: CudaRuntime, cp: Any, case: str) -> None:
    a = _strided_cases(cp)[case]
    desc = describe(a)
    cp.cuda.Device(0).synchronize()  # the producer ran on CuPy's stream; ours does not wait for it
    s = rt.create_stream(0)
    buf = rt.pack(desc, 0, s)
    s.synchronize()
    assert buf.nbytes == a.nbytes
    assert buf.ptr != desc.ptr  # always a new buffer
    assert rt.locate(buf.ptr) == DEVICE0
    packed = _as_cupy(cp, buf, a.shape, a.dtype)
    assert _host_bytes(cp.asnumpy(packed)) == _host_bytes(cp.asnumpy(a))


@pytest.mark.parametrize(
    ("typestr", "shape", "strides", "offset"),
    [
        ("|V12", (7,), (-24,), 6 * 24),  # a structured type CuPy cannot hold
        (">f4", (5, 3), (24, -4), 8),  # big-endian
        ("<c16", (4,), (40,), 0),
    ],
)
def test_pack_dtypes_cupy_refuses(
    rt: CudaRuntime, cp: Any, typestr: str, shape: tuple[int, ...], strides: tuple[int, ...], offset: int
) -> None:
    raw = cp.arange(256, dtype=cp.uint8)
    desc = CAIDescriptor(ptr=raw.data.ptr + offset, shape=shape, typestr=typestr, strides=strides)
    host = cp.asnumpy(raw)
    expected = np.ndarray(shape, desc.dtype, buffer=host, offset=offset, strides=strides)
    cp.cuda.Device(0).synchronize()
    s = rt.create_stream(0)
    buf = rt.pack(desc, 0, s)
    s.synchronize()
    packed = cp.asnumpy(_as_cupy(cp, buf, (buf.nbytes,), cp.uint8))
    assert packed.tobytes() == _host_bytes(expected)


@pytest.mark.parametrize("layout", ["negative strides", "F order"])
def test_unpack_into_strided_destination(rt: CudaRuntime, cp: Any, layout: str) -> None:
    if layout == "negative strides":
        base = cp.zeros((5, 12), dtype=cp.float64)
        dst = base[::-1, ::2]
        untouched = base[:, 1::2]
    else:
        base = cp.zeros((4, 6), dtype=cp.int32, order="F")
        dst = base
        untouched = cp.zeros(0)
    expected = cp.arange(dst.size, dtype=dst.dtype).reshape(dst.shape) + 1
    packed = cp.ascontiguousarray(expected)
    cp.cuda.Device(0).synchronize()
    s = rt.create_stream(0)
    rt.unpack(packed.data.ptr, describe(dst), 0, s)
    s.synchronize()
    assert np.array_equal(cp.asnumpy(dst), cp.asnumpy(expected))
    assert not cp.asnumpy(untouched).any()


def test_pack_then_unpack_round_trip_on_one_stream(rt: CudaRuntime, cp: Any) -> None:
    src = (cp.arange(7 * 9, dtype=cp.float32).reshape(7, 9) * 1.5)[1::2, ::-3]
    dst_base = cp.zeros((7, 9), dtype=cp.float32)
    dst = dst_base[1::2, ::-3]
    cp.cuda.Device(0).synchronize()
    s = rt.create_stream(0)
    buf = rt.pack(describe(src), 0, s)
    rt.unpack(buf.ptr, describe(dst), 0, s)
    ev = rt.record_event(s)
    ev.synchronize()
    assert np.array_equal(cp.asnumpy(dst), cp.asnumpy(src))


# -- other exporters ------------------------------------------------------------------------


def test_pytorch_tensors_are_located(rt: CudaRuntime) -> None:
    torch = _import("torch")
    if not torch.cuda.is_available():
        pytest.skip("PyTorch has no CUDA here")
    t = torch.arange(12, device="cuda:0", dtype=torch.float32).reshape(3, 4)
    desc = describe(t)
    assert rt.locate(desc.ptr) == DEVICE0
    assert rt.locate(t.t().contiguous().data_ptr()) == DEVICE0
    pinned = torch.empty(16).pin_memory()
    assert rt.locate(pinned.data_ptr()) == PINNED0


def test_pytorch_transposed_tensor_packs(rt: CudaRuntime) -> None:
    torch = _import("torch")
    _import("cupy")
    if not torch.cuda.is_available():
        pytest.skip("PyTorch has no CUDA here")
    t = torch.arange(12, device="cuda:0", dtype=torch.float32).reshape(3, 4).t()
    desc = describe(t)  # CAI v2, no stream: the caller syncs the device
    rt.sync_device(0)
    s = rt.create_stream(0)
    buf = rt.pack(desc, 0, s)
    out = rt.alloc_pinned(buf.nbytes)
    rt.copy_async(out.ptr, buf.ptr, buf.nbytes, s)
    s.synchronize()
    assert out.array.tobytes() == t.contiguous().cpu().numpy().tobytes()


def test_numba_arrays_are_located(rt: CudaRuntime) -> None:
    numba_cuda = _import("numba.cuda")
    if not numba_cuda.is_available():
        pytest.skip("Numba sees no GPU")
    d = numba_cuda.to_device(np.arange(10, dtype=np.float64))
    assert rt.locate(describe(d).ptr) == DEVICE0
    managed = numba_cuda.managed_array(10, dtype=np.float64)
    assert rt.locate(describe(managed).ptr) == Location(MemoryKind.MANAGED, 0)
