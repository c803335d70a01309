"""What an agreement slot may cost: raw mpi4py ``Allgather`` and ``Bcast`` of SIZE bytes per rank, for the sizes a
slot of the one-shot collectives could have (issue 26). The slot is chosen as the largest size whose collective
costs about what the smallest one does, since every call pays it.

    mpiexec -n 2 python scripts/bench/collective_slot_size.py [SIZES]

Prints, per collective and size, the best and the median of 5 rounds of 2000 calls (microseconds per call).
"""

from __future__ import annotations

import statistics
import sys
import time

import numpy as np
from mpi4py import MPI


def main() -> None:
    comm = MPI.COMM_WORLD.Dup()
    size = comm.Get_size()
    sizes = [int(s) for s in sys.argv[1].split(",")] if len(sys.argv) > 1 else [256, 512, 1024, 2048, 4096, 8192]
    figures: dict[tuple[str, int], list[float]] = {}
    for _round in range(5):
        for nbytes in sizes:
            mine, every = np.zeros(nbytes, np.uint8), np.empty(nbytes * size, np.uint8)
            for name in ("Allgather", "Bcast"):
                args = (mine, every) if name == "Allgather" else (mine,)
                call = getattr(comm, name)
                for _ in range(50):
                    call(*args)
                comm.Barrier()
                t0 = time.perf_counter()
                for _ in range(2000):
                    call(*args)
                comm.Barrier()
                figures.setdefault((name, nbytes), []).append((time.perf_counter() - t0) / 2000 * 1e6)
    if comm.Get_rank() == 0:
        print(f"# {size} ranks, {MPI.Get_library_version().splitlines()[0]}")
        print("# collective  bytes/rank   best us  median us")
        for (name, nbytes), us in figures.items():
            print(f"{name:<12} {nbytes:>10} {min(us):>9.2f} {statistics.median(us):>10.2f}")


if __name__ == "__main__":
    main()
