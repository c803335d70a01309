"""The pieces under the transfer layer: Config parsing, simulated streams, the host and simulated
runtimes, the host buffer pool and the strided MPI datatypes."""

from __future__ import annotations

import dataclasses
import gc
import subprocess
import sys
import threading
import time
import weakref
from typing import Any

import numpy as np
import pytest
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st
from mpi4py import MPI

from cai_mpi._src import config as config_mod
from cai_mpi._src.bufexport import HAVE_C_BUFFER_EXPORT
from cai_mpi._src.config import ENV_VARS, Config, reload_config
from cai_mpi._src.datatypes import describable, strided_type
from cai_mpi._src.descriptor import CAIDescriptor, describe, descriptor_from_numpy
from cai_mpi._src.errors import CaiMpiError, RuntimeUnavailableError, StreamError
from cai_mpi._src.hostmem import HostBufferPool, host_view
from cai_mpi._src.runtime import simstream
from cai_mpi._src.runtime.base import HOST, Location, MemoryKind
from cai_mpi._src.runtime.host import HostRuntime
from cai_mpi._src.runtime.simstream import resolve_stream
from cai_mpi._src.runtime.simulated import SimulatedDeviceBuffer
from cai_mpi.testing import FakeCudaArray, SimulatedEvent, SimulatedRuntime, SimulatedStream, use_runtime

# =============================================================================================
# Config

DEFAULTS = Config(
    sync=True,
    runtime=None,
    chunk_bytes=4 << 20,
    max_message_bytes=1 << 30,
    inline_bytes=8192,
    max_payload_bytes=1 << 40,
    device_datatypes=False,
)


def test_config_defaults() -> None:
    assert Config.from_env({}) == DEFAULTS
    assert Config.from_env({"UNRELATED": "1", "CAI_MPI_SYNC": "", "CAI_MPI_CHUNK_BYTES": "  "}) == DEFAULTS


@pytest.mark.parametrize(
    ("name", "field"),
    [("CAI_MPI_SYNC", "sync"), ("CAI_MPI_DEVICE_DATATYPES", "device_datatypes")],
)
@pytest.mark.parametrize(
    ("raw", "value"),
    [
        ("1", True),
        ("true", True),
        ("TRUE", True),
        ("yes", True),
        ("On", True),
        (" 1 ", True),
        ("0", False),
        ("false", False),
        ("No", False),
        ("OFF", False),
        ("\t0\n", False),
    ],
)
def test_config_bools(name: str, field: str, raw: str, value: bool) -> None:
    assert getattr(Config.from_env({name: raw}), field) is value


@pytest.mark.parametrize("name", ["CAI_MPI_SYNC", "CAI_MPI_DEVICE_DATATYPES"])
@pytest.mark.parametrize("raw", ["2", "maybe", "y", "-1", "01", "truee"])
def test_config_bad_bools(name: str, raw: str) -> None:
    with pytest.raises(ValueError, match=f"^{name}={raw!r}: expected 1 or 0$"):
        Config.from_env({name: raw})


@pytest.mark.parametrize(
    ("raw", "value"),
    [
        ("cuda", "cuda"),
        ("host", "host"),
        ("simulated", "simulated"),
        ("SIMULATED", "simulated"),
        (" Host ", "host"),
        ("", None),
        ("   ", None),
    ],
)
def test_config_runtime(raw: str, value: str | None) -> None:
    assert Config.from_env({"CAI_MPI_RUNTIME": raw}).runtime == value


@pytest.mark.parametrize("raw", ["gpu", "cpu", "sim", "cuda12"])
def test_config_bad_runtime(raw: str) -> None:
    with pytest.raises(ValueError, match=f"^CAI_MPI_RUNTIME={raw!r}: expected cuda, host or simulated$"):
        Config.from_env({"CAI_MPI_RUNTIME": raw})


INT_VARS = [
    ("CAI_MPI_CHUNK_BYTES", "chunk_bytes", 1),
    ("CAI_MPI_MAX_MESSAGE_BYTES", "max_message_bytes", 1),
    ("CAI_MPI_INLINE_BYTES", "inline_bytes", 0),
    ("CAI_MPI_MAX_PAYLOAD_BYTES", "max_payload_bytes", 0),
]


