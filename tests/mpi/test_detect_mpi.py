"""agree() under mpiexec: one answer on every rank, and a disagreement makes every rank not-aware."""

from __future__ import annotations

import pytest
from mpi4py import MPI

from cai_mpi._src.transport.detect import CudaAwareness, agree, detect_local


def _same_everywhere(comm: MPI.Comm, result: CudaAwareness) -> list[tuple[bool, str]]:
    answers: list[tuple[bool, str]] = comm.allgather((result.aware, result.source))
    return answers


def _hand_built(aware: bool) -> CudaAwareness:
    return CudaAwareness(aware, "test", "hand-built", "made by the test")


@pytest.mark.mpi(min_size=2)
def test_agree_real_answer_is_the_same_on_all_ranks() -> None:
    comm = MPI.COMM_WORLD
    local = detect_local()
    result = agree(comm, local)
    answers = _same_everywhere(comm, result)
    assert answers == [answers[0]] * comm.Get_size()
    assert result == local  # every rank runs the same library here, so nobody disagrees


@pytest.mark.mpi(min_size=2)
@pytest.mark.parametrize("aware", [True, False])
def test_agree_unanimous_returns_local(aware: bool) -> None:
    local = _hand_built(aware)
    result = agree(MPI.COMM_WORLD, local)
    assert result is local


@pytest.mark.mpi(min_size=2)
def test_rank0_alone_aware_means_nobody_is() -> None:
    comm = MPI.COMM_WORLD
    size = comm.Get_size()
    result = agree(comm, _hand_built(comm.Get_rank() == 0))
    assert (result.aware, result.source) == (False, "disagreement")
    assert f"1 of {size} ranks" in result.detail
    assert _same_everywhere(comm, result) == [(False, "disagreement")] * size


@pytest.mark.mpi(min_size=2)
def test_rank0_alone_not_aware_means_nobody_is() -> None:
    comm = MPI.COMM_WORLD
    size = comm.Get_size()
    result = agree(comm, _hand_built(comm.Get_rank() != 0))
    assert (result.aware, result.source) == (False, "disagreement")
    assert f"{size - 1} of {size} ranks" in result.detail
    assert "CAI_MPI_CUDA_AWARE" in result.detail


@pytest.mark.mpi(min_size=3)
def test_agree_on_a_split_communicator() -> None:
    # Even ranks all say yes, odd ranks disagree among themselves only if there are two or more of them.
    world = MPI.COMM_WORLD
    rank = world.Get_rank()
    sub = world.Split(color=rank % 2, key=rank)
    try:
        aware = rank % 2 == 0 or sub.Get_rank() == 0
        result = agree(sub, _hand_built(aware))
        if rank % 2 == 0 or sub.Get_size() == 1:
            assert (result.aware, result.source) == (aware, "test")
        else:
            assert (result.aware, result.source) == (False, "disagreement")
            assert f"1 of {sub.Get_size()} ranks" in result.detail
    finally:
        sub.Free()
