"""Two versions of ``Pipeline`` side by side in the same processes, with a raw mpi4py chain as the floor.

    mpiexec -n 2 python scripts/bench/pipeline_ab.py OLD_PIPELINE_PY SIZE ITEMS ROUNDS [OUT.json]
    git show 973ebaa:cai_mpi/_src/api/pipeline.py > /tmp/pipeline_before.py
    mpiexec -n 2 python scripts/bench/pipeline_ab.py /tmp/pipeline_before.py 8 2000 9

The old ``pipeline.py`` is loaded beside the current one (as ``cai_mpi._src.api.pipeline_before``, so both run on
the same point-to-point layer), and every round times, one after the other: the raw chain (``Isend`` of a buffer
of known size, ``Recv`` of the next item into one of two buffers, as ``bench pipeline``'s ``raw``), the
``isend_array``/``recv_array`` chain the Pipeline is built on (``cai-chain``, no back-pressure), then each version
at depth 2 and 8. On a shared machine a burst of load hits every variant of a round alike, which
alternating whole runs of two revisions cannot promise. Rank 0 prints each variant's median items/s over the
rounds and its ratio to raw's.
"""

from __future__ import annotations

import importlib.util
import json
import statistics
import sys
import time
from collections.abc import Callable
from types import ModuleType
from typing import Any

import numpy as np
from mpi4py import MPI

import cai_mpi
from cai_mpi._src.api import pipeline as current


def load(path: str) -> ModuleType:
    spec = importlib.util.spec_from_file_location("cai_mpi._src.api.pipeline_before", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def main(argv: list[str]) -> None:
    if len(argv) < 4:
        sys.exit(__doc__)
    old, nbytes, items, rounds = load(argv[0]), int(argv[1]), int(argv[2]), int(argv[3])
    comm = MPI.COMM_WORLD.Dup()
    rank, size = comm.Get_rank(), comm.Get_size()
    last = size - 1
    x = np.zeros(nbytes, np.uint8)
    bufs = [np.empty(nbytes, np.uint8), np.empty(nbytes, np.uint8)]
    ack = np.zeros(1, np.uint8)

    def raw(n: int) -> float:
        comm.Barrier()
        t0 = time.perf_counter()
        prev: Any = None
        if rank == 0:
            for _ in range(n):
                sent = comm.Isend(x, 1, 5)
                if prev is not None:
                    prev.Wait()
                prev = sent
            prev.Wait()
            comm.Recv(ack, last, 6)
            return time.perf_counter() - t0
        for k in range(n):
            comm.Recv(bufs[k & 1], rank - 1, 5)
            if rank != last:
                if prev is not None:
                    prev.Wait()
                prev = comm.Isend(bufs[k & 1], rank + 1, 5)
        if prev is not None:
            prev.Wait()
        if rank == last:
            comm.Send(ack, 0, 6)
        return time.perf_counter() - t0

    def chain(n: int) -> float:
        """The point-to-point chain the Pipeline is built on: isend_array, recv_array (no back-pressure)."""
        comm.Barrier()
        t0 = time.perf_counter()
        prev: Any = None
        if rank == 0:
            for _ in range(n):
                sent = cai_mpi.isend_array(x, 1, 5, comm)
                if prev is not None:
                    prev.wait()
                prev = sent
            prev.wait()
            comm.Recv(ack, last, 6)
            return time.perf_counter() - t0
        for _ in range(n):
            got = cai_mpi.recv_array(rank - 1, 5, comm)
            if rank != last:
                if prev is not None:
                    prev.wait()
                prev = cai_mpi.isend_array(got, rank + 1, 5, comm)
        if prev is not None:
            prev.wait()
        if rank == last:
            comm.Send(ack, 0, 6)
        return time.perf_counter() - t0

    def pipe(module: ModuleType, depth: int) -> Callable[[int], float]:
        def run(n: int) -> float:
            p = module.Pipeline(comm, depth=depth)
            comm.Barrier()
            t0 = time.perf_counter()
            with p:
                if p.first:
                    for _ in range(n):
                        p.send(x)
                    p.close()
                    comm.Recv(ack, last, 6)
                else:
                    for a in p:
                        if not p.last:
                            p.send(a)
                    if p.last:
                        comm.Send(ack, 0, 6)
            return time.perf_counter() - t0
        return run

    variants = {"raw": raw, "cai-chain": chain, "before-d2": pipe(old, 2), "after-d2": pipe(current, 2),
                "before-d8": pipe(old, 8), "after-d8": pipe(current, 8)}
    for run in variants.values():
        run(max(10, items // 10))  # warm-up
    samples: dict[str, list[float]] = {k: [] for k in variants}
    for _ in range(rounds):
        for name, run in variants.items():
            samples[name].append(items / run(items))
    if rank == 0:
        med = {k: statistics.median(v) for k, v in samples.items()}
        doc = {"size": nbytes, "ranks": size, "items": items, "rounds": rounds, "mpi": MPI.Get_library_version()[:40],
               "items_per_s": med, "ratio_to_raw": {k: med[k] / med["raw"] for k in med}, "samples": samples}
        print(" ".join(f"{k} {med[k]:.0f}/s ({med[k] / med['raw']:.3f}x)" for k in med))
        if len(argv) > 4:
            with open(argv[4], "w") as f:
                json.dump(doc, f, indent=1)
    comm.Free()


if __name__ == "__main__":
    main(sys.argv[1:])
