"""A multi-rank pipeline: rank 0 produces micro-batches, every rank transforms and forwards, the last checks.

Run:  mpiexec -n 4 python examples/pipeline.py [--batches 8]

With a GPU and CuPy the batches live on the device (CuPy arrays in, cai_mpi Arrays through);
without, they are host numpy arrays. Nobody tells the receivers a shape or dtype: each message
describes itself, and `meta` carries the micro-batch id along the chain.
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


def main() -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--batches", type=int, default=8)
    args = p.parse_args()
    comm = MPI.COMM_WORLD
    rank, size = comm.Get_rank(), comm.Get_size()
    xp = array_module()
    last = size - 1

    if size == 1:
        print("run with at least 2 ranks: mpiexec -n 4 python examples/pipeline.py")
        return 0
    if rank == 0:
        pending = []
        for b in range(args.batches):
            batch = xp.arange(b, b + 1000 * (b + 1), dtype=xp.float32).reshape(b + 1, 1000)
            pending.append(cai_mpi.isend_array(batch, 1, meta={"batch": b, "stages": [0]}))
        for req in pending:
            req.wait()
    else:
        for _ in range(args.batches):
            a = cai_mpi.recv_array(rank - 1)
            meta = dict(a.meta or {}, stages=[*a.meta["stages"], rank])
            if rank == last:
                b = meta["batch"]
                data = np.asarray(a) if a.device == "host" else a.numpy()
                expected = np.arange(b, b + 1000 * (b + 1), dtype=np.float32).reshape(b + 1, 1000) * 2.0 ** (size - 2)
                ok = np.array_equal(data, expected)
                print(f"rank {rank}: batch {b} shape {a.shape} via ranks {meta['stages']}: {'ok' if ok else 'WRONG'}")
                if not ok:
                    return 1
            else:
                # Transform on whatever device the data landed on, then forward with the updated meta.
                y = xp.asarray(a) * 2 if a.device != "host" else np.asarray(a) * 2
                cai_mpi.send_array(y, rank + 1, meta=meta)
    comm.Barrier()
    if rank == last:
        print(f"pipeline of {size} ranks: {args.batches} batches arrived intact")
    return 0


if __name__ == "__main__":
    sys.exit(main())
