"""A reduction's result comes from no single rank: its ``Array`` carries MPI's status of a message from no rank,
``source == MPI.PROC_NULL`` and ``tag == MPI.ANY_TAG`` (docs/collectives.md), on the root of ``reduce_array`` and
on every rank of ``allreduce_array``; the other ranks of ``reduce_array`` get None. A survivor of the mutation run
(a result naming rank 1 as its source passed every test, docs/testing.md). Passes at any world size >= 2."""

from __future__ import annotations

import numpy as np
import pytest
from mpi4py import MPI

import cai_mpi

pytestmark = pytest.mark.mpi(min_size=2)

comm = MPI.COMM_WORLD
rank, size = comm.Get_rank(), comm.Get_size()


def mine() -> np.ndarray:
    return np.arange(5, dtype="<i8") * (rank + 1)


def expected_sum() -> list[int]:
    return (np.arange(5, dtype="<i8") * sum(r + 1 for r in range(size))).tolist()


def test_an_allreduce_result_names_no_source_and_no_tag() -> None:
    got = cai_mpi.allreduce_array(mine())
    assert isinstance(got, cai_mpi.Array)
    assert np.asarray(got).tolist() == expected_sum()
    assert (got.source, got.tag) == (MPI.PROC_NULL, MPI.ANY_TAG)


@pytest.mark.parametrize("last", [False, True], ids=["root-0", "root-last"])
def test_a_reduce_result_names_no_source_and_no_tag_on_the_root(last: bool) -> None:
    root = size - 1 if last else 0
    got = cai_mpi.reduce_array(mine(), root=root)
    if rank != root:
        assert got is None
        return
    assert isinstance(got, cai_mpi.Array)
    assert np.asarray(got).tolist() == expected_sum()
    assert (got.source, got.tag) == (MPI.PROC_NULL, MPI.ANY_TAG)
