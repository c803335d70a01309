"""``sendrecv_array(x, right, source=left, out=x)``: the send buffer given as ``out=`` means "replace" (MPI's
``Sendrecv_replace``): each rank gets its left neighbour's data in ``x`` and its right neighbour gets ``x`` as it
was, whatever the size, layout and memory; any other overlap of ``out=`` with the send buffer is a ValueError,
raised before anything is sent."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np
import pytest
from mpi4py import MPI
from ordering import assert_nothing_waiting

import cai_mpi
from cai_mpi.testing import DoubleDeviceArray, FakeCudaArray, SimulatedRuntime, use_runtime

pytestmark = [pytest.mark.mpi(min_size=2), pytest.mark.timeout(40)]

world = MPI.COMM_WORLD
rank, size = world.Get_rank(), world.Get_size()
right, left = (rank + 1) % size, (rank - 1) % size
NBYTES = [64, 64 * 1024, 1024 * 1024]  # inline, about where MPI stops sending eagerly, well past it
ROUNDS = 3


def content(r: int, n: int, rnd: int) -> np.ndarray[Any, Any]:
    """What rank ``r`` holds before round ``rnd``: distinct per rank, round and element."""
    return np.arange(n, dtype="<f8") + (r + 1) * 1e7 + rnd * 1e9


def ring(comm: MPI.Comm, n: int, x: Any, read: Callable[[], np.ndarray[Any, Any]],
         write: Callable[[np.ndarray[Any, Any]], None], what: str) -> None:
    """Rounds of a ring shift in place: x goes right, the left neighbour's x comes into x."""
    for rnd in range(ROUNDS):
        write(content(rank, n, rnd))
        comm.Barrier()  # every rank's x is written before any neighbour's message may arrive
        got = cai_mpi.sendrecv_array(x, right, 7, left, 7, comm, out=x)
        assert got.source == left and got.shape == (n,), what
        assert np.array_equal(read(), content(left, n, rnd)), (what, n, rnd)
    assert_nothing_waiting(comm)


@pytest.mark.parametrize("nbytes", NBYTES)
@pytest.mark.parametrize("layout", ["contiguous", "strided", "Array"])
def test_host_send_buffer_as_out_is_replaced(comm: MPI.Comm, nbytes: int, layout: str) -> None:
    n = nbytes // 8
    if layout == "strided":
        field = np.zeros((n, 2))
        x: Any = field[:, 1]  # every other element: MPI reads it through a datatype or a packed copy
        view = x
    else:
        view = np.zeros(n)
        x = view if layout == "contiguous" else cai_mpi.Array.from_host(view)

    def write(v: np.ndarray[Any, Any]) -> None:
        view[...] = v

    ring(comm, n, x, lambda: view.copy(), write, layout)


@pytest.mark.parametrize("nbytes", NBYTES)
@pytest.mark.parametrize("strided", [False, True])
def test_simulated_device_send_buffer_as_out_is_replaced(routed_dup: Any, nbytes: int, strided: bool) -> None:
    n = nbytes // 8
    comm = routed_dup(False)
    try:
        with use_runtime(SimulatedRuntime()):
            if strided:
                x = FakeCudaArray(np.zeros(2 * n), device=True, shape=(n,), strides=(16,))
            else:
                x = FakeCudaArray(np.zeros(n), device=True)

            def write(v: np.ndarray[Any, Any]) -> None:
                x.host[...] = v

            ring(comm, n, x, x.copy_to_host, write, f"simulated strided={strided}")
    finally:
        comm.Barrier()
        comm.Free()


# (the driver double moves strided device memory an element at a time: a strided MiB would take too long)
@pytest.mark.parametrize(("strided", "nbytes"), [(False, n) for n in NBYTES] + [(True, n) for n in NBYTES[:2]])
@pytest.mark.parametrize("aware", [False, True])
def test_device_send_buffer_as_out_is_replaced(on_double: Any, nbytes: int, strided: bool, aware: bool) -> None:
    n = nbytes // 8
    with on_double(aware) as (rt, comm):
        x = DoubleDeviceArray(rt, np.zeros(2 * n if strided else n), stream=1,
                              view=((n,), (16,)) if strided else None)
        double = rt.driver_double

        def read() -> np.ndarray[Any, Any]:
            whole = x.read()
            return whole[::2].copy() if strided else whole

        def write(v: np.ndarray[Any, Any]) -> None:
            rt.sync_device(0)
            whole = np.zeros(2 * n) if strided else v
            if strided:
                whole[::2] = v
            double.write_device(x.buf.ptr, whole.tobytes())

        ring(comm, n, x, read, write, f"double aware={aware} strided={strided}")