@pytest.mark.parametrize(("name", "field", "minimum"), INT_VARS)
@pytest.mark.parametrize(("raw", "value"), [("1024", 1024), ("0x100", 256), ("1_000", 1000), (" 77 ", 77)])
def test_config_ints(name: str, field: str, minimum: int, raw: str, value: int) -> None:
    assert getattr(Config.from_env({name: raw}), field) == value


@pytest.mark.parametrize(("name", "field", "minimum"), INT_VARS)
def test_config_int_minimum(name: str, field: str, minimum: int) -> None:
    assert getattr(Config.from_env({name: str(minimum)}), field) == minimum
    with pytest.raises(ValueError, match=f"^{name}='{minimum - 1}': must be at least {minimum}$"):
        Config.from_env({name: str(minimum - 1)})


@pytest.mark.parametrize(("name", "field", "minimum"), INT_VARS)
@pytest.mark.parametrize("raw", ["4MiB", "1.5", "1e6", "ten", "0x", "12 34"])
def test_config_bad_ints(name: str, field: str, minimum: int, raw: str) -> None:
    with pytest.raises(
        ValueError, match=f"^{name}={raw!r}: expected an integer number of bytes, e.g. {name}="
    ):
        Config.from_env({name: raw})


def test_config_caps() -> None:
    c = Config.from_env({"CAI_MPI_MAX_MESSAGE_BYTES": str(3 << 30), "CAI_MPI_INLINE_BYTES": "100000"})
    assert c.max_message_bytes == 2**31 - 1
    assert c.inline_bytes == 1 << 16
    c = Config.from_env({"CAI_MPI_MAX_MESSAGE_BYTES": str(2**31 - 2), "CAI_MPI_INLINE_BYTES": "65535"})
    assert (c.max_message_bytes, c.inline_bytes) == (2**31 - 2, 65535)
    assert Config.from_env({"CAI_MPI_MAX_PAYLOAD_BYTES": str(1 << 50)}).max_payload_bytes == 1 << 50


def test_config_is_frozen_and_documented() -> None:
    c = Config.from_env({})
    with pytest.raises(dataclasses.FrozenInstanceError):
        c.sync = False  # type: ignore[misc]
    for name in [
        "CAI_MPI_SYNC",
        "CAI_MPI_RUNTIME",
        "CAI_MPI_CHUNK_BYTES",
        "CAI_MPI_MAX_MESSAGE_BYTES",
        "CAI_MPI_INLINE_BYTES",
        "CAI_MPI_MAX_PAYLOAD_BYTES",
        "CAI_MPI_DEVICE_DATATYPES",
    ]:
        assert name in ENV_VARS


def test_reload_config_with_a_dict() -> None:
    c = reload_config({"CAI_MPI_CHUNK_BYTES": "123", "CAI_MPI_SYNC": "0"})
    assert config_mod.config() is c
    assert (c.chunk_bytes, c.sync) == (123, False)


# =============================================================================================
# SimulatedStream


@pytest.fixture
def stream() -> Any:
    s = SimulatedStream("test-stream")
    yield s
    try:
        s.close()
    except StreamError:
        s.close()


def test_stream_runs_work_in_order_after_the_delay(stream: SimulatedStream) -> None:
    log: list[int] = []
    stream.enqueue(log.append, 1, delay=0.05)
    stream.enqueue(log.append, 2)
    stream.enqueue(log.append, 3, delay=0.01)
    assert log == []  # the first item is still sleeping
    stream.synchronize()
    assert log == [1, 2, 3]


def test_stream_delay_is_honoured(stream: SimulatedStream) -> None:
    t0 = time.monotonic()
    stream.enqueue(lambda: None, delay=0.1)
    stream.synchronize()
    assert time.monotonic() - t0 >= 0.1


def test_stream_query(stream: SimulatedStream) -> None:
    assert stream.query() is True
    gate = threading.Event()
    stream.enqueue(gate.wait)
    assert stream.query() is False
    gate.set()
    stream.synchronize()
    assert stream.query() is True


def test_stream_runs_on_its_own_thread(stream: SimulatedStream) -> None:
    seen: list[str] = []
    stream.enqueue(lambda: seen.append(threading.current_thread().name))
    stream.synchronize()
    assert seen == ["test-stream"]


def test_events_record_and_wait(stream: SimulatedStream) -> None:
    gate = threading.Event()
    stream.enqueue(gate.wait)
    ev = stream.record_event()
    assert isinstance(ev, SimulatedEvent)
    assert ev.query() is False
    gate.set()
    ev.synchronize()
    assert ev.query() is True


