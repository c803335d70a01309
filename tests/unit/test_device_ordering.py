"""Ordering and ownership of device memory, end to end: the real CUDA runtime and transport on the CUDA driver
double, a rank sending to itself. Each test plays a producer (a "kernel" still running on some stream) and checks
that what arrives is exactly what the stream order says it must be."""

from __future__ import annotations

import contextlib
import ctypes
import gc
import threading
import weakref
from collections.abc import Iterator
from typing import Any

import numpy as np
import pytest
from mpi4py import MPI

import cai_mpi
from cai_mpi._src.config import reload_config
from cai_mpi._src.runtime.cuda import CudaRuntime
from cai_mpi._src.transport import pieces
from cai_mpi.testing import CudaDriverDouble, DoubleDeviceArray, double_runtime, use_runtime

me = MPI.COMM_WORLD.Get_rank()
SLOW = 0.3  # seconds a "kernel" or copy takes: long enough that a missing wait shows
LAZY = 0.2  # queued device work runs only when waited for, or after this long: a missing wait reads stale bytes


def double_of(rt: Any) -> CudaDriverDouble:
    return rt.driver_double  # type: ignore[no-any-return]


def device_bytes(rt: CudaRuntime, array: cai_mpi.Array) -> bytes:
    rt.sync_device(0)
    return double_of(rt).read_device(array.descriptor.ptr, array.nbytes)


def kernel_write(rt: CudaRuntime, stream: int, ptr: int, data: np.ndarray[Any, Any], delay: float = SLOW) -> None:
    """A kernel on ``stream`` (1: the legacy default stream) that writes ``data`` at ``ptr`` after ``delay``."""
    with rt.driver.on(0):
        double_of(rt).kernel_write(stream, ptr, data.tobytes(), delay=delay)


def user_stream(rt: CudaRuntime, *, blocking: bool = False) -> int:
    """A stream of the user's: CU_STREAM_NON_BLOCKING (like a PyTorch side stream), or a blocking one (as
    ``cupy.cuda.Stream()`` makes by default)."""
    d = double_of(rt)
    flags = d.CUstream_flags.CU_STREAM_DEFAULT if blocking else d.CUstream_flags.CU_STREAM_NON_BLOCKING
    with rt.driver.on(0):
        (handle,) = rt.driver.check("cuStreamCreate", flags)
    return int(handle)


@pytest.fixture(params=["legacy", "blocking"])
def users_stream(request: pytest.FixtureRequest) -> Any:
    """Where a user's kernel on a received Array runs, of the streams the default rule covers."""
    return lambda rt: 1 if request.param == "legacy" else user_stream(rt, blocking=True)


@contextlib.contextmanager
def on_the_double(
    direct: bool, monkeypatch: pytest.MonkeyPatch, lazy: float = 0.0
) -> Iterator[tuple[CudaRuntime, MPI.Comm]]:
    """The runtime on a double and a communicator whose device payloads go to MPI directly (a CUDA-aware MPI,
    host-accessible device memory) or are staged through pinned memory (device memory faults on host access)."""
    monkeypatch.setenv("CAI_MPI_CUDA_AWARE", "1" if direct else "0")
    reload_config({"CAI_MPI_INLINE_BYTES": "0", "CAI_MPI_CHUNK_BYTES": "65536"})
    rt = double_runtime(cuda_aware=direct, lazy=lazy)
    comm = MPI.COMM_WORLD.Dup()
    with use_runtime(rt):
        yield rt, comm  # type: ignore[misc]
        gc.collect()
    comm.Free()
    reload_config()
    gc.collect()
    double_of(rt).close()


