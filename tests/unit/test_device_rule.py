"""The device rule (issue 24, defect 3): a rank's received arrays land on the device current in the calling thread
(or ``device=``), and the rank's own GPU only where no device is current; the real CUDA runtime and transport on
a driver double with 2 and 4 devices, a rank sending to itself."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from typing import Any

import numpy as np
import pytest
from mpi4py import MPI

import cai_mpi
from cai_mpi._src.config import reload_config
from cai_mpi._src.runtime.cuda import CudaRuntime
from cai_mpi.testing import CudaDriverDouble, DoubleDeviceArray, double_runtime, use_runtime

me = MPI.COMM_WORLD.Get_rank()
DATA = np.arange(4096, dtype=np.float64)


@pytest.fixture(params=[(2, "direct"), (2, "staged"), (4, "direct"), (4, "staged")],
                ids=["2-gpus-direct", "2-gpus-staged", "4-gpus-direct", "4-gpus-staged"])
def node(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> Iterator[tuple[CudaRuntime, MPI.Comm]]:
    devices, route = request.param
    monkeypatch.setenv("CAI_MPI_CUDA_AWARE", "1" if route == "direct" else "0")
    reload_config({"CAI_MPI_INLINE_BYTES": "0"})
    rt = double_runtime(devices, ordinal=1, cuda_aware=route == "direct")  # the rank's GPU (local rank % count) is 1
    comm = MPI.COMM_WORLD.Dup()
    with use_runtime(rt):
        yield rt, comm  # type: ignore[misc]
    comm.Free()
    reload_config()
    rt.driver_double.close()  # type: ignore[attr-defined]


def make_current(d: CudaDriverDouble, gpu: int | None) -> None:
    """What ``cupy.cuda.Device(gpu).use()`` or ``torch.cuda.set_device(gpu)`` does: its primary context current."""
    assert d.cuInit(0) == (d.CUresult.CUDA_SUCCESS,)
    ctx = 0 if gpu is None else d.cuDevicePrimaryCtxRetain(gpu)[1]
    assert d.cuCtxSetCurrent(ctx) == (d.CUresult.CUDA_SUCCESS,)


def received(rt: CudaRuntime, comm: MPI.Comm, **kw: Any) -> cai_mpi.Array:
    req = cai_mpi.isend_array(DoubleDeviceArray(rt, DATA, ordinal=0), me, 3, comm)
    got = cai_mpi.recv_array(me, 3, comm, **kw)
    req.wait()
    return got


def check(rt: CudaRuntime, got: cai_mpi.Array, gpu: int) -> None:
    d: CudaDriverDouble = rt.driver_double  # type: ignore[attr-defined]
    assert got.device == gpu
    assert rt.locate(got.descriptor.ptr).ordinal == gpu  # the memory really is on that GPU
    rt.sync_device(gpu)
    assert d.read_device(got.descriptor.ptr, DATA.nbytes) == DATA.tobytes()


def test_a_receive_lands_on_the_device_current_in_the_calling_thread(node: tuple[CudaRuntime, MPI.Comm]) -> None:
    rt, comm = node
    d: CudaDriverDouble = rt.driver_double  # type: ignore[attr-defined]
    for gpu in reversed(range(d.devices)):  # the last GPU first: neither 0 nor the rank's
        make_current(d, gpu)
        check(rt, received(rt, comm), gpu)
        assert d.cuCtxGetCurrent()[1] == d.cuDevicePrimaryCtxRetain(gpu)[1]  # still the caller's current device
    make_current(d, None)


def test_without_a_current_device_a_receive_lands_on_the_ranks_gpu(node: tuple[CudaRuntime, MPI.Comm]) -> None:
    rt, comm = node
    make_current(rt.driver_double, None)  # type: ignore[arg-type, attr-defined]
    check(rt, received(rt, comm), 1)


def test_device_overrides_the_current_device(node: tuple[CudaRuntime, MPI.Comm]) -> None:
    rt, comm = node
    d: CudaDriverDouble = rt.driver_double  # type: ignore[attr-defined]
    make_current(d, d.devices - 1)
    check(rt, received(rt, comm, device=0), 0)
    make_current(d, None)


def test_threads_with_different_current_devices_each_receive_on_their_own(node: tuple[CudaRuntime, MPI.Comm]) -> None:
    rt, comm = node
    d: CudaDriverDouble = rt.driver_double  # type: ignore[attr-defined]
    landed: dict[int, int] = {}

    def worker(gpu: int) -> None:
        make_current(d, gpu)
        tag = 10 + gpu
        req = cai_mpi.isend_array(DATA, me, tag, comm)
        landed[gpu] = int(cai_mpi.recv_array(me, tag, comm).device)
        req.wait()

    threads = [threading.Thread(target=worker, args=(gpu,)) for gpu in range(d.devices)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert landed == {gpu: gpu for gpu in range(d.devices)}
