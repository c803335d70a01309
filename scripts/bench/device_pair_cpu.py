"""CPU time of one 4 KiB device message on the CUDA driver double: cai_mpi's Python around the driver calls.

    PYTHONPATH=TREE python scripts/bench/device_pair_cpu.py NAME [REPS] [PAIRS]

One rank sends a 4 KiB float64 device array to itself and receives it onto its GPU (``isend_array``,
``recv_array(device=0)``, ``wait``) and drops the received Array (its release), with the user's context current, as
``tests/unit/runtime/test_driver_call_budget.py`` counts it; direct (a CUDA-aware MPI) and staged. The double runs
``eager`` (device work done when its call returns), so the path taken does not depend on timing. Each figure is the
thread's CPU time per pair (``time.thread_time``, PAIRS pairs, default 2000), the least over REPS repetitions
(default 3). Prints one JSON line: ``{"name": NAME, "tree": where cai_mpi came from, "direct": us,
"staged": us}``. For an A/B comparison alternate
the source trees (each revision's ``git archive`` on PYTHONPATH, one venv), each run a fresh process.
"""

from __future__ import annotations

import gc
import json
import os
import sys
import time

import numpy as np
from mpi4py import MPI

import cai_mpi
from cai_mpi._src.config import reload_config
from cai_mpi.testing import DoubleDeviceArray, double_runtime, use_runtime

N = 512  # float64: 4 KiB


def per_pair(direct: bool, reps: int, pairs: int) -> float:
    """The least CPU time of one pair and release, in microseconds."""
    os.environ["CAI_MPI_CUDA_AWARE"] = "1" if direct else "0"
    reload_config({"CAI_MPI_INLINE_BYTES": "0"})  # (a 4 KiB message travels as a payload, as on a GPU it would)
    rt = double_runtime(cuda_aware=direct, eager=True)
    d = rt.driver_double  # type: ignore[attr-defined]
    comm = MPI.COMM_WORLD.Dup()
    me = comm.Get_rank()
    try:
        with use_runtime(rt):
            d.cuInit(0)
            d.cuCtxSetCurrent(d.cuDevicePrimaryCtxRetain(0)[1])  # the user's context, as CuPy or PyTorch leave it
            held = [DoubleDeviceArray(rt, np.arange(N, dtype=np.float64), stream=1)]

            def run(n: int) -> None:
                for _ in range(n):
                    req = cai_mpi.isend_array(held[0], me, 5, comm)
                    got = cai_mpi.recv_array(me, 5, comm, device=0)
                    req.wait()
                    del got

            run(pairs // 10)  # warm-up: pools and caches filled
            best = float("inf")
            for _ in range(reps):
                d.calls.clear()
                gc.collect()
                gc.disable()  # (a collection inside the loop would land on whichever pair it hit)
                t = time.thread_time()
                run(pairs)
                best = min(best, (time.thread_time() - t) / pairs)
                gc.enable()
            held.clear()  # (freed while the double is open)
            gc.collect()
    finally:
        comm.Free()
        d.close()
    return best * 1e6


def main() -> None:
    name = sys.argv[1] if len(sys.argv) > 1 else "cai_mpi"
    reps = int(sys.argv[2]) if len(sys.argv) > 2 else 3
    pairs = int(sys.argv[3]) if len(sys.argv) > 3 else 2000
    tree = os.path.dirname(os.path.dirname(cai_mpi.__file__))
    found = {"name": name, "tree": tree, "direct": round(per_pair(True, reps, pairs), 1),
             "staged": round(per_pair(False, reps, pairs), 1)}
    print(json.dumps(found), flush=True)


if __name__ == "__main__":
    main()
