"""Every collective given ``timeout=`` (or ``CAI_MPI_TIMEOUT``) on ranks that all join returns exactly what it
returns without one: the timed path posts the nonblocking collective and polls it, a different MPI call from the
untimed one. tests/test_collective_timeouts.py covers a rank that never joins; this covers the common case (a
survivor of the mutation run: a broken name for the nonblocking call passed every MPI test, docs/testing.md).
Passes at any world size >= 2."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import numpy as np
import pytest
from mpi4py import MPI

import cai_mpi
from cai_mpi._src.config import reload_config

pytestmark = pytest.mark.mpi(min_size=2)

comm = MPI.COMM_WORLD
rank, size = comm.Get_rank(), comm.Get_size()
ROOT = size - 1  # not rank 0: a root that is not the default


def piece(r: int) -> np.ndarray[Any, Any]:
    return np.arange(4, dtype="<i8") + 10 * r


@pytest.fixture(params=["argument", "environment"])
def timed(request: pytest.FixtureRequest) -> Iterator[dict[str, float]]:
    """``timeout=60`` passed to the call, or ``CAI_MPI_TIMEOUT=60`` with no argument."""
    if request.param == "argument":
        yield {"timeout": 60.0}
        return
    reload_config({"CAI_MPI_TIMEOUT": "60"})
    yield {}
    reload_config()


def values(arrays: list[Any]) -> list[list[int]]:
    return [np.asarray(a).tolist() for a in arrays]


def test_bcast(timed: dict[str, float]) -> None:
    got = cai_mpi.bcast_array(piece(ROOT) if rank == ROOT else None, root=ROOT, **timed)
    assert np.asarray(got).tolist() == piece(ROOT).tolist()


def test_gather_and_allgather(timed: dict[str, float]) -> None:
    expected = [piece(r).tolist() for r in range(size)]
    got = cai_mpi.gather_array(piece(rank), root=ROOT, **timed)
    if rank == ROOT:
        assert values(got) == expected
    else:
        assert got is None
    assert values(cai_mpi.allgather_array(piece(rank), **timed)) == expected


def test_scatter_and_alltoall(timed: dict[str, float]) -> None:
    got = cai_mpi.scatter_array([piece(r) for r in range(size)] if rank == ROOT else None, root=ROOT, **timed)
    assert np.asarray(got).tolist() == piece(rank).tolist()
    mine = [piece(rank * size + dest) for dest in range(size)]
    assert values(cai_mpi.alltoall_array(mine, **timed)) == [piece(src * size + rank).tolist() for src in range(size)]


def test_reduce_and_allreduce(timed: dict[str, float]) -> None:
    expected = sum(piece(r) for r in range(size)).tolist()
    got = cai_mpi.reduce_array(piece(rank), root=ROOT, **timed)
    if rank == ROOT:
        assert np.asarray(got).tolist() == expected
    else:
        assert got is None
    assert np.asarray(cai_mpi.allreduce_array(piece(rank), **timed)).tolist() == expected
