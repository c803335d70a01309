"""A multi-rank pipeline: rank 0 produces micro-batches, every rank transforms and forwards, the last checks.

Run:  mpiexec -n 4 python examples/pipeline.py [--batches 8] [--fail-at-batch B]

With a GPU and CuPy the batches live on the device (CuPy arrays in, cai_mpi Arrays through); without,
they are host numpy arrays. Nobody tells the receivers a shape or dtype: each item describes itself,
`meta` carries the micro-batch id along the chain, a stage has at most `depth` items in flight to the
next (back-pressure), and an error on any stage stops every stage with a PipelineError naming it.

With --fail-at-batch B, stage 1 (the middle stage of a 3-rank run) raises a ValueError on batch B. Every other
stage then gets a PipelineError that says which stage failed, on which item, and with what error (its type,
message and traceback text); every rank reports what it saw, the pipeline is left cleanly, and every rank exits
with status 2 (so mpiexec does too) instead of hanging or aborting. Without a failure the exit status is 0.
"""

from __future__ import annotations

import argparse
import sys
from typing import Any

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
    p.add_argument("--fail-at-batch", type=int, default=None, help="stage 1 raises a ValueError on this batch")
    args = p.parse_args()
    comm = MPI.COMM_WORLD
    if comm.Get_size() == 1:
        print("run with at least 2 ranks: mpiexec -n 4 python examples/pipeline.py")
        return 0
    xp = array_module()
    ok = True
    try:
        ok = run_stage(comm, args, xp)
    except cai_mpi.PipelineError as e:  # another stage failed: this one was stopped
        print(f"rank {comm.Get_rank()}: stopped: stage {e.rank} failed on {e.meta} with {e.error_type}: "
              f"{e.error_message}", flush=True)
        return 2
    except StageFailure as e:  # this stage failed: the others were told
        print(f"rank {comm.Get_rank()}: failed: {type(e).__name__}: {e}", flush=True)
        return 2
    ok = comm.allreduce(ok, op=MPI.LAND)
    if comm.Get_rank() == comm.Get_size() - 1:
        print(f"pipeline of {comm.Get_size()} ranks: {args.batches} batches {'arrived intact' if ok else 'WRONG'}")
    return 0 if ok else 1


class StageFailure(ValueError):
    """The failure --fail-at-batch injects into stage 1."""


def run_stage(comm: MPI.Intracomm, args: argparse.Namespace, xp: Any) -> bool:
    """This rank's part of the pipeline; True when every batch it checked arrived intact."""
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
                    if pipe.stage == 1 and a.meta["batch"] == args.fail_at_batch:
                        raise StageFailure(f"batch {args.fail_at_batch} cannot be transformed")
                    y = xp.asarray(a) * 2 if a.device != "host" else np.asarray(a) * 2
                    pipe.send(y, meta=a.meta)  # a new array: pass the item's meta on
    return ok


if __name__ == "__main__":
    cai_mpi.abort_on_error()  # an exception on one rank ends the job, with its traceback, instead of a hang
    sys.exit(main())
