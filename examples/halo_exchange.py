"""Neighbour exchange on a ring: every rank posts irecv_array, then sends, then waits: no deadlock.

Run:  mpiexec -n 3 python examples/halo_exchange.py
"""

from __future__ import annotations

import sys

import numpy as np
from mpi4py import MPI

import cai_mpi


def main() -> int:
    comm = MPI.COMM_WORLD
    rank, size = comm.Get_rank(), comm.Get_size()
    left, right = (rank - 1) % size, (rank + 1) % size
    field = np.full((512, 512), float(rank))
    # Post both receives first, then send the two edge columns (strided views: no copy needed).
    from_left = cai_mpi.irecv_array(left, tag=1)
    from_right = cai_mpi.irecv_array(right, tag=2)
    cai_mpi.send_array(field[:, -1], right, tag=1)
    cai_mpi.send_array(field[:, 0], left, tag=2)
    halo_left, halo_right = from_left.wait(), from_right.wait()
    ok = (np.asarray(halo_left) == left).all() and (np.asarray(halo_right) == right).all()
    print(f"rank {rank}: halos from {halo_left.source} and {halo_right.source}: {'ok' if ok else 'WRONG'}")
    return 0 if comm.allreduce(int(not ok)) == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
