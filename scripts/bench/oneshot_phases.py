"""CPU time of allreduce_array's phases on each rank, COMM_WORLD against COMM_SELF in the same job.

    mpiexec -n 2 python scripts/bench/oneshot_phases.py

Phases (thread CPU time, so a rank descheduled by a busy machine does not count it): the Python before the
exchange (setup, plan), the exchange (slot fill, the Allgather and its wait for the other ranks, slot read),
the Python after it (checks, combine, the result Array); and the wall time of the call. Medians of 2000 calls,
3 rounds.
"""

from __future__ import annotations

import time
from typing import Any

import numpy as np
from mpi4py import MPI

import cai_mpi
from cai_mpi._src.api import reductions

N = 2000
_marks = [0.0, 0.0]
_real = reductions.exchange


def _timed_exchange(*args: Any, **kwargs: Any) -> Any:
    _marks[0] = time.thread_time()
    ex = _real(*args, **kwargs)
    _marks[1] = time.thread_time()
    return ex


def _run(comm: MPI.Intracomm, x: np.ndarray[Any, Any]) -> Any:
    for _ in range(200):
        cai_mpi.allreduce_array(x, "sum", comm)
    MPI.COMM_WORLD.Barrier()
    rows = np.zeros((N, 4))
    for i in range(N):
        c0, w0 = time.thread_time(), time.perf_counter()
        cai_mpi.allreduce_array(x, "sum", comm)
        w3, c3 = time.perf_counter(), time.thread_time()
        rows[i] = (_marks[0] - c0, _marks[1] - _marks[0], c3 - _marks[1], w3 - w0)
    return np.median(rows, axis=0) * 1e6


def main() -> None:
    reductions.exchange = _timed_exchange  # type: ignore[assignment]
    x = np.ones(1)
    lines = []
    for _round in range(3):
        for label, comm in (("WORLD", MPI.COMM_WORLD), ("SELF", MPI.COMM_SELF)):
            m = _run(comm, x)
            lines.append(f"rank {MPI.COMM_WORLD.Get_rank()} {label:5s} CPU before {m[0]:5.1f} exchange {m[1]:5.1f} "
                         f"after {m[2]:5.1f} | wall {m[3]:5.1f}")
    print("\n".join(sorted(lines)), flush=True)


if __name__ == "__main__":
    main()
