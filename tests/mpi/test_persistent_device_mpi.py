"""Persistent collectives and the bucketed allreduce on device arrays: each rank on its own CUDA driver double,
handed to MPI directly (a CUDA-aware MPI: CAI_MPI_CUDA_AWARE=1) or staged through pinned memory (device memory
faults on host access, as an MPI that is not CUDA-aware would). The producer stream is synchronized before each
use: the double's streams are lazy (queued work runs only once something synchronizes on it), so a kernel writing
the input on its stream is seen only through that synchronization, however fast or slow the machine. Results are
compared exactly with numpy."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import numpy as np
import pytest
from mpi4py import MPI

import cai_mpi
from cai_mpi._src.runtime.base import Runtime
from cai_mpi.testing import DoubleDeviceArray

pytestmark = pytest.mark.mpi(min_size=2)

world = MPI.COMM_WORLD
rank, size = world.Get_rank(), world.Get_size()
LAZY = 40.0  # s: queued device work runs when synchronized on, or only after this (a missing wait fails every time)


@pytest.fixture(params=["direct", "staged"])
def gpu(request: pytest.FixtureRequest, on_double: Any) -> Iterator[tuple[Runtime, MPI.Comm]]:
    with on_double(request.param == "direct", lazy=LAZY) as made:
        yield made


def values(r: int, n: int = 12, dtype: str = "f8", step: int = 0) -> np.ndarray[Any, Any]:
    return (np.arange(n) % 5 + r + 1 + step).astype(dtype)


def host(a: Any) -> np.ndarray[Any, Any]:
    return a.read() if isinstance(a, DoubleDeviceArray) else (np.asarray(a) if a.is_host else a.numpy())


def slow_write(rt: Runtime, x: DoubleDeviceArray, data: np.ndarray[Any, Any]) -> None:
    """A kernel on x's stream writes ``data`` once something synchronizes on it: only a synchronized producer sees
    it (on the lazy double, not by luck of timing)."""
    with rt.driver.on(0):  # type: ignore[attr-defined]
        rt.driver_double.kernel_write(x.stream, x.buf.ptr, data.tobytes())  # type: ignore[attr-defined]


def non_blocking_stream(rt: Runtime) -> int:
    """A stream of the user's that CUDA orders after nothing: only the stream policy orders a read after it."""
    double = rt.driver_double  # type: ignore[attr-defined]
    with rt.driver.on(0):  # type: ignore[attr-defined]
        (handle,) = rt.driver.check("cuStreamCreate", double.CUstream_flags.CU_STREAM_NON_BLOCKING)  # type: ignore[attr-defined]
    return int(handle)


@pytest.mark.parametrize("dtype, stream", [("f8", "legacy"), ("i4", "legacy"), ("c8", "legacy"),
                                           ("f8", "non-blocking")])
def test_allreduce_init_of_device_arrays_reused(gpu: tuple[Runtime, MPI.Comm], dtype: str, stream: str) -> None:
    rt, comm = gpu
    x = DoubleDeviceArray(rt, values(rank, dtype=dtype), stream=1 if stream == "legacy" else non_blocking_stream(rt))
    with cai_mpi.allreduce_init(x, comm=comm) as red:
        for step in range(3):
            slow_write(rt, x, values(rank, dtype=dtype, step=step))
            got = red()
            assert got.device == 0
            assert np.array_equal(host(got), sum(values(r, dtype=dtype, step=step) for r in range(size)))


def test_allreduce_init_mean_and_out_on_the_device(gpu: tuple[Runtime, MPI.Comm]) -> None:
    rt, comm = gpu
    x = DoubleDeviceArray(rt, values(rank) / 4, stream=1)
    out = DoubleDeviceArray(rt, np.zeros(12))
    want = np.empty(12)
    comm.Allreduce(values(rank) / 4, want, MPI.SUM)
    with cai_mpi.allreduce_init(x, op="mean", comm=comm, out=out) as red:
        for _ in range(2):
            red()
            assert np.array_equal(out.read(), want / size)


