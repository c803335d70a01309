"""The floor of ``bcast_array``'s design above the slot, side by side with the call itself (issue 42).

    mpiexec -n 2 python scripts/bench/bcast_floor.py [NBYTES] [ROUNDS] [CALLS]

Interleaves, round after round: MPI's ``Bcast`` on ``COMM_WORLD`` (raw), the same on a duplicate communicator, the
vote's ``Allreduce(MAX)`` of six int64 followed by the ``Bcast`` (the MPI calls of ``bcast_array`` past
``SPECULATE_BYTES``, in mpi4py alone: that design's floor), the vote's ``Iallreduce`` and an ``Ibcast`` posted
together and completed by one ``Waitall`` (the steady state's calls up to ``SPECULATE_BYTES``), and ``bcast_array``
without ``out=``. Prints on rank 0 each mode's median time
per call (us) and its time relative to raw, as JSON. Defaults: 1 MiB, 7 rounds of 200 calls.
"""

from __future__ import annotations

import json
import statistics
import sys
import time
from collections.abc import Callable

import numpy as np
from mpi4py import MPI

import cai_mpi


def main() -> None:
    given = [int(a) for a in sys.argv[1:4]]
    nbytes, rounds, calls = given + [1 << 20, 7, 200][len(given) :]
    comm = MPI.COMM_WORLD
    rank = comm.Get_rank()
    dup = comm.Dup()
    src = np.arange(nbytes, dtype=np.uint8)
    buf = np.empty(nbytes, np.uint8)
    votes = np.zeros(6, np.int64)
    mine = src if rank == 0 else buf

    def vote_then_bcast() -> None:
        dup.Allreduce(MPI.IN_PLACE, votes, MPI.MAX)
        dup.Bcast(mine, root=0)

    def vote_with_ibcast() -> None:
        MPI.Request.Waitall([dup.Ibcast(mine, root=0), dup.Iallreduce(MPI.IN_PLACE, votes, MPI.MAX)])

    modes: dict[str, Callable[[], object]] = {
        "raw": lambda: comm.Bcast(mine, root=0),
        "raw on a duplicate": lambda: dup.Bcast(mine, root=0),
        "vote + Bcast": vote_then_bcast,
        "vote with Ibcast": vote_with_ibcast,
        "bcast_array": lambda: cai_mpi.bcast_array(src if rank == 0 else None, root=0),
    }
    times: dict[str, list[float]] = {name: [] for name in modes}
    for call in modes.values():
        for _ in range(20):
            call()  # warm-up: pools and caches filled
    for _ in range(rounds):
        for name, call in modes.items():
            comm.Barrier()
            start = time.perf_counter()
            for _ in range(calls):
                call()
            times[name].append((time.perf_counter() - start) / calls * 1e6)
    if rank == 0:
        median = {name: statistics.median(t) for name, t in times.items()}
        print(json.dumps({"nbytes": nbytes, "rounds": rounds, "calls": calls, "us": median,
                          "x raw": {name: m / median["raw"] for name, m in median.items()}}, indent=1))
    dup.Free()


if __name__ == "__main__":
    main()
