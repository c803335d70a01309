"""What a staged 4 KiB device message costs in CUDA driver calls between two ranks, counted as a user writes the pair:
the user's context current, ``send_array(x, dest)`` on one rank and ``recv_array(source)`` (no ``device=``) on the
other, each rank counting its own driver double's calls for its half (the receiver's includes the release of the
Array its previous receive returned, which the new one replaces). docs/benchmarks.md ("Driver calls per device
message") has the table; the one-rank counts per route and layout are in tests/unit/runtime/test_driver_call_budget.py.
Both take the double and the user's context from tests/driver_counting.py (eager: the counts do not depend on timing),
with the library's default settings, as a user has them.
"""

from __future__ import annotations

import collections
from collections.abc import Iterator
from typing import Any

import numpy as np
import pytest
from driver_counting import user_context_on_double
from mpi4py import MPI

import cai_mpi
from cai_mpi.testing import CudaDriverDouble, DoubleDeviceArray

pytestmark = pytest.mark.mpi(min_size=2)

world = MPI.COMM_WORLD
rank, size = world.Get_rank(), world.Get_size()
N = 512  # float64: 4 KiB
#: Issue 44's budget: the driver calls of one staged pair, sender's and receiver's together.
PAIR_BUDGET = 16
ROUNDS = 4  # three to warm every cache and pool, the last one counted


@pytest.fixture
def staged(routed_dup: Any) -> Iterator[tuple[Any, CudaDriverDouble, MPI.Comm]]:
    """The runtime on a counting double, the user's context current, and a communicator that stages device data."""
    comm = routed_dup(False)
    try:
        with user_context_on_double() as (rt, d):
            yield rt, d, comm
    finally:
        comm.Barrier()
        comm.Free()


def test_a_staged_pair_between_two_ranks_stays_within_its_driver_call_budget(
    staged: tuple[Any, CudaDriverDouble, MPI.Comm],
) -> None:
    rt, d, comm = staged
    pairs = size - size % 2  # ranks 2k and 2k + 1 pair up; an odd last rank only counts nothing
    role = "idle" if rank >= pairs else ("sender" if rank % 2 == 0 else "receiver")
    sent = np.arange(N, dtype=np.float64) + rank
    x = DoubleDeviceArray(rt, sent, stream=1)
    got: Any = None
    calls: collections.Counter[str] = collections.Counter()
    for _ in range(ROUNDS):
        d.calls.clear()
        if role == "sender":
            cai_mpi.send_array(x, rank + 1, 5, comm)
        elif role == "receiver":
            got = cai_mpi.recv_array(rank - 1, 5, comm)  # the previous Array dies here, as in a user's loop
        calls = collections.Counter(call for call, _ctx in d.calls)
        if role == "receiver":
            assert got.device == 0 and np.array_equal(got.to_host(), np.arange(N, dtype=np.float64) + rank - 1)
    spent = sum(calls.values())
    counts = comm.allgather(spent)
    found = comm.allgather(dict(calls))
    for sender in range(0, pairs, 2):
        assert counts[sender] + counts[sender + 1] <= PAIR_BUDGET, (found[sender], found[sender + 1])
