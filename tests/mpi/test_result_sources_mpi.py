"""Where a collective's result says it came from (issue 34): the root for ``bcast_array``, ``scatter_array`` and
``bcast_init``, the sending rank for each piece of a gather, allgather and alltoall (one-shot and persistent), and
``PROC_NULL`` for a persistent reduction's result, which every rank contributed to; every collective result's tag
is ``ANY_TAG`` (collectives have no tag). Small payloads (carried in the agreement's slots) and large ones (moved
by MPI after it). Passes at any world size >= 2."""

from __future__ import annotations

import numpy as np
import pytest
from mpi4py import MPI

import cai_mpi

pytestmark = pytest.mark.mpi(min_size=2)

comm = MPI.COMM_WORLD
rank, size = comm.Get_rank(), comm.Get_size()
SIZES = [3, 100_000]  # in the slots, past them
ids = ["small", "large"]


def data(n: int, r: int) -> np.ndarray:
    return np.arange(n, dtype="<i8") + 1000 * r


@pytest.mark.parametrize("n", SIZES, ids=ids)
def test_bcast_and_scatter_results_come_from_the_root(n: int) -> None:
    root = size - 1
    got = cai_mpi.bcast_array(data(n, root) if rank == root else None, root=root)
    assert (got.source, got.tag) == (root, MPI.ANY_TAG) and np.array_equal(np.asarray(got), data(n, root))
    piece = cai_mpi.scatter_array([data(n, r) for r in range(size)] if rank == root else None, root=root)
    assert (piece.source, piece.tag) == (root, MPI.ANY_TAG) and np.array_equal(np.asarray(piece), data(n, rank))


@pytest.mark.parametrize("n", SIZES, ids=ids)
def test_gathered_pieces_come_from_their_rank(n: int) -> None:
    everyone = cai_mpi.allgather_array(data(n, rank))
    assert [(a.source, a.tag) for a in everyone] == [(r, MPI.ANY_TAG) for r in range(size)]
    assert all(np.array_equal(np.asarray(a), data(n, a.source)) for a in everyone)
    gathered = cai_mpi.gather_array(data(n, rank), root=0)
    if rank == 0:
        assert [(a.source, a.tag) for a in gathered] == [(r, MPI.ANY_TAG) for r in range(size)]
    swapped = cai_mpi.alltoall_array([data(n, rank) for _ in range(size)])
    assert [(a.source, a.tag) for a in swapped] == [(r, MPI.ANY_TAG) for r in range(size)]
    assert all(np.array_equal(np.asarray(a), data(n, a.source)) for a in swapped)


@pytest.mark.parametrize("n", SIZES, ids=ids)
def test_persistent_results_follow_the_one_shot_rule(n: int) -> None:
    root = size - 1
    buf = data(n, root) if rank == root else np.zeros(n, "<i8")
    with cai_mpi.bcast_init(buf, root=root) as b:
        got = b()
        assert (got.source, got.tag) == (root, MPI.ANY_TAG) and np.array_equal(np.asarray(got), data(n, root))
    with cai_mpi.allgather_init(data(n, rank)) as g:
        assert [(a.source, a.tag) for a in g()] == [(r, MPI.ANY_TAG) for r in range(size)]


@pytest.mark.parametrize("n", SIZES, ids=ids)
def test_a_persistent_reduction_s_result_comes_from_no_single_rank(n: int) -> None:
    expected = sum(data(n, r) for r in range(size))
    with cai_mpi.allreduce_init(data(n, rank)) as red:
        got = red()
        assert (got.source, got.tag) == (MPI.PROC_NULL, MPI.ANY_TAG) and np.array_equal(np.asarray(got), expected)
        assert "source=PROC_NULL, tag=ANY_TAG" in repr(got)
    root = size - 1
    with cai_mpi.reduce_init(data(n, rank), root=root) as red:
        got = red()
        if rank == root:
            assert (got.source, got.tag) == (MPI.PROC_NULL, MPI.ANY_TAG)
            assert np.array_equal(np.asarray(got), expected)
        else:
            assert got is None