def test_forwarded_array_keeps_its_meta(comm: MPI.Comm) -> None:
    n = 64 * 1024
    x = cai_mpi.Array.from_host(content(rank, n, 0), meta={"from": rank})
    got = cai_mpi.sendrecv_array(x, right, 8, left, 8, comm, out=x)
    assert got.meta == {"from": left}
    assert np.array_equal(np.asarray(x), content(left, n, 0))


def test_interleaved_halves_of_one_buffer_do_not_overlap(comm: MPI.Comm) -> None:
    """Send the even elements, receive into the odd ones: the same allocation, but no byte shared."""
    n = 64 * 1024
    buf = np.zeros(2 * n)
    buf[::2] = content(rank, n, 0)
    got = cai_mpi.sendrecv_array(buf[::2], right, 9, left, 9, comm, out=buf[1::2])
    assert np.array_equal(np.asarray(got), content(left, n, 0))
    assert np.array_equal(buf[1::2], content(left, n, 0)) and np.array_equal(buf[::2], content(rank, n, 0))


def overlaps(n: int) -> list[tuple[str, Callable[[np.ndarray[Any, Any]], tuple[Any, Any]]]]:
    """(what, buffer -> (send, out)) that share memory without being the same array."""
    return [
        ("partial", lambda b: (b[:n], b[n // 2:n // 2 + n])),
        ("inside", lambda b: (b[:n], b[1:n // 2])),
        ("reversed", lambda b: (b[:n], b[:n][::-1])),
        ("reshaped", lambda b: (b[:n], b[:n].reshape(2, n // 2))),
        ("transposed", lambda b: (b[:n].reshape(8, n // 8), b[:n].reshape(8, n // 8).T)),
        ("every other", lambda b: (b[:n], b[:n][::2])),
    ]


@pytest.mark.parametrize("nbytes", [64, 64 * 1024])
def test_other_overlaps_are_refused_before_anything_is_sent(comm: MPI.Comm, nbytes: int) -> None:
    n = nbytes // 8
    buf = np.arange(2 * n, dtype="<f8")
    for what, pick in overlaps(n):
        send, out = pick(buf)
        with pytest.raises(ValueError, match=r"sendrecv_array: out= shares memory with the array sent") as err:
            cai_mpi.sendrecv_array(send, right, 10, left, 10, comm, out=out)
        assert "the same array" in str(err.value), what  # what to do instead
        assert np.array_equal(buf, np.arange(2 * n, dtype="<f8")), what
    assert_nothing_waiting(comm)  # nothing was sent by any rank


def test_device_overlaps_are_refused(on_double: Any) -> None:
    n = 1024
    with on_double(False) as (rt, comm):
        whole = np.arange(2 * n, dtype="<f8")
        send = DoubleDeviceArray(rt, whole, view=((n,), (8,)))
        cases = {
            "partial": DoubleDeviceArray(rt, whole, view=((n,), (8,)), offset=8 * (n // 2)),
            "reversed": DoubleDeviceArray(rt, whole, view=((n,), (-8,)), offset=8 * (n - 1)),
            "reshaped": DoubleDeviceArray(rt, whole, view=((2, n // 2), (8 * (n // 2), 8))),
        }
        for what, other in cases.items():
            other.buf = send.buf  # the same device memory, seen another way
            with pytest.raises(ValueError, match=r"sendrecv_array: out= shares memory with the array sent"):
                cai_mpi.sendrecv_array(send, right, 11, left, 11, comm, out=other)
            assert np.array_equal(send.read(), whole), what
        assert_nothing_waiting(comm)
