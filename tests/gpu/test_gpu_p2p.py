"""Device transfers with real GPU exporters (CuPy, PyTorch, Numba), in a ring over COMM_WORLD: a rank to itself
at 1 rank, to its neighbours at 2 or more (scripts/test-gpu.sh runs both, the 2 ranks sharing one GPU if the node
has one). Each exporter's data is compared exactly with what was sent; direct (when the MPI is CUDA-aware) and
staged routes, one chunk and many.

The device rule: a rank's received arrays land on the device current in the receiving thread, or on ``device=``.
So the tests compare with the current device, never with 0: on a node with several GPUs, rank 1 may compute on
GPU 1."""

from __future__ import annotations

import os
import subprocess
import sys
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

world = MPI.COMM_WORLD
rank, size = world.Get_rank(), world.Get_size()
nxt, prv = (rank + 1) % size, (rank - 1) % size
CHUNK_BYTES = 1 << 20  # the staged route's chunks (the ``route`` fixture, tests/gpu/conftest.py): several at a few MiB


def _import(name: str) -> Any:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return pytest.importorskip(name)


def ring(obj: Any, comm: MPI.Comm = world, **kw: Any) -> cai_mpi.Array:
    """Send ``obj`` to the next rank, receive the previous rank's (every rank at once)."""
    req = cai_mpi.isend_array(obj, nxt, 17, comm)
    got = cai_mpi.recv_array(prv, 17, comm, **kw)
    req.wait()
    return got


def current_device(cp: Any) -> int:
    """The device current in this thread (CuPy's view, the same as the CUDA runtime's): where receives land."""
    return int(cp.cuda.Device().id)


def other_device(cp: Any) -> int:
    """A device other than the current one; skips where there is none."""
    count = cp.cuda.runtime.getDeviceCount()
    if count < 2:
        pytest.skip("needs two GPUs")
    return (current_device(cp) + 1) % count


def made_by(r: int, cp: Any, n: int = 64 * 48, dtype: Any = "float32") -> Any:
    return (cp.arange(n, dtype=dtype) * (r + 1)).reshape(64, -1)


def test_runtime_is_cuda() -> None:
    assert get_runtime().name == "cuda"


@pytest.mark.parametrize("rows", [0, 7, 1 << 18])  # 1 << 18 rows: 3 MiB, several staging chunks
@pytest.mark.parametrize("layout", ["C", "F", "strided"])
def test_cupy_ring_lands_on_the_device(cp: Any, route: MPI.Comm, layout: str, rows: int) -> None:
    def made(r: int) -> Any:
        a = (cp.arange(rows * 6, dtype=cp.uint16) + r).reshape(rows, 6)
        return {"C": a, "F": cp.asfortranarray(a), "strided": a[::-2, 1::3]}[layout]

    got = ring(made(rank), route)
    assert got.device == current_device(cp)
    y = cp.asarray(got)  # zero-copy adoption through __cuda_array_interface__
    assert got.nbytes == 0 or y.data.ptr == got.descriptor.ptr
    assert y.shape == made(prv).shape and cp.array_equal(y, made(prv))


def test_a_busy_non_blocking_stream_is_synchronized_before_sending(cp: Any, route: MPI.Comm) -> None:
    s = cp.cuda.Stream(non_blocking=True)
    with s:
        x = cp.zeros(1 << 22, dtype=cp.float64)
        for _ in range(20):
            x += 1.0  # much work queued on s; CuPy exports s while it is current
        got = ring(x, route)
    assert float(cp.asarray(got).min()) == 20.0


def test_forwarding_after_work_on_a_received_array(cp: Any, route: MPI.Comm) -> None:
    # Defect 1's rule: cai_mpi's own device Arrays are synchronized before they are sent again.
    got = ring(made_by(rank, cp), route)
    y = cp.asarray(got)
    for _ in range(10):
        y *= 2  # on CuPy's current stream, still running when the Array is forwarded
    again = ring(got, route)
    assert cp.array_equal(cp.asarray(again), made_by((rank - 2) % size, cp) * 1024)


def test_array_numpy_sees_pending_work(cp: Any) -> None:
    got = ring(made_by(rank, cp))
    y = cp.asarray(got)
    with cp.cuda.Stream(non_blocking=True):
        y += 1
        assert np.array_equal(got.numpy(), cp.asnumpy(made_by(prv, cp)) + 1)


@pytest.mark.parametrize("layout", ["F", "strided"])
def test_device_out_of_any_layout(cp: Any, route: MPI.Comm, layout: str) -> None:
    base = cp.zeros((64, 96), dtype=cp.float32)
    out = cp.asfortranarray(base[:, :48]) if layout == "F" else base[:, ::2]
    got = ring(made_by(rank, cp), route, out=out)
    assert got.descriptor.ptr == out.data.ptr and cp.array_equal(out, made_by(prv, cp))
    if layout == "strided":
        assert not base[:, 1::2].any()


