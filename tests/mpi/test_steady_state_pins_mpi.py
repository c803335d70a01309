"""Behaviours of the collectives' steady state (a call posts its payload with the vote, shaped by the signature the
last call agreed on) that no other test pins (issue 42): each of these failed, by an assertion, on a mistake
planted in the code it pins. Every call that could hang on such a mistake has a ``timeout=`` well under the hang
watchdog. Passes at any world size >= 2."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
from mpi4py import MPI

import cai_mpi
from cai_mpi._src.api.validation import check_comm

pytestmark = pytest.mark.mpi(min_size=2)

world = MPI.COMM_WORLD
rank, size = world.Get_rank(), world.Get_size()
LAST = size - 1
WAIT = 30.0  # every call's timeout=: a planted mistake that would hang fails within it


def fresh() -> MPI.Intracomm:
    comm = world.Dup()
    cai_mpi.cuda_aware(comm)  # (cai_mpi's first use of a communicator is collective: done while everyone is here)
    return comm


def piece(shape: tuple[int, ...], r: int) -> np.ndarray[Any, Any]:
    return (np.arange(int(np.prod(shape)), dtype=np.float64) + 100 * r).reshape(shape)


# Many shapes: the fingerprint of a new shape falls above the agreed one's for some, below it for others, so a check
# of either side alone (the vote's MAX of ``own`` or of ``-own``) misses one rank's change for some of them.
SHAPES = [(k,) for k in range(1, 13)] + [(2, k) for k in range(1, 7)] + [(3, 2, 1), (1, 4), (4, 1), ()]


@pytest.mark.parametrize("fn", ["gather_array", "allgather_array"])
def test_one_rank_whose_next_contribution_changes_shape_is_noticed_whatever_the_hashes_order(fn: str) -> None:
    comm = fresh()
    usual = (5,)

    def gather(shape: tuple[int, ...]) -> list[Any] | None:
        x = piece(shape, rank)
        if fn == "gather_array":
            return cai_mpi.gather_array(x, root=0, comm=comm, timeout=WAIT)
        return cai_mpi.allgather_array(x, comm=comm, timeout=WAIT)

    for new in SHAPES:
        gather(usual)  # agreed: the next call posts its payload with the vote, shaped by this
        got = gather(new if rank == LAST else usual)
        if got is None:
            assert fn == "gather_array" and rank != 0
            continue
        for r, a in enumerate(got):
            shape = new if r == LAST else usual
            assert a.shape == shape and np.array_equal(a.numpy(), piece(shape, r)), (new, r, a.shape)
    comm.Free()


@pytest.mark.parametrize("bad", ["shape", "dtype", "not an array"])
def test_a_non_roots_bad_out_in_a_repeated_bcast_raises_on_that_rank(bad: str) -> None:
    comm = fresh()
    x = piece((2, 3), 0)
    for _ in range(3):  # the steady state
        got = cai_mpi.bcast_array(x if rank == 0 else None, root=0, comm=comm, out=np.empty((2, 3)) if rank else None,
                                  timeout=WAIT)
        assert np.array_equal(got.numpy(), x)
    out = {"shape": np.empty((3, 2)), "dtype": np.empty((2, 3), np.float32), "not an array": "out"}[bad]
    if rank == LAST:
        with pytest.raises((cai_mpi.RecvMismatchError, TypeError, ValueError)):
            cai_mpi.bcast_array(None, root=0, comm=comm, out=out, timeout=WAIT)
    else:
        got = cai_mpi.bcast_array(x if rank == 0 else None, root=0, comm=comm, timeout=WAIT)
        assert np.array_equal(got.numpy(), x)  # (the others complete normally)
    got = cai_mpi.bcast_array(x if rank == 0 else None, root=0, comm=comm, timeout=WAIT)
    assert np.array_equal(got.numpy(), x)
    comm.Free()


def test_a_scratch_buffer_one_element_too_small_is_an_internal_error_not_a_write_past_its_end() -> None:
    """A private seam: the remembered signature says one element fewer bytes than its count (a sizing mistake), and
    every rank's next call differs from it, so every rank posts scratch sized from it."""
    comm = fresh()
    cai_mpi.allreduce_array(np.ones(4), comm=comm, timeout=WAIT)
    check_comm("test", comm).agreed["allreduce_array"].nbytes -= 8
    with pytest.raises(AssertionError, match=r"internal error: a buffer of 24 bytes handed to MPI for 32 bytes"):
        cai_mpi.allreduce_array(np.ones(5), comm=comm, timeout=WAIT)
    comm.Free()


@pytest.mark.parametrize("warm", [False, True], ids=["first call", "steady state"])
def test_ranks_naming_different_roots_in_reduce_array_fail_within_the_timeout(warm: bool) -> None:
    comm = fresh()
    x = piece((4,), rank)
    for _ in range(2 if warm else 0):
        cai_mpi.reduce_array(x, root=0, comm=comm, timeout=WAIT)
    try:
        cai_mpi.reduce_array(x, root=0 if rank != LAST else LAST, comm=comm, timeout=WAIT)
        outcome: Any = "returned"
    except Exception as exc:  # (any other outcome fails below, by an assertion)
        outcome = exc
    assert isinstance(outcome, cai_mpi.CollectiveMismatchError), outcome
    assert "one op and root" in str(outcome) and f"root={LAST}" in str(outcome), outcome
    comm.Free()