def test_wait_event_orders_two_streams(stream: SimulatedStream) -> None:
    log: list[str] = []
    with SimulatedStream("producer") as producer:
        producer.enqueue(log.append, "producer work", delay=0.1)
        ev = producer.record_event()
        stream.wait_event(ev)
        stream.enqueue(log.append, "consumer work")
        stream.synchronize()
        assert log == ["producer work", "consumer work"]
        assert ev.query() is True


def test_an_exception_in_work_is_reraised_at_synchronize(stream: SimulatedStream) -> None:
    log: list[int] = []

    def boom() -> None:
        raise ValueError("kernel failed")

    stream.enqueue(boom)
    stream.enqueue(log.append, 1)  # later work still runs
    with pytest.raises(
        StreamError, match=r"work on test-stream failed: ValueError\('kernel failed'\)"
    ) as info:
        stream.synchronize()
    assert isinstance(info.value.__cause__, ValueError)
    assert isinstance(info.value, CaiMpiError)
    assert log == [1]
    stream.synchronize()  # reported once only


def test_the_first_of_several_errors_is_reraised(stream: SimulatedStream) -> None:
    def fail(exc: BaseException) -> None:
        raise exc

    stream.enqueue(fail, ValueError("first"))
    stream.enqueue(fail, KeyError("second"))
    with pytest.raises(StreamError) as info:
        stream.synchronize()
    assert isinstance(info.value.__cause__, ValueError)


def test_close_waits_and_refuses_more_work() -> None:
    s = SimulatedStream()
    handle = s.handle
    assert resolve_stream(handle) is s
    log: list[int] = []
    s.enqueue(log.append, 1, delay=0.05)
    s.close()
    assert log == [1]
    assert resolve_stream(handle) is None
    with pytest.raises(StreamError, match="is closed"):
        s.enqueue(log.append, 2)
    with pytest.raises(StreamError, match="is closed"):
        s.record_event()
    s.close()  # idempotent


def test_context_manager_closes() -> None:
    with SimulatedStream() as s:
        handle = s.handle
        assert resolve_stream(handle) is s
    assert resolve_stream(handle) is None


def test_handles_are_distinct_and_never_special() -> None:
    streams = [SimulatedStream() for _ in range(5)]
    try:
        handles = [s.handle for s in streams]
        assert len(set(handles)) == 5
        assert all(h > 2 for h in handles)
        assert all(resolve_stream(h) is s for h, s in zip(handles, streams, strict=True))
        assert (
            repr(streams[0]) == f"<SimulatedStream simulated-stream-{handles[0]:#x} handle={handles[0]:#x}>"
        )
    finally:
        for s in streams:
            s.close()


def test_default_streams_have_handles_1_and_2() -> None:
    legacy = SimulatedStream.legacy()
    assert legacy.handle == 1
    assert SimulatedStream.legacy() is legacy
    assert resolve_stream(1) is legacy
    per_thread = SimulatedStream.per_thread()
    assert per_thread.handle == 2
    assert SimulatedStream.per_thread() is per_thread
    assert resolve_stream(2) is per_thread
    assert per_thread is not legacy
    # another thread gets its own per-thread stream, and the same legacy stream
    other: list[Any] = []

    def in_thread() -> None:
        other.extend([SimulatedStream.per_thread(), resolve_stream(2), SimulatedStream.legacy()])

    t = threading.Thread(target=in_thread)
    t.start()
    t.join()
    assert other[0] is other[1]
    assert other[0] is not per_thread
    assert other[0].handle == 2
    assert other[2] is legacy
    other[0].close()


def test_resolve_unknown_handle_is_none() -> None:
    assert resolve_stream(0xDEAD_BEEF_0000) is None
    assert resolve_stream(3) is None


def test_a_dropped_stream_is_collected() -> None:
    s = SimulatedStream()
    handle = s.handle
    ref = weakref.ref(s)
    del s
    gc.collect()
    assert ref() is None
    assert resolve_stream(handle) is None


# =============================================================================================
# HostRuntime


