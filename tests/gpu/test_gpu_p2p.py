"""send_array / recv_array with real GPU exporters (CuPy, PyTorch, Numba), rank to itself."""

from __future__ import annotations

import warnings
from typing import Any

import numpy as np
import pytest
from mpi4py import MPI

import cai_mpi
from cai_mpi._src.runtime import get_runtime
from cai_mpi._src.runtime.cudadriver import probe

USABLE, REASON = probe()

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not USABLE, reason=f"no usable CUDA GPU: {REASON}"),
]

me = MPI.COMM_WORLD.Get_rank()


def _import(name: str) -> Any:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return pytest.importorskip(name)


def self_round_trip(obj: Any, **kw: Any) -> cai_mpi.Array:
    req = cai_mpi.isend_array(obj, me, tag=17)
    got = cai_mpi.recv_array(me, 17, **kw)
    req.wait()
    return got


def test_runtime_is_cuda() -> None:
    assert get_runtime().name == "cuda"


@pytest.mark.parametrize("layout", ["C", "F", "strided"])
def test_cupy_round_trip_lands_on_device(layout: str) -> None:
    cp = _import("cupy")
    base = cp.arange(64 * 48, dtype=cp.float32).reshape(64, 48)
    x = {"C": base, "F": cp.asfortranarray(base), "strided": base[::-2, 1::3]}[layout]
    got = self_round_trip(x)
    assert got.device == 0
    y = cp.asarray(got)  # zero-copy adoption through __cuda_array_interface__
    assert y.data.ptr == got.descriptor.ptr
    assert cp.array_equal(y, x)


def test_cupy_stream_is_synchronized_before_send() -> None:
    """A kernel still running on a non-blocking stream when send_array is called must finish first."""
    cp = _import("cupy")
    s = cp.cuda.Stream(non_blocking=True)
    with s:
        x = cp.zeros(1 << 24, dtype=cp.float64)
        for _ in range(20):
            x += 1.0  # queue a lot of work on s
        # CuPy exports the current stream (s) in its CAI while inside the block.
        got = self_round_trip(x)
    assert float(cp.asarray(got).min()) == 20.0


def test_torch_v2_export_is_synchronized_conservatively() -> None:
    torch = _import("torch")
    if not torch.cuda.is_available():
        pytest.skip("this torch build has no CUDA")
    x = torch.arange(1000, device="cuda", dtype=torch.float64) * 3
    got = self_round_trip(x)
    t = torch.as_tensor(got, device="cuda")
    assert torch.equal(t, x)


def test_numba_device_array() -> None:
    cuda = _import("numba.cuda")
    x = cuda.to_device(np.arange(100, dtype=np.int32))
    got = self_round_trip(x)
    assert np.array_equal(cuda.as_cuda_array(got).copy_to_host(), np.arange(100, dtype=np.int32))


def test_receive_into_cupy_out_and_host() -> None:
    cp = _import("cupy")
    x = cp.random.standard_normal((33, 17))
    out = cp.empty_like(x)
    got = self_round_trip(x, out=out)
    assert got.descriptor.ptr == out.data.ptr and cp.array_equal(out, x)
    host = self_round_trip(x, device="host")
    assert np.array_equal(np.asarray(host), cp.asnumpy(x))


def test_staged_path_forced() -> None:
    """CAI_MPI_CUDA_AWARE=0 on a CUDA-aware MPI still works, through pinned staging."""
    import os

    cp = _import("cupy")
    os.environ["CAI_MPI_CUDA_AWARE"] = "0"
    try:
        comm = MPI.COMM_WORLD.Dup()
    finally:
        del os.environ["CAI_MPI_CUDA_AWARE"]
    try:
        assert not cai_mpi.cuda_aware(comm)
        x = cp.arange(3 << 20, dtype=cp.uint8)
        req = cai_mpi.isend_array(x, me, comm=comm)
        got = cai_mpi.recv_array(me, comm=comm)
        req.wait()
        assert cp.array_equal(cp.asarray(got), x)
    finally:
        comm.Free()
