"""Device memory a CUDA-aware MPI writes, fresh from the stream-ordered pool, on the driver double: CUDA's default
pool may hand out a block whose previous user's kernel is still pending on another stream, making the allocating
stream wait for it (cudaMemPoolReuseAllowInternalDependencies). MPI writes from the host, ordered by no stream, so
cai_mpi must wait for that stream before MPI writes, or the earlier kernel lands after the received data.

The double is ``lazy``: the user's kernel runs only when something waits for it, so a receive that skips the wait
loses its data every time, not by luck of timing."""

from __future__ import annotations

import collections.abc
import gc
from collections.abc import Callable
from typing import Any

import numpy as np
import pytest
from mpi4py import MPI

import cai_mpi
from cai_mpi._src.config import reload_config
from cai_mpi.testing import CudaDriverDouble, DoubleDeviceArray, double_runtime, use_runtime

N = 512  # float64: 4 KiB, one page of the double's pool
me = MPI.COMM_WORLD.Get_rank()


@pytest.fixture
def direct(monkeypatch: pytest.MonkeyPatch) -> collections.abc.Iterator[tuple[Any, CudaDriverDouble, MPI.Comm]]:
    """A CUDA-aware route on a lazy double, the user's context current; a one-rank communicator."""
    monkeypatch.setenv("CAI_MPI_CUDA_AWARE", "1")
    reload_config({"CAI_MPI_INLINE_BYTES": "0"})
    rt = double_runtime(cuda_aware=True, lazy=30.0)
    d: CudaDriverDouble = rt.driver_double  # type: ignore[attr-defined]
    comm = MPI.COMM_WORLD.Split(me, 0)
    try:
        with use_runtime(rt):
            assert d.cuInit(0)[0] == 0
            _err, ctx = d.cuDevicePrimaryCtxRetain(0)
            assert d.cuCtxSetCurrent(ctx)[0] == 0
            yield rt, d, comm
            gc.collect()
    finally:
        comm.Free()
        reload_config()
        gc.collect()
        d.close()


def freed_under_a_pending_kernel(d: CudaDriverDouble) -> None:
    """The user's stream-ordered block (CuPy's MemoryAsyncPool, cudaMallocAsync) freed behind a kernel still to
    write it: the block goes back to the device's pool at once."""
    user = d.cuStreamCreate(d.CUstream_flags.CU_STREAM_NON_BLOCKING)[1]
    err, block = d.cuMemAllocAsync(N * 8, user)
    assert err == 0
    d.kernel_write(user, block, b"\xff" * (N * 8))
    assert d.cuMemFreeAsync(block, user) == (d.CUresult.CUDA_SUCCESS,)


def landed(d: CudaDriverDouble, got: cai_mpi.Array) -> np.ndarray[Any, Any]:
    """The received bytes once every stream's work has run (the user's kernel included)."""
    assert d.cuCtxSynchronize() == (d.CUresult.CUDA_SUCCESS,)
    return np.frombuffer(d.read_device(got.descriptor.ptr, got.nbytes), np.float64)


@pytest.mark.timeout(40)
@pytest.mark.parametrize("call", ["recv_array", "allreduce_array"])
def test_mpi_writes_a_reused_block_only_after_its_previous_users_work(
    direct: tuple[Any, CudaDriverDouble, MPI.Comm], call: str
) -> None:
    rt, d, comm = direct
    assert cai_mpi.cuda_aware(comm)
    x = DoubleDeviceArray(rt, np.arange(N, dtype=np.float64), stream=1)
    receive: dict[str, Callable[[], cai_mpi.Array]] = {
        "recv_array": lambda: _pair(x, comm),
        "allreduce_array": lambda: cai_mpi.allreduce_array(x, comm=comm),
    }
    freed_under_a_pending_kernel(d)
    got = receive[call]()
    assert np.array_equal(landed(d, got), np.arange(N, dtype=np.float64))


def _pair(x: Any, comm: MPI.Comm) -> cai_mpi.Array:
    req = cai_mpi.isend_array(x, 0, 5, comm)
    got = cai_mpi.recv_array(0, 5, comm, device=0)
    req.wait()
    return got
