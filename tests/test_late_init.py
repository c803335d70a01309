"""cai_mpi imported before MPI is initialized (``mpi4py.rc.initialize = False``, an application that initializes MPI
itself later): the import makes nothing, a call before ``MPI.Init`` says MPI is not initialized, and after it every
rank's calls work, on COMM_WORLD's private duplicates made then. Runs at 2 ranks, with this venv's MPI."""

from __future__ import annotations

from launch import run_ranks

PROGRAM = r"""
import mpi4py
mpi4py.rc.initialize = False
mpi4py.rc.finalize = False
from mpi4py import MPI
import numpy as np
import cai_mpi

assert not MPI.Is_initialized(), "importing cai_mpi initialized MPI"
try:
    cai_mpi.allreduce_array(np.ones(2))
except RuntimeError as exc:
    assert "not initialized" in str(exc), exc
else:
    raise AssertionError("a collective before MPI.Init() did not say MPI is not initialized")
MPI.Init()
rank, size = MPI.COMM_WORLD.Get_rank(), MPI.COMM_WORLD.Get_size()
total = cai_mpi.allreduce_array(np.arange(4.0) * (rank + 1))
assert np.array_equal(np.asarray(total), np.arange(4.0) * sum(range(1, size + 1))), total
pieces = cai_mpi.allgather_array(np.full(3, rank, np.int32))
assert [int(np.asarray(p)[0]) for p in pieces] == list(range(size)), pieces
if rank == 0:
    cai_mpi.send_array(np.arange(5), 1)
elif rank == 1:
    assert np.array_equal(np.asarray(cai_mpi.recv_array(0)), np.arange(5))
MPI.COMM_WORLD.Barrier()
MPI.Finalize()
print(f"rank {rank}: ok", flush=True)
"""


def test_cai_mpi_imported_before_mpi_init_works_once_the_program_initializes_it() -> None:
    done = run_ranks(2, ["-c", PROGRAM], timeout=120)
    assert done.returncode == 0, done.output
    assert done.stdout.count(": ok") == 2, done.output
