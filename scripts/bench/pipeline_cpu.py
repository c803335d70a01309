"""CPU time per item of two ``Pipeline`` versions in the same processes, next to the raw mpi4py chain.

    mpiexec -n 2 python scripts/bench/pipeline_cpu.py OLD_PIPELINE_PY SIZE ITEMS ROUNDS DEPTH [OUT.json]
    git show b4d4e5c:cai_mpi/_src/api/pipeline.py > /tmp/pipeline_before.py
    mpiexec -n 2 python scripts/bench/pipeline_cpu.py /tmp/pipeline_before.py 8 20000 5 64

As ``pipeline_ab.py`` (the old ``pipeline.py`` loaded beside the current one, on the same point-to-point layer),
but every round records each rank's thread CPU time per item (``time.thread_time``), which a busy shared machine
disturbs less than wall-clock time. It includes what a stage spends polling while it waits, so at a deep window
(where the slower stage rarely waits) the slower stage's figure is close to its own work per item. Rank 0 prints,
per variant, the median over the rounds of every rank's CPU microseconds per item and the items/s.
"""

from __future__ import annotations

import json
import statistics
import sys
import time
from collections.abc import Callable
from types import ModuleType
from typing import Any

import numpy as np
from mpi4py import MPI
from pipeline_ab import load  # (the same loading of the older pipeline.py; both scripts run from scripts/bench)


def main(argv: list[str]) -> None:
    if len(argv) < 5:
        sys.exit(__doc__)
    from cai_mpi._src.api import pipeline as current

    old, nbytes, items, rounds, depth = load(argv[0]), int(argv[1]), int(argv[2]), int(argv[3]), int(argv[4])
    comm = MPI.COMM_WORLD.Dup()
    rank, size = comm.Get_rank(), comm.Get_size()
    last = size - 1
    x = np.zeros(nbytes, np.uint8)
    bufs = [np.empty(nbytes, np.uint8), np.empty(nbytes, np.uint8)]

    def raw(n: int) -> None:
        prev: Any = None
        for k in range(n):
            if rank == 0:
                sent = comm.Isend(x, 1, 5)
            else:
                comm.Recv(bufs[k & 1], rank - 1, 5)
                sent = None if rank == last else comm.Isend(bufs[k & 1], rank + 1, 5)
            if prev is not None:
                prev.Wait()
            prev = sent
        if prev is not None:
            prev.Wait()

    def pipe(module: ModuleType) -> Callable[[int], None]:
        def run(n: int) -> None:
            with module.Pipeline(comm, depth=depth) as p:
                if p.first:
                    for _ in range(n):
                        p.send(x)
                else:
                    for a in p:
                        if not p.last:
                            p.send(a)
        return run

    variants = {"raw": raw, "before": pipe(old), "after": pipe(current)}
    for run in variants.values():
        run(max(10, items // 10))  # warm-up
    cpu: dict[str, list[list[float]]] = {k: [] for k in variants}
    rate: dict[str, list[float]] = {k: [] for k in variants}
    for _ in range(rounds):
        for name, run in variants.items():
            comm.Barrier()
            t0, c0 = time.perf_counter(), time.thread_time()
            run(items)
            c1 = time.thread_time()
            comm.Barrier()
            t1 = time.perf_counter()
            cpu[name].append(comm.gather(1e6 * (c1 - c0) / items, root=0) or [])
            rate[name].append(items / (t1 - t0))
    if rank == 0:
        per_item = {k: [statistics.median(r[i] for r in v) for i in range(size)] for k, v in cpu.items()}
        doc = {"size": nbytes, "ranks": size, "items": items, "rounds": rounds, "depth": depth,
               "mpi": MPI.Get_library_version()[:40], "cpu_us_per_item": per_item,
               "items_per_s": {k: statistics.median(v) for k, v in rate.items()},
               "samples_cpu": cpu, "samples_rate": rate}
        for k in variants:
            per_rank = " ".join(f"{c:.2f}" for c in doc["cpu_us_per_item"][k])
            print(f"{k}: cpu us/item by rank [{per_rank}], {doc['items_per_s'][k]:.0f} items/s")
        if len(argv) > 5:
            with open(argv[5], "w") as f:
                json.dump(doc, f, indent=1)
    comm.Free()


if __name__ == "__main__":
    main(sys.argv[1:])
