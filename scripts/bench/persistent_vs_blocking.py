"""One collective four ways, interleaved in one job (issue 26): MPI's blocking collective, mpi4py's MPI-4
persistent form on COMM_WORLD and on a duplicate of it, and cai_mpi's persistent object (``allreduce_init``,
``allgather_init`` or ``bcast_init``). Shows whether a gap between cai_mpi's persistent form and the blocking
collective is cai_mpi's or MPI's own.

    mpiexec -n 2 python scripts/bench/persistent_vs_blocking.py NBYTES allreduce|allgather|bcast [ITERATIONS]

Open MPI's persistent collectives are its ``coll/libnbc`` schedules: ``--mca coll_libnbc_iallreduce_algorithm N``
(or ``..._iallgather_...``) on the mpiexec line chooses their algorithm (docs/benchmarks.md).
"""

from __future__ import annotations

import sys
import time
from collections.abc import Callable

import numpy as np
from mpi4py import MPI

import cai_mpi


def main() -> None:
    comm = MPI.COMM_WORLD
    me = comm.Get_rank()
    nbytes = int(sys.argv[1]) if len(sys.argv) > 1 else 1 << 20
    kind = sys.argv[2] if len(sys.argv) > 2 else "allreduce"
    iters = int(sys.argv[3]) if len(sys.argv) > 3 else 300
    dup = comm.Dup()
    x = np.full(max(nbytes // 8, 1), me + 1.0)
    out, gathered = np.empty_like(x), np.empty(comm.Get_size() * x.size)
    if kind == "allreduce":
        reqs = [c.Allreduce_init(x, out, MPI.SUM) for c in (comm, dup)]
        blocking: Callable[[], None] = lambda: comm.Allreduce(x, out, MPI.SUM)  # noqa: E731
        ours = cai_mpi.allreduce_init(x, comm=comm, out=out)
    elif kind == "allgather":
        reqs = [c.Allgather_init(x, gathered) for c in (comm, dup)]
        blocking = lambda: comm.Allgather(x, gathered)  # noqa: E731
        ours = cai_mpi.allgather_init(x, comm)
    else:
        reqs = [c.Bcast_init(x, 0) for c in (comm, dup)]
        blocking = lambda: comm.Bcast(x, 0)  # noqa: E731
        ours = cai_mpi.bcast_init(x, 0, comm)

    def persistent(req: MPI.Prequest) -> Callable[[], None]:
        def run() -> None:
            req.Start()
            req.Wait()
        return run

    modes = {"blocking": blocking, "mpi4py *_init": persistent(reqs[0]), "mpi4py *_init, dup": persistent(reqs[1]),
             "cai_mpi *_init": ours}
    times: dict[str, list[float]] = {name: [] for name in modes}
    for run in modes.values():
        for _ in range(20):
            run()
    for _ in range(9):
        for name, run in modes.items():
            comm.Barrier()
            t0 = time.perf_counter()
            for _ in range(iters):
                run()
            comm.Barrier()
            times[name].append((time.perf_counter() - t0) / iters * 1e6)
    ours.close()
    for req in reqs:
        req.Free()
    if me == 0:
        base = float(np.median(times["blocking"]))
        library = MPI.Get_library_version().splitlines()[0].strip(chr(0))[:60]
        print(f"# {kind} of {nbytes} bytes, {comm.Get_size()} ranks, {library}")
        for name, values in times.items():
            print(f"{name:20s} {np.median(values):9.1f} us   {np.median(values) / base:5.2f}x blocking")


if __name__ == "__main__":
    main()
