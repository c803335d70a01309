"""CudaRuntime without a GPU: probe, status checking, pointer classification and context handling
against a fake cuda-python driver module (the real one only where a test needs it)."""

from __future__ import annotations

import enum
import gc
import threading
from collections.abc import Iterator
from typing import Any

import numpy as np
import pytest

from cai_mpi._src.descriptor import CAIDescriptor
from cai_mpi._src.errors import CudaError, RuntimeUnavailableError, StreamError
from cai_mpi._src.runtime import cuda as cuda_rt
from cai_mpi._src.runtime.base import HOST, Location, MemoryKind, Stream
from cai_mpi._src.runtime.cuda import CudaEvent, CudaRuntime, byte_view, classify_pointer, probe

# -- a fake cuda.bindings.driver ---------------------------------------------------


class FakeCUresult(enum.IntEnum):
    CUDA_SUCCESS = 0
    CUDA_ERROR_INVALID_VALUE = 1
    CUDA_ERROR_NOT_INITIALIZED = 3
    CUDA_ERROR_NO_DEVICE = 100
    CUDA_ERROR_INVALID_DEVICE = 101
    CUDA_ERROR_INVALID_HANDLE = 400
    CUDA_ERROR_NOT_READY = 600
    CUDA_ERROR_ILLEGAL_ADDRESS = 700


class FakeCUpointer_attribute(enum.IntEnum):
    CU_POINTER_ATTRIBUTE_MEMORY_TYPE = 2
    CU_POINTER_ATTRIBUTE_IS_MANAGED = 8
    CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL = 9


class FakeCUstream_flags(enum.IntEnum):
    CU_STREAM_DEFAULT = 0
    CU_STREAM_NON_BLOCKING = 1


class FakeCUevent_flags(enum.IntEnum):
    CU_EVENT_DEFAULT = 0
    CU_EVENT_DISABLE_TIMING = 2


OK = FakeCUresult.CUDA_SUCCESS
CTX_BASE = 0x1000  # fake primary context of device d is CTX_BASE + d


