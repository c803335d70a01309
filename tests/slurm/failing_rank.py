"""A job program whose rank 1 raises while every other rank waits for a message from it: the Slurm template runs
programs under ``python -m cai_mpi run``, so the job must end at once, with rank 1's traceback, not hang."""

from mpi4py import MPI

import cai_mpi

if MPI.COMM_WORLD.Get_rank() == 1:
    raise RuntimeError("rank 1 fails on purpose")
cai_mpi.recv_array(source=1)  # only the abort ends this wait
