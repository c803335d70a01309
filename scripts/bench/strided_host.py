"""A strided host row exchanged between two ranks: MPI's derived datatype in place, against numpy packing plus a
contiguous message (what CAI_MPI_HOST_DATATYPE_BYTES chooses between; docs/benchmarks.md, "Strided host payloads").

    mpiexec -n 2 python scripts/bench/strided_host.py [--json FILE] [--samples 7]

Each rank sends one row of a Fortran-ordered (10, n) float64 field (stride 80 bytes) to the other and receives the
other's into the same row of its own field (``Irecv`` + ``Isend`` + ``Waitall``). "datatype" hands MPI an hvector;
"packed" copies the row into a contiguous buffer, sends it, and copies the received buffer into the row. Each figure
is the median over ``--samples`` interleaved samples of the slowest rank's time per exchange.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from typing import Any

import numpy as np
from mpi4py import MPI


def exchange_forms(comm: MPI.Comm, n: int) -> dict[str, Any]:
    peer = 1 - comm.Get_rank()
    field, ghost = np.zeros((10, n), order="F"), np.zeros((10, n), order="F")
    row, into = field[1], ghost[1]
    vector = MPI.DOUBLE.Create_vector(n, 1, 10).Commit()
    extent = (n - 1) * 80 + 8
    send_view = MPI.buffer.fromaddress(row.ctypes.data, extent, readonly=True)
    recv_view = MPI.buffer.fromaddress(into.ctypes.data, extent)
    out, land = np.empty(n), np.empty(n)

    def datatype() -> None:
        MPI.Request.Waitall([comm.Irecv([recv_view, 1, vector], peer, 0), comm.Isend([send_view, 1, vector], peer, 0)])

    def packed() -> None:
        out[...] = row
        MPI.Request.Waitall([comm.Irecv(land, peer, 0), comm.Isend(out, peer, 0)])
        into[...] = land

    return {"datatype": datatype, "packed": packed, "_free": vector.Free}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cells", default="1024,2048,8192,131072", help="row lengths (float64 cells)")
    parser.add_argument("--samples", type=int, default=7)
    parser.add_argument("--json")
    args = parser.parse_args()
    comm = MPI.COMM_WORLD
    if comm.Get_size() != 2:
        raise SystemExit("run with exactly 2 ranks")
    rows = []
    for n in (int(c) for c in args.cells.split(",")):
        forms = exchange_forms(comm, n)
        free = forms.pop("_free")
        reps = max(5, 200_000 // n)
        times: dict[str, list[float]] = {name: [] for name in forms}
        for run in forms.values():
            run()
        for _ in range(args.samples):
            for name, run in forms.items():
                comm.Barrier()
                start = time.perf_counter()
                for _ in range(reps):
                    run()
                times[name].append(comm.allreduce((time.perf_counter() - start) / reps, op=MPI.MAX))
        free()
        medians = {name: statistics.median(t) * 1e6 for name, t in times.items()}
        rows.append({"row_bytes": 8 * n, "datatype_us": medians["datatype"], "packed_us": medians["packed"],
                     "datatype_over_packed": medians["datatype"] / medians["packed"]})
    if comm.Get_rank() == 0:
        print(f"# {MPI.Get_library_version().splitlines()[0]}: strided row exchange, median of {args.samples} samples")
        print(f"{'row bytes':>10} {'datatype us':>12} {'packed us':>10} {'datatype/packed':>16}")
        for r in rows:
            print(f"{r['row_bytes']:>10} {r['datatype_us']:>12.1f} {r['packed_us']:>10.1f} "
                  f"{r['datatype_over_packed']:>15.2f}x")
        if args.json:
            with open(args.json, "w") as f:
                json.dump({"library": MPI.Get_library_version().splitlines()[0], "rows": rows}, f, indent=1)


if __name__ == "__main__":
    main()
