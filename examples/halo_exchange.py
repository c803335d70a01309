"""Neighbour exchange on a ring with sendrecv_array: each rank sends its edge columns and receives its
neighbours', no shapes exchanged, no deadlock.

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
    # The edge columns are strided views: they travel without a copy. Each call sends one way and
    # receives the other at once, so no ordering of the ranks is needed.
    halo_left = cai_mpi.sendrecv_array(field[:, -1], dest=right, source=left, sendtag=1, recvtag=1)
    halo_right = cai_mpi.sendrecv_array(field[:, 0], dest=left, source=right, sendtag=2, recvtag=2)
    ok = bool((np.asarray(halo_left) == left).all() and (np.asarray(halo_right) == right).all())
    print(f"rank {rank}: halos from {halo_left.source} and {halo_right.source}: {'ok' if ok else 'WRONG'}")
    return 0 if comm.allreduce(int(not ok)) == 0 else 1


if __name__ == "__main__":
    cai_mpi.abort_on_error()  # an exception on one rank ends the job, with its traceback, instead of a hang
    sys.exit(main())