def test_bcast_init_of_device_buffers_into_a_strided_one(gpu: tuple[Runtime, MPI.Comm]) -> None:
    rt, comm = gpu
    if rank == 0:
        buf = DoubleDeviceArray(rt, values(0, 12, "i4").reshape(3, 4), stream=1)
    else:  # an F-ordered (3, 4) view of 12 int32
        buf = DoubleDeviceArray(rt, np.full(12, -1, "i4"), view=((3, 4), (4, 12)))
    with cai_mpi.bcast_init(buf, comm=comm) as bc:
        for step in range(3):
            if rank == 0:
                slow_write(rt, buf, values(0, 12, "i4", step).reshape(3, 4))
            got = bc()
            assert got.shape == (3, 4)
            assert np.array_equal(host(got), values(0, 12, "i4", step).reshape(3, 4))


def test_allgather_init_of_device_arrays(gpu: tuple[Runtime, MPI.Comm]) -> None:
    rt, comm = gpu
    x = DoubleDeviceArray(rt, values(rank, 6, "i8"), stream=1)
    with cai_mpi.allgather_init(x, comm=comm) as ag:
        for step in range(3):
            slow_write(rt, x, values(rank, 6, "i8", step))
            got = ag()
            assert [a.source for a in got] == list(range(size))
            for r, a in enumerate(got):
                assert a.device == 0 and np.array_equal(host(a), values(r, 6, "i8", step))


def test_reduce_init_of_device_arrays(gpu: tuple[Runtime, MPI.Comm]) -> None:
    rt, comm = gpu
    x = DoubleDeviceArray(rt, values(rank), stream=1)
    out = DoubleDeviceArray(rt, np.zeros(12)) if rank == 1 else None
    with cai_mpi.reduce_init(x, op="max", root=1, comm=comm, out=out) as rd:
        got = rd()
    if rank == 1:
        assert out is not None and np.array_equal(out.read(), values(size - 1))
    else:
        assert got is None


def test_a_host_rank_and_device_ranks_together(gpu: tuple[Runtime, MPI.Comm]) -> None:
    """Rank 0 reduces host memory, the others device memory: every rank uses the nonblocking form."""
    rt, comm = gpu
    x: Any = values(rank) if rank == 0 else DoubleDeviceArray(rt, values(rank))
    with cai_mpi.allreduce_init(x, comm=comm) as red:
        assert np.array_equal(host(red()), sum(values(r) for r in range(size)))


@pytest.mark.parametrize("container", ["list", "dict"])
def test_bucketed_allreduce_of_device_and_host_arrays(gpu: tuple[Runtime, MPI.Comm], container: str) -> None:
    rt, comm = gpu
    dev = DoubleDeviceArray(rt, values(rank, 6, "f4"), stream=1)
    arrays = [dev, values(rank, 4, "i4"), DoubleDeviceArray(rt, values(rank, 3, "i4"))]
    objs: Any = arrays if container == "list" else dict(zip("abc", arrays, strict=True))
    wants = [sum(values(r, 6, "f4") for r in range(size)), sum(values(r, 4, "i4") for r in range(size)),
             sum(values(r, 3, "i4") for r in range(size))]
    got = cai_mpi.allreduce_arrays(objs, comm=comm)
    items = got if container == "list" else [got[k] for k in "abc"]
    assert [a.device for a in items] == [0, "host", 0]
    for a, want in zip(items, wants, strict=True):
        assert np.array_equal(host(a), want)
    with cai_mpi.allreduce_init(objs, comm=comm) as red:
        for step in range(3):
            slow_write(rt, dev, values(rank, 6, "f4", step))
            got = red()
            items = got if container == "list" else [got[k] for k in "abc"]
            assert np.array_equal(host(items[0]), sum(values(r, 6, "f4", step) for r in range(size)))
            assert np.array_equal(host(items[2]), wants[2])


