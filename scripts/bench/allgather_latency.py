"""Wall-clock time per ``allgather_array`` call in the steady state, against raw mpi4py ``Allgather`` of the same
bytes and mpi4py's pickled ``comm.allgather`` of the same array (issue 42: one collective per call).

    mpiexec -n 2 python scripts/bench/allgather_latency.py [--rounds 9] [--calls 2000] [--sizes 8,65536]
        [--json out.json]

The three calls are interleaved round by round (so a busy machine disturbs them alike); each round times
``--calls`` calls after a barrier, on every rank, and keeps the slowest rank's time. Prints, per payload size
(``--sizes``, bytes per rank: 8 B and 64 KiB by default; a tenth of the calls above 8 B, a hundredth from 1 MiB),
the median over the rounds in microseconds per call, and the ratios the issue's targets name (allgather_array /
pickle, allgather_array / raw).
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from collections.abc import Callable

import numpy as np
from mpi4py import MPI

import cai_mpi


def timed(comm: MPI.Intracomm, call: Callable[[], object], calls: int) -> float:
    """Microseconds per call of ``call``, the slowest rank's."""
    comm.Barrier()
    t0 = time.perf_counter()
    for _ in range(calls):
        call()
    mine = (time.perf_counter() - t0) / calls * 1e6
    return float(comm.allreduce(mine, op=MPI.MAX))


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--rounds", type=int, default=9)
    parser.add_argument("--calls", type=int, default=2000)
    parser.add_argument("--sizes", default="8,65536", help="bytes per rank, comma-separated")
    parser.add_argument("--json", default=None)
    args = parser.parse_args()
    comm = MPI.COMM_WORLD
    size = comm.Get_size()
    results: dict[str, dict[str, float]] = {}
    for nbytes in (int(n) for n in args.sizes.split(",")):
        x = np.full(nbytes // 8, float(comm.Get_rank()))
        gathered = np.empty(size * x.size)
        calls: dict[str, Callable[[], object]] = {
            "Allgather (raw)": lambda x=x, g=gathered: comm.Allgather(x, g),
            "comm.allgather (pickle)": lambda x=x: comm.allgather(x),
            "allgather_array": lambda x=x: cai_mpi.allgather_array(x, comm),
        }
        n = args.calls if nbytes == 8 else max(args.calls // (10 if nbytes < 1 << 20 else 100), 20)
        samples: dict[str, list[float]] = {name: [] for name in calls}
        for call in calls.values():
            for _ in range(50):
                call()
        for _round in range(args.rounds):
            for name, call in calls.items():
                samples[name].append(timed(comm, call, n))
        medians = {name: round(statistics.median(s), 2) for name, s in samples.items()}
        medians["allgather_array / pickle"] = round(medians["allgather_array"] / medians["comm.allgather (pickle)"], 2)
        medians["allgather_array / raw"] = round(medians["allgather_array"] / medians["Allgather (raw)"], 2)
        results[f"{nbytes} B"] = medians
    if comm.Get_rank() == 0:
        print(json.dumps({"ranks": size, "library": MPI.Get_library_version().split("\n")[0][:40], **results}))
        if args.json:
            with open(args.json, "w") as f:
                json.dump(results, f, indent=1)


if __name__ == "__main__":
    main()
