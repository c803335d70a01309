"""A persistent collective's ``wait()`` keeps the other cai_mpi transfers of its rank moving (the progress rule):
rank 0 waits for the collective while its own ``irecv_array`` still needs the library to post its payload receive,
and rank 1 joins the collective only once its large ``send_array`` to rank 0 is received. A wait that blocked in
MPI without driving the receive would leave both ranks waiting for each other: the job would not end. Runs as its
own job, with this venv's MPI, at 2 ranks."""

from __future__ import annotations

from launch import run_ranks

PROGRAM = r"""
import numpy as np
from mpi4py import MPI
import cai_mpi

world = MPI.COMM_WORLD
rank = world.Get_rank()
big = np.arange(1 << 18, dtype=np.float64)  # 2 MiB: MPI waits for the payload's receive before the send returns
coll = cai_mpi.allreduce_init(np.ones(4))
if rank == 0:
    pending = cai_mpi.irecv_array(1, 5)  # (its payload receive is posted by whichever cai_mpi wait drives it)
    coll.start()
    total = coll.wait()
    got = pending.wait()
    assert np.array_equal(got.numpy(), big), "the message arrived changed"
else:
    cai_mpi.send_array(big, 0, 5)
    coll.start()
    total = coll.wait()
assert np.array_equal(np.asarray(total), np.full(4, 2.0)), total
coll.close()
print(f"rank {rank}: done", flush=True)
"""


def test_a_persistent_wait_drives_the_ranks_other_transfers() -> None:
    done = run_ranks(2, ["-c", PROGRAM], timeout=120)  # (a deadlock never ends: the limit only has to end it)
    assert done.returncode == 0, done.output
    assert all(f"rank {r}: done" in done.stdout for r in range(2)), done.output
