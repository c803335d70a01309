"""Which GPU holds a pointer, on the CUDA driver double with 2 and 4 devices: the device comes from the pointer's
context (cuda-bindings 12.9.6-12.9.8 and 13.1.2-13.4.2 report DEVICE_ORDINAL 0 for every pointer), queries run in
a context that may ask, and the producer is synchronized on the GPU that holds its memory."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np
import pytest
from mpi4py import MPI

import cai_mpi
from cai_mpi._src.arrays.operands import DeviceSource, send_source
from cai_mpi._src.config import reload_config
from cai_mpi._src.errors import CudaError
from cai_mpi._src.runtime import cudadriver
from cai_mpi._src.runtime.base import Location, MemoryKind
from cai_mpi._src.runtime.cuda import CudaRuntime, device_attribution
from cai_mpi.testing import CudaDriverDouble, DoubleDeviceArray, use_runtime

A = CudaDriverDouble.CUpointer_attribute


@pytest.fixture(params=[2, 4], ids=["2-gpus", "4-gpus"])
def d(request: pytest.FixtureRequest, make_double: Callable[..., CudaDriverDouble]) -> CudaDriverDouble:
    """A double whose bindings report every pointer on GPU 0, as the broken cuda-bindings releases do."""
    return make_double(request.param, ordinal_bug=True)


@pytest.fixture
def rt(d: CudaDriverDouble) -> CudaRuntime:
    runtime = CudaRuntime(0, driver=d)
    runtime.driver_double = d  # type: ignore[attr-defined]  # what DoubleDeviceArray allocates through
    return runtime


def last_gpu(d: CudaDriverDouble) -> int:
    return d.devices - 1


def users_allocation(d: CudaDriverDouble, gpu: int, nbytes: int = 64) -> int:
    """Memory the user allocated with ``gpu``'s primary context current, as CuPy under ``Device(gpu)`` does;
    that context stays current (the user works there)."""
    d.cuInit(0)
    ctx = d.cuDevicePrimaryCtxRetain(gpu)[1]
    assert d.cuCtxSetCurrent(ctx) == (d.CUresult.CUDA_SUCCESS,)
    return int(d.cuMemAlloc(nbytes)[1])


def queries(d: CudaDriverDouble) -> list[int]:
    return [ctx for name, ctx in d.calls if name == "cuPointerGetAttributes"]


def test_memory_of_another_gpu_is_located_there(rt: CudaRuntime, d: CudaDriverDouble) -> None:
    """Defect: locate() trusted DEVICE_ORDINAL, 0 under the broken bindings, so memory of GPU 1 was synchronized
    and packed on GPU 0."""
    gpu = last_gpu(d)
    ptr = users_allocation(d, gpu)
    assert rt.locate(ptr + 8) == Location(MemoryKind.DEVICE, gpu)
    own = rt.alloc_device(64, gpu)  # cai_mpi's own: from the stream-ordered pool, which belongs to no context
    with pytest.raises(CudaError, match="install cuda-bindings"):
        rt.locate(own.ptr)  # only DEVICE_ORDINAL could tell, and these bindings read it wrong: said, not guessed


def test_every_gpu_is_told_apart(rt: CudaRuntime, d: CudaDriverDouble) -> None:
    pointers = [users_allocation(d, gpu, 32) for gpu in range(d.devices)]
    assert [rt.locate(p).ordinal for p in pointers] == list(range(d.devices))


def test_a_query_runs_in_the_callers_context_and_leaves_it_current(rt: CudaRuntime, d: CudaDriverDouble) -> None:
    """UVA lets any context ask; the caller's is the one its arrays most likely live in, and asking from it needs
    no switch. With no context current, the query runs in cai_mpi's and nothing is left current."""
    gpu = last_gpu(d)
    ptr = users_allocation(d, gpu)
    rt.locate(ptr)
    assert queries(d) == [d.context_of(gpu)]
    assert int(d.cuCtxGetCurrent()[1]) == d.context_of(gpu)
    d.cuCtxSetCurrent(0)
    d.calls.clear()
    assert rt.locate(ptr).ordinal == gpu
    assert queries(d) == [d.context_of(0)] and int(d.cuCtxGetCurrent()[1]) == 0


def test_a_query_the_callers_context_cannot_answer_is_asked_in_ours(rt: CudaRuntime, d: CudaDriverDouble) -> None:
    gpu = last_gpu(d)
    ptr = users_allocation(d, gpu)
    d.fail_next("cuPointerGetAttributes", d.CUresult.CUDA_ERROR_ILLEGAL_ADDRESS)  # the caller's context is poisoned
    assert rt.locate(ptr).ordinal == gpu
    assert queries(d) == [d.context_of(gpu), d.context_of(0)]
    assert int(d.cuCtxGetCurrent()[1]) == d.context_of(gpu)
    d.fail_next("cuPointerGetAttributes", d.CUresult.CUDA_ERROR_ILLEGAL_ADDRESS)
    d.cuCtxSetCurrent(d.context_of(0))  # already ours: no second try
    with pytest.raises(CudaError, match=r"cannot classify pointer 0x[0-9a-f]+: cuPointerGetAttributes failed"):
        rt.locate(ptr)


def test_a_foreign_context_is_asked_its_device_once(rt: CudaRuntime, d: CudaDriverDouble) -> None:
    gpu = last_gpu(d)
    ptr = users_allocation(d, gpu)
    for _ in range(3):
        assert rt.locate(ptr).ordinal == gpu
    assert [name for name, _ in d.calls].count("cuCtxGetDevice") == 1


