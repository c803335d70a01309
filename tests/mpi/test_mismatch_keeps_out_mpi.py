"""On an error, ``out=`` keeps what it held (issue 42). In the steady state a collective posts its payload with the
vote, shaped by the signature the last call agreed on; a rank whose call is another posts scratch. A rank whose
call did match must not find, once every rank raises ``CollectiveMismatchError``, its ``out=`` holding a result
made with that scratch: host and (simulated) device ``out=``, for ``allreduce_array``, ``reduce_array``'s root
and ``bcast_array``'s non-roots. Passes at any world size >= 2."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

import numpy as np
import pytest
from mpi4py import MPI

import cai_mpi
from cai_mpi.testing import FakeCudaArray, SimulatedRuntime, use_runtime

pytestmark = pytest.mark.mpi(min_size=2)

world = MPI.COMM_WORLD
rank, size = world.Get_rank(), world.Get_size()
LAST = size - 1
HELD = -7.0  # what out= holds before the failing call
LIMIT = 15.0  # s: a call that agreement mistakes leave waiting raises TimeoutError, well before the 50 s watchdog


def data(r: int) -> np.ndarray[Any, Any]:
    return np.arange(6.0) + 10 * r


@pytest.fixture(params=["host", "device"])
def where(request: pytest.FixtureRequest) -> Iterator[str]:
    if request.param == "host":
        yield "host"
        return
    with use_runtime(SimulatedRuntime()):
        yield "device"


def make_out(where: str) -> tuple[Any, np.ndarray[Any, Any]]:
    """``out=`` (host memory, or a simulated device array) and a numpy view of what it holds."""
    held = np.full(6, HELD)
    if where == "host":
        return held, held
    dev = FakeCudaArray(held, device=True)
    return dev, dev.host


def src(where: str, r: int) -> Any:
    return data(r) if where == "host" else FakeCudaArray(data(r), device=True)


# name -> (the matching call, with out= on the ranks that get a result; the failing call, on the rank that does
# not match; what the matching call gives on this rank; does this rank pass out=)
Case = tuple[Callable[[MPI.Intracomm, Any, str], Any], Callable[[MPI.Intracomm, str], Any], Any, bool]


def cases() -> dict[str, Case]:
    total = sum(data(r) for r in range(size))
    t = LIMIT
    return {
        "allreduce_array": (lambda c, out, w: cai_mpi.allreduce_array(src(w, rank), comm=c, out=out, timeout=t),
                            lambda c, w: cai_mpi.allreduce_array(src(w, rank), "max", comm=c, timeout=t),
                            total, True),
        "reduce_array": (lambda c, out, w: cai_mpi.reduce_array(src(w, rank), root=0, comm=c,
                                                                out=out if rank == 0 else None, timeout=t),
                         lambda c, w: cai_mpi.reduce_array(src(w, rank), "max", root=0, comm=c, timeout=t),
                         total, rank == 0),
        "bcast_array": (lambda c, out, w: cai_mpi.bcast_array(src(w, 0) if rank == 0 else None, root=0, comm=c,
                                                              out=out if rank != 0 else None, timeout=t),
                        lambda c, w: cai_mpi.bcast_array(None, root=LAST, comm=c, timeout=t), data(0), rank != 0),
    }


@pytest.mark.parametrize("name", ["allreduce_array", "reduce_array", "bcast_array"])
def test_a_matching_rank_keeps_its_out_when_another_rank_does_not_match(name: str, where: str,
                                                                       comm: MPI.Intracomm) -> None:
    matching, failing, expected, has_out = cases()[name]
    fails_here = rank == (0 if name == "bcast_array" else LAST)  # (bcast: the root names another root)
    cai_mpi.cuda_aware(comm)  # (cai_mpi's first use of a communicator is collective: done while everyone is here)
    out, held = make_out(where)
    for _ in range(2):  # the steady state: the next call's payload goes with its vote
        got = matching(comm, out, where)
        if has_out:
            assert np.array_equal(held, expected)
            assert np.array_equal(got.numpy(), expected)
    held[...] = HELD
    with pytest.raises(cai_mpi.CollectiveMismatchError):
        failing(comm, where) if fails_here else matching(comm, out, where)
    if has_out and not fails_here:
        assert np.array_equal(held, np.full(6, HELD)), f"rank {rank}: out= was written: {held.tolist()}"
    got = matching(comm, out, where)  # (the communicator works afterwards, out= too)
    if has_out:
        assert np.array_equal(held, expected) and np.array_equal(got.numpy(), expected)
