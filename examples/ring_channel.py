"""A time loop around a ring: every step each rank sends its state to the next rank through a channel.

Run:  mpiexec -n 3 python examples/ring_channel.py [--steps 200] [--size 1000]

The state has the same shape every step, so it is described once (send_channel / recv_channel)
and each later step moves only the data, through MPI persistent requests. The loop is then
timed again with send_array / recv_array, which describe every message, for comparison.
With a GPU, CuPy and a CUDA-aware MPI the state lives on the device; otherwise in host memory.
"""

from __future__ import annotations

import argparse
import sys
import time

import numpy as np
from mpi4py import MPI

import cai_mpi


def array_module():  # type: ignore[no-untyped-def]
    # A device channel hands device memory to MPI directly, so it needs a CUDA-aware MPI.
    try:
        import cupy

        if cupy.cuda.runtime.getDeviceCount() > 0 and cai_mpi.cuda_aware().aware:
            return cupy
    except Exception:
        pass
    return np


def main() -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--steps", type=int, default=200)
    p.add_argument("--size", type=int, default=1000, help="float64 elements in each rank's state")
    args = p.parse_args()
    comm = MPI.COMM_WORLD
    rank, nranks = comm.Get_rank(), comm.Get_size()
    right, left = (rank + 1) % nranks, (rank - 1) % nranks
    xp = array_module()
    state = xp.zeros(args.size, dtype=xp.float64)
    bad = 0

    comm.Barrier()
    t0 = time.perf_counter()
    with cai_mpi.send_channel(state, dest=right, tag=7) as tx, cai_mpi.recv_channel(source=left, tag=7) as rx:
        for step in range(args.steps):
            state[:] = rank * 1_000_000 + step  # this step's "simulation"
            sent = tx.isend()  # nonblocking: every rank sends before it receives
            got = rx.recv()  # the same Array every step, overwritten with the newest state
            if float(got.numpy()[-1]) != left * 1_000_000 + step:
                bad += 1
            sent.wait()  # only now may the next step write `state`
    channel_us = (time.perf_counter() - t0) / args.steps * 1e6

    comm.Barrier()
    t0 = time.perf_counter()
    for step in range(args.steps):
        state[:] = rank * 1_000_000 + step
        sent = cai_mpi.isend_array(state, dest=right, tag=8)
        got = cai_mpi.recv_array(source=left, tag=8)
        if float(got.numpy()[-1]) != left * 1_000_000 + step:
            bad += 1
        sent.wait()
    array_us = (time.perf_counter() - t0) / args.steps * 1e6

    where = "device" if xp is not np else "host"
    print(f"rank {rank}: {args.steps} steps from rank {left} ({where}): "
          f"{'ok' if bad == 0 else f'{bad} WRONG'}; per step: channel {channel_us:.1f} us, "
          f"send_array {array_us:.1f} us", flush=True)
    return 1 if comm.allreduce(bad) else 0


if __name__ == "__main__":
    cai_mpi.abort_on_error()  # an exception on one rank ends the job, with its traceback, instead of a hang
    sys.exit(main())