@pytest.mark.parametrize("container", ["list", "dict"])
def test_allreduce_arrays_large_on_device_on_some_ranks_only(gpu: tuple[Runtime, MPI.Comm], container: str) -> None:
    """A large array on the device on ranks > 0 and on the host on rank 0: every rank buckets it (as the device
    ranks must), none reduces it alone from its buffer; beside a small host array and a fused-sized call."""
    from cai_mpi._src.api.bucketed import DIRECT_BYTES

    rt, comm = gpu
    n = DIRECT_BYTES // 8
    big: Any = values(rank, n) if rank == 0 else DoubleDeviceArray(rt, values(rank, n))
    arrays = [big, values(rank, 4, "i4"), values(rank, n + 1, "f8")]
    objs: Any = arrays if container == "list" else dict(zip("abc", arrays, strict=True))
    got = cai_mpi.allreduce_arrays(objs, comm=comm)
    items = got if container == "list" else [got[k] for k in "abc"]
    assert items[0].device == ("host" if rank == 0 else 0)
    assert np.array_equal(host(items[0]), sum(values(r, n) for r in range(size)))
    assert np.array_equal(host(items[1]), sum(values(r, 4, "i4") for r in range(size)))
    assert np.array_equal(host(items[2]), sum(values(r, n + 1) for r in range(size)))
    small: Any = values(rank, 3) if rank == 0 else DoubleDeviceArray(rt, values(rank, 3))
    mean = cai_mpi.allreduce_arrays([small, values(rank, 2, "f4")], op="mean", comm=comm)
    assert np.array_equal(host(mean[0]), sum(values(r, 3) for r in range(size)) / size)
    assert np.array_equal(host(mean[1]), np.float32(sum(values(r, 2, "f4") for r in range(size))) / np.float32(size))


def test_bucketed_allreduce_init_large_on_device_on_some_ranks_only(gpu: tuple[Runtime, MPI.Comm]) -> None:
    """The persistent form with a large array on the device on ranks > 0 and on the host on rank 0: every rank
    buckets it (none binds it alone), reused with the contents changed."""
    from cai_mpi._src.api.bucketed import DIRECT_BYTES

    rt, comm = gpu
    n = DIRECT_BYTES // 8
    big: Any = values(rank, n) if rank == 0 else DoubleDeviceArray(rt, values(rank, n))
    other = values(rank, n + 3)
    with cai_mpi.allreduce_init([big, other], comm=comm) as red:
        for step in range(3):
            if rank == 0:
                big[...] = values(rank, n, step=step)
            else:
                slow_write(rt, big, values(rank, n, step=step))
            other[...] = values(rank, n + 3, step=step)
            got = red()
            assert np.array_equal(host(got[0]), sum(values(r, n, step=step) for r in range(size)))
            assert np.array_equal(host(got[1]), sum(values(r, n + 3, step=step) for r in range(size)))


def test_bcast_init_and_reduce_init_from_every_root_on_the_device(gpu: tuple[Runtime, MPI.Comm]) -> None:
    """Every rank as the root of a device broadcast and reduction (MPI's nonblocking form per start): the root's
    data reaches every rank, the reduction lands on the root only."""
    rt, comm = gpu
    for root in range(size):
        mine = values(root, 12, "i4") * (root + 2) if rank == root else np.zeros(12, "i4")
        buf = DoubleDeviceArray(rt, mine, stream=1)
        with cai_mpi.bcast_init(buf, root=root, comm=comm) as bc:
            for step in range(2):
                if rank == root:
                    slow_write(rt, buf, values(root, 12, "i4", step) * (root + 2))
                assert np.array_equal(host(bc()), values(root, 12, "i4", step) * (root + 2))
        x = DoubleDeviceArray(rt, values(rank), stream=1)
        with cai_mpi.reduce_init(x, op="sum", root=root, comm=comm) as rd:
            got = rd()
        if rank == root:
            assert got.device == 0 and np.array_equal(host(got), sum(values(r) for r in range(size)))
        else:
            assert got is None


@pytest.mark.parametrize("fn", ["bcast_init", "reduce_init"])
def test_ranks_naming_different_roots_on_the_device_is_an_error_on_every_rank(gpu: tuple[Runtime, MPI.Comm],
                                                                               fn: str) -> None:
    rt, comm = gpu
    kind = fn.removesuffix("_init")
    x = DoubleDeviceArray(rt, values(rank))
    with pytest.raises(cai_mpi.CollectiveMismatchError, match=rf"rank 0: {kind} .*root=0; rank 1: {kind} .*root=1"):
        getattr(cai_mpi, fn)(x, root=0 if rank == 0 else 1, comm=comm)
    with cai_mpi.allreduce_init(x, comm=comm) as red:  # still in step (bounded: out of step fails in 20 s)
        assert np.array_equal(host(red(timeout=20.0)), sum(values(r) for r in range(size)))


