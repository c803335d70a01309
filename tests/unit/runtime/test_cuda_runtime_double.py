"""The real CUDA runtime (cai_mpi._src.runtime.cuda) on the CUDA driver double: probing, status checking,
contexts, pointers, streams, events, copies, allocation and packing, with CUDA's semantics."""

from __future__ import annotations

import gc
import threading
from collections.abc import Callable
from typing import Any

import numpy as np
import pytest

from cai_mpi._src.core.descriptor import CAIDescriptor
from cai_mpi._src.errors import CudaError, RuntimeUnavailableError, StreamError
from cai_mpi._src.runtime import cudadriver
from cai_mpi._src.runtime.base import HOST, Location, MemoryKind
from cai_mpi._src.runtime.cuda import CudaEvent, CudaRuntime
from cai_mpi._src.runtime.cudadriver import check, classify_pointer, error_text, probe
from cai_mpi.testing import CudaDriverDouble

CUresult = CudaDriverDouble.CUresult


@pytest.fixture
def d(make_double: Callable[..., CudaDriverDouble]) -> CudaDriverDouble:
    return make_double(2)


@pytest.fixture
def rt(d: CudaDriverDouble) -> CudaRuntime:
    return CudaRuntime(1, driver=d)  # (not GPU 0: a call that forgets its device shows)


def current_ordinal(d: CudaDriverDouble) -> int | None:
    _err, ctx = d.cuCtxGetCurrent()
    return None if int(ctx) == 0 else d.ordinal_of(int(ctx))


def calls(d: CudaDriverDouble, name: str) -> list[tuple[str, int]]:
    return [c for c in d.calls if c[0] == name]


# -- probe and status checking ----------------------------------------------------------------------------------


def test_probe_usable_creates_no_context(d: CudaDriverDouble) -> None:
    assert probe() == (True, "2 CUDA device(s), driver CUDA 12.9")
    assert not calls(d, "cuDevicePrimaryCtxRetain") and current_ordinal(d) is None
    assert cudadriver.visible_device_count() == 2


def test_probe_reasons(d: CudaDriverDouble, monkeypatch: pytest.MonkeyPatch) -> None:
    d.fail_next("cuInit", CUresult.CUDA_ERROR_NO_DEVICE)
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "")
    assert probe() == (False, "the NVIDIA driver sees no CUDA device (CUDA_VISIBLE_DEVICES='')")
    d.fail_next("cuInit", CUresult.CUDA_ERROR_INVALID_DEVICE)
    assert "cuInit failed with CUDA_ERROR_INVALID_DEVICE (101)" in probe()[1]
    d.devices = 0
    assert probe() == (False, "the NVIDIA driver reports 0 CUDA devices")

    def missing() -> Any:
        raise ImportError("No module named 'cuda'")

    monkeypatch.setattr(cudadriver, "load_driver", missing)
    usable, reason = probe()
    assert not usable and "cuda-python is not installed" in reason and "cai_mpi[cuda12]" in reason
    assert cudadriver.visible_device_count() == 0


def test_probe_on_this_machine_never_raises() -> None:
    usable, reason = probe()
    if usable:
        pytest.skip(f"a GPU is usable here: {reason}")
    assert any(why in reason for why in ("cuda-python is not installed", "NVIDIA driver")), reason


def test_check_reads_the_status_not_the_tuple(d: CudaDriverDouble) -> None:
    d.cuInit(0)
    assert check(d, "cuDeviceGetCount") == (2,)
    d.fail_next("cuStreamSynchronize", CUresult.CUDA_ERROR_INVALID_HANDLE)
    with pytest.raises(CudaError) as info:
        check(d, "cuStreamSynchronize", 1)  # a truthy 1-tuple
    assert (info.value.call, info.value.code, info.value.name) == ("cuStreamSynchronize", 400,
                                                                   "CUDA_ERROR_INVALID_HANDLE")
    with pytest.raises(CudaError, match="cuNoSuchCall is not provided by this cuda-python"):
        check(d, "cuNoSuchCall")
    assert error_text(d, CUresult.CUDA_ERROR_NOT_READY)[0] == "CUDA_ERROR_NOT_READY"


