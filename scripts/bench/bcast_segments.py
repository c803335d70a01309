"""Where the time of a large ``bcast_array`` goes on each rank (issue 26): the Python before the header broadcast,
the header broadcast (waiting for the root included), the Python between it and the payload broadcast, the
payload broadcast, and the Python after it; raw mpi4py ``Bcast`` of the same bytes interleaved.

    mpiexec -n 2 python scripts/bench/bcast_segments.py [NBYTES]

Prints each rank's median of each segment (microseconds). The payload broadcast of a rank that arrives first
includes waiting for the other: compare the ranks' segments, not only their totals.
"""

from __future__ import annotations

import sys
import time
from typing import Any

import numpy as np
from mpi4py import MPI

import cai_mpi
from cai_mpi._src.api import collectives


def main() -> None:
    comm = MPI.COMM_WORLD
    rank = comm.Get_rank()
    nbytes = int(sys.argv[1]) if len(sys.argv) > 1 else 1 << 20
    x, out = np.ones(nbytes // 8), np.empty(nbytes // 8)
    clock = time.perf_counter
    marks: dict[str, float] = {}
    header, payload = getattr(collectives, "broadcast"), getattr(collectives, "bcast")  # noqa: B009  (not exported)

    def timed_header(*args: Any, **kwargs: Any) -> Any:
        marks["h0"] = clock()
        got = header(*args, **kwargs)
        marks["h1"] = clock()
        return got

    def timed_payload(*args: Any, **kwargs: Any) -> None:
        marks["p0"] = clock()
        payload(*args, **kwargs)
        marks["p1"] = clock()

    setattr(collectives, "broadcast", timed_header)  # noqa: B010  (the names the module calls, replaced by spies)
    setattr(collectives, "bcast", timed_payload)  # noqa: B010
    segments: dict[str, list[float]] = {k: [] for k in ("before", "header", "between", "payload", "after", "total",
                                                         "raw")}
    for i in range(1500):
        if i % 3 == 2:
            t0 = clock()
            comm.Bcast(x if rank == 0 else out, 0)
            segments["raw"].append(clock() - t0)
            continue
        t0 = clock()
        cai_mpi.bcast_array(x if rank == 0 else None, 0, comm)
        t1 = clock()
        if i >= 30:
            segments["before"].append(marks["h0"] - t0)
            segments["header"].append(marks["h1"] - marks["h0"])
            segments["between"].append(marks["p0"] - marks["h1"])
            segments["payload"].append(marks["p1"] - marks["p0"])
            segments["after"].append(t1 - marks["p1"])
            segments["total"].append(t1 - t0)
    medians = comm.gather({k: float(np.median(v)) * 1e6 for k, v in segments.items()})
    if rank == 0:
        assert medians is not None
        print(f"# {nbytes} bytes, {comm.Get_size()} ranks, {MPI.Get_library_version().splitlines()[0]}")
        for r, m in enumerate(medians):
            print(f"rank {r} " + " ".join(f"{k}={v:.1f}" for k, v in m.items()))


if __name__ == "__main__":
    main()
