"""A send that fails posts nothing or tells the receiver, a rank sending to itself through real MPI on the CUDA
driver double (no launcher needed; tests/mpi/test_send_failure_mpi.py runs the same between ranks)."""

from __future__ import annotations

import gc
from collections.abc import Iterator
from typing import Any

import numpy as np
import pytest
from mpi4py import MPI

import cai_mpi
from cai_mpi._src.config import reload_config
from cai_mpi._src.runtime.base import Runtime
from cai_mpi.testing import DoubleDeviceArray, double_runtime, use_runtime

pytestmark = pytest.mark.timeout(60)
N = 50_000  # float64: seven staging chunks of 64 KiB


@pytest.fixture(params=["direct", "staged"])
def route(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> Iterator[tuple[Runtime, MPI.Comm]]:
    direct = request.param == "direct"
    monkeypatch.setenv("CAI_MPI_CUDA_AWARE", "1" if direct else "0")
    reload_config({"CAI_MPI_CHUNK_BYTES": "65536"})
    rt = double_runtime(cuda_aware=direct)
    comm = MPI.COMM_SELF.Dup()
    try:
        with use_runtime(rt):
            yield rt, comm
            gc.collect()
    finally:
        comm.Free()
        reload_config()
        rt.driver_double.close()  # type: ignore[attr-defined]


def data(k: int, n: int = 2 * N) -> np.ndarray[Any, Any]:
    return np.arange(n, dtype="<f8") * k


def every_other(rt: Runtime, k: int) -> DoubleDeviceArray:
    return DoubleDeviceArray(rt, data(k), view=((N,), (16,)))


def received(a: cai_mpi.Array) -> np.ndarray[Any, Any]:
    return np.asarray(a) if a.device == "host" else a.numpy()


@pytest.mark.parametrize("why", ["out of device memory", "2-D copy refused"])
def test_a_pack_that_fails_posts_nothing(route: tuple[Runtime, MPI.Comm], why: str) -> None:
    rt, comm = route
    double = rt.driver_double  # type: ignore[attr-defined]
    x = every_other(rt, 3)
    if why == "out of device memory":
        double.device_memory_bytes = double.device_memory_in_use(0) + 4096
        expected = "OUT_OF_MEMORY"
    else:
        double.fail_next("cuMemcpy2DAsync", double.CUresult.CUDA_ERROR_INVALID_VALUE)
        expected = "INVALID_VALUE"
    with pytest.raises(cai_mpi.CudaError, match=expected):
        cai_mpi.isend_array(x, 0, 1, comm)
    double.device_memory_bytes = 1 << 34
    with pytest.raises(cai_mpi.TimeoutError) as caught:
        cai_mpi.recv_array(0, 1, comm, timeout=0.2)
    assert caught.value.cancelled  # no header came
    req = cai_mpi.isend_array(x, 0, 1, comm)
    assert np.array_equal(received(cai_mpi.recv_array(0, 1, comm, timeout=30)), data(3)[::2])
    req.wait()


def test_a_send_whose_context_dies_after_its_first_chunk_tells_the_receiver(route: tuple[Runtime, MPI.Comm]) -> None:
    rt, comm = route
    double = rt.driver_double  # type: ignore[attr-defined]
    if cai_mpi.cuda_aware(comm).aware:
        x = every_other(rt, 4)  # packed, then handed to MPI: the pack's event reports the error
        trigger, count = "record_event", 1
    else:
        x = DoubleDeviceArray(rt, data(4, N))  # staged: the third staging copy comes after chunk 0 was sent
        trigger, count = "copy_async", 3
    original = getattr(rt, trigger)
    calls = 0

    def dies(*args: Any) -> Any:
        nonlocal calls
        out = original(*args)
        calls += 1
        if calls == count:
            double.fault(0)
        return out

    setattr(rt, trigger, dies)
    req = cai_mpi.isend_array(x, 0, 2, comm)
    with pytest.raises(cai_mpi.SenderFailedError, match="rank 0 failed after sending the header") as caught:
        cai_mpi.recv_array(0, 2, comm, device="host", timeout=30)
    assert caught.value.source == 0 and caught.value.tag == 2 and "ILLEGAL_ADDRESS" in caught.value.reason
    with pytest.raises(cai_mpi.CudaError, match="ILLEGAL_ADDRESS"):
        req.wait(timeout=30)
    delattr(rt, trigger)  # the runtime's own method again
    double.clear_fault(0)
    req = cai_mpi.isend_array(DoubleDeviceArray(rt, data(5, N)), 0, 2, comm)
    assert np.array_equal(received(cai_mpi.recv_array(0, 2, comm, timeout=30)), data(5, N))
    req.wait()