def test_real_bindings_without_a_driver() -> None:
    driver = pytest.importorskip("cuda.bindings.driver", reason="cuda-python is not installed")
    if probe()[0]:
        pytest.skip("a GPU driver is present")
    assert error_text(driver, driver.CUresult.CUDA_ERROR_INVALID_HANDLE)[0] == "CUDA_ERROR_INVALID_HANDLE"
    with pytest.raises(CudaError, match="cuInit could not run") as info:
        check(driver, "cuInit", 0)
    assert isinstance(info.value.__cause__, RuntimeError)


@pytest.mark.parametrize("ordinal", [-1, True, 1.0])
def test_runtime_rejects_bad_ordinals(d: CudaDriverDouble, ordinal: Any) -> None:
    with pytest.raises(ValueError, match="ordinal must be a non-negative int"):
        CudaRuntime(ordinal, driver=d)


def test_runtime_needs_cuda_python(monkeypatch: pytest.MonkeyPatch) -> None:
    def missing() -> Any:
        raise ImportError("No module named 'cuda'")

    monkeypatch.setattr("cai_mpi._src.runtime.cuda.load_driver", missing)
    with pytest.raises(RuntimeUnavailableError, match="needs cuda-python"):
        CudaRuntime(0)


# -- contexts: the caller's current context is what it was after every call --------------------------------------


def test_construction_makes_no_cuda_call(rt: CudaRuntime, d: CudaDriverDouble) -> None:
    assert d.calls == []
    assert rt.current_device() == 1  # no device current in this thread: the rank's


def test_a_call_leaves_no_context_current_where_there_was_none(rt: CudaRuntime, d: CudaDriverDouble) -> None:
    """Defect: the first call from a thread made the rank's GPU current and left it so: later CuPy or PyTorch
    allocations of the caller moved to another device."""
    rt.sync_stream(1, None)
    rt.create_stream(0)
    assert current_ordinal(d) is None
    seen: list[int | None] = []

    def worker() -> None:
        rt.sync_device(None)
        seen.append(current_ordinal(d))

    t = threading.Thread(target=worker)
    t.start()
    t.join()
    assert seen == [None]


def test_the_callers_context_is_restored(rt: CudaRuntime, d: CudaDriverDouble) -> None:
    d.cuInit(0)
    d.cuCtxSetCurrent(d.cuDevicePrimaryCtxRetain(0)[1])  # the caller works on GPU 0; the rank's GPU is 1
    rt.sync_device(None)
    buf = rt.alloc_device(64, 1)
    rt.locate(buf.ptr)
    assert [c[1] for c in calls(d, "cuCtxSynchronize")] == [d.context_of(1)]
    assert [c[1] for c in calls(d, "cuMemAllocAsync")] == [d.context_of(1)]
    assert current_ordinal(d) == 0


def test_primary_contexts_are_retained_once_per_process(rt: CudaRuntime, d: CudaDriverDouble) -> None:
    for _ in range(3):
        rt.sync_device(0)
        rt.sync_device(1)
    assert (d.retained(0), d.retained(1)) == (1, 1) and len(calls(d, "cuInit")) == 1


def test_invalid_ordinal_is_explained(d: CudaDriverDouble) -> None:
    with pytest.raises(StreamError, match=r"GPU 5 is not usable by this process.*CUDA_VISIBLE_DEVICES"):
        CudaRuntime(5, driver=d).sync_device(None)


# -- pointers ----------------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("memory_type", "managed", "ordinal", "expected"),
    [(0, False, 0, HOST), (1, False, 1, Location(MemoryKind.HOST, 1)), (2, False, 1, Location(MemoryKind.DEVICE, 1)),
     (2, True, 0, Location(MemoryKind.MANAGED, 0)), (4, False, -2, Location(MemoryKind.MANAGED, 7))],
)
def test_classify_pointer(memory_type: int, managed: bool, ordinal: int, expected: Location) -> None:
    assert classify_pointer(memory_type, managed, ordinal, 7) == expected


