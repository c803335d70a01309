"""Device transfers of arrays made by cai_mpi's own CUDA runtime (its allocation and copies, no CuPy), in a ring
over COMM_WORLD: the runtime's driver calls end to end, staged and direct, contiguous and strided, sent and received
into ``out=``.

They run wherever the GPU tests do: on a GPU (scripts/test-gpu.sh), on the CUDA driver double (scripts/test.sh) and
through the real cuda-bindings over the libcuda stub (scripts/test-real-bindings.sh, which also takes the direct
route: the stub's device memory is host memory, so any MPI can read it)."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
from mpi4py import MPI

import cai_mpi
from cai_mpi._src.runtime import get_runtime
from cai_mpi._src.runtime.base import DeviceBuffer, Runtime
from cai_mpi._src.runtime.cudadriver import probe

USABLE, REASON = probe()

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not USABLE, reason=f"no usable CUDA GPU: {REASON}"),
]

world = MPI.COMM_WORLD
rank, size = world.Get_rank(), world.Get_size()
nxt, prv = (rank + 1) % size, (rank - 1) % size
LEGACY = 1  # CAI v3's stream 1: the legacy default stream
CHUNK_BYTES = 1 << 16  # the staged route's chunks (the ``route`` fixture, tests/gpu/conftest.py): 192 KiB is several


class RuntimeArray:
    """A CAI v3 exporter over device memory from the runtime (what a CuPy array is to cai_mpi), exported on the
    legacy default stream; ``view`` is ``(shape, byte_strides, offset)`` of the same memory."""

    def __init__(self, rt: Runtime, data: np.ndarray[Any, Any], view: tuple[Any, Any, int] | None = None) -> None:
        self.rt, self.host = rt, np.ascontiguousarray(data)
        self.buf: DeviceBuffer = rt.alloc_device(self.host.nbytes, rt.current_device() or 0)
        self.write(self.host)
        self.shape, self.strides, self.offset = view or (self.host.shape, None, 0)

    @property
    def __cuda_array_interface__(self) -> dict[str, Any]:
        return {"shape": self.shape, "typestr": self.host.dtype.str, "version": 3, "strides": self.strides,
                "data": (self.buf.ptr + self.offset, False), "stream": LEGACY}

    def write(self, data: np.ndarray[Any, Any]) -> None:
        if data.nbytes:
            stream = self.rt.create_stream(self.buf.ordinal)
            self.rt.copy_async(self.buf.ptr, data.ctypes.data, data.nbytes, stream)
            stream.synchronize()

    def read(self) -> np.ndarray[Any, Any]:
        """The whole allocation now, as the data's dtype and shape."""
        return read(self.rt, self.buf.ptr, self.host.nbytes, self.buf.ordinal).view(self.host.dtype).reshape(
            self.host.shape)


def read(rt: Runtime, ptr: int, nbytes: int, ordinal: int) -> np.ndarray[Any, Any]:
    """``nbytes`` of device memory at ``ptr``, copied to the host after the device's work."""
    out = np.zeros(nbytes, np.uint8)
    if nbytes:
        rt.sync_device(ordinal)
        stream = rt.create_stream(ordinal)
        rt.copy_async(out.ctypes.data, ptr, nbytes, stream)
        stream.synchronize()
    return out


def received(got: cai_mpi.Array) -> np.ndarray[Any, Any]:
    """A received device Array's bytes as a C-ordered numpy array."""
    desc = got.descriptor
    assert got.device == get_runtime().current_device()
    raw = read(get_runtime(), desc.ptr, got.nbytes, int(got.device))
    return raw.view(np.dtype(desc.typestr)).reshape(got.shape)


def ring(obj: Any, comm: MPI.Comm, **kw: Any) -> cai_mpi.Array:
    req = cai_mpi.isend_array(obj, nxt, 23, comm)
    got = cai_mpi.recv_array(prv, 23, comm, **kw)
    req.wait()
    return got


def made_by(r: int, rows: int = 64) -> np.ndarray[Any, Any]:
    return (np.arange(rows * 6, dtype=np.uint16) + 100 * r).reshape(rows, 6)


@pytest.mark.parametrize("rows", [0, 5, 1 << 14])  # 1 << 14 rows: 192 KiB, several staging chunks
def test_runtime_arrays_ring(route: MPI.Comm, rows: int) -> None:
    rt = get_runtime()
    got = ring(RuntimeArray(rt, made_by(rank, rows)), route)
    assert got.shape == (rows, 6)
    assert np.array_equal(received(got), made_by(prv, rows))


def test_strided_runtime_arrays_are_packed(route: MPI.Comm) -> None:
    rt = get_runtime()
    data = made_by(rank, 300)
    # every other row from the last, columns 1 and 4: both axes strided, one reversed (a 2-D copy per run)
    view = ((150, 2), (-2 * 12, 6), (299 * 12) + 2)
    got = ring(RuntimeArray(rt, data, view), route)
    assert np.array_equal(received(got), made_by(prv, 300)[::-2, 1::3])


def test_receive_into_a_strided_runtime_array(route: MPI.Comm) -> None:
    rt = get_runtime()
    out = RuntimeArray(rt, np.zeros((40, 6), np.uint16), ((40, 3), (12, 4), 0))  # columns 0, 2 and 4
    sent = RuntimeArray(rt, made_by(rank, 40)[:, ::2].copy())
    got = ring(sent, route, out=out)
    whole = np.zeros((40, 6), np.uint16)
    whole[:, ::2] = made_by(prv, 40)[:, ::2]
    assert got.descriptor.ptr == out.buf.ptr and np.array_equal(out.read(), whole)


def test_a_received_array_is_forwarded(route: MPI.Comm) -> None:
    got = ring(RuntimeArray(get_runtime(), made_by(rank)), route)
    again = ring(got, route)
    assert np.array_equal(received(again), made_by((rank - 2) % size))
