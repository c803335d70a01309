"""Interpreter exit with persistent collectives never closed (or started and never waited): their MPI requests
are freed (or kept) before MPI finalizes, so the job ends at once, without MPI's complaints about persistent
requests left to it, a traceback or a hang."""

from __future__ import annotations

import pytest
from launch import run_ranks

PROGRAM = r"""
import atexit
import sys


def check_freed():
    # Registered before cai_mpi is imported, this exit hook runs after cai_mpi's own, before MPI finalizes.
    from cai_mpi._src.api.lifecycle import open_collectives
    left = [p for p in open_collectives() if not repr(p).endswith(" closed>")]  # (repr ends with the state)
    print(f"rank {rank}: {len(left)} open at exit", flush=True)


atexit.register(check_freed)

import numpy as np
from mpi4py import MPI
import cai_mpi

rank = MPI.COMM_WORLD.Get_rank()
case = sys.argv[1]
x = np.full(4, float(rank))
red = cai_mpi.allreduce_init(x)
bc = cai_mpi.bcast_init(np.zeros(3))
ag = cai_mpi.allgather_init(x)
rd = cai_mpi.reduce_init(x, op="max")
bucket = cai_mpi.allreduce_init({"a": x, "b": np.ones(2, np.int32)})
for p in (red, bc, ag, rd, bucket):
    p()
if case == "started, never waited":
    red.start()
    bucket.start()
elif case == "dropped":
    del red, bc, ag, rd, bucket
MPI.COMM_WORLD.Barrier()
print(f"rank {rank}: exiting", flush=True)
"""

CASES = ["never closed", "started, never waited", "dropped"]


@pytest.mark.parametrize("nprocs", [2, 3])
@pytest.mark.parametrize("case", CASES)
def test_exit_with_persistent_collectives_open(case: str, nprocs: int) -> None:
    done = run_ranks(nprocs, ["-c", PROGRAM, case], timeout=60)
    assert done.returncode == 0 and done.seconds < 30, done.output
    assert all(f"rank {r}: exiting" in done.stdout for r in range(nprocs)), done.output
    assert "Traceback" not in done.stderr and "Exception ignored" not in done.stderr, done.output
    assert "persistent request" not in done.output, done.output  # MPICH: "freeing inactive persistent request"
    if case != "dropped":  # closed (or kept, when in flight) by cai_mpi's exit hook before MPI finalizes
        assert all(f"rank {r}: 0 open at exit" in done.stdout for r in range(nprocs)), done.output