@pytest.fixture(params=["direct", "staged"])
def route(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> Iterator[tuple[CudaRuntime, MPI.Comm]]:
    with on_the_double(request.param == "direct", monkeypatch) as r:
        yield r


@pytest.fixture(params=["direct", "staged"])
def lazy_route(
    request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch
) -> Iterator[tuple[CudaRuntime, MPI.Comm]]:
    """``route`` on a lazy double: queued device work runs only when something waits for it (or after ``LAZY``
    seconds), so a read that skips a wait sees the old bytes every time, not by luck of timing."""
    with on_the_double(request.param == "direct", monkeypatch, LAZY) as r:
        yield r


@pytest.fixture
def staged(monkeypatch: pytest.MonkeyPatch) -> Iterator[tuple[CudaRuntime, MPI.Comm]]:
    with on_the_double(False, monkeypatch) as r:
        yield r


def round_trip(obj: Any, comm: MPI.Comm, sync: bool | None = None, **kw: Any) -> cai_mpi.Array:
    req = cai_mpi.isend_array(obj, me, 5, comm, sync=sync)
    got = cai_mpi.recv_array(me, 5, comm, **kw)
    req.wait()
    return got


N = 1 << 15  # 256 KiB of float64: four staging chunks
OLD, NEW = np.zeros(N), np.arange(N, dtype=np.float64) + 1


# -- defect 1: cai_mpi's own device data, and v3 exporters that give no stream ---------------------------------


def test_v3_stream_none_on_device_waits_for_the_default_stream(lazy_route: tuple[CudaRuntime, MPI.Comm]) -> None:
    # Numba exports "stream": None while kernels it launched on the default stream may still run.
    rt, comm = lazy_route
    x = DoubleDeviceArray(rt, OLD, stream=None)
    kernel_write(rt, 1, x.buf.ptr, NEW)
    assert np.array_equal(np.asarray(round_trip(x, comm, device="host")), NEW)


def test_forwarding_a_received_device_array_waits_for_work_on_it(
    lazy_route: tuple[CudaRuntime, MPI.Comm], users_stream: Any
) -> None:
    # cupy.asarray(got) *= 2 runs on the caller's stream; send_array(got) must send the result.
    rt, comm = lazy_route
    got = round_trip(DoubleDeviceArray(rt, OLD), comm, device=0)
    assert got.device == 0
    kernel_write(rt, users_stream(rt), got.descriptor.ptr, NEW)
    assert np.array_equal(np.asarray(round_trip(got, comm, device="host")), NEW)


def test_receiving_into_a_device_array_waits_for_work_on_it(
    lazy_route: tuple[CudaRuntime, MPI.Comm], users_stream: Any
) -> None:
    rt, comm = lazy_route
    out = round_trip(DoubleDeviceArray(rt, OLD), comm, device=0)
    kernel_write(rt, users_stream(rt), out.descriptor.ptr, OLD)  # still writing when the receive starts
    got = round_trip(NEW, comm, out=out)
    assert got.descriptor.ptr == out.descriptor.ptr
    assert device_bytes(rt, got) == NEW.tobytes()


def test_work_on_a_non_blocking_stream_is_waited_for_only_with_sync_device(
    route: tuple[CudaRuntime, MPI.Comm],
) -> None:
    # Issue 24, defect 6: a producer that names no stream is ordered after the legacy default stream (and so every
    # blocking stream); a non-blocking stream's work (an NCCL collective, say) is not waited for, or a collective
    # whose peer waits for this message would deadlock. CAI_MPI_SYNC=device opts in to the whole device.
    rt, comm = route
    x = DoubleDeviceArray(rt, OLD, stream=None)
    side = user_stream(rt)
    gate = threading.Event()  # the side stream's kernel runs until the test lets it finish
    with rt.driver.on(0):
        double_of(rt).launch(side, lambda: gate.wait(30))
    kernel_write(rt, side, x.buf.ptr, NEW, delay=0)
    assert np.array_equal(np.asarray(round_trip(x, comm, device="host")), OLD)  # not waited for: no deadlock
    gate.set()
    rt.sync_device(0)
    kernel_write(rt, side, x.buf.ptr, OLD)
    reload_config({"CAI_MPI_INLINE_BYTES": "0", "CAI_MPI_CHUNK_BYTES": "65536", "CAI_MPI_SYNC": "device"})
    assert np.array_equal(np.asarray(round_trip(x, comm, device="host")), OLD)  # the whole device: waited for


class MappedArray:
    """A CAI v3 exporter of mapped pinned memory at its device alias ``ptr``, naming no stream."""

    def __init__(self, ptr: int, like: np.ndarray[Any, Any]) -> None:
        self.__cuda_array_interface__ = {"shape": like.shape, "typestr": like.dtype.str, "data": (ptr, False),
                                         "version": 3, "strides": None, "stream": None}


def test_pinned_host_memory_a_kernel_writes_is_waited_for(lazy_route: tuple[CudaRuntime, MPI.Comm]) -> None:
    # Issue 24, defect 6: Numba's mapped_array is pinned host memory a default-stream kernel writes; it names no
    # stream, and MPI reads it directly, so the default-stream rule applies to it too.
    rt, comm = lazy_route
    d = double_of(rt)
    with rt.driver.on(0):
        host = int(rt.driver.check("cuMemHostAlloc", OLD.nbytes, d.CU_MEMHOSTALLOC_DEVICEMAP)[0])
        alias = int(rt.driver.check("cuMemHostGetDevicePointer", host, 0)[0])
    ctypes.memmove(host, OLD.ctypes.data, OLD.nbytes)
    mapped = MappedArray(alias, OLD)  # what Numba's mapped_array exports: the device alias, stream None
    kernel_write(rt, 1, alias, NEW)
    assert np.array_equal(np.asarray(round_trip(mapped, comm, device="host")), NEW)
    with rt.driver.on(0):
        rt.driver.check("cuMemFreeHost", host)


def test_numpy_of_a_device_array_sees_pending_work(lazy_route: tuple[CudaRuntime, MPI.Comm]) -> None:
    rt, comm = lazy_route
    got = round_trip(DoubleDeviceArray(rt, OLD), comm, device=0)
    kernel_write(rt, 1, got.descriptor.ptr, NEW)
    assert np.array_equal(got.numpy(), NEW)


def test_sync_false_trusts_the_caller(route: tuple[CudaRuntime, MPI.Comm]) -> None:
    # The opt-out is honoured: what is pending is not waited for (the caller promised there is nothing).
    # The write waits until the round trip is done, so OLD is what was sent however slow the machine is (a wait
    # that should not happen blocks for 30 s, then sees NEW).
    rt, comm = route
    x = DoubleDeviceArray(rt, OLD, stream=None)
    stream, sent = user_stream(rt), threading.Event()
    with rt.driver.on(0):
        double_of(rt).launch(stream, lambda: sent.wait(30))
    kernel_write(rt, stream, x.buf.ptr, NEW, delay=0.0)
    got = np.asarray(round_trip(x, comm, device="host", sync=False))
    sent.set()
    rt.sync_device(0)
    assert np.array_equal(got, OLD)


def test_a_channel_waits_for_work_on_its_array_before_the_next_message(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("CAI_MPI_CUDA_AWARE", "1")
    rt = double_runtime(cuda_aware=True)
    comm = MPI.COMM_WORLD.Dup()
    try:
        with use_runtime(rt):
            x = np.zeros(N)
            with cai_mpi.send_channel(x, me, 9, comm) as tx, cai_mpi.recv_channel(me, 9, comm, device=0) as rx:
                tx.isend()
                first = rx.recv()
                seen = bytearray()
                ptr, nbytes = first.descriptor.ptr, first.nbytes
                reader = user_stream(rt, blocking=True)
                with rt.driver.on(0):  # a kernel still reading the first message (on a blocking stream)
                    double_of(rt).launch(reader, lambda: seen.extend(double_of(rt).read_device(ptr, nbytes)),
                                         delay=SLOW)
                x[:] = NEW
                req = tx.isend()
                rx.recv()
                req.wait()
                rt.sync_device(0)
                assert bytes(seen) == np.zeros(N).tobytes()
                assert device_bytes(rt, first) == NEW.tobytes()
    finally:
        comm.Free()
        double_of(rt).close()


def test_a_staged_device_receive_waits_for_its_last_copy(lazy_route: tuple[CudaRuntime, MPI.Comm]) -> None:
    # Issue 28, item 3: a staged receive that did not wait for its last copy event was caught in 3 runs of 5; on the
    # lazy double the copy has not run when recv_array returns unless the receive waited for it, every time.
    rt, comm = lazy_route
    for n in (1, 4, 5):  # one chunk, exactly four, and four plus a partial one (CAI_MPI_CHUNK_BYTES is 64 KiB)
        data = np.arange(n * 8192 + (n == 5) * 100, dtype=np.float64) + n
        got = round_trip(data, comm, device=0)
        assert double_of(rt).read_device(got.descriptor.ptr, got.nbytes) == data.tobytes()  # no wait of our own


# -- issue 24, defect 1: a received block is not recycled while a user kernel still reads it ----------------------


def test_a_received_block_is_not_reused_while_a_kernel_still_reads_it(lazy_route: tuple[CudaRuntime, MPI.Comm]) -> None:
    # z = f(cupy.asarray(recv_array(0))): f still reads the block on the caller's stream when the Array dies; the
    # next receive must not land in that block under f (the pool hands a freed block to the next allocation on
    # the stream it was freed on at once).
    rt, comm = lazy_route
    first = round_trip(DoubleDeviceArray(rt, OLD), comm, device=0)
    seen = bytearray()
    ptr, nbytes = first.descriptor.ptr, first.nbytes
    with rt.driver.on(0):  # f, on the legacy default stream (the caller's current stream without CuPy)
        double_of(rt).launch(1, lambda: seen.extend(double_of(rt).read_device(ptr, nbytes)), delay=SLOW)
    del first
    gc.collect()
    second = round_trip(NEW, comm, device=0)  # (a host send: nothing on the device is waited for)
    assert device_bytes(rt, second) == NEW.tobytes()
    assert bytes(seen) == OLD.tobytes()


def test_a_retired_block_is_reused_once_the_kernels_reading_it_are_done(route: tuple[CudaRuntime, MPI.Comm]) -> None:
    # The guard holds a block back only while user work may read it: a steady stream of receives reuses memory.
    rt, comm = route
    first = round_trip(DoubleDeviceArray(rt, OLD), comm, device=0)
    ptr = first.descriptor.ptr
    del first
    gc.collect()
    rt.sync_device(0)
    second = round_trip(DoubleDeviceArray(rt, NEW), comm, device=0)
    assert second.descriptor.ptr == ptr
    assert device_bytes(rt, second) == NEW.tobytes()


def test_a_received_array_names_the_stream_its_data_is_ready_on(route: tuple[CudaRuntime, MPI.Comm]) -> None:
    rt, comm = route
    got = round_trip(DoubleDeviceArray(rt, NEW), comm, device=0)
    cai = got.__cuda_array_interface__
    assert cai["version"] == 3 and cai["stream"] == 1  # the caller's current stream: the legacy default one
    assert device_bytes(rt, got) == NEW.tobytes()


# -- defect 12: the producer's stream after a device pack, and v3 streams on the staged path -------------------


def test_a_v3_stream_is_synchronized_before_a_send(lazy_route: tuple[CudaRuntime, MPI.Comm]) -> None:
    rt, comm = lazy_route
    s = user_stream(rt)
    x = DoubleDeviceArray(rt, OLD, stream=s)
    kernel_write(rt, s, x.buf.ptr, NEW)
    assert np.array_equal(np.asarray(round_trip(x, comm, device="host")), NEW)


def test_the_producer_stream_cannot_overtake_the_pack(lazy_route: tuple[CudaRuntime, MPI.Comm]) -> None:
    # A strided v3 array is packed on cai_mpi's stream; the producer's stream must wait for the pack, so work the
    # producer enqueues after isend_array returns cannot change what is sent.
    rt, comm = lazy_route
    base = np.arange(2 * N, dtype=np.float64)
    s = user_stream(rt)
    x = DoubleDeviceArray(rt, base, stream=s, view=((N,), (16,)))
    double_of(rt).set_copy_delay(SLOW)
    req = cai_mpi.isend_array(x, me, 6, comm)
    kernel_write(rt, s, x.buf.ptr, np.full(2 * N, -1.0), delay=0)
    double_of(rt).set_copy_delay(0)
    got = cai_mpi.recv_array(me, 6, comm, device="host")
    req.wait()
    assert np.array_equal(np.asarray(got), base[::2])


# -- defect 2: device receive buffers come from CuPy's pool under cai_mpi's stream ----------------------------


class FakeCupy:
    """What cai_mpi uses of CuPy, on the double: it records the current stream of every allocation."""

    def __init__(self, rt: CudaRuntime) -> None:
        self.rt, self.current_stream, self.allocated_on = rt, 0, []
        fake = self

        class Stream:
            @staticmethod
            def from_external(ref: Any) -> Any:
                class Current:
                    def __enter__(self) -> None:
                        self.previous, fake.current_stream = fake.current_stream, ref.__cuda_stream__()[1]

                    def __exit__(self, *exc: object) -> None:
                        fake.current_stream = self.previous

                return Current()

        class Device:
            def __init__(self, ordinal: int) -> None:
                pass

            def __enter__(self) -> None:
                pass

            def __exit__(self, *exc: object) -> None:
                pass

        class Memory:
            def __init__(self, nbytes: int) -> None:
                fake.allocated_on.append(fake.current_stream)
                (ptr,) = rt.driver.check("cuMemAlloc", nbytes)
                self.ptr = int(ptr)

        class PinnedMemory(bytearray):  # the buffer numpy views; its address as CuPy's PinnedMemoryPointer has it
            def __init__(self, nbytes: int) -> None:
                super().__init__(nbytes)
                self.ptr = np.frombuffer(self, np.uint8).ctypes.data

        class NullStream:
            ptr = 0

        def get_current_stream(device_id: int = -1) -> Any:
            return NullStream()

        self.cuda = type("cuda", (), {"Stream": Stream, "Device": Device, "alloc": Memory,
                                      "alloc_pinned_memory": PinnedMemory,
                                      "get_current_stream": staticmethod(get_current_stream)})


def test_receive_buffers_are_allocated_on_cai_mpis_stream(route: tuple[CudaRuntime, MPI.Comm]) -> None:
    rt, comm = route
    x = DoubleDeviceArray(rt, NEW)
    cupy = FakeCupy(rt)
    rt._load_cupy = lambda: cupy  # type: ignore[method-assign]
    got = round_trip(x, comm, device=0)
    assert device_bytes(rt, got) == NEW.tobytes()
    ours = pieces.internal_stream(rt, 0).handle  # type: ignore[attr-defined]
    assert cupy.allocated_on and set(cupy.allocated_on) == {ours}, (cupy.allocated_on, ours)


# -- defect 8: the per-thread default stream is synchronized by the thread that owns it -----------------------


def test_an_out_on_the_per_thread_stream_is_synchronized_in_the_calling_thread(
    route: tuple[CudaRuntime, MPI.Comm],
) -> None:
    rt, comm = route
    out = DoubleDeviceArray(rt, OLD, stream=2)
    started = threading.Event()
    box: dict[str, Any] = {}

    def caller() -> None:  # its per-thread stream still writes into out= when the receive is posted
        kernel_write(rt, 2, out.buf.ptr, OLD)
        box["req"] = cai_mpi.irecv_array(me, 7, comm, out=out)
        started.set()

    t = threading.Thread(target=caller)
    t.start()
    started.wait()
    cai_mpi.send_array(NEW, me, 7, comm)  # this thread's waits drive the receive
    box["req"].wait()
    t.join()
    rt.sync_device(0)
    assert double_of(rt).read_device(out.buf.ptr, NEW.nbytes) == NEW.tobytes()


# -- defects 4 and 6: pinned staging memory is bounded, and never lent out while MPI or a copy still uses it ------


def test_pinned_staging_memory_stays_within_the_pool_budget(staged: tuple[CudaRuntime, MPI.Comm]) -> None:
    rt, comm = staged
    budget = 128 << 10
    reload_config({"CAI_MPI_INLINE_BYTES": "0", "CAI_MPI_CHUNK_BYTES": "65536",
                   "CAI_MPI_PINNED_POOL_BYTES": str(budget)})
    d = double_of(rt)
    for n in range(1000, 200_000, 3331):  # 60 distinct message sizes
        x = np.arange(n, dtype=np.uint8)
        assert np.array_equal(np.asarray(round_trip(DoubleDeviceArray(rt, x), comm, device="host")), x)
    assert d.pinned_bytes_outstanding <= budget, d.pinned_bytes_outstanding
    assert d.pinned_bytes_peak <= budget + 4 * 65536, d.pinned_bytes_peak  # + what two transfers hold at once


class CupyPinnedPool:
    """CuPy's pinned memory pool, as cai_mpi would meet it: page-locked blocks from the driver, sizes rounded up to
    a power of two, and a freed block kept for reuse, never given back to the driver."""

    def __init__(self, rt: CudaRuntime) -> None:
        self.rt, self.idle = rt, {}  # size -> blocks kept

    def alloc_pinned_memory(self, nbytes: int) -> Any:
        size = 1 << max(nbytes - 1, 511).bit_length()
        kept = self.idle.setdefault(size, [])
        if kept:
            ptr = kept.pop()
        else:
            with self.rt.driver.on(0):
                (ptr,) = self.rt.driver.check("cuMemHostAlloc", size, 1)
        raw = (ctypes.c_ubyte * size).from_address(int(ptr))
        raw.ptr = int(ptr)  # type: ignore[attr-defined]  # as CuPy's PinnedMemoryPointer
        weakref.finalize(raw, kept.append, ptr)  # back to the pool (not the driver) once no view of it remains
        return raw


def test_pinned_memory_stays_within_its_budget_with_cupys_pinned_pool(
    staged: tuple[CudaRuntime, MPI.Comm],
) -> None:
    # Issue 24, defect 7: CuPy's pinned pool keeps every freed block, so CAI_MPI_PINNED_POOL_BYTES bounded only
    # cai_mpi's own pool of blocks, not the page-locked memory behind them.
    rt, comm = staged
    budget = 128 << 10
    reload_config({"CAI_MPI_INLINE_BYTES": "0", "CAI_MPI_CHUNK_BYTES": "65536",
                   "CAI_MPI_PINNED_POOL_BYTES": str(budget)})
    cupy = FakeCupy(rt)
    cupy.cuda.alloc_pinned_memory = CupyPinnedPool(rt).alloc_pinned_memory  # type: ignore[attr-defined]
    rt._load_cupy = lambda: cupy  # type: ignore[method-assign]
    d = double_of(rt)
    for n in range(1000, 200_000, 3331):  # many distinct sizes: a pool that never gives back keeps them all
        x = np.arange(n, dtype=np.uint8)
        assert np.array_equal(np.asarray(round_trip(DoubleDeviceArray(rt, x), comm, device="host")), x)
    gc.collect()
    assert d.pinned_bytes_outstanding <= budget, d.pinned_bytes_outstanding


def test_a_staged_send_failing_after_its_first_chunk_is_reported_and_loses_no_block(
    staged: tuple[CudaRuntime, MPI.Comm], monkeypatch: pytest.MonkeyPatch
) -> None:
    # Chunk 0 is copied and sent; chunk 1's copy fails. The receiver (posted first: a send to this rank completes
    # only once matched on some MPIs) takes chunk 0 and the failure notice and raises SenderFailedError; both
    # staging blocks go back to the pool only once MPI and the copies are done with them, and the next message
    # arrives intact.
    rt, comm = staged
    d = double_of(rt)
    x = DoubleDeviceArray(rt, np.arange(2 * 65536, dtype=np.uint8))  # two chunks: two staging blocks
    copies = d.cuMemcpyAsync

    def second_copy_fails(*args: Any) -> Any:
        if sum(1 for name, _ in d.calls if name == "cuMemcpyAsync") == 1:
            d.fail_next("cuMemcpyAsync", d.CUresult.CUDA_ERROR_ILLEGAL_ADDRESS)
        return copies(*args)

    receive = cai_mpi.irecv_array(me, 8, comm, device="host")
    monkeypatch.setattr(d, "cuMemcpyAsync", second_copy_fails)
    with pytest.raises(cai_mpi.CudaError, match="CUDA_ERROR_ILLEGAL_ADDRESS"):
        cai_mpi.send_array(x, me, 8, comm, sync=False)
    monkeypatch.setattr(d, "cuMemcpyAsync", copies)
    with pytest.raises(cai_mpi.SenderFailedError, match="ILLEGAL_ADDRESS"):
        receive.wait(timeout=30)
    rt.sync_device(0)
    gc.collect()
    assert pieces.pinned_pool(rt).idle_bytes == 2 * 65536  # both blocks back, none lost
    assert np.array_equal(np.asarray(round_trip(DoubleDeviceArray(rt, NEW), comm, device="host")), NEW)
