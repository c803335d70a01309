"""``timeout=`` bounds every wait of a collective call, also past its vote (issue 42): rank 0 calls with a short
timeout and gives up; the other ranks come late, with a timeout of their own, and find rank 0's stale vote, which
matches theirs. They must not wait for ever for the payload collective rank 0 never makes: each raises
``TimeoutError`` within its timeout, or, where every MPI call it made matched one rank 0 had posted before giving
up (the steady state of a small payload, which goes with the vote), returns exactly the right result. Every call at
8 B, 64 KiB + 1 and 1 MiB, as the first call of its kind and after matching calls. Each late call runs in a thread
so that one that hangs (before the fix: a blocking payload collective) fails the test by an assertion. Passes at
any world size >= 2."""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any

import numpy as np
import pytest
from mpi4py import MPI

import cai_mpi

pytestmark = pytest.mark.mpi(min_size=2)


@pytest.fixture(autouse=True)
def out_of_step_collectives_kept_apart() -> Any:
    """What each test leaves behind: collectives a timeout abandoned on communicators now out of step, which no rank
    will ever match (MPI cannot withdraw a collective). The library keeps them, with their memory, and polls them in
    every later wait; the tests after these, which count what is pending, start with nothing pending: the leftovers
    are kept to the end of the process instead, as at interpreter exit."""
    from cai_mpi._src.progress.driving import PENDING
    from cai_mpi._src.progress.requests import keep_past_exit

    before = set(PENDING)
    yield
    for req in [r for r in list(PENDING) if r not in before]:
        keep_past_exit(req)  # type: ignore[arg-type]
        PENDING.discard(req)

world = MPI.COMM_WORLD
rank, size = world.Get_rank(), world.Get_size()
SIZES = [8, 64 * 1024 + 1, 1 << 20]  # bytes: speculated with the vote, just past that, voted first
EARLY, LATE = 0.2, 0.5  # rank 0's timeout, the late ranks' (each late by all of rank 0's calls at least)
HANG = 15.0  # past this a late call counts as hung (its timeout is LATE)


def data(nbytes: int, r: int) -> np.ndarray[Any, Any]:
    """Bytes whose sum over up to 8 ranks does not wrap (Open MPI's vectorized uint8 sums saturate instead)."""
    return ((np.arange(nbytes) * (r + 1) + r) % 31).astype(np.uint8)


def total(nbytes: int) -> np.ndarray[Any, Any]:
    return sum((data(nbytes, r) for r in range(size)), np.zeros(nbytes, np.uint8))


# name -> (the call on a communicator with a timeout, what it returns when it completes, as lists of bytes)
Call = Callable[[MPI.Intracomm, int, float | None], Any]
CALLS: dict[str, tuple[Call, Callable[[int], Any]]] = {
    "allreduce_array": (lambda c, n, t: cai_mpi.allreduce_array(data(n, rank), comm=c, timeout=t),
                        lambda n: total(n)),
    "reduce_array": (lambda c, n, t: cai_mpi.reduce_array(data(n, rank), root=0, comm=c, timeout=t),
                     lambda n: total(n) if rank == 0 else None),
    "bcast_array": (lambda c, n, t: cai_mpi.bcast_array(data(n, 0) if rank == 0 else None, root=0, comm=c,
                                                        timeout=t),
                    lambda n: data(n, 0)),
    "gather_array": (lambda c, n, t: cai_mpi.gather_array(data(n, rank), root=0, comm=c, timeout=t),
                     lambda n: [data(n, r) for r in range(size)] if rank == 0 else None),
    "allgather_array": (lambda c, n, t: cai_mpi.allgather_array(data(n, rank), comm=c, timeout=t),
                        lambda n: [data(n, r) for r in range(size)]),
    "allreduce_arrays": (lambda c, n, t: cai_mpi.allreduce_arrays([data(n, rank), data(8, rank)], comm=c,
                                                                  timeout=t),
                         lambda n: [total(n), total(8)]),
    "scatter_array": (lambda c, n, t: cai_mpi.scatter_array([data(n, 0)] * size if rank == 0 else None, root=0,
                                                            comm=c, timeout=t),
                      lambda n: data(n, 0)),
    "alltoall_array": (lambda c, n, t: cai_mpi.alltoall_array([data(n, rank)] * size, comm=c, timeout=t),
                       lambda n: [data(n, r) for r in range(size)]),
}


def as_bytes(got: Any) -> Any:
    if got is None:
        return None
    if isinstance(got, list):
        return [np.asarray(a).tobytes() for a in got]
    return np.asarray(got).tobytes()


def bounded(call: Callable[[], Any], limit: float) -> tuple[str, Any]:
    """``call()`` in a thread: ``("returned", value)`` or ``("raised", exception)``; a call still running after
    ``limit`` seconds fails the test here (it would hang the run)."""
    outcome: list[tuple[str, Any]] = []

    def run() -> None:
        try:
            outcome.append(("returned", call()))
        except BaseException as exc:  # (handed to the test thread)
            outcome.append(("raised", exc))

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    thread.join(limit)
    assert not thread.is_alive(), f"rank {rank}: the call did not return within {limit} s (hung past its timeout)"
    return outcome[0]


@pytest.mark.parametrize("name", list(CALLS))
def test_a_rank_late_to_a_collective_that_timed_out_elsewhere_times_out_too(name: str) -> None:
    if MPI.Query_thread() < MPI.THREAD_SERIALIZED:
        pytest.skip("the late calls run in a thread: needs MPI_THREAD_SERIALIZED")
    call, expected = CALLS[name]
    cases = [(n, warm) for n in SIZES for warm in (False, True)]
    comms = [world.Dup() for _ in cases]  # one per case: a timed-out call leaves its own out of step
    for c, (n, warm) in zip(comms, cases, strict=True):
        cai_mpi.cuda_aware(c)  # (cai_mpi's first use of a communicator is collective: done while everyone is here)
        for _ in range(2 if warm else 0):  # matching calls first: the steady state
            assert as_bytes(call(c, n, None)) == as_bytes(expected(n))
    if rank == 0:
        for c, (n, warm) in zip(comms, cases, strict=True):
            how, got = bounded(lambda c=c, n=n: call(c, n, EARLY), HANG)
            assert how == "raised" and isinstance(got, cai_mpi.TimeoutError), (name, n, warm, how, got)
    world.Barrier()  # (rank 0 has given up on every case: the others come late to all of them)
    if rank != 0:
        for c, (n, warm) in zip(comms, cases, strict=True):
            how, got = bounded(lambda c=c, n=n: call(c, n, LATE), HANG)
            if how == "raised":
                assert isinstance(got, cai_mpi.TimeoutError), (name, n, warm, got)
            else:  # (every MPI call it made matched one rank 0 had posted: rank 0's data, exactly)
                assert as_bytes(got) == as_bytes(expected(n)), (name, n, warm)
    world.Barrier()
    for c in comms:
        c.Free()
