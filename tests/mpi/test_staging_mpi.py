"""Device paths on the simulated GPU: staging through pinned buffers, device packing, CUDA-aware direct."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import numpy as np
import pytest
from mpi4py import MPI

import cai_mpi
from cai_mpi._src.config import reload_config
from cai_mpi._src.runtime import get_runtime
from cai_mpi._src.runtime.base import MemoryKind
from cai_mpi.testing import FakeCudaArray, SimulatedRuntime, SimulatedStream, use_runtime

pytestmark = pytest.mark.mpi(min_size=2)

comm = MPI.COMM_WORLD
rank, size = comm.Get_rank(), comm.Get_size()
nxt, prv = (rank + 1) % size, (rank - 1) % size


def make(shape: tuple[int, ...], seed: int, dtype: str = "<f8") -> np.ndarray[Any, Any]:
    n = int(np.prod(shape))
    return np.random.default_rng(seed).standard_normal(n).astype(dtype).reshape(shape)


@pytest.fixture
def simulated_gpu() -> Iterator[SimulatedRuntime]:
    with use_runtime(SimulatedRuntime()) as rt:
        assert isinstance(rt, SimulatedRuntime)
        yield rt


def ring(obj: Any, comm_: MPI.Comm = comm, **kw: Any) -> cai_mpi.Array:
    req = cai_mpi.isend_array(obj, nxt, tag=31, comm=comm_)
    got = cai_mpi.recv_array(prv, 31, comm=comm_, **kw)
    req.wait()
    return got


@pytest.mark.parametrize("chunk", ["1000", "65536", "4194304"])
@pytest.mark.parametrize("layout", ["C", "F", "strided"])
def test_staged_device_to_device(simulated_gpu: SimulatedRuntime, chunk: str, layout: str) -> None:
    """Not CUDA-aware (the wheels are not): device memory must travel through pinned chunks."""
    reload_config({"CAI_MPI_CHUNK_BYTES": chunk})
    assert not cai_mpi.cuda_aware()

    def obj(seed: int) -> tuple[FakeCudaArray, np.ndarray[Any, Any]]:
        data = make((70, 90), seed)
        if layout == "C":
            return FakeCudaArray(data, device=True), data
        if layout == "F":
            return FakeCudaArray(data.T.copy(), device=True, shape=(70, 90), strides=(8, 560)), data
        return FakeCudaArray(data, device=True, shape=(35, 30), strides=(-1440, 24), offset=69 * 720), \
            data[::-2, ::3]

    sent, _ = obj(rank)
    got = ring(sent)
    assert got.device == 0  # landed in (simulated) device memory
    # the memory itself is the simulated GPU's, not host memory behind a device descriptor
    assert get_runtime().locate(got.__cuda_array_interface__["data"][0]).kind is MemoryKind.DEVICE
    expected = obj(prv)[1]
    assert np.array_equal(got.numpy(), expected)
    assert got.__cuda_array_interface__["stream"] is None


def test_staged_device_into_host_and_host_into_device(simulated_gpu: SimulatedRuntime) -> None:
    reload_config({"CAI_MPI_CHUNK_BYTES": "4096"})
    got = ring(FakeCudaArray(make((100, 33), rank), device=True), device="host")
    assert got.device == "host" and np.array_equal(np.asarray(got), make((100, 33), prv))
    got = ring(make((100, 33), rank))
    assert got.device == 0 and np.array_equal(got.numpy(), make((100, 33), prv))


def test_staged_into_device_out(simulated_gpu: SimulatedRuntime) -> None:
    reload_config({"CAI_MPI_CHUNK_BYTES": "2048", "CAI_MPI_INLINE_BYTES": "0"})
    out = FakeCudaArray(np.zeros((40, 50)), device=True)
    got = ring(FakeCudaArray(make((40, 50), rank), device=True), out=out)
    assert np.array_equal(out.host, make((40, 50), prv))
    assert got.descriptor.ptr == out.ptr
    # A strided device out= is filled through a temporary and an unpack on the device.
    big = FakeCudaArray(np.zeros((80, 100)), device=True)
    view = FakeCudaArray.__new__(FakeCudaArray)
    view.__dict__.update(big.__dict__)
    view.shape, view.strides, view.offset = (40, 50), (1600, 16), 0
    view.host = big.host[::2, ::2]
    ring(FakeCudaArray(make((40, 50), rank), device=True), out=view)
    assert np.array_equal(big.host[::2, ::2], make((40, 50), prv))
    assert not big.host[1::2].any()


def test_v2_device_array_gets_conservative_device_sync(simulated_gpu: SimulatedRuntime) -> None:
    """CAI v2 has no stream: pending work anywhere on the (simulated) device is waited for."""
    stream = SimulatedStream("v2-producer")
    x = FakeCudaArray(np.zeros(5000), version=2, device=True)
    stream.enqueue(x.host.fill, 7.0, delay=0.2)
    got = ring(x)
    stream.synchronize()
    assert (got.numpy() == 7.0).all()


def test_cuda_aware_direct_path(simulated_gpu: SimulatedRuntime, routed_dup: Any) -> None:
    """With CAI_MPI_CUDA_AWARE=1, device pointers go to MPI directly (simulated memory is readable)."""
    aware_comm = routed_dup(True)
    assert cai_mpi.cuda_aware(aware_comm).source == "env CAI_MPI_CUDA_AWARE"
    try:
        reload_config({"CAI_MPI_INLINE_BYTES": "0"})
        got = ring(FakeCudaArray(make((64, 64), rank), device=True), aware_comm)
        assert got.device == 0 and np.array_equal(got.numpy(), make((64, 64), prv))
        strided = FakeCudaArray(make((64, 64), rank), device=True, shape=(32, 64), strides=(1024, 8))
        got = ring(strided, aware_comm)
        assert np.array_equal(got.numpy(), make((64, 64), prv)[::2])
    finally:
        aware_comm.Free()


def test_many_staged_in_flight_any_source(simulated_gpu: SimulatedRuntime) -> None:
    reload_config({"CAI_MPI_CHUNK_BYTES": "3000"})
    reqs = [cai_mpi.isend_array(FakeCudaArray(make((i + 1, 500), rank * 100 + i), device=True), 0, tag=i)
            for i in range(5)]
    if rank == 0:
        recvs = [cai_mpi.irecv_array(cai_mpi.ANY_SOURCE, cai_mpi.ANY_TAG) for _ in range(5 * size)]
        for r in recvs:
            a = r.wait()
            assert np.array_equal(a.numpy(), make((a.tag + 1, 500), a.source * 100 + a.tag))
    for r in reqs:
        r.wait()
    comm.Barrier()


def test_device_datatypes_on_request(simulated_gpu: SimulatedRuntime, routed_dup: Any) -> None:
    """CAI_MPI_DEVICE_DATATYPES=1 on a CUDA-aware MPI: strided device data goes out through a datatype."""
    aware_comm = routed_dup(True)
    try:
        reload_config({"CAI_MPI_DEVICE_DATATYPES": "1", "CAI_MPI_INLINE_BYTES": "0"})
        strided = FakeCudaArray(make((64, 64), rank), device=True, shape=(32, 22), strides=(-1024, 24),
                                offset=63 * 512)
        got = ring(strided, aware_comm)
        assert np.array_equal(got.numpy(), make((64, 64), prv)[::-2, ::3])
    finally:
        aware_comm.Free()
