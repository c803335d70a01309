"""A non-periodic line of ranks, as ``Cart.Shift`` makes it: the ends send to or receive from PROC_NULL. Every kind
of ``out=`` (host and device) either receives the neighbour's data or, from PROC_NULL, is returned unchanged."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

import numpy as np
import pytest
from mpi4py import MPI
from ordering import assert_nothing_waiting

import cai_mpi
from cai_mpi._src.config import reload_config
from cai_mpi.testing import DoubleDeviceArray, FakeCudaArray, SimulatedRuntime, double_runtime, use_runtime

pytestmark = pytest.mark.mpi(min_size=2)

world = MPI.COMM_WORLD
rank, size = world.Get_rank(), world.Get_size()
right = rank + 1 if rank + 1 < size else MPI.PROC_NULL
left = rank - 1 if rank else MPI.PROC_NULL
SHAPE = (5, 7)
STALE = np.full(SHAPE, -1.0)


def face(r: int) -> np.ndarray[Any, Any]:
    """What rank ``r`` sends: distinct per rank and element."""
    return np.arange(SHAPE[0] * SHAPE[1], dtype="<f8").reshape(SHAPE) * (r + 1) + r


@pytest.fixture(params=["host", "simulated", "double"])
def runtime(request: pytest.FixtureRequest, routed_dup: Any) -> Iterator[tuple[str, MPI.Comm, Any]]:
    """The runtime the out= kinds live on, and a communicator whose route (staged) is fixed for it."""
    comm = routed_dup(False)
    rt: Any = None
    try:
        if request.param == "host":
            yield request.param, comm, None
        else:
            rt = SimulatedRuntime() if request.param == "simulated" else double_runtime()
            with use_runtime(rt):
                yield request.param, comm, rt
    finally:
        comm.Barrier()
        comm.Free()
        reload_config()
        if request.param == "double":
            rt.driver_double.close()


def outs(where: str, rt: Any) -> list[tuple[str, Any, Callable[[], np.ndarray[Any, Any]]]]:
    """(name, out, read) for each out= kind of this runtime, each holding STALE."""
    if where == "host":
        c = STALE.copy()
        field = np.asfortranarray(np.full((3, *SHAPE), -1.0))
        strided = field[1]  # a Fortran-ordered field's inner plane: strided
        fake = FakeCudaArray(STALE)
        arr = cai_mpi.Array.from_host(STALE.copy())
        return [("numpy", c, c.copy), ("numpy-strided", strided, strided.copy), ("host-cai", fake, fake.copy_to_host),
                ("host-Array", arr, lambda: np.asarray(arr).copy())]
    if where == "simulated":
        fake = FakeCudaArray(STALE, device=True)
        return [("simulated-cai", fake, fake.copy_to_host)]
    dev = DoubleDeviceArray(rt, STALE, stream=1)
    held = DoubleDeviceArray(rt, STALE)
    arr = cai_mpi.Array(cai_mpi.describe(held), device=0, owner=held)
    return [("double-cai", dev, lambda: dev.read().reshape(SHAPE)), ("double-Array", arr, arr.numpy)]


def check(name: str, got: cai_mpi.Array, out: Any, read: Callable[[], np.ndarray[Any, Any]], source: int) -> None:
    assert got.shape == SHAPE and got.dtype == np.float64, name
    assert got.source == source, name
    want = STALE if source == MPI.PROC_NULL else face(source)
    assert np.array_equal(read(), want), (name, source)
    assert np.array_equal(got.numpy(), want), (name, source)


def test_a_shift_along_a_line_into_every_out_kind(runtime: tuple[str, MPI.Comm, Any]) -> None:
    where, comm, rt = runtime
    for name, out, read in outs(where, rt):
        got = cai_mpi.sendrecv_array(face(rank), dest=right, sendtag=3, source=left, recvtag=3, comm=comm, out=out)
        check(name, got, out, read, left)  # rank 0 receives from PROC_NULL; the last rank sends to it
    for name, out, read in outs(where, rt):
        got = cai_mpi.sendrecv_array(face(rank), dest=left, sendtag=4, source=right, recvtag=4, comm=comm, out=out)
        check(name, got, out, read, right)


def test_both_ends_proc_null(runtime: tuple[str, MPI.Comm, Any]) -> None:
    where, comm, rt = runtime
    for name, out, read in outs(where, rt):
        got = cai_mpi.sendrecv_array(face(rank), dest=MPI.PROC_NULL, source=MPI.PROC_NULL, comm=comm, out=out)
        check(name, got, out, read, MPI.PROC_NULL)
    # Nothing was sent or left unreceived: the next exchange gets the neighbour's data.
    got = cai_mpi.sendrecv_array(face(rank), dest=right, sendtag=5, source=left, recvtag=5, comm=comm, device="host")
    if left == MPI.PROC_NULL:
        assert got.size == 0 and got.source == MPI.PROC_NULL
    else:
        assert np.array_equal(np.asarray(got), face(left))
    assert_nothing_waiting(comm)


def test_nonblocking_halves_at_the_walls(runtime: tuple[str, MPI.Comm, Any]) -> None:
    where, comm, rt = runtime
    for name, out, read in outs(where, rt):
        recv = cai_mpi.irecv_array(left, 6, comm, out=out)
        send = cai_mpi.isend_array(face(rank), right, 6, comm)
        got = recv.wait()
        send.wait()
        check(name, got, out, read, left)