def test_locate_every_kind_of_memory(rt: CudaRuntime, d: CudaDriverDouble) -> None:
    dev = rt.alloc_device(64, 0)
    pinned = rt.alloc_pinned(64)
    assert rt.locate(dev.ptr + 8) == Location(MemoryKind.DEVICE, 0)
    assert rt.locate(pinned.ptr) == Location(MemoryKind.HOST, 1)  # pinned: a kernel on GPU 1 may write it
    assert rt.locate(np.zeros(3).ctypes.data) == HOST
    assert rt.locate(0) == Location(MemoryKind.DEVICE, 1)  # zero-size arrays: the rank's GPU


def test_host_memory_mapped_at_a_device_alias_is_read_at_its_host_address(rt: CudaRuntime, d: CudaDriverDouble) -> None:
    """Defect: memory type HOST (registered, mapped pinned memory) was read at the address the exporter gave,
    a device alias the host cannot touch; CU_POINTER_ATTRIBUTE_HOST_POINTER says where the host reads it."""
    d.cuInit(0)
    d.cuCtxPushCurrent(d.cuDevicePrimaryCtxRetain(1)[1])
    host = d.cuMemHostAlloc(64, d.CU_MEMHOSTALLOC_DEVICEMAP)[1]
    alias = int(d.cuMemHostGetDevicePointer(host, 0)[1])
    d.cuCtxPopCurrent()
    where = rt.locate(alias + 16)
    assert where.kind is MemoryKind.HOST and where.host_address == host + 16


def test_locate_error_names_the_pointer(rt: CudaRuntime, d: CudaDriverDouble) -> None:
    rt.sync_device(None)
    d.fail_next("cuPointerGetAttributes", CUresult.CUDA_ERROR_INVALID_VALUE)
    with pytest.raises(CudaError, match="cannot classify pointer 0xdead00"):
        rt.locate(0xDEAD00)


# -- streams and events -------------------------------------------------------------------------------------------


def test_sync_stream_waits_for_a_pending_kernel(rt: CudaRuntime, d: CudaDriverDouble) -> None:
    buf = rt.alloc_device(8, 1)
    d.cuCtxPushCurrent(d.context_of(1))  # (the double's hooks act in the current context)
    d.kernel_write(2, buf.ptr, b"\x01" * 8, delay=0.2)  # this thread's per-thread default stream
    d.cuCtxPopCurrent()
    rt.sync_stream(2, 1)
    assert d.read_device(buf.ptr, 8) == b"\x01" * 8


@pytest.mark.parametrize("handle", [0, -3, True, 1.5, "1"])
def test_sync_stream_refuses_non_handles_without_calling_cuda(rt: CudaRuntime, d: CudaDriverDouble,
                                                              handle: Any) -> None:
    with pytest.raises(StreamError, match="CAI v3 handles are positive ints"):
        rt.sync_stream(handle, None)
    assert not calls(d, "cuStreamSynchronize")


def test_sync_stream_invalid_handle_says_which_and_why(rt: CudaRuntime, d: CudaDriverDouble) -> None:
    with pytest.raises(StreamError) as info:
        rt.sync_stream(0x7F00DEAD, 1)
    text = str(info.value)
    assert "stream 0x7f00dead on GPU 1 cannot be synchronized" in text and "CUDA_ERROR_INVALID_HANDLE (400)" in text
    assert "destroyed the stream" in text


def test_sync_device_failure_is_a_stream_error(rt: CudaRuntime, d: CudaDriverDouble) -> None:
    rt.sync_device(0)
    d.fail_next("cuCtxSynchronize", CUresult.CUDA_ERROR_ILLEGAL_ADDRESS)
    with pytest.raises(StreamError, match=r"GPU 0 cannot be synchronized.*ILLEGAL_ADDRESS"):
        rt.sync_device(0)