def test_2d_f_ordered_and_strided_host_arrays_in_a_bucket_beside_a_device_array(gpu: tuple[Runtime, MPI.Comm]) -> None:
    """Host arrays of every layout share a bucket (their dtype) with a device array: each comes back in its own
    shape with its elements where they were (an F-ordered one copied in memory order would come back transposed)."""
    rt, comm = gpu

    def grid(r: int, step: int = 0) -> np.ndarray[Any, Any]:
        return (np.arange(12).reshape(3, 4) * (r + 1) + 10 * step).astype("f8")

    def layouts(r: int, step: int = 0) -> list[np.ndarray[Any, Any]]:
        g = grid(r, step)
        return [g.copy(), np.asfortranarray(g), np.repeat(g, 2, axis=1)[:, ::2], np.asfortranarray(g[:, :3])]

    dev = DoubleDeviceArray(rt, values(rank, 6), stream=1)
    hosts = layouts(rank)
    assert hosts[1].flags.f_contiguous and not hosts[1].flags.c_contiguous
    wants = [sum(layouts(r)[i] for r in range(size)) for i in range(len(hosts))]
    got = cai_mpi.allreduce_arrays([dev, *hosts], comm=comm)
    assert np.array_equal(host(got[0]), sum(values(r, 6) for r in range(size)))
    for a, want in zip(got[1:], wants, strict=True):
        assert a.shape == want.shape and np.array_equal(host(a), want)
    with cai_mpi.allreduce_init([dev, *hosts], comm=comm) as red:
        for step in range(2):
            for h, new in zip(hosts, layouts(rank, step), strict=True):
                h[...] = new
            got = red()
            assert np.array_equal(host(got[0]), sum(values(r, 6) for r in range(size)))
            for i, a in enumerate(got[1:]):
                want = sum(layouts(r, step)[i] for r in range(size))
                assert a.shape == want.shape and np.array_equal(host(a), want)


@pytest.fixture
def lazy_gpu(on_double: Any) -> Iterator[tuple[Runtime, MPI.Comm]]:
    """``gpu``, staged, on a lazy double: queued device work runs only when something waits for it, so a copy that
    skips a wait overtakes the work it should follow every time."""
    with on_double(False, lazy=600.0) as made:
        yield made


def test_bucketed_allreduce_init_waits_for_readers_of_the_last_result(lazy_gpu: tuple[Runtime, MPI.Comm]) -> None:
    """A kernel on a blocking stream of the user's still reads use 1's device result when use 2 starts: use 2 must
    not overwrite it under the kernel (sync=False concerns the inputs; the single-array form waits the same way)."""
    rt, comm = lazy_gpu
    d: Any = rt.driver_double  # type: ignore[attr-defined]
    x = DoubleDeviceArray(rt, values(rank), stream=1)
    with rt.driver.on(0):  # type: ignore[attr-defined]
        (reader,) = rt.driver.check("cuStreamCreate", 0)  # type: ignore[attr-defined]
    with cai_mpi.allreduce_init([x, values(rank, 4)], comm=comm, sync=False) as red:
        first = red()[0]
        seen = bytearray()
        ptr, nbytes = first.descriptor.ptr, first.nbytes
        with rt.driver.on(0):  # type: ignore[attr-defined]
            d.launch(int(reader), lambda: seen.extend(d.read_device(ptr, nbytes)))
        d.write_device(x.buf.ptr, values(rank, step=1).tobytes())
        second = red()[0]
        assert second.descriptor.ptr == ptr  # (the same result Array, refreshed)
        rt.sync_device(0)
        assert np.frombuffer(bytes(seen), "f8").tolist() == sum(values(r) for r in range(size)).tolist()
        assert np.array_equal(host(second), sum(values(r, step=1) for r in range(size)))
