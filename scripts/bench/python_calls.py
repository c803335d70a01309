"""Python calls per 8 B point-to-point pair, counted with cProfile (deterministic where CPU time is not).

    PYTHONPATH=TREE python scripts/bench/python_calls.py

One rank sends to itself: the nonblocking pair of a halo exchange (``irecv_array(out=)`` + ``isend_array`` +
``waitall``), the blocking pair (``send_array`` + ``recv_array``) and the same into ``out=``. Needs an MPI whose
blocking send to the same rank completes for a small message (Open MPI's wheel). Compare trees A/B, each on
PYTHONPATH, as scripts/bench/self_loop.py does for CPU time.
"""

from __future__ import annotations

import cProfile
import io
import pstats

import numpy as np
from mpi4py import MPI

from cai_mpi import irecv_array, isend_array, recv_array, send_array, waitall

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


for pair in (nonblocking, blocking, blocking_out):
    for _ in range(50):
        pair()  # warm-up: caches filled
    profile = cProfile.Profile()
    profile.enable()
    for _ in range(1000):
        pair()
    profile.disable()
    calls = pstats.Stats(profile, stream=io.StringIO()).total_calls / 1000
    print(f"{pair.__name__:13s} {calls:.0f} Python calls per pair")
