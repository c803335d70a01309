"""SimulatedRuntime (cai_mpi.testing): simulated device memory, packing and unpacking on simulated streams."""

from __future__ import annotations

import threading
import time
from typing import Any

import numpy as np
import pytest

from cai_mpi._src.core.descriptor import CAIDescriptor, describe
from cai_mpi._src.errors import StreamError
from cai_mpi._src.runtime.base import HOST, Location, MemoryKind
from cai_mpi.testing import FakeCudaArray, SimulatedEvent, SimulatedRuntime, SimulatedStream, use_runtime
from cai_mpi.testing import _streams as simstream
from cai_mpi.testing._runtime import SimulatedDeviceBuffer
from cai_mpi.testing._streams import resolve_stream

# =============================================================================================
# SimulatedRuntime


@pytest.mark.parametrize("handle", [1, 2])
def test_sync_default_handles_without_simulated_streams_is_a_noop(
    handle: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(simstream, "_legacy", None)  # (one per process: an earlier test may have made it)
    failed: list[BaseException] = []

    def in_a_new_thread() -> None:  # (no per-thread default stream there yet: none is made by these calls either)
        try:
            assert resolve_stream(handle) is None
            SimulatedRuntime().sync_stream(handle, None)
            SimulatedRuntime().sync_stream(handle, 0)
            SimulatedRuntime().stream_wait_event(handle, SimulatedEvent(), None)  # nothing to wait on either
            assert resolve_stream(handle) is None
        except BaseException as exc:
            failed.append(exc)

    thread = threading.Thread(target=in_a_new_thread)
    thread.start()
    thread.join()
    if failed:
        raise failed[0]


def test_sync_stream_waits_for_a_simulated_stream(stream: SimulatedStream) -> None:
    box = bytearray(1)
    stream.enqueue(box.__setitem__, 0, 42, delay=0.05)
    SimulatedRuntime().sync_stream(stream.handle, None)
    assert box[0] == 42


def test_sync_legacy_stream_waits() -> None:
    box = bytearray(1)
    SimulatedStream.legacy().enqueue(box.__setitem__, 0, 7, delay=0.05)
    SimulatedRuntime().sync_stream(1, None)
    assert box[0] == 7


def test_sync_stream_reraises_the_producers_error(stream: SimulatedStream) -> None:
    stream.enqueue(int, "not a number")
    with pytest.raises(StreamError, match="work on test-stream failed"):
        SimulatedRuntime().sync_stream(stream.handle, None)


def test_stream_wait_event_makes_the_producer_wait(stream: SimulatedStream) -> None:
    rt = SimulatedRuntime()
    own = rt.create_stream(0)
    log: list[str] = []
    gate = threading.Event()
    own.sim.enqueue(gate.wait)  # type: ignore[attr-defined]
    own.sim.enqueue(log.append, "consumer done")  # type: ignore[attr-defined]
    ev = rt.record_event(own)
    rt.stream_wait_event(stream.handle, ev, None)
    stream.enqueue(log.append, "producer writes again")
    time.sleep(0.05)
    assert log == []
    gate.set()
    stream.synchronize()
    assert log == ["consumer done", "producer writes again"]
    own.synchronize()


def test_locate_device_vs_host_memory() -> None:
    rt = SimulatedRuntime(devices=2)
    assert (rt.name, rt.device_count(), rt.current_device()) == ("simulated", 2, 0)
    buf = SimulatedDeviceBuffer(100, 1)
    dev1 = Location(MemoryKind.DEVICE, 1)
    assert rt.locate(buf.ptr) == dev1
    assert rt.locate(buf.ptr + 50) == dev1
    assert rt.locate(buf.ptr + 99) == dev1
    assert rt.locate(buf.ptr - 1) == HOST
    assert rt.locate(buf.ptr + 100) == HOST  # one past the end (malloc headers keep neighbours further away)
    host = np.zeros(100)
    assert rt.locate(host.ctypes.data) == HOST
    x = FakeCudaArray(np.arange(4.0), device=True)
    assert rt.locate(describe(x).ptr) == Location(MemoryKind.DEVICE, 0)
    assert rt.locate(FakeCudaArray(np.arange(4.0)).ptr) == HOST
    ptr = buf.ptr
    buf.free()
    assert rt.locate(ptr) == HOST


def test_alloc_device_and_zero_size() -> None:
    rt = SimulatedRuntime()
    buf = rt.alloc_device(64, 0)
    assert rt.locate(buf.ptr) == Location(MemoryKind.DEVICE, 0)
    assert buf.host_array.shape == (64,)  # type: ignore[attr-defined]
    empty = rt.alloc_device(0, 0)
    assert (empty.ptr, empty.nbytes) == (0, 0)
    assert rt.locate(0) == HOST


def test_use_runtime_installs_and_restores() -> None:
    from cai_mpi._src.runtime import get_runtime

    before = get_runtime()
    with use_runtime("simulated") as rt:
        assert isinstance(rt, SimulatedRuntime)
        assert get_runtime() is rt
    assert get_runtime() is before


def strided_fake(kind: str, dtype: str = "<f8", **kwargs: Any) -> FakeCudaArray:
    """A (3, 4) device view of 12 elements: negative row stride, negative column stride, or F order."""
    data = np.arange(12).astype(dtype)
    item = np.dtype(dtype).itemsize
    layouts = {
        "neg-rows": ((-4 * item, item), 8 * item),
        "neg-cols": ((4 * item, -item), 3 * item),
        "neg-both": ((-4 * item, -item), 11 * item),
        "fortran": ((item, 3 * item), 0),
        "every-other": ((4 * item, 2 * item), 0),
    }
    strides, offset = layouts[kind]
    shape = (3, 2) if kind == "every-other" else (3, 4)
    return FakeCudaArray(data, shape=shape, strides=strides, offset=offset, device=True, **kwargs)


KINDS = ["neg-rows", "neg-cols", "neg-both", "fortran", "every-other"]


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("dtype", ["<f8", ">i2", "u1", "<c16"])
def test_pack_equals_ascontiguousarray(kind: str, dtype: str) -> None:
    rt = SimulatedRuntime()
    x = strided_fake(kind, dtype)
    desc = describe(x)
    assert desc.strides is not None
    assert rt.locate(desc.ptr).kind is MemoryKind.DEVICE
    own = rt.create_stream(0)
    out = rt.pack(desc, 0, own)
    own.synchronize()
    assert rt.locate(out.ptr) == Location(MemoryKind.DEVICE, 0)
    assert out.nbytes == desc.nbytes
    assert bytes(out.host_array) == np.ascontiguousarray(x.host).tobytes()  # type: ignore[attr-defined]


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("dtype", ["<f8", ">i2"])
def test_unpack_fills_the_strided_view(kind: str, dtype: str) -> None:
    rt = SimulatedRuntime()
    x = strided_fake(kind, dtype)
    before = np.array(x._mem.host_array)  # every byte of the allocation
    x.host[...] = 0
    desc = describe(x)
    values = (np.arange(desc.size) + 100).astype(dtype).reshape(desc.shape)
    src = rt.alloc_device(desc.nbytes, 0)
    src.host_array[:] = np.frombuffer(values.tobytes(), np.uint8)  # type: ignore[attr-defined]
    own = rt.create_stream(0)
    rt.unpack(src.ptr, desc, 0, own)
    own.synchronize()
    assert x.host.tobytes() == values.tobytes()
    assert np.array_equal(x.host, values)
    # bytes outside the view are untouched
    expected = before.copy()
    view = np.ndarray(desc.shape, dtype, buffer=expected, offset=x.offset, strides=desc.strides)
    view[...] = values
    assert bytes(x._mem.host_array) == expected.tobytes()


def test_pack_of_an_empty_array_enqueues_nothing() -> None:
    rt = SimulatedRuntime()
    desc = CAIDescriptor.for_new_buffer(0, (0, 3), np.dtype("f4"))
    own = rt.create_stream(0)
    out = rt.pack(desc, 0, own)
    rt.unpack(0, desc, 0, own)
    own.synchronize()
    assert (out.ptr, out.nbytes) == (0, 0)


