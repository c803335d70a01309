"""The real CUDA runtime between MPI ranks, each rank on its own CUDA driver double: device arrays through
point-to-point, channels, collectives and a Pipeline, handed to MPI directly (a CUDA-aware MPI: device memory
the host can read, CAI_MPI_CUDA_AWARE=1) or staged through pinned memory (device memory faults on host access,
as an MPI that is not CUDA-aware would). Received data is compared exactly with what was sent."""

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
nxt, prv = (rank + 1) % size, (rank - 1) % size
SLOW = 0.2


@pytest.fixture(params=["direct", "staged"])
def gpu(request: pytest.FixtureRequest, on_double: Any) -> Iterator[tuple[Runtime, MPI.Comm]]:
    # (several staging chunks at modest sizes)
    with on_double(request.param == "direct", settings={"CAI_MPI_CHUNK_BYTES": "65536"}) as made:
        yield made


def payload(r: int, n: int, dtype: str = "<f8") -> np.ndarray[Any, Any]:
    return (np.arange(n) * (r + 1) + r).astype(dtype)


def received(a: cai_mpi.Array) -> np.ndarray[Any, Any]:
    return np.asarray(a) if a.device == "host" else a.numpy()


@pytest.mark.parametrize("n", [0, 1, 1000, 50_000])
@pytest.mark.parametrize("device", [None, "host"])
def test_ring_of_device_arrays(gpu: tuple[Runtime, MPI.Comm], n: int, device: str | None) -> None:
    rt, comm = gpu
    x = DoubleDeviceArray(rt, payload(rank, n), stream=1)
    req = cai_mpi.isend_array(x, nxt, 3, comm)
    got = cai_mpi.recv_array(prv, 3, comm, device=device)
    req.wait()
    assert got.device == (0 if device is None else "host")  # on the rank's GPU unless asked otherwise
    assert got.shape == (n,) and np.array_equal(received(got), payload(prv, n))


STRIDED = {  # (shape, byte strides, offset of element 0) over 30 x 40 int32, rows 160 bytes apart
    "F": ((30, 40), (4, 120), 0),
    "every-other-column": ((40, 15), (120, 8), 0),
    "rows-and-columns": ((20, 10), (240, 12), 0),
    "reversed": ((30, 40), (-160, -4), 4796),
    "reversed-rows-every-other-column": ((15, 20), (-320, 8), 29 * 160),
    "broadcast-row": ((7, 40), (0, 4), 0),
    "reversed-column-broadcast": ((30, 5), (-160, 0), 29 * 160 + 12),
}


