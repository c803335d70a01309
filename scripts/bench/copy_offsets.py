"""How fast MPI moves 1 MiB between two buffers, by where each starts in its 4 KiB page (benchmarks-history.md, "A
large call like the last keeps its agreed signature"): on the development machine a destination 16 bytes past its
source's offset copies several times slower.

    mpiexec -n 2 python scripts/bench/copy_offsets.py

mpi4py alone: rank 0 sends to rank 1 and back, 50 times per pairing, 7 rounds; prints on rank 0 the median time per
one-way message (us) for each (source offset, destination offset) in {0, 16, 32}.
"""

from __future__ import annotations

import statistics
import time

import numpy as np
from mpi4py import MPI

NBYTES = 1 << 20


def at(offset: int) -> np.ndarray:
    """NBYTES of memory starting ``offset`` bytes into a page."""
    raw = np.empty(NBYTES + 4096, np.uint8)
    skip = (offset - raw.ctypes.data) % 4096
    return raw[skip : skip + NBYTES]


def main() -> None:
    comm = MPI.COMM_WORLD
    rank = comm.Get_rank()
    times = {}
    for s in (0, 16, 32):
        for d in (0, 16, 32):
            src, dst = at(s), at(d)
            src[:] = 1
            rounds = []
            for _ in range(7):
                comm.Barrier()
                t0 = time.perf_counter()
                for _ in range(50):
                    if rank == 0:
                        comm.Send(src, 1, 0)
                        comm.Recv(dst, 1, 0)
                    else:
                        comm.Recv(dst, 0, 0)
                        comm.Send(src, 0, 0)
                rounds.append((time.perf_counter() - t0) / 100 * 1e6)
            times[f"source +{s}, destination +{d}"] = round(statistics.median(rounds), 1)
    if rank == 0:
        for name, us in times.items():
            print(f"{name}: {us} us")


if __name__ == "__main__":
    main()
