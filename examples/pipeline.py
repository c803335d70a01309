"""A multi-rank pipeline: rank 0 produces micro-batches, every rank transforms and forwards, the last checks.

Run:  mpiexec -n 4 python examples/pipeline.py [--batches 8]

With a GPU and CuPy the batches live on the device (CuPy arrays in, cai_mpi Arrays through); without,
they are host numpy arrays. Nobody tells the receivers a shape or dtype: each item describes itself,
`meta` carries the micro-batch id along the chain, a stage has at most `depth` items in flight to the
next (back-pressure), and an error on any stage stops every stage with a PipelineError naming it.
"""

from __future__ import annotations

import argparse
import sys

import numpy as np
from mpi4py import MPI

import cai_mpi


def array_module():  # type: ignore[no-untyped-def]
    try:
        import cupy

        if cupy.cuda.runtime.getDeviceCount() > 0:
            return cupy
    except Exception:
        pass
    return np


def batch(b: int, xp: object = np) -> np.ndarray:  # type: ignore[type-arg]
    return xp.arange(b, b + 1000 * (b + 1), dtype=xp.float32).reshape(b + 1, 1000)  # type: ignore[attr-defined,no-any-return]


def main() -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--batches", type=int, default=8)
    p.add_argument("--depth", type=int, default=2, help="items a stage may have in flight to the next")
    args = p.parse_args()
    comm = MPI.COMM_WORLD
    if comm.Get_size() == 1:
        print("run with at least 2 ranks: mpiexec -n 4 python examples/pipeline.py")
        return 0
    xp = array_module()
    ok = True
    with cai_mpi.Pipeline(comm, depth=args.depth) as pipe:
        if pipe.first:
            for b in range(args.batches):
                pipe.send(batch(b, xp), meta={"batch": b})
        else:
            for a in pipe:  # the next item is received while this one is worked on
                if pipe.last:
                    b = a.meta["batch"]
                    data = np.asarray(a) if a.device == "host" else a.numpy()
                    good = np.array_equal(data, batch(b) * 2.0 ** (pipe.stage - 1))
                    ok &= good
                    print(f"rank {pipe.stage}: batch {b} shape {a.shape}: {'ok' if good else 'WRONG'}")
                else:
                    y = xp.asarray(a) * 2 if a.device != "host" else np.asarray(a) * 2
                    pipe.send(y, meta=a.meta)  # a new array: pass the item's meta on
    ok = comm.allreduce(ok, op=MPI.LAND)
    if comm.Get_rank() == comm.Get_size() - 1:
        print(f"pipeline of {comm.Get_size()} ranks: {args.batches} batches {'arrived intact' if ok else 'WRONG'}")
    return 0 if ok else 1


if __name__ == "__main__":
    cai_mpi.abort_on_error()  # an exception on one rank ends the job, with its traceback, instead of a hang
    sys.exit(main())
