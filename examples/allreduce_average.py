"""Data-parallel gradient averaging of a dict of parameters: every rank computes gradients on its own shard of
the data, then one persistent bucketed allreduce (allreduce_init of the dict, op="mean") averages all of them
over the ranks, as distributed training does: made once, called every step, one collective per dtype.

Run:  mpiexec -n 4 python examples/allreduce_average.py [--steps 200]

A small two-layer linear model (parameters of different shapes and dtypes: float32 and float64) is fitted by
gradient descent on data split across the ranks. With the averaged gradients every rank takes the same step,
so the parameters stay identical everywhere, and the model approaches the true map.
"""

from __future__ import annotations

import argparse
import sys
from typing import Any

import numpy as np
from mpi4py import MPI

import cai_mpi


def gradients(params: dict[str, Any], x: np.ndarray[Any, Any], y: np.ndarray[Any, Any]) -> dict[str, Any]:
    """This shard's gradients of the mean squared error of y ~ (x @ w1 + b1) @ w2, each in its parameter's dtype."""
    w1, b1, w2 = (params[k].astype(np.float64) for k in ("w1", "b1", "w2"))
    hidden = x @ w1 + b1
    err = 2.0 * (hidden @ w2 - y) / len(y)
    d_hidden = np.outer(err, w2)
    grads = {"w1": x.T @ d_hidden, "b1": d_hidden.sum(axis=0), "w2": hidden.T @ err}
    return {k: g.astype(params[k].dtype) for k, g in grads.items()}


def main() -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--steps", type=int, default=200)
    args = p.parse_args()
    comm = MPI.COMM_WORLD
    rank = comm.Get_rank()
    true_w = np.array([2.0, -1.0, 0.5, 3.0])
    rng = np.random.default_rng(rank)  # each rank its own shard
    x = rng.standard_normal((256, true_w.size))
    y = x @ true_w + 0.01 * rng.standard_normal(256)
    start = np.random.default_rng(0)  # the same initial parameters on every rank
    params: dict[str, Any] = {
        "w1": (0.3 * start.standard_normal((4, 3))).astype(np.float32),
        "b1": np.zeros(3, np.float64),
        "w2": (0.3 * start.standard_normal(3)).astype(np.float64),
    }
    grads = {k: np.zeros_like(v) for k, v in params.items()}  # filled in place each step: the persistent form's input
    with cai_mpi.allreduce_init(grads, op="mean") as average:  # agreed once, here; one collective per dtype per step
        for _ in range(args.steps):
            for name, grad in gradients(params, x, y).items():
                grads[name][...] = grad
            for name, mean in average().items():  # the averages over the ranks, each in its gradient's dtype
                params[name] -= np.asarray(mean) * params[name].dtype.type(0.05)
    fitted = params["w1"].astype(np.float64) @ params["w2"]  # the linear map the model computes
    same_everywhere = all(
        all(np.array_equal(np.asarray(other), value) for other in cai_mpi.allgather_array(value))
        for value in params.values())
    close = bool(np.allclose(fitted, true_w, atol=0.02))
    dtypes = ", ".join(f"{k}: {v.dtype}" for k, v in params.items())
    print(f"rank {rank}: w1 @ w2 = {np.round(fitted, 3).tolist()} ({dtypes}): "
          f"{'ok' if same_everywhere and close else 'WRONG'}")
    return 0 if comm.allreduce(int(not (same_everywhere and close))) == 0 else 1


if __name__ == "__main__":
    cai_mpi.abort_on_error()  # an exception on one rank ends the job, with its traceback, instead of a hang
    sys.exit(main())
