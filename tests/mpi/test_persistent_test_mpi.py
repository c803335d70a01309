"""``test()`` on persistent collectives (issue 34): ``(False, None)`` while the use cannot have completed, then
``(True, result)`` with what ``wait()`` would return, and the use is over (the next ``start()`` is allowed), as
mpi4py's lowercase ``Request.test``. No timing: the rank that tests first (rank 0) is one whose use needs the other
ranks' data, and they start their use only after it tested (a barrier on COMM_WORLD orders it). Passes at any
world size >= 2."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
from mpi4py import MPI

import cai_mpi

pytestmark = pytest.mark.mpi(min_size=2)

world = MPI.COMM_WORLD
rank, size = world.Get_rank(), world.Get_size()
N = 5
KINDS = ["allreduce_init", "allreduce_init-list", "allgather_init", "reduce_init", "bcast_init"]


def mine(r: int = rank, step: int = 0) -> np.ndarray:
    return np.arange(N, dtype="<i8") * (r + 1) + step


def summed(step: int) -> list[int]:
    return [int(v) for v in sum(mine(r, step) for r in range(size))]


def create(kind: str, x: np.ndarray, y: np.ndarray) -> Any:
    if kind == "allreduce_init":
        return cai_mpi.allreduce_init(x)
    if kind == "allreduce_init-list":
        return cai_mpi.allreduce_init([x, y])  # bucketed: one bucket per dtype
    if kind == "allgather_init":
        return cai_mpi.allgather_init(x)
    if kind == "reduce_init":
        return cai_mpi.reduce_init(x, root=0)
    return cai_mpi.bcast_init(x, root=size - 1)  # the root is the last rank: rank 0 needs its data


def expected(kind: str, step: int) -> Any:
    """What a use returns on this rank, as plain lists (None where it returns None)."""
    if kind == "allgather_init":
        return [mine(r, step).tolist() for r in range(size)]
    if kind == "bcast_init":
        return mine(size - 1, step).tolist()
    if kind == "reduce_init" and rank != 0:
        return None
    if kind == "allreduce_init-list":
        return [summed(step), [float(v) for v in summed(step)]]
    return summed(step)


def plain(got: Any) -> Any:
    if got is None:
        return None
    if isinstance(got, list):
        return [np.asarray(a).tolist() for a in got]
    return np.asarray(got).tolist()


def until_done(obj: Any) -> Any:
    while True:
        flag, result = obj.test()
        if flag:
            return result
        assert result is None


def use(obj: Any) -> Any:
    """One use: rank 0 tests once before the others start, then every rank tests until its use is done."""
    if rank == 0:
        obj.start()
        assert obj.test() == (False, None)
        world.Barrier()
    else:
        world.Barrier()
        obj.start()
    return until_done(obj)


@pytest.mark.parametrize("kind", KINDS)
def test_test_reports_progress_then_the_result(kind: str) -> None:
    x, y = mine(), mine().astype("<f4")
    with create(kind, x, y) as obj:
        for step in range(3):  # a use finished by test() leaves the object ready for the next start()
            x[:] = mine(rank, step)
            y[:] = x
            assert plain(use(obj)) == expected(kind, step)
        assert plain(obj()) == expected(kind, 2)  # and a call, as before


def test_test_without_start_or_after_close_is_an_error() -> None:
    red = cai_mpi.allreduce_init(mine())
    with pytest.raises(ValueError, match=r"allreduce_init: test\(\) without start\(\)"):
        red.test()
    red.start()
    assert plain(until_done(red)) == summed(0)
    with pytest.raises(ValueError, match=r"test\(\) without start\(\)"):  # the use is over
        red.test()
    red.close()
    with pytest.raises(ValueError, match=r"test\(\) on a closed"):
        red.test()
