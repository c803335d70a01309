"""CPU time per call of each one-shot collective at 8 B (or NBYTES) on one rank, against raw mpi4py (issue 26), and
of ``allreduce_arrays`` of the bench's 16 arrays of 8 B against 16 raw ``Allreduce`` calls.

    python scripts/bench/collective_cpu_per_call.py [NBYTES]

(NBYTES over 64 KiB times the calls whose vote goes first, then their payload collective.)

Prints a JSON dict of microseconds: the best of 7 rounds of 5000 calls (500 from 8 KiB), timed with process_time
(CPU time of this process), which a busy shared machine disturbs less than wall-clock time. One rank: the figures
are the Python and MPI library work of a call, without waiting for other ranks.
"""

from __future__ import annotations

import json
import sys
import time
from collections.abc import Callable

import numpy as np
from mpi4py import MPI

import cai_mpi
from cai_mpi._src.cli.bench.persistent import _arrays as bench_arrays


def main() -> None:
    comm = MPI.COMM_WORLD
    count = max(int(sys.argv[1]) // 8, 1) if len(sys.argv) > 1 else 1
    x, out, gathered = np.ones(count), np.empty(count), np.empty(count * comm.Get_size())
    arrays = bench_arrays(8, comm.Get_rank())
    pairs = [(a, np.empty_like(a)) for a in arrays]
    calls: dict[str, Callable[[], object]] = {
        "Bcast (raw)": lambda: comm.Bcast(x, 0),
        "bcast_array": lambda: cai_mpi.bcast_array(x, 0, comm),
        "Allreduce (raw)": lambda: comm.Allreduce(x, out),
        "allreduce_array": lambda: cai_mpi.allreduce_array(x, "sum", comm),
        "Allgather (raw)": lambda: comm.Allgather(x, gathered),
        "allgather_array": lambda: cai_mpi.allgather_array(x, comm),
        "16 Allreduce (raw, the bench's allreduce-arrays at 8 B)": lambda: [comm.Allreduce(a, o) for a, o in pairs],
        "allreduce_arrays (of those 16)": lambda: cai_mpi.allreduce_arrays(arrays, "sum", comm),
    }
    n = 5000 if count < 1024 else 500
    best: dict[str, float] = {}
    for name, call in calls.items():
        for _ in range(200):
            call()
        for _round in range(7):
            t0 = time.process_time()
            for _ in range(n):
                call()
            best[name] = min(best.get(name, 1e9), (time.process_time() - t0) / n * 1e6)
    print(json.dumps({k: round(v, 2) for k, v in best.items()}))


if __name__ == "__main__":
    main()