def test_host_to_device_and_back(cp: Any, route: MPI.Comm) -> None:
    here = current_device(cp)
    got = ring(np.arange(1 << 20, dtype=np.int64) + rank, route, device=here)
    assert got.device == here and cp.array_equal(cp.asarray(got), cp.arange(1 << 20, dtype=cp.int64) + prv)
    back = ring(made_by(rank, cp), route, device="host")
    assert back.device == "host" and np.array_equal(np.asarray(back), cp.asnumpy(made_by(prv, cp)))


def test_managed_memory(cp: Any, route: MPI.Comm) -> None:
    mem = cp.cuda.malloc_managed(4096 * 8)
    x = cp.ndarray((4096,), cp.float64, memptr=mem)
    x[:] = cp.arange(4096) + rank
    got = ring(x, route)
    assert np.array_equal(np.asarray(got) if got.device == "host" else got.numpy(), np.arange(4096) + prv)


def test_a_second_device(cp: Any, route: MPI.Comm) -> None:
    here, other = current_device(cp), other_device(cp)
    with cp.cuda.Device(other):
        x = made_by(rank, cp)
    got = ring(x, route, device=other)
    assert got.device == other
    with cp.cuda.Device(other):
        assert cp.array_equal(cp.asarray(got), made_by(prv, cp))
    assert current_device(cp) == here  # the caller's current device is left alone


def test_receives_land_on_the_device_current_in_the_thread(cp: Any, route: MPI.Comm) -> None:
    # The device rule without device=: switching the current device moves where the next receive lands.
    here, other = current_device(cp), other_device(cp)
    with cp.cuda.Device(other):
        got = ring(made_by(rank, cp), route)
        assert got.device == other
        assert cp.array_equal(cp.asarray(got), made_by(prv, cp))
    got = ring(made_by(rank, cp), route)
    assert got.device == here and cp.array_equal(cp.asarray(got), made_by(prv, cp))


def test_device_channels(cp: Any, route: MPI.Comm) -> None:
    x = cp.zeros(1 << 16, dtype=cp.float32)
    if not cai_mpi.cuda_aware(route):
        with pytest.raises(ValueError, match="contiguous device memory through a CUDA-aware MPI"):
            cai_mpi.send_channel(x, nxt, 9, route)
        return
    here = current_device(cp)
    with cai_mpi.send_channel(x, nxt, 9, route) as tx, cai_mpi.recv_channel(prv, 9, route, device=here) as rx:
        for step in range(1, 4):
            x[:] = step * (rank + 1)
            req = tx.isend()
            got = rx.recv()
            req.wait()
            assert got.device == here and bool((cp.asarray(got) == step * (prv + 1)).all())


def test_torch_tensors(route: MPI.Comm) -> None:
    torch = _import("torch")
    if not torch.cuda.is_available():
        pytest.skip("this torch build has no CUDA")
    x = torch.arange(1000, device="cuda", dtype=torch.float64).reshape(20, 50).t() * (rank + 1)  # CAI v2, strided
    got = ring(x, route)
    assert got.device == torch.cuda.current_device()
    t = torch.as_tensor(got, device="cuda")
    expected = torch.arange(1000, device="cuda", dtype=torch.float64).reshape(20, 50).t() * (prv + 1)
    assert torch.equal(t, expected)


def test_numba_default_stream_producer(route: MPI.Comm) -> None:
    cuda = _import("numba.cuda")
    if not cuda.is_available():
        pytest.skip("Numba sees no GPU")

    @cuda.jit
    def fill(a: Any, value: int) -> None:
        i = cuda.grid(1)
        if i < a.size:
            a[i] = value

    x = cuda.device_array(1 << 20, dtype=np.int32)
    fill[(x.size + 255) // 256, 256](x, rank + 1)  # on the default stream: still running when sent
    got = ring(x, route)
    assert got.device == cuda.get_current_device().id
    assert np.array_equal(cuda.as_cuda_array(got).copy_to_host(), np.full(1 << 20, prv + 1, np.int32))


CUPY_PER_THREAD = """
import cupy as cp, numpy as np, cai_mpi
x = cp.zeros(1 << 22, dtype=cp.float64)
for _ in range(10):
    x += 1.0  # on the per-thread default stream (CAI v3 stream 2)
assert x.__cuda_array_interface__["stream"] == 2, x.__cuda_array_interface__["stream"]
req = cai_mpi.isend_array(x, 0)
got = cai_mpi.recv_array(0)
req.wait()
assert float(cp.asarray(got).min()) == 10.0
print("ok")
"""


def test_cupy_with_the_per_thread_default_stream() -> None:
    _import("cupy")
    if size > 1:
        pytest.skip("runs its own one-rank interpreter; covered by the 1-rank run")
    env = {**os.environ, "CUPY_CUDA_PER_THREAD_DEFAULT_STREAM": "1"}
    done = subprocess.run([sys.executable, "-c", CUPY_PER_THREAD], env=env, capture_output=True, text=True,
                          timeout=300)
    assert done.returncode == 0 and done.stdout.strip() == "ok", done.stderr