def test_host_runtime_basics() -> None:
    rt = HostRuntime()
    assert (rt.name, rt.device_count(), rt.current_device()) == ("host", 0, None)
    assert rt.locate(np.zeros(3).ctypes.data) == HOST == Location(MemoryKind.HOST, None)
    with pytest.raises(RuntimeUnavailableError, match="cannot allocate device memory"):
        rt.alloc_device(8, 0)
    pinned = rt.alloc_pinned(100)
    assert pinned.nbytes == 100
    assert pinned.array.dtype == np.uint8
    assert pinned.array.shape == (100,)
    assert pinned.ptr == pinned.array.ctypes.data


@pytest.mark.parametrize("handle", [3, 0x7F00_1234_5600, 2**64 - 1])
def test_sync_unknown_handle_raises_naming_it(handle: int) -> None:
    with pytest.raises(StreamError, match=f"stream handle {handle:#x} cannot be synchronized") as info:
        HostRuntime().sync_stream(handle, None)
    assert "no simulated stream has that handle" in str(info.value)


@pytest.mark.parametrize("handle", [1, 2])
def test_sync_default_handles_without_simulated_streams_is_a_noop(
    handle: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(simstream, "_legacy", None)
    monkeypatch.setattr(simstream, "_per_thread", threading.local())
    assert resolve_stream(handle) is None
    HostRuntime().sync_stream(handle, None)
    HostRuntime().sync_stream(handle, 0)
    HostRuntime().stream_wait_event(handle, SimulatedEvent(), None)  # nothing to wait on either


def test_sync_stream_waits_for_a_simulated_stream(stream: SimulatedStream) -> None:
    box = bytearray(1)
    stream.enqueue(box.__setitem__, 0, 42, delay=0.05)
    HostRuntime().sync_stream(stream.handle, None)
    assert box[0] == 42


def test_sync_legacy_stream_waits() -> None:
    box = bytearray(1)
    SimulatedStream.legacy().enqueue(box.__setitem__, 0, 7, delay=0.05)
    HostRuntime().sync_stream(1, None)
    assert box[0] == 7


def test_sync_stream_reraises_the_producers_error(stream: SimulatedStream) -> None:
    stream.enqueue(int, "not a number")
    with pytest.raises(StreamError, match="work on test-stream failed"):
        HostRuntime().sync_stream(stream.handle, None)


def test_stream_wait_event_makes_the_producer_wait(stream: SimulatedStream) -> None:
    rt = HostRuntime()
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


def test_copy_async_on_an_own_stream() -> None:
    rt = HostRuntime()
    own = rt.create_stream(0)
    src = np.arange(100, dtype=np.uint8)
    dst = np.zeros(100, np.uint8)
    rt.copy_async(dst.ctypes.data + 10, src.ctypes.data, 50, own)
    rt.copy_async(dst.ctypes.data, src.ctypes.data, 0, own)
    own.synchronize()
    assert bytes(dst) == bytes(10) + bytes(range(50)) + bytes(40)


# =============================================================================================
# SimulatedRuntime


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


# =============================================================================================
# HostBufferPool


@pytest.fixture(params=[False, True], ids=["c-lease", "python-lease"])
def pure_python(request: pytest.FixtureRequest) -> bool:
    """Every pool test runs on the C lease (where built) and on the pure-Python fallback."""
    if not request.param and not HAVE_C_BUFFER_EXPORT:
        pytest.skip("the C extension cai_mpi._src._bufexport was not built")
    return bool(request.param)


def test_pool_reuses_a_freed_block(pure_python: bool) -> None:
    pool = HostBufferPool(min_bytes=1024, max_bytes=1 << 20, pure_python=pure_python)
    a = pool.take(5000)
    assert (a.dtype, a.shape, a.flags.writeable) == (np.dtype(np.uint8), (5000,), True)
    assert type(a) is np.ndarray
    addr = a.ctypes.data
    a[:] = 7
    del a
    gc.collect()
    assert pool.cached_bytes == 8192
    b = pool.take(6000)  # same size class (8192)
    assert b.ctypes.data == addr
    assert b.shape == (6000,)
    assert pool.cached_bytes == 0


def test_pool_does_not_reuse_while_a_view_is_alive(pure_python: bool) -> None:
    pool = HostBufferPool(min_bytes=1024, max_bytes=1 << 20, pure_python=pure_python)
    a = pool.take(5000)
    addr = a.ctypes.data
    views = [a[10:20], a.reshape(50, 100)[::2].T, a.view(np.float64)]
    del a
    gc.collect()
    assert pool.cached_bytes == 0
    b = pool.take(5000)
    assert b.ctypes.data != addr
    for i in range(len(views)):
        views[i] = None  # type: ignore[call-overload]
        gc.collect()
        if i < len(views) - 1:
            assert pool.cached_bytes == 0
    assert pool.cached_bytes == 8192
    c = pool.take(5000)
    assert c.ctypes.data == addr
    del b


@pytest.mark.parametrize(
    ("shape", "dtype", "fortran"),
    [((8192,), np.uint8, False), ((64, 32), np.float32, False), ((64, 32), np.float32, True), ((3, 700), "V3", False)],
)
def test_pool_take_array_keeps_its_block_until_the_last_view_dies(
    shape: tuple[int, ...], dtype: Any, fortran: bool, pure_python: bool
) -> None:
    """Exact size classes too: numpy collapses view bases, so the lease must stay in the chain."""
    pool = HostBufferPool(min_bytes=1024, max_bytes=1 << 20, pure_python=pure_python)
    nbytes = int(np.prod(shape)) * np.dtype(dtype).itemsize
    a = pool.take_array(nbytes, shape, np.dtype(dtype), fortran)
    assert (type(a), a.shape, a.dtype, a.flags.writeable) == (np.ndarray, shape, np.dtype(dtype), True)
    assert a.flags.f_contiguous if fortran else a.flags.c_contiguous
    gc.collect()
    assert pool.cached_bytes == 0  # the block is lent out
    addr = a.ctypes.data
    row = a[..., 1:]
    del a
    gc.collect()
    assert pool.cached_bytes == 0  # a view still uses it
    assert pool.take_array(nbytes, shape, np.dtype(dtype), fortran).ctypes.data != addr
    del row
    gc.collect()
    assert pool.cached_bytes > 0
    assert pool.take_array(nbytes, shape, np.dtype(dtype), fortran).ctypes.data == addr


def test_pool_size_classes_and_limits(pure_python: bool) -> None:
    pool = HostBufferPool(min_bytes=1024, max_bytes=8192, max_cached=8192, pure_python=pure_python)
    small = pool.take(100)
    big = pool.take(10000)
    assert (small.nbytes, big.nbytes) == (100, 10000)
    del small, big
    gc.collect()
    assert pool.cached_bytes == 0  # neither size is pooled
    x, y = pool.take(5000), pool.take(5000)
    del x, y
    gc.collect()
    assert pool.cached_bytes == 8192  # max_cached keeps one of the two blocks
    z = pool.take(2000)  # size class 2048: a different bucket
    assert pool.cached_bytes == 8192
    del z
    gc.collect()
    assert pool.cached_bytes == 2048  # the 8192 block, taken longest ago, made room for it
    pool.clear()
    assert pool.cached_bytes == 0


def test_pool_evicts_least_recent_size_class(pure_python: bool) -> None:
    """A run that moves on to a new size keeps pooling it (no page faults) once the cache is full."""
    pool = HostBufferPool(min_bytes=1024, max_bytes=1 << 20, max_cached=3 * 4096, pure_python=pure_python)
    old = [pool.take(4096) for _ in range(3)]
    del old
    gc.collect()
    assert pool.cached_bytes == 3 * 4096
    new = pool.take(8192)
    addr = new.ctypes.data
    del new
    gc.collect()
    assert pool.cached_bytes == 4096 + 8192  # two 4 KiB blocks evicted, oldest class first
    again = pool.take(8192)
    assert again.ctypes.data == addr  # the new size class is served from the pool
    del again
    gc.collect()
    assert pool.cached_bytes <= pool.max_cached


def test_pool_moves_on_to_a_new_size_used_several_at_a_time(pure_python: bool) -> None:
    """Blocks of a new size class returning to a full pool evict the old class's idle blocks, however
    many of the new class are in use at once: after the first round every take is served from the pool."""
    pool = HostBufferPool(min_bytes=1024, max_bytes=1 << 20, max_cached=4 * 4096, pure_python=pure_python)
    old = [pool.take(4096) for _ in range(4)]
    del old
    gc.collect()
    assert pool.cached_bytes == 4 * 4096
    seen: set[int] = set()
    for _ in range(20):
        pair = [pool.take(8192), pool.take(8192)]
        seen.update(a.ctypes.data for a in pair)
        del pair
        gc.collect()
    assert len(seen) == 2  # two blocks made in the first round, reused ever after
    assert pool.cached_bytes == 2 * 8192 and not pool._free[4096]


def test_pool_clear_while_another_thread_takes_new_sizes(pure_python: bool) -> None:
    errors: list[BaseException] = []
    stop = threading.Event()

    def clearer(pool: HostBufferPool) -> None:
        while not stop.is_set():
            try:
                pool.clear()
            except BaseException as exc:  # any error fails the test below
                errors.append(exc)
                return

    old_interval = sys.getswitchinterval()
    sys.setswitchinterval(1e-6)  # switch threads as often as possible
    try:
        for _ in range(50):
            pool = HostBufferPool(min_bytes=1, max_bytes=1 << 28, pure_python=pure_python)
            for k in range(12):
                pool.take(1 << k)  # size classes with an idle block each: clear() has a walk to do
            t = threading.Thread(target=clearer, args=(pool,))
            t.start()
            for k in range(12, 28):
                pool.take(1 << k)  # a new size class each (np.empty: no page is touched)
            stop.set()
            t.join()
            stop.clear()
            if errors:
                break
    finally:
        sys.setswitchinterval(old_interval)
    assert not errors


C_LEASE_OUT_OF_MEMORY = """
import sys, numpy as np, _testcapi
from cai_mpi._src._bufexport import PoolBudget, take_lease
budget, free = PoolBudget(1 << 30), []
refs = sys.getrefcount(budget), sys.getrefcount(free)
lease = take_lease(free, budget, 4096, np.empty(4096, np.uint8))
_testcapi.set_nomemory(0, 1)  # the next allocation fails: the block cannot be appended to the free list
del lease
_testcapi.remove_mem_hooks()
assert (free, budget.cached) == ([], 0), (free, budget.cached)
assert (sys.getrefcount(budget), sys.getrefcount(free)) == refs, (refs, sys.getrefcount(budget))
print("ok")
"""


def test_c_lease_dropped_out_of_memory_frees_its_block_quietly() -> None:
    """A failed return to the pool (no memory for the list to grow) frees the block, nothing else."""
    if not HAVE_C_BUFFER_EXPORT:
        pytest.skip("the C extension cai_mpi._src._bufexport was not built")
    pytest.importorskip("_testcapi", reason="this Python was built without _testcapi")
    # In a child process: the bug this guards against (reporting the error about the dying lease
    # itself) deallocated the lease twice and crashed the interpreter.
    proc = subprocess.run([sys.executable, "-c", C_LEASE_OUT_OF_MEMORY], capture_output=True, text=True,
                          timeout=60)
    assert proc.returncode == 0 and proc.stdout.strip() == "ok", proc.stderr
    assert "Exception ignored" not in proc.stderr  # a block not pooled is not an error worth a report


def test_pool_budget_stays_exact_under_threads(pure_python: bool) -> None:
    """Takes and returns from several threads: the idle bytes counted are the idle bytes held."""
    pool = HostBufferPool(min_bytes=1024, max_bytes=1 << 16, max_cached=5 * 8192, pure_python=pure_python)
    sizes = [1500, 3000, 5000, 9000, 20000, 40000]

    def churn(seed: int) -> None:
        rng = np.random.default_rng(seed)
        held: list[np.ndarray[Any, Any]] = []
        for _ in range(3000):
            if held and rng.random() < 0.5:
                held.pop(int(rng.integers(len(held))))
            else:
                a = pool.take(int(rng.choice(sizes)))
                a[:8] = seed  # the memory is writable and ours
                held.append(a)

    threads = [threading.Thread(target=churn, args=(seed,)) for seed in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    gc.collect()
    idle = sum(cls * len(free) for cls, free in pool._free.items())
    assert pool.cached_bytes == idle
    assert 0 < idle <= pool.max_cached


# =============================================================================================
# strided_type through MPI.COMM_SELF


@st.composite
def strided_views(draw: st.DrawFn) -> tuple[np.ndarray[Any, Any], np.ndarray[Any, Any]]:
    itemsize = draw(st.sampled_from([1, 2, 3, 4, 8, 16]))
    dtype = np.dtype(f"V{itemsize}")
    shape = tuple(draw(st.lists(st.integers(1, 5), min_size=0, max_size=4)))
    nbytes = int(np.prod(shape)) * itemsize
    base = np.frombuffer(bytearray(draw(st.binary(min_size=nbytes, max_size=nbytes))), dtype).reshape(shape)
    index = tuple(
        slice(draw(st.integers(0, n)), None, draw(st.sampled_from([1, 2, 3, -1, -2]))) for n in shape
    )
    view = base[(*index, Ellipsis)]
    if view.ndim > 1 and draw(st.booleans()):
        view = view.transpose(draw(st.permutations(range(view.ndim))))
    return base, view


def mpi_strided_buffer(view: np.ndarray[Any, Any]) -> list[Any]:
    assume(describable(view.shape, view.strides))  # stride -1 layouts are copied, not described
    desc = descriptor_from_numpy(view)
    dt, low = strided_type(view.shape, desc.byte_strides, view.itemsize)
    if view.size:
        assert low == desc.byte_extent[0]
        extent = desc.byte_extent[1] - desc.byte_extent[0]
        assert dt.Get_true_extent() == (0, extent)
        ptr = view.ctypes.data
    else:
        extent, ptr = 0, view.ctypes.data
    assert dt.Get_size() == view.nbytes
    return [MPI.buffer.fromaddress(ptr + low, extent), 1, dt]


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(strided_views())
def test_strided_type_sends_a_view(bv: tuple[np.ndarray[Any, Any], np.ndarray[Any, Any]]) -> None:
    base, view = bv
    before = base.tobytes()
    recv = bytearray(view.nbytes + 8)
    MPI.COMM_SELF.Sendrecv(mpi_strided_buffer(view), 0, 5, [recv, view.nbytes, MPI.BYTE], 0, 5)
    assert bytes(recv[: view.nbytes]) == np.ascontiguousarray(view).tobytes()
    assert bytes(recv[view.nbytes :]) == bytes(8)
    assert base.tobytes() == before


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(strided_views(), st.data())
def test_strided_type_receives_into_a_view(
    bv: tuple[np.ndarray[Any, Any], np.ndarray[Any, Any]], data: st.DataObject
) -> None:
    base, view = bv
    payload = data.draw(st.binary(min_size=view.nbytes, max_size=view.nbytes))
    expected = base.copy()
    expected_view = (
        np.ndarray(
            view.shape,
            view.dtype,
            buffer=expected,
            offset=view.ctypes.data - base.ctypes.data,
            strides=view.strides,
        )
        if view.size
        else expected[:0]
    )
    if view.size:
        expected_view[...] = np.frombuffer(payload, view.dtype).reshape(view.shape)
    MPI.COMM_SELF.Sendrecv([bytearray(payload), len(payload), MPI.BYTE], 0, 6, mpi_strided_buffer(view), 0, 6)
    assert np.ascontiguousarray(view).tobytes() == payload
    assert base.tobytes() == expected.tobytes()


def test_strided_type_is_cached_and_low_is_the_lowest_byte() -> None:
    a, low_a = strided_type((3, 4), (-32, 8), 8)
    b, low_b = strided_type((3, 4), (-32, 8), 8)
    assert a is b
    assert low_a == low_b == -64
    assert a.Get_size() == 96
    assert a.Get_true_extent() == (0, 96)
    _, low = strided_type((2, 3), (24, -8), 8)
    assert low == -16


def test_strided_type_of_a_zero_size_view() -> None:
    dt, _ = strided_type((0, 4), (32, 8), 8)
    assert dt.Get_size() == 0
    recv = bytearray(4)
    MPI.COMM_SELF.Sendrecv([MPI.buffer.fromaddress(0, 0), 1, dt], 0, 7, [recv, 0, MPI.BYTE], 0, 7)
    assert bytes(recv) == bytes(4)


def test_host_view_round_trips_a_strided_descriptor() -> None:
    base = np.arange(24, dtype="<i4").reshape(4, 6)
    view = base[::-2, 1::2].T
    d = descriptor_from_numpy(view)
    hv = host_view(d)
    assert hv.tobytes() == view.tobytes()
    assert hv.strides == view.strides
    assert hv.flags.writeable
    assert host_view(d, readonly=True).flags.writeable is False
    hv[0, 0] = -1
    assert base[3, 1] == -1


def test_describable_refuses_byte_stride_minus_one() -> None:
    """Open MPI 5.0 mishandles hvector stride -1; such layouts must take the copy path."""
    assert not describable((4, 3), (-1, 4))
    assert describable((1, 3), (-1, 4))  # a length-1 dimension's stride is never used
    assert describable((4,), (-2,))
