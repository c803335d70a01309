"""A received device Array taken by real DLPack consumers (CuPy, PyTorch, JAX where installed), zero-copy, in a
ring over COMM_WORLD (a rank to itself at 1 rank); and numpy refusing it with a TypeError that says what to do."""

from __future__ import annotations

import warnings
from typing import Any

import numpy as np
import pytest
from mpi4py import MPI

import cai_mpi
from cai_mpi._src.runtime.cudadriver import probe

USABLE, REASON = probe()

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not USABLE, reason=f"no usable CUDA GPU: {REASON}"),
]

world = MPI.COMM_WORLD
rank, size = world.Get_rank(), world.Get_size()
nxt, prv = (rank + 1) % size, (rank - 1) % size


def _import(name: str) -> Any:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return pytest.importorskip(name)


def ring(obj: Any) -> cai_mpi.Array:
    """Send ``obj`` to the next rank, receive the previous rank's on this thread's current device."""
    req = cai_mpi.isend_array(obj, nxt, 23)
    got = cai_mpi.recv_array(prv, 23)
    req.wait()
    return got


def made_by(r: int, layout: str) -> np.ndarray[Any, Any]:
    a = (np.arange(48 * 32, dtype=np.float32) * (r + 1)).reshape(48, 32)
    return {"C": a, "F": np.asfortranarray(a)}[layout]


@pytest.mark.parametrize("layout", ["C", "F"])
def test_cupy_from_dlpack_adopts_a_received_array(layout: str) -> None:
    cp = _import("cupy")
    got = ring(cp.asarray(made_by(rank, layout), order=layout))
    assert got.device == int(cp.cuda.Device().id)
    s = cp.cuda.Stream(non_blocking=True)
    with s:  # CuPy passes its current stream: the handshake orders it after the receive
        y = cp.from_dlpack(got)
        total = cp.asnumpy(y, stream=s)
    s.synchronize()
    assert y.data.ptr == got.descriptor.ptr and y.strides == got.descriptor.byte_strides
    assert np.array_equal(total, made_by(prv, layout))


@pytest.mark.parametrize("layout", ["C", "F"])
def test_torch_from_dlpack_adopts_a_received_array(layout: str) -> None:
    torch = _import("torch")
    if not torch.cuda.is_available():
        pytest.skip("PyTorch has no CUDA here")
    got = ring(torch.as_tensor(made_by(rank, layout)).cuda())  # (PyTorch's .cuda() keeps a Fortran layout)
    t = torch.from_dlpack(got)
    assert t.is_cuda and t.data_ptr() == got.descriptor.ptr
    assert tuple(t.shape) == got.shape
    assert np.array_equal(t.cpu().numpy(), made_by(prv, layout))
    del got
    assert np.array_equal(t.cpu().numpy(), made_by(prv, layout))  # the tensor keeps the memory alive


def test_jax_from_dlpack_takes_a_received_array() -> None:
    jax = _import("jax")
    if not any(d.platform == "gpu" for d in jax.devices()):
        pytest.skip("JAX has no GPU here")
    got = ring(made_by(rank, "C"))
    assert np.array_equal(np.asarray(jax.dlpack.from_dlpack(got)), made_by(prv, "C"))


def test_numpy_refuses_a_device_array_and_to_host_copies() -> None:
    got = ring(made_by(rank, "C"))
    if got.is_host:
        pytest.skip("this rank has no current GPU: the Array landed in host memory")
    with pytest.raises(TypeError, match=r"to_host\(\)"):
        np.asarray(got)
    assert np.array_equal(got.to_host(), made_by(prv, "C"))