class FakeDriver:
    """Enough of cuda.bindings.driver: tuple returns, enum-typed arguments, per-thread current context."""

    CUresult = FakeCUresult
    CUpointer_attribute = FakeCUpointer_attribute
    CUstream_flags = FakeCUstream_flags
    CUevent_flags = FakeCUevent_flags
    CU_MEMHOSTALLOC_PORTABLE = 1

    def __init__(self, devices: int = 2) -> None:
        self.devices = devices
        self.calls: list[tuple[Any, ...]] = []
        self.fail: dict[str, FakeCUresult] = {}  # call name -> status to return instead of success
        self.pointers: dict[int, tuple[int, bool, int]] = {}
        self.event_status = OK
        self._tls = threading.local()
        self._next = 0x10000
        self.host_blocks: dict[int, np.ndarray[Any, Any]] = {}

    # helpers
    @property
    def current(self) -> int:
        return getattr(self._tls, "ctx", 0)

    def _log(self, name: str, *args: Any) -> FakeCUresult | None:
        self.calls.append((name, self.current, *args))
        return self.fail.get(name)

    def names(self) -> list[str]:
        return [c[0] for c in self.calls]

    def _handle(self) -> int:
        self._next += 0x100
        return self._next

    # error strings
    def cuGetErrorName(self, err: FakeCUresult) -> tuple[FakeCUresult, bytes]:
        return OK, FakeCUresult(err).name.encode()

    def cuGetErrorString(self, err: FakeCUresult) -> tuple[FakeCUresult, bytes]:
        return OK, f"fake description of {int(err)}".encode()

    # devices and contexts
    def cuInit(self, flags: int) -> tuple[FakeCUresult]:
        return (self._log("cuInit", flags) or OK,)

    def cuDeviceGetCount(self) -> tuple[FakeCUresult, int | None]:
        err = self._log("cuDeviceGetCount")
        return (err, None) if err else (OK, self.devices)

    def cuDriverGetVersion(self) -> tuple[FakeCUresult, int]:
        return OK, 12040

    def cuDeviceGet(self, ordinal: int) -> tuple[FakeCUresult, int | None]:
        self._log("cuDeviceGet", ordinal)
        if ordinal >= self.devices:
            return FakeCUresult.CUDA_ERROR_INVALID_DEVICE, None
        return OK, ordinal

    def cuDevicePrimaryCtxRetain(self, dev: int) -> tuple[FakeCUresult, int]:
        self._log("cuDevicePrimaryCtxRetain", dev)
        return OK, CTX_BASE + dev

    def cuCtxGetCurrent(self) -> tuple[FakeCUresult, int]:
        return OK, self.current

    def cuCtxSetCurrent(self, ctx: int) -> tuple[FakeCUresult]:
        self._log("cuCtxSetCurrent", ctx)
        self._tls.ctx = int(ctx)
        return (OK,)

    def cuCtxSynchronize(self) -> tuple[FakeCUresult]:
        return (self._log("cuCtxSynchronize") or OK,)

    # pointers
    def cuPointerGetAttributes(
        self, n: int, attrs: list[Any], ptr: int
    ) -> tuple[FakeCUresult, list[Any] | None]:
        # The real binding raises TypeError unless every attribute is a CUpointer_attribute member.
        if not all(isinstance(a, FakeCUpointer_attribute) for a in attrs):
            raise TypeError("Argument 'attributes' is not instance of type CUpointer_attribute")
        err = self._log("cuPointerGetAttributes", n, tuple(attrs), ptr)
        if err:
            return err, None
        mem_type, managed, ordinal = self.pointers.get(ptr, (0, False, 0))  # unknown: type 0, null values
        values = {2: mem_type, 8: managed, 9: ordinal}
        return OK, [values[int(a)] for a in attrs[:n]]

    # streams and events
    def cuStreamSynchronize(self, h: int) -> tuple[FakeCUresult]:
        return (self._log("cuStreamSynchronize", h) or OK,)

    def cuStreamCreate(self, flags: Any) -> tuple[FakeCUresult, int]:
        self._log("cuStreamCreate", flags)
        return OK, self._handle()

    def cuStreamDestroy(self, h: int) -> tuple[FakeCUresult]:
        return (self._log("cuStreamDestroy", h) or OK,)

    def cuStreamWaitEvent(self, h: int, ev: int, flags: int) -> tuple[FakeCUresult]:
        return (self._log("cuStreamWaitEvent", h, ev, flags) or OK,)

    def cuEventCreate(self, flags: Any) -> tuple[FakeCUresult, int]:
        self._log("cuEventCreate", flags)
        return OK, self._handle()

    def cuEventRecord(self, ev: int, h: int) -> tuple[FakeCUresult]:
        return (self._log("cuEventRecord", ev, h) or OK,)

    def cuEventQuery(self, ev: int) -> tuple[FakeCUresult]:
        self._log("cuEventQuery", ev)
        return (self.event_status,)

    def cuEventSynchronize(self, ev: int) -> tuple[FakeCUresult]:
        return (self._log("cuEventSynchronize", ev) or OK,)

    def cuEventDestroy(self, ev: int) -> tuple[FakeCUresult]:
        return (self._log("cuEventDestroy", ev) or OK,)

    # memory
    def cuMemAlloc(self, n: int) -> tuple[FakeCUresult, int]:
        self._log("cuMemAlloc", n)
        return OK, self._handle()

    def cuMemFree(self, p: int) -> tuple[FakeCUresult]:
        return (self._log("cuMemFree", p) or OK,)

    def cuMemHostAlloc(self, n: int, flags: int) -> tuple[FakeCUresult, int]:
        self._log("cuMemHostAlloc", n, flags)
        block = np.zeros(n, np.uint8)  # real memory, so the runtime's numpy view can be used
        self.host_blocks[block.ctypes.data] = block
        return OK, block.ctypes.data

    def cuMemFreeHost(self, p: int) -> tuple[FakeCUresult]:
        self._log("cuMemFreeHost", p)
        del self.host_blocks[p]
        return (OK,)

    def cuMemcpyAsync(self, dst: int, src: int, n: int, h: int) -> tuple[FakeCUresult]:
        return (self._log("cuMemcpyAsync", dst, src, n, h) or OK,)


@pytest.fixture
def drv(monkeypatch: pytest.MonkeyPatch) -> Iterator[FakeDriver]:
    fake = FakeDriver()
    monkeypatch.setattr(cuda_rt, "_load_driver", lambda: fake)
    monkeypatch.setattr(cuda_rt, "_load_cupy", lambda: None)
    yield fake
    gc.collect()  # run pending finalizers while the fake is still installed