@pytest.mark.parametrize("layout", list(STRIDED))
def test_strided_device_layouts(gpu: tuple[Runtime, MPI.Comm], layout: str) -> None:
    rt, comm = gpu
    shape, strides, offset = STRIDED[layout]

    def view(r: int) -> np.ndarray[Any, Any]:
        return np.lib.stride_tricks.as_strided(payload(r, 40 * 30, "<i4")[offset // 4:], shape, strides)

    x = DoubleDeviceArray(rt, payload(rank, 40 * 30, "<i4"), view=(shape, strides), offset=offset)
    got = cai_mpi.sendrecv_array(x, nxt, 4, prv, 4, comm)
    assert got.shape == shape and np.array_equal(received(got), view(prv))


@pytest.mark.parametrize("layout", ["F", "reversed", "reversed-rows-every-other-column"])
def test_receive_into_a_strided_device_array(gpu: tuple[Runtime, MPI.Comm], layout: str) -> None:
    """The payload is scattered into out='s elements, and not one byte between them is written."""
    rt, comm = gpu
    shape, strides, offset = STRIDED[layout]
    fill = np.full(40 * 30, -7, "<i4")
    out = DoubleDeviceArray(rt, fill, view=(shape, strides), offset=offset)
    sent = np.ascontiguousarray(payload(rank, int(np.prod(shape)), "<i4").reshape(shape))
    req = cai_mpi.isend_array(DoubleDeviceArray(rt, sent), nxt, 8, comm)
    got = cai_mpi.recv_array(prv, 8, comm, out=out)
    req.wait()
    expected = fill.copy()
    np.lib.stride_tricks.as_strided(expected[offset // 4:], shape, strides)[...] = payload(prv, sent.size,
                                                                                          "<i4").reshape(shape)
    assert got.shape == shape and np.array_equal(out.read(), expected)


def test_a_broadcast_device_out_is_refused_and_the_communicator_stays_in_step(gpu: tuple[Runtime, MPI.Comm]) -> None:
    """Which value would land in an element that repeats is undefined: such an out= is refused (the payload
    is received and dropped), and the next message arrives as sent."""
    rt, comm = gpu
    shape, strides, offset = STRIDED["broadcast-row"]
    out = DoubleDeviceArray(rt, np.full(40, -7, "<i4"), view=(shape, strides), offset=offset)
    sent = payload(rank, 7 * 40, "<i4").reshape(shape)
    req = cai_mpi.isend_array(DoubleDeviceArray(rt, sent), nxt, 9, comm)
    with pytest.raises(ValueError, match="overlapping strides"):
        cai_mpi.recv_array(prv, 9, comm, out=out)
    req.wait()
    assert np.array_equal(out.read(), np.full(40, -7, "<i4"))
    got = cai_mpi.sendrecv_array(DoubleDeviceArray(rt, payload(rank, 100)), nxt, 10, prv, 10, comm)
    assert np.array_equal(received(got), payload(prv, 100))


def test_forwarding_around_the_ring_after_work_on_the_device(gpu: tuple[Runtime, MPI.Comm]) -> None:
    rt, comm = gpu
    got = cai_mpi.sendrecv_array(DoubleDeviceArray(rt, payload(rank, 5000)), nxt, 5, prv, 5, comm)
    assert got.device == 0  # received arrays land on the rank's GPU
    with rt.driver.on(0):  # type: ignore[attr-defined]  # a slow kernel doubling the received data
        rt.driver_double.kernel_write(1, got.descriptor.ptr, (payload(prv, 5000) * 2).tobytes(),  # type: ignore[attr-defined]
                                      delay=SLOW)
    again = cai_mpi.sendrecv_array(got, nxt, 6, prv, 6, comm)
    assert np.array_equal(received(again), payload((rank - 2) % size, 5000) * 2)


def test_sendrecv_into_host_memory_on_a_gpu_rank(gpu: tuple[Runtime, MPI.Comm]) -> None:
    rt, comm = gpu
    got = cai_mpi.sendrecv_array(DoubleDeviceArray(rt, payload(rank, 3000)), nxt, 7, prv, 7, comm, device="host")
    assert got.device == "host" and np.array_equal(np.asarray(got), payload(prv, 3000))


def test_collectives_of_device_arrays(gpu: tuple[Runtime, MPI.Comm]) -> None:
    rt, comm = gpu
    mine = DoubleDeviceArray(rt, payload(rank, 3000 + rank))
    parts = cai_mpi.allgather_array(mine, comm)
    assert [received(p).tolist() for p in parts] == [payload(r, 3000 + r).tolist() for r in range(size)]
    root = cai_mpi.bcast_array(mine if rank == 0 else None, 0, comm)
    assert np.array_equal(received(root), payload(0, 3000))
    same = DoubleDeviceArray(rt, payload(rank, 4096))
    total = cai_mpi.allreduce_array(same, "sum", comm)
    assert total.device == 0 and np.array_equal(total.numpy(), sum(payload(r, 4096) for r in range(size)))
    out = DoubleDeviceArray(rt, np.zeros(4096))
    cai_mpi.allreduce_array(same, "max", comm, out=out)
    assert np.array_equal(out.read(), payload(size - 1, 4096))


@pytest.mark.parametrize("n", [0, 3, 3000], ids=["empty", "in-a-slot", "over-a-slot"])
def test_scatter_and_alltoall_of_device_arrays(gpu: tuple[Runtime, MPI.Comm], n: int) -> None:
    """Device pieces never ride in a description slot (only host bytes do); host pieces that do land on the GPU
    all the same, into out= when given; every piece exact."""
    rt, comm = gpu

    def piece(src: int, dst: int) -> np.ndarray[Any, Any]:
        return payload(10 * src + dst, n + dst)

    for root in range(size):
        for on_device in (True, False):
            parts = [DoubleDeviceArray(rt, piece(root, r)) if on_device else piece(root, r) for r in range(size)]
            got = cai_mpi.scatter_array(parts if rank == root else None, root, comm)
            assert got.device == 0 and got.source == root
            assert np.array_equal(received(got), piece(root, rank))
            out = DoubleDeviceArray(rt, np.full(n + rank, -1.0))
            got = cai_mpi.scatter_array(parts if rank == root else None, root, comm, out=out, timeout=30.0)
            assert np.array_equal(out.read(), piece(root, rank))
    for on_device in (True, False):
        mine = [DoubleDeviceArray(rt, piece(rank, d)) if on_device else piece(rank, d) for d in range(size)]
        got = cai_mpi.alltoall_array(mine, comm)
        assert [a.device for a in got] == [0] * size
        assert all(np.array_equal(received(a), piece(src, rank)) for src, a in enumerate(got))
    mixed = [DoubleDeviceArray(rt, piece(rank, d)) if (rank + d) % 2 else piece(rank, d) for d in range(size)]
    got = cai_mpi.alltoall_array(mixed, comm, timeout=30.0)
    assert all(np.array_equal(received(a), piece(src, rank)) for src, a in enumerate(got))

def test_a_pipeline_forwards_device_arrays(gpu: tuple[Runtime, MPI.Comm]) -> None:
    rt, comm = gpu
    items = 6
    with cai_mpi.Pipeline(comm, depth=2) as pipe:
        if pipe.first:
            for i in range(items):
                pipe.send(DoubleDeviceArray(rt, payload(i, 2000 + i)), meta={"i": i})
        else:
            seen = []
            for a in pipe:
                assert a.device == 0
                if pipe.last:
                    seen.append((a.meta["i"], received(a)))
                else:
                    pipe.send(a)
            if pipe.last:
                assert [i for i, _ in seen] == list(range(items))
                assert all(np.array_equal(v, payload(i, 2000 + i)) for i, v in seen)


def test_device_channels_when_direct(gpu: tuple[Runtime, MPI.Comm]) -> None:
    rt, comm = gpu
    if not cai_mpi.cuda_aware(comm):  # staged: a channel cannot land in device memory; it says so, nothing hangs
        host = payload(rank, 10)
        with cai_mpi.send_channel(host, nxt, 7, comm) as tx, cai_mpi.recv_channel(prv, 7, comm, device=0) as rx:
            req = tx.isend()
            with pytest.raises(ValueError, match="cannot be received in place"):
                rx.recv()
            req.wait()
        return
    x = DoubleDeviceArray(rt, np.zeros(1000), stream=1)
    with cai_mpi.send_channel(x, nxt, 8, comm) as tx, cai_mpi.recv_channel(prv, 8, comm, device=0) as rx:
        for step in range(1, 4):
            with rt.driver.on(0):  # type: ignore[attr-defined]
                rt.driver_double.kernel_write(1, x.buf.ptr, payload(rank * step, 1000).tobytes(),  # type: ignore[attr-defined]
                                              delay=SLOW)
            req = tx.isend()
            got = rx.recv()
            req.wait()
            assert got.device == 0 and np.array_equal(got.numpy(), payload(prv * step, 1000))


@pytest.mark.parametrize("aware", [True, False], ids=["direct", "staged"])
def test_a_repeated_allgather_of_device_arrays_lands_exactly_and_goes_direct_on_a_cuda_aware_mpi(
    on_double: Any, aware: bool
) -> None:
    """The steady state of allgather_array (one Allgather of host records carrying the ballot's words) is for MPIs
    that stage device data anyway; on a CUDA-aware MPI a repeated call hands device memory to MPI as the first call
    does, copying nothing through the host."""
    with on_double(aware) as (rt, comm):
        for step in range(4):
            mine = DoubleDeviceArray(rt, payload(rank, 512) + step)
            d = rt.driver_double
            d.calls.clear()
            parts = cai_mpi.allgather_array(mine, comm)
            copies = [name for name, _ in d.calls if name.startswith("cuMemcpy")]
            assert [received(p).tolist() for p in parts] == [(payload(r, 512) + step).tolist() for r in range(size)]
            if aware and step > 0:
                assert copies == [], f"step {step}: a repeated allgather copied through the host: {copies}"
