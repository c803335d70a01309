"""Python calls per 8 B point-to-point pair and per 8 B one-shot collective, counted with cProfile (deterministic
where CPU time is not).

    PYTHONPATH=TREE python scripts/bench/python_calls.py

One rank sends to itself: the nonblocking pair of a halo exchange (``irecv_array(out=)`` + ``isend_array`` +
``waitall``), the blocking pair (``send_array`` + ``recv_array``) and the same into ``out=``. Needs an MPI whose
blocking send to the same rank completes for a small message (Open MPI's wheel). Then the steady state of
``bcast_array``, ``allreduce_array``, ``allgather_array`` and ``allreduce_arrays`` of the bench's 16 arrays, on that
one rank. Compare trees A/B, each on PYTHONPATH, as scripts/bench/self_loop.py and
scripts/bench/collective_cpu_per_call.py do for CPU time.
"""

from __future__ import annotations

import cProfile
import io
import pstats

import numpy as np
from mpi4py import MPI

import cai_mpi
from cai_mpi import irecv_array, isend_array, recv_array, send_array, waitall
from cai_mpi._src.cli.bench.persistent import _arrays as bench_arrays

comm = MPI.COMM_WORLD
me = comm.Get_rank()
x, out = np.arange(1, dtype=np.float64), np.empty(1)


def nonblocking() -> None:
    waitall([irecv_array(me, 0, out=out), isend_array(x, me, 0)])


def blocking() -> None:
    send_array(x, me, 0)
    recv_array(me, 0)


def blocking_out() -> None:
    send_array(x, me, 0)
    recv_array(me, 0, out=out)


def bcast() -> None:
    cai_mpi.bcast_array(x, root=0)


def allreduce() -> None:
    cai_mpi.allreduce_array(x)


def allgather() -> None:
    cai_mpi.allgather_array(x)


arrays = bench_arrays(8, me)


def allreduce_arrays() -> None:
    cai_mpi.allreduce_arrays(arrays)


for pair in (nonblocking, blocking, blocking_out, bcast, allreduce, allgather, allreduce_arrays):
    for _ in range(50):
        pair()  # warm-up: caches filled
    profile = cProfile.Profile()
    profile.enable()
    for _ in range(1000):
        pair()
    profile.disable()
    calls = pstats.Stats(profile, stream=io.StringIO()).total_calls / 1000
    print(f"{pair.__name__:16s} {calls:.0f} Python calls per {'pair' if 'blocking' in pair.__name__ else 'call'}")
