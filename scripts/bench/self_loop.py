"""CPU time of cai_mpi's per-message Python path, in one process, without a peer to wait for.

    PYTHONPATH=TREE python scripts/bench/self_loop.py NAME [REPS]

One rank sends 8-byte float64 arrays to itself and receives them (``send_array`` + ``recv_array``, then the same
into ``out=``), 20,000 pairs per repetition, against raw ``Comm.Send`` + ``Comm.Recv``; and the nonblocking pair of a
halo exchange, ``irecv_array(out=)`` + ``isend_array`` + ``waitall`` ("cai-nb"), against raw ``Irecv`` + ``Isend`` +
``Waitall`` ("raw-nb"); and ``irecv_array`` (without and with ``out=``) + ``send_array`` + ``wait``
("cai-irecv", "cai-out-irecv"). Each figure is the thread's
CPU time per pair (``time.thread_time``), the least over REPS repetitions: on a loaded machine, CPU time is not
inflated by the time the process waits for a core, and there is no peer whose delays would be counted. Needs an MPI
whose blocking send to the same rank completes for a small message (Open MPI's wheel; MPICH's waits for the
receive). Alternate the source trees (each revision's ``git archive`` on PYTHONPATH, one venv), as
``ab_revisions.py`` does.
"""

from __future__ import annotations

import sys
import time

import numpy as np
from mpi4py import MPI

from cai_mpi import irecv_array, isend_array, recv_array, send_array, waitall

N = 20_000


def main() -> None:
    name = sys.argv[1] if len(sys.argv) > 1 else "cai_mpi"
    reps = int(sys.argv[2]) if len(sys.argv) > 2 else 5
    comm = MPI.COMM_WORLD
    me = comm.Get_rank()
    x, out, landing = np.arange(1, dtype=np.float64), np.empty(1), np.empty(1)

    def cai(n: int, into: np.ndarray | None) -> None:
        for _ in range(n):
            send_array(x, me, 0)
            recv_array(me, 0, out=into)

    def raw(n: int) -> None:
        for _ in range(n):
            comm.Send(x, me, 0)
            comm.Recv(landing, me, 0)

    def cai_nb(n: int) -> None:
        for _ in range(n):
            waitall([irecv_array(me, 0, out=out), isend_array(x, me, 0)])

    def cai_irecv(n: int, into: np.ndarray | None) -> None:
        for _ in range(n):
            req = irecv_array(me, 0, out=into)
            send_array(x, me, 0)
            req.wait()

    def raw_nb(n: int) -> None:
        for _ in range(n):
            MPI.Request.Waitall([comm.Irecv(landing, me, 0), comm.Isend(x, me, 0)])

    runs = {"raw": lambda n: raw(n), "cai": lambda n: cai(n, None), "cai-out": lambda n: cai(n, out),
            "cai-irecv": lambda n: cai_irecv(n, None), "cai-out-irecv": lambda n: cai_irecv(n, out),
            "raw-nb": raw_nb, "cai-nb": cai_nb}
    for run in runs.values():
        run(N // 10)  # warm-up
    best = dict.fromkeys(runs, float("inf"))
    for _ in range(reps):
        for mode, run in runs.items():
            t = time.thread_time()
            run(N)
            best[mode] = min(best[mode], (time.thread_time() - t) / N * 1e6)
    print(f"{name:14s} CPU us per send+recv pair: " + "  ".join(f"{m} {v:.2f}" for m, v in best.items()))


if __name__ == "__main__":
    main()
