"""Data-parallel gradient averaging: every rank computes gradients on its own shard of the data, then
allreduce_array sums them and each rank divides by the number of ranks, as distributed training does.

Run:  mpiexec -n 4 python examples/allreduce_average.py [--steps 20]

A linear model y = X @ w is fitted by gradient descent on data split across the ranks; with the averaged
gradient every rank takes the same step, so the weights stay identical everywhere, and they approach the
true weights. With a GPU and CuPy the gradients live on the device.
"""

from __future__ import annotations

import argparse
import sys

import numpy as np
from mpi4py import MPI

import cai_mpi


def main() -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--steps", type=int, default=200)
    args = p.parse_args()
    comm = MPI.COMM_WORLD
    rank, size = comm.Get_rank(), comm.Get_size()
    true_w = np.array([2.0, -1.0, 0.5, 3.0])
    rng = np.random.default_rng(rank)  # each rank its own shard
    x = rng.standard_normal((256, true_w.size))
    y = x @ true_w + 0.01 * rng.standard_normal(256)
    w = np.zeros_like(true_w)
    for _ in range(args.steps):
        grad = 2.0 * x.T @ (x @ w - y) / len(y)  # this shard's gradient
        total = cai_mpi.allreduce_array(grad, op="sum")  # no shape given: any array, any rank count
        w -= 0.1 * np.asarray(total) / size
    spread = max(cai_mpi.allgather_array(w), key=lambda a: float(np.abs(np.asarray(a) - w).max()))
    same_everywhere = np.array_equal(np.asarray(spread), w)
    close = bool(np.allclose(w, true_w, atol=0.01))
    print(f"rank {rank}: w = {np.round(w, 3).tolist()}: {'ok' if same_everywhere and close else 'WRONG'}")
    return 0 if comm.allreduce(int(not (same_everywhere and close))) == 0 else 1


if __name__ == "__main__":
    cai_mpi.abort_on_error()  # an exception on one rank ends the job, with its traceback, instead of a hang
    sys.exit(main())