def test_streams_events_and_waits(rt: CudaRuntime, d: CudaDriverDouble) -> None:
    s = rt.create_stream(0)
    producer = d.cuStreamCreate  # (a producer stream of the user, on GPU 0)
    d.cuCtxPushCurrent(d.context_of(0))
    user = int(producer(1)[1])
    d.cuCtxPopCurrent()
    log: list[str] = []
    gate = threading.Event()
    d.cuCtxPushCurrent(d.context_of(0))
    d.launch(s.handle, lambda: gate.wait(10))  # cai_mpi's stream is held until the gate opens
    # (the delay: a producer that did not wait for the event would write first)
    d.launch(s.handle, lambda: log.append("cai_mpi's copy"), delay=0.2)
    d.cuCtxPopCurrent()
    ev = rt.record_event(s)
    assert isinstance(ev, CudaEvent) and ev.query() is False
    rt.stream_wait_event(user, ev, 0)  # the producer may not run ahead of cai_mpi's work
    d.cuCtxPushCurrent(d.context_of(0))
    d.launch(user, lambda: log.append("producer writes again"))
    d.cuCtxPopCurrent()
    assert ev.query() is False and log == []
    gate.set()
    rt.sync_stream(user, 0)
    assert log == ["cai_mpi's copy", "producer writes again"] and ev.query() is True
    with pytest.raises(TypeError, match="needs a stream from create_stream"):
        rt.record_event(object())  # type: ignore[arg-type]


def test_copy_async_between_host_and_device(rt: CudaRuntime, d: CudaDriverDouble) -> None:
    s = rt.create_stream(1)
    buf = rt.alloc_device(32, 1)
    src, dst = np.arange(4.0), np.zeros(4)
    rt.copy_async(buf.ptr, src.ctypes.data, 32, s)
    rt.copy_async(dst.ctypes.data, buf.ptr, 32, s)
    s.synchronize()
    assert dst.tolist() == [0.0, 1.0, 2.0, 3.0]


def test_allocations_are_freed(rt: CudaRuntime, d: CudaDriverDouble) -> None:
    dev = rt.alloc_device(4096, 0)
    assert rt.alloc_device(0, 0).ptr == 0
    pinned = rt.alloc_pinned(10_000)
    assert d.pinned_bytes_outstanding == 10_000 and pinned.array.shape == (10_000,)
    ptr = dev.ptr
    dev.free()
    del pinned
    gc.collect()
    assert d.pinned_bytes_outstanding == 0
    assert rt.locate(ptr) == HOST  # the device block is gone


# -- packing strided device arrays without CuPy --------------------------------------------------------------------


@pytest.mark.parametrize("kind", ["transposed", "every-other-column", "reversed-rows", "3d-slice"])
def test_pack_and_unpack_with_the_driver(rt: CudaRuntime, d: CudaDriverDouble, kind: str) -> None:
    base = np.arange(6 * 8 * 5, dtype="<i4").reshape(6, 8, 5)
    view = {"transposed": base[0].T, "every-other-column": base[1, :, ::2], "reversed-rows": base[2, ::-1],
            "3d-slice": base[1:5:2, ::3, 1:4]}[kind]
    buf = rt.alloc_device(base.nbytes, 1)
    d.write_device(buf.ptr, base.tobytes())
    offset = view.__array_interface__["data"][0] - base.ctypes.data
    desc = CAIDescriptor(ptr=buf.ptr + offset, shape=view.shape, typestr="<i4", strides=view.strides)
    s = rt.create_stream(1)
    packed = rt.pack(desc, 1, s)
    s.synchronize()
    assert d.read_device(packed.ptr, view.nbytes) == np.ascontiguousarray(view).tobytes()
    d.write_device(buf.ptr, bytes(base.nbytes))
    rt.unpack(packed.ptr, desc, 1, s)
    s.synchronize()
    after = np.frombuffer(d.read_device(buf.ptr, base.nbytes), "<i4").reshape(base.shape)
    expected = np.zeros_like(base)
    expected.reshape(-1).view(np.uint8)  # (same layout)
    np.lib.stride_tricks.as_strided(expected.reshape(-1)[offset // 4:], view.shape, view.strides)[...] = view
    assert after.tobytes() == expected.tobytes()