def test_a_pending_kernel_of_another_gpu_is_waited_for(rt: CudaRuntime, d: CudaDriverDouble) -> None:
    """Defect: a CAI v3 producer on GPU 1 with a kernel pending on its legacy default stream was synchronized on
    GPU 0 (a different stream 1), and the stale bytes were sent."""
    gpu = last_gpu(d)
    x = DoubleDeviceArray(rt, np.zeros(16, np.uint8), stream=1, ordinal=gpu)
    d.cuCtxPushCurrent(d.context_of(gpu))  # the producer works on its GPU
    d.kernel_write(1, x.buf.ptr, bytes(range(1, 17)), delay=0.3)
    source = send_source("send_array", x, None, rt)
    assert isinstance(source, DeviceSource) and source.ordinal == gpu
    assert d.read_device(x.buf.ptr, 16) == bytes(range(1, 17))  # synchronized: no stream order needed to look


@pytest.mark.parametrize("aware", [False, True], ids=["staged", "direct"])
def test_a_strided_array_of_another_gpu_arrives_as_written(rt: CudaRuntime, d: CudaDriverDouble, aware: bool,
                                                           monkeypatch: pytest.MonkeyPatch) -> None:
    """End to end, a rank sending to itself: a strided CAI v3 array on the last GPU, a kernel still writing it on
    that GPU's legacy default stream. It must be synchronized and packed there, and arrive as written."""
    gpu = last_gpu(d)
    d.host_accessible = aware  # a CUDA-aware MPI reads device memory; else a host access faults
    monkeypatch.setenv("CAI_MPI_CUDA_AWARE", "1" if aware else "0")
    reload_config({"CAI_MPI_INLINE_BYTES": "0", "CAI_MPI_CHUNK_BYTES": "4096"})
    base = np.zeros(4096, np.float64)
    written = np.arange(4096, dtype=np.float64) + 1
    x = DoubleDeviceArray(rt, base, stream=1, ordinal=gpu, view=((2048,), (16,)))  # every other element
    d.cuCtxPushCurrent(d.context_of(gpu))
    d.kernel_write(1, x.buf.ptr, written.tobytes(), delay=0.3)
    comm = MPI.COMM_SELF.Dup()
    try:
        with use_runtime(rt):
            request = cai_mpi.isend_array(x, 0, 3, comm)
            got = cai_mpi.recv_array(0, 3, comm, device="host")
            request.wait()
        assert np.array_equal(np.asarray(got), written[::2])
    finally:
        comm.Free()
        reload_config()
        d.cuCtxPopCurrent()


def test_memory_without_a_context_under_broken_bindings_is_refused(rt: CudaRuntime, d: CudaDriverDouble) -> None:
    """Stream-ordered memory has no context (CUDA documents CONTEXT as NULL): only DEVICE_ORDINAL tells where it
    is, and the broken bindings say 0 for all. A clear error, never a guess."""
    gpu = last_gpu(d)
    users_allocation(d, gpu)
    ptr = int(d.cuMemAllocAsync(64, 1)[1])
    with pytest.raises(CudaError, match=r"cuda-bindings 12\.9\.6.*cuda-bindings>=12\.9\.9"):
        rt.locate(ptr)
    d.bindings_version = "12.9.10"  # a fixed release: DEVICE_ORDINAL is believed
    d.ordinal_bug = False
    assert rt.locate(ptr) == Location(MemoryKind.DEVICE, gpu)
    d.cuMemFreeAsync(ptr, 1)
    d.cuStreamSynchronize(1)


def test_the_context_wins_over_a_wrong_ordinal(d: CudaDriverDouble, monkeypatch: pytest.MonkeyPatch) -> None:
    rt = CudaRuntime(0, driver=d)
    gpu = last_gpu(d)
    ptr = users_allocation(d, gpu)
    real = d._pointer_values

    def lying(block: Any, address: int) -> dict[int, Any]:
        values = real(block, address)
        values[int(A.CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL)] = 0
        return values

    d.ordinal_bug = False
    monkeypatch.setattr(d, "_pointer_values", lying)
    assert rt.locate(ptr).ordinal == gpu


@pytest.mark.parametrize(("reported", "signed"), [(4294967294, -2), (1, 1), (-2, -2)])
def test_an_ordinal_read_as_unsigned_is_signed_again(reported: int, signed: int) -> None:
    """cuda-bindings before 12.9.6 and 13.1.2 read DEVICE_ORDINAL as unsigned: -2 (no device) came back 2**32-2."""
    assert cudadriver.signed_ordinal(reported) == signed


@pytest.mark.parametrize(
    ("version", "broken"),
    [("12.9.5", False), ("12.9.6", True), ("12.9.8", True), ("12.9.9", False), ("13.1.1", False), ("13.1.2", True),
     ("13.2.0", True), ("13.4.2", True), ("13.4.3", False), ("13.5.0", False), (None, False), ("dev", False)],
)
def test_the_broken_releases(version: str | None, broken: bool) -> None:
    assert cudadriver.ordinal_unreliable(version) is broken


def test_device_attribution_per_gpu(rt: CudaRuntime, d: CudaDriverDouble) -> None:
    """What ``python -m cai_mpi info`` shows: where cai_mpi places a buffer of each GPU, and what the bindings
    report (0 for all under the broken releases)."""
    report = device_attribution(rt)
    assert [(r["gpu"], r["located"], r["reported"]) for r in report] == [(g, g, 0) for g in range(d.devices)]