@pytest.fixture
def rt(drv: FakeDriver) -> CudaRuntime:
    return CudaRuntime(1)


def _real_driver() -> Any:
    """The installed cuda-python driver module (either layout), or skip."""
    try:
        return cuda_rt._load_driver()
    except ImportError:
        pytest.skip("cuda-python is not installed")


def _raise_import_error() -> Any:
    raise ImportError("No module named 'cuda'")


# -- probe ---------------------------------------------------------------------------


def test_probe_on_this_machine_returns_a_reason_and_never_raises() -> None:
    usable, reason = probe()
    if usable:
        pytest.skip(f"a GPU is usable here: {reason}")
    assert isinstance(reason, str)
    assert any(why in reason for why in ("cuda-python is not installed", "NVIDIA driver")), reason


def test_probe_real_cuda_python_without_a_driver() -> None:
    _real_driver()
    usable, reason = probe()
    if usable:
        pytest.skip(f"a GPU is usable here: {reason}")
    assert "NVIDIA driver" in reason, reason


def test_probe_without_cuda_python(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(cuda_rt, "_load_driver", _raise_import_error)
    usable, reason = probe()
    assert not usable
    assert "cuda-python is not installed" in reason
    assert "cai_mpi[cuda12]" in reason


def test_probe_driver_library_missing(drv: FakeDriver, monkeypatch: pytest.MonkeyPatch) -> None:
    def missing(flags: int) -> Any:
        raise RuntimeError("Failed to dlopen libcuda.so.1")

    monkeypatch.setattr(drv, "cuInit", missing)
    usable, reason = probe()
    assert not usable
    assert "driver library" in reason and "Failed to dlopen libcuda.so.1" in reason


def test_probe_no_visible_device(drv: FakeDriver, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "")
    drv.fail["cuInit"] = FakeCUresult.CUDA_ERROR_NO_DEVICE
    usable, reason = probe()
    assert not usable
    assert "no CUDA device" in reason and "CUDA_VISIBLE_DEVICES=''" in reason


def test_probe_other_cuinit_failure_is_named(drv: FakeDriver) -> None:
    drv.fail["cuInit"] = FakeCUresult.CUDA_ERROR_INVALID_DEVICE
    usable, reason = probe()
    assert not usable
    assert "cuInit failed with CUDA_ERROR_INVALID_DEVICE (101)" in reason


def test_probe_zero_devices(drv: FakeDriver) -> None:
    drv.devices = 0
    assert probe() == (False, "the NVIDIA driver reports 0 CUDA devices")


def test_probe_usable_creates_no_context(drv: FakeDriver) -> None:
    usable, reason = probe()
    assert usable
    assert reason == "2 CUDA device(s), driver CUDA 12.4"
    assert "cuDevicePrimaryCtxRetain" not in drv.names()
    assert "cuCtxSetCurrent" not in drv.names()


def test_probe_never_raises(drv: FakeDriver, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(drv, "cuDeviceGetCount", lambda: (OK,))  # malformed: no count
    usable, reason = probe()
    assert not usable
    assert reason.startswith("CUDA probe failed: ValueError")


def test_visible_device_count(drv: FakeDriver, monkeypatch: pytest.MonkeyPatch) -> None:
    assert cuda_rt.visible_device_count() == 2
    assert "cuDevicePrimaryCtxRetain" not in drv.names()
    drv.fail["cuInit"] = FakeCUresult.CUDA_ERROR_NO_DEVICE
    assert cuda_rt.visible_device_count() == 0
    monkeypatch.setattr(cuda_rt, "_load_driver", _raise_import_error)
    assert cuda_rt.visible_device_count() == 0


# -- status checking -----------------------------------------------------------------


def test_check_returns_outputs_and_reads_the_status_not_the_tuple(drv: FakeDriver) -> None:
    assert cuda_rt._check(drv, "cuDeviceGetCount") == (2,)
    assert cuda_rt._check(drv, "cuStreamSynchronize", 1) == ()
    drv.fail["cuStreamSynchronize"] = FakeCUresult.CUDA_ERROR_INVALID_HANDLE
    with pytest.raises(CudaError) as info:
        cuda_rt._check(drv, "cuStreamSynchronize", 1)  # returns a truthy 1-tuple
    exc = info.value
    assert str(exc) == (
        "cuStreamSynchronize failed with CUDA_ERROR_INVALID_HANDLE (400): fake description of 400"
    )
    assert (exc.call, exc.code, exc.name) == ("cuStreamSynchronize", 400, "CUDA_ERROR_INVALID_HANDLE")


def test_check_turns_a_missing_driver_function_into_cuda_error(
    drv: FakeDriver, monkeypatch: pytest.MonkeyPatch
) -> None:
    def not_found(*args: Any) -> Any:
        raise RuntimeError('Function "cuStreamGetDevice" not found')

    monkeypatch.setattr(drv, "cuStreamGetDevice", not_found, raising=False)
    with pytest.raises(
        CudaError, match='cuStreamGetDevice could not run: Function "cuStreamGetDevice" not found'
    ):
        cuda_rt._check(drv, "cuStreamGetDevice", 5)
    with pytest.raises(CudaError, match="cuNoSuchCall is not provided by this cuda-python"):
        cuda_rt._check(drv, "cuNoSuchCall")


def test_error_name_falls_back_to_the_enum_name(drv: FakeDriver, monkeypatch: pytest.MonkeyPatch) -> None:
    def no_driver(err: Any) -> Any:
        raise RuntimeError("no driver")

    monkeypatch.setattr(drv, "cuGetErrorName", no_driver)
    monkeypatch.setattr(drv, "cuGetErrorString", no_driver)
    assert cuda_rt._error_text(drv, FakeCUresult.CUDA_ERROR_NOT_READY) == ("CUDA_ERROR_NOT_READY", "")
    assert cuda_rt._error_text(drv, 12345) == ("CUresult 12345", "")


def test_real_bindings_status_checking_without_a_driver() -> None:
    driver = _real_driver()
    if probe()[0]:
        pytest.skip("a GPU driver is present")
    name, _ = cuda_rt._error_text(driver, driver.CUresult.CUDA_ERROR_INVALID_HANDLE)
    assert name == "CUDA_ERROR_INVALID_HANDLE"
    with pytest.raises(CudaError, match="cuInit could not run") as info:
        cuda_rt._check(driver, "cuInit", 0)
    assert isinstance(info.value.__cause__, RuntimeError)
    # The real enum members are what locate() passes (plain ints raise TypeError there).
    assert int(driver.CUpointer_attribute.CU_POINTER_ATTRIBUTE_MEMORY_TYPE) == 2
    assert int(driver.CUpointer_attribute.CU_POINTER_ATTRIBUTE_IS_MANAGED) == 8
    assert int(driver.CUpointer_attribute.CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL) == 9
    assert int(driver.CUstream_flags.CU_STREAM_NON_BLOCKING) == 1
    assert int(driver.CUevent_flags.CU_EVENT_DISABLE_TIMING) == 2
    assert int(driver.CU_MEMHOSTALLOC_PORTABLE) == 1


def test_runtime_needs_cuda_python(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(cuda_rt, "_load_driver", _raise_import_error)
    with pytest.raises(RuntimeUnavailableError, match="needs cuda-python"):
        CudaRuntime(0)


@pytest.mark.parametrize("ordinal", [-1, True, 1.0])
def test_runtime_rejects_bad_ordinals(drv: FakeDriver, ordinal: Any) -> None:
    with pytest.raises(ValueError, match="ordinal must be a non-negative int"):
        CudaRuntime(ordinal)


# -- pointer classification -----------------------------------------------------------


@pytest.mark.parametrize(
    ("memory_type", "managed", "ordinal", "expected"),
    [
        (0, False, 0, HOST),  # unknown to CUDA: pageable host memory (ordinal meaningless)
        (0, False, 3, HOST),
        (1, False, 1, HOST),  # pinned / registered host memory
        (2, False, 0, Location(MemoryKind.DEVICE, 0)),
        (2, False, 3, Location(MemoryKind.DEVICE, 3)),
        (2, True, 1, Location(MemoryKind.MANAGED, 1)),  # managed reports DEVICE: IS_MANAGED decides
        (2, True, -1, Location(MemoryKind.MANAGED, 7)),  # no ordinal: the fallback
        (4, False, 2, Location(MemoryKind.MANAGED, 2)),  # CU_MEMORYTYPE_UNIFIED
    ],
)
def test_classify_pointer(memory_type: int, managed: bool, ordinal: int, expected: Location) -> None:
    assert classify_pointer(memory_type, managed, ordinal, 7) == expected


def test_classify_refuses_cuda_arrays_and_unknown_types() -> None:
    with pytest.raises(CudaError, match="CUDA array"):
        classify_pointer(3, False, 0, 0)
    with pytest.raises(CudaError, match="unknown memory type 9"):
        classify_pointer(9, False, 0, 0)


def test_locate_queries_three_attributes_as_enum_members(rt: CudaRuntime, drv: FakeDriver) -> None:
    drv.pointers = {0xA000: (2, False, 0), 0xB000: (2, True, 1), 0xC000: (1, False, 1)}
    assert rt.locate(0xA000) == Location(MemoryKind.DEVICE, 0)
    assert rt.locate(0xB000) == Location(MemoryKind.MANAGED, 1)
    assert rt.locate(0xC000) == HOST
    assert rt.locate(0xD000) == HOST  # unregistered: memory type 0
    name, ctx, n, attrs, ptr = drv.calls[-1]
    assert (name, ctx, n, ptr) == ("cuPointerGetAttributes", CTX_BASE + 1, 3, 0xD000)
    assert attrs == (
        FakeCUpointer_attribute.CU_POINTER_ATTRIBUTE_MEMORY_TYPE,
        FakeCUpointer_attribute.CU_POINTER_ATTRIBUTE_IS_MANAGED,
        FakeCUpointer_attribute.CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL,
    )


def test_locate_null_pointer_is_the_current_device_without_a_query(rt: CudaRuntime, drv: FakeDriver) -> None:
    assert rt.locate(0) == Location(MemoryKind.DEVICE, 1)
    assert drv.calls == []


def test_locate_error_names_the_pointer(rt: CudaRuntime, drv: FakeDriver) -> None:
    drv.fail["cuPointerGetAttributes"] = FakeCUresult.CUDA_ERROR_INVALID_VALUE
    with pytest.raises(
        CudaError,
        match=r"cannot classify pointer 0xa000: cuPointerGetAttributes failed with "
        r"CUDA_ERROR_INVALID_VALUE \(1\)",
    ):
        rt.locate(0xA000)


# -- contexts --------------------------------------------------------------------------


def test_construction_makes_no_cuda_call(rt: CudaRuntime, drv: FakeDriver) -> None:
    assert drv.calls == []
    assert rt.name == "cuda"
    assert rt.current_device() == 1


def test_first_use_binds_each_thread_to_the_primary_context(rt: CudaRuntime, drv: FakeDriver) -> None:
    rt.sync_stream(1, None)
    assert drv.current == CTX_BASE + 1
    assert drv.names()[:4] == ["cuInit", "cuDeviceGet", "cuDevicePrimaryCtxRetain", "cuCtxSetCurrent"]

    seen: list[int] = []

    def worker() -> None:
        rt.sync_stream(2, None)
        seen.append(drv.current)

    t = threading.Thread(target=worker)
    t.start()
    t.join()
    assert seen == [CTX_BASE + 1]  # the helper thread was bound too
    assert drv.names().count("cuInit") == 1
    assert drv.names().count("cuDevicePrimaryCtxRetain") == 1  # retained once per process


def test_other_device_is_switched_to_and_back(rt: CudaRuntime, drv: FakeDriver) -> None:
    rt.sync_stream(1, 0)
    sync = [c for c in drv.calls if c[0] == "cuStreamSynchronize"]
    assert sync == [("cuStreamSynchronize", CTX_BASE + 0, 1)]  # legacy stream of GPU 0's context
    assert drv.current == CTX_BASE + 1  # the thread stays on the rank's GPU


def test_a_context_the_user_made_current_is_restored(rt: CudaRuntime, drv: FakeDriver) -> None:
    rt.sync_stream(1, None)
    drv.cuCtxSetCurrent(CTX_BASE + 0)  # user code switched device afterwards
    rt.sync_device(None)
    assert [c[1] for c in drv.calls if c[0] == "cuCtxSynchronize"] == [CTX_BASE + 1]
    assert drv.current == CTX_BASE + 0


def test_invalid_ordinal_is_explained(drv: FakeDriver) -> None:
    rt = CudaRuntime(5)
    with pytest.raises(StreamError, match=r"GPU 5 is not usable by this process.*CUDA_VISIBLE_DEVICES"):
        rt.sync_stream(1, None)


def test_device_count_needs_no_context(rt: CudaRuntime, drv: FakeDriver) -> None:
    assert rt.device_count() == 2
    assert rt.device_count() == 2
    assert drv.names() == ["cuInit", "cuDeviceGetCount"]


# -- streams ---------------------------------------------------------------------------


@pytest.mark.parametrize("handle", [1, 2, 0x7F00DEAD])
def test_sync_stream_accepts_special_and_real_handles(rt: CudaRuntime, drv: FakeDriver, handle: int) -> None:
    rt.sync_stream(handle, 1)
    assert ("cuStreamSynchronize", CTX_BASE + 1, handle) in drv.calls


@pytest.mark.parametrize("handle", [0, -3, True])
def test_sync_stream_refuses_non_handles_without_calling_cuda(
    rt: CudaRuntime, drv: FakeDriver, handle: int
) -> None:
    with pytest.raises(StreamError, match="CAI v3 handles are positive ints"):
        rt.sync_stream(handle, None)
    assert "cuStreamSynchronize" not in drv.names()


def test_sync_stream_invalid_handle_says_which_and_why(rt: CudaRuntime, drv: FakeDriver) -> None:
    drv.fail["cuStreamSynchronize"] = FakeCUresult.CUDA_ERROR_INVALID_HANDLE
    with pytest.raises(StreamError) as info:
        rt.sync_stream(0x7F00DEAD, 1)
    text = str(info.value)
    assert "stream 0x7f00dead on GPU 1 cannot be synchronized" in text
    assert "CUDA_ERROR_INVALID_HANDLE (400)" in text
    assert "destroyed the stream" in text and "another process" in text
    assert isinstance(info.value.__cause__, CudaError)


def test_sync_stream_kernel_fault_is_reported(rt: CudaRuntime, drv: FakeDriver) -> None:
    drv.fail["cuStreamSynchronize"] = FakeCUresult.CUDA_ERROR_ILLEGAL_ADDRESS
    with pytest.raises(
        StreamError,
        match=r"stream 0x2 \(the per-thread default stream\).*ILLEGAL_ADDRESS.*"
        "Work queued on the stream failed",
    ):
        rt.sync_stream(2, None)


def test_sync_stream_without_driver_library_is_a_stream_error(
    rt: CudaRuntime, drv: FakeDriver, monkeypatch: pytest.MonkeyPatch
) -> None:
    rt.sync_stream(1, None)  # bound

    def gone(h: int) -> Any:
        raise RuntimeError("Failed to dlopen libcuda.so.1")

    monkeypatch.setattr(drv, "cuStreamSynchronize", gone)
    with pytest.raises(StreamError, match=r"stream 0x1 \(the legacy default stream\).*could not run"):
        rt.sync_stream(1, None)


def test_sync_device_failure_is_a_stream_error(rt: CudaRuntime, drv: FakeDriver) -> None:
    drv.fail["cuCtxSynchronize"] = FakeCUresult.CUDA_ERROR_ILLEGAL_ADDRESS
    with pytest.raises(StreamError, match=r"GPU 0 cannot be synchronized.*ILLEGAL_ADDRESS"):
        rt.sync_device(0)


def test_create_stream_record_event_and_wait(rt: CudaRuntime, drv: FakeDriver) -> None:
    s = rt.create_stream(0)
    assert s.ordinal == 0
    assert ("cuStreamCreate", CTX_BASE + 0, FakeCUstream_flags.CU_STREAM_NON_BLOCKING) in drv.calls
    ev = rt.record_event(s)
    assert isinstance(ev, CudaEvent)
    assert ("cuEventCreate", CTX_BASE + 0, FakeCUevent_flags.CU_EVENT_DISABLE_TIMING) in drv.calls
    assert ("cuEventRecord", CTX_BASE + 0, ev.handle, s.handle) in drv.calls
    rt.stream_wait_event(1, ev, 0)
    assert ("cuStreamWaitEvent", CTX_BASE + 0, 1, ev.handle, 0) in drv.calls
    s.synchronize()
    assert ("cuStreamSynchronize", CTX_BASE + 0, s.handle) in drv.calls

    stream_handle, event_handle = s.handle, ev.handle
    del s, ev
    gc.collect()
    assert ("cuEventDestroy", CTX_BASE + 0, event_handle) in drv.calls  # in the owning context
    assert ("cuStreamDestroy", CTX_BASE + 0, stream_handle) in drv.calls
    assert drv.current == CTX_BASE + 1


def test_event_query_and_synchronize(rt: CudaRuntime, drv: FakeDriver) -> None:
    ev = rt.record_event(rt.create_stream(1))
    assert ev.query() is True
    drv.event_status = FakeCUresult.CUDA_ERROR_NOT_READY
    assert ev.query() is False
    drv.event_status = FakeCUresult.CUDA_ERROR_ILLEGAL_ADDRESS
    with pytest.raises(CudaError, match="cuEventQuery failed with CUDA_ERROR_ILLEGAL_ADDRESS"):
        ev.query()
    ev.synchronize()
    assert "cuEventSynchronize" in drv.names()


def test_stream_wait_event_failure_and_foreign_objects(rt: CudaRuntime, drv: FakeDriver) -> None:
    ev = rt.record_event(rt.create_stream(1))
    drv.fail["cuStreamWaitEvent"] = FakeCUresult.CUDA_ERROR_INVALID_HANDLE
    with pytest.raises(StreamError, match="stream 0x1234 on GPU 1 cannot be made to wait"):
        rt.stream_wait_event(0x1234, ev, 1)

    class Foreign(Stream):
        handle = 5
        ordinal = 0

        def synchronize(self) -> None:
            pass

    with pytest.raises(TypeError, match="needs a stream from create_stream"):
        rt.copy_async(1, 2, 3, Foreign())
    with pytest.raises(TypeError, match="needs an event from record_event"):
        rt.stream_wait_event(1, object(), 0)  # type: ignore[arg-type]


def test_copy_async(rt: CudaRuntime, drv: FakeDriver) -> None:
    s = rt.create_stream(1)
    rt.copy_async(0xA000, 0xB000, 64, s)
    assert ("cuMemcpyAsync", CTX_BASE + 1, 0xA000, 0xB000, 64, s.handle) in drv.calls
    n = len(drv.calls)
    rt.copy_async(0xA000, 0xB000, 0, s)
    assert len(drv.calls) == n


# -- allocation without CuPy ------------------------------------------------------------------


def test_alloc_device_with_the_driver(rt: CudaRuntime, drv: FakeDriver) -> None:
    buf = rt.alloc_device(1024, 0)
    assert (buf.nbytes, buf.ordinal) == (1024, 0)
    assert ("cuMemAlloc", CTX_BASE + 0, 1024) in drv.calls
    buf.free()
    buf.free()  # idempotent
    assert drv.calls.count(("cuMemFree", CTX_BASE + 0, buf.ptr)) == 1

    other = rt.alloc_device(16, 1)
    ptr = other.ptr
    del other
    gc.collect()
    assert ("cuMemFree", CTX_BASE + 1, ptr) in drv.calls


def test_alloc_zero_bytes(rt: CudaRuntime, drv: FakeDriver) -> None:
    buf = rt.alloc_device(0, 1)
    assert (buf.ptr, buf.nbytes, buf.ordinal) == (0, 0, 1)
    buf.free()
    pinned = rt.alloc_pinned(0)
    assert (pinned.ptr, pinned.nbytes, pinned.array.shape) == (0, 0, (0,))
    assert drv.calls == []


def test_alloc_pinned_with_the_driver(rt: CudaRuntime, drv: FakeDriver) -> None:
    buf = rt.alloc_pinned(100)
    assert ("cuMemHostAlloc", CTX_BASE + 1, 100, 1) in drv.calls  # PORTABLE
    arr = buf.array
    assert (arr.dtype, arr.shape, arr.ctypes.data) == (np.dtype(np.uint8), (100,), buf.ptr)
    arr[:] = 7
    assert int(drv.host_blocks[buf.ptr].sum()) == 700  # the view is the allocation
    ptr = buf.ptr
    buf.free()
    gc.collect()
    assert "cuMemFreeHost" not in drv.names()  # a view is still alive: freeing now would leave it dangling
    with pytest.raises(ValueError, match="already freed"):
        _ = buf.array
    del arr
    gc.collect()
    assert ("cuMemFreeHost", CTX_BASE + 1, ptr) in drv.calls


def test_pack_and_unpack_need_cupy(rt: CudaRuntime, drv: FakeDriver) -> None:
    desc = CAIDescriptor(ptr=0xA000, shape=(4, 4), typestr="<f4", strides=(32, 4))
    s = rt.create_stream(1)
    with pytest.raises(
        RuntimeUnavailableError, match="install cupy-cuda12x to send non-contiguous device arrays"
    ):
        rt.pack(desc, 1, s)
    with pytest.raises(RuntimeUnavailableError, match="install cupy-cuda12x"):
        rt.unpack(0xB000, desc, 1, s)


# -- packing layout (pure) -------------------------------------------------------------


@pytest.mark.parametrize(
    ("shape", "strides", "itemsize", "pointers", "expected"),
    [
        ((4, 3), (24, 8), 8, (0x1000,), ("u8", (4, 3), (24, 8))),
        ((4, 3), (-24, -8), 8, (0x1000,), ("u8", (4, 3), (-24, -8))),  # negative strides kept
        ((5,), (2,), 1, (0x1001,), ("u1", (5,), (2,))),  # bool, int8
        ((5,), (32,), 16, (0x1000,), ("u8", (5, 2), (32, 8))),  # complex128: trailing axis
        ((5,), (24,), 12, (0x1000,), ("u4", (5, 3), (24, 4))),  # a 12-byte struct
        ((5,), (24,), 12, (0x1002,), ("u2", (5, 6), (24, 2))),  # misaligned pointer: narrower word
        ((5,), (13,), 13, (0x1000,), ("u1", (5, 13), (13, 1))),
        ((1, 4), (3, 8), 8, (0x1000,), ("u8", (1, 4), (3, 8))),  # length-1 dims never stepped
        ((), (), 4, (0x1000, 0x2004), ("u4", (), ())),  # 0-d
        ((4,), (8,), 8, (0x1000, 0x2004), ("u4", (4, 2), (8, 4))),  # unpack source misaligned
    ],
)
def test_byte_view(
    shape: tuple[int, ...],
    strides: tuple[int, ...],
    itemsize: int,
    pointers: tuple[int, ...],
    expected: tuple[str, tuple[int, ...], tuple[int, ...]],
) -> None:
    dtype, vshape, vstrides = byte_view(shape, strides, itemsize, pointers)
    assert (dtype.str[1:], vshape, vstrides) == expected


@pytest.mark.parametrize(
    ("shape", "strides", "typestr"),
    [((6, 5), (-40, 8), "<f8"), ((3, 4), (4, 12), "<c8"), ((7,), (-12,), "|V12"), ((), None, ">i2")],
)
def test_byte_view_moves_exactly_the_same_bytes(
    shape: tuple[int, ...], strides: tuple[int, ...] | None, typestr: str
) -> None:
    """Gathering the uint view in numpy gives the bytes of gathering the original array."""
    desc = CAIDescriptor(ptr=0, shape=shape, typestr=typestr, strides=strides)
    low, high = desc.byte_extent
    backing = np.random.default_rng(0).integers(0, 256, high - low, dtype=np.uint8)
    base = backing.ctypes.data - low
    original = np.ndarray(shape, desc.dtype, buffer=backing, offset=-low, strides=desc.byte_strides)
    dtype, vshape, vstrides = byte_view(shape, desc.byte_strides, desc.itemsize, (base,))
    view = np.ndarray(vshape, dtype, buffer=backing, offset=-low, strides=vstrides)
    assert np.ascontiguousarray(view).tobytes() == np.ascontiguousarray(original).tobytes()


# -- CuPy wrapping (constructing CuPy arrays needs no GPU) ------------------------------------


def test_as_cupy_points_at_element_zero_with_negative_strides() -> None:
    cp = pytest.importorskip("cupy")
    a = cuda_rt._as_cupy(cp, 0x7F0000001028, (3, 2), np.dtype("u4"), (-16, 4), 0)
    assert (a.shape, a.strides, a.dtype) == ((3, 2), (-16, 4), np.dtype("u4"))
    assert a.data.ptr == 0x7F0000001028
    assert a.data.mem.ptr == 0x7F0000001028 - 32  # the memory spans the whole extent
    assert a.data.mem.size == 40
    assert a.data.device_id == 0
    c = cuda_rt._as_cupy(cp, 0x7F0000002000, (2, 3), np.dtype("u8"), None, 1)
    assert (c.strides, c.flags.c_contiguous, c.data.device_id) == ((24, 8), True, 1)


def test_stream_protocol_adapter() -> None:
    ref = cuda_rt._CudaStreamRef(0x7F00)
    assert ref.__cuda_stream__() == (0, 0x7F00)
    assert type(ref.__cuda_stream__()[1]) is int  # CuPy 14 checks isinstance(ptr, int)
