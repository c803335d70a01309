"""Wall and CPU time per call of the one-shot collectives at 8 B against the raw calls, on COMM_WORLD or COMM_SELF.

    mpiexec -n 2 python scripts/bench/oneshot_loop.py [world|self]

For each call: 200 warm-up calls, a Barrier, 2000 timed calls; the median of 5 repetitions of
(wall us, CPU us) per call, printed per rank as JSON. "Allgather1K raw" is the collective the fused path makes
(1 KiB slots, MPI.IN_PLACE, on a duplicate of the communicator).
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
    comm = MPI.COMM_SELF if sys.argv[1:] == ["self"] else MPI.COMM_WORLD
    dup = comm.Dup()
    x, out = np.ones(1), np.empty(1)
    slots = np.empty(1024 * comm.Get_size(), np.uint8)
    calls: dict[str, Callable[[], object]] = {
        "Allreduce raw": lambda: comm.Allreduce(x, out),
        "Allgather1K raw": lambda: dup.Allgather(MPI.IN_PLACE, [slots, 1024, MPI.BYTE]),
        "allreduce_array": lambda: cai_mpi.allreduce_array(x, "sum", comm),
        "allgather_array": lambda: cai_mpi.allgather_array(x, comm),
        "bcast_array": lambda: cai_mpi.bcast_array(x, 0, comm),
    }
    res = {}
    for name, call in calls.items():
        for _ in range(200):
            call()
        walls, cpus = [], []
        for _rep in range(5):
            comm.Barrier()
            t0, c0 = time.perf_counter(), time.process_time()
            for _ in range(2000):
                call()
            walls.append((time.perf_counter() - t0) / 2000 * 1e6)
            cpus.append((time.process_time() - c0) / 2000 * 1e6)
        res[name] = (round(statistics.median(walls), 1), round(statistics.median(cpus), 1))
    print(MPI.COMM_WORLD.Get_rank(), json.dumps(res), flush=True)


if __name__ == "__main__":
    main()
