"""Where the time of a 2-rank face exchange goes: ``irecv_array(out=)`` + ``isend_array`` + ``waitall`` against
mpi4py's ``Irecv`` + ``Isend`` + ``Waitall``, phase by phase.

    mpiexec -n 2 python scripts/bench/halo_phases.py [--cells N,N...] [--rounds R] [--json FILE]

Each rank exchanges a float64 face of N cells with the other, after a barrier, R times per size, cai_mpi and raw
alternating. Per exchange it records when each call returned and when cai_mpi posted the payload receive (its
``post_recv``, wrapped here; an inline message posts none), and prints the median of each phase per rank. The
payload receive is what a rendezvous-sized message waits for: everything before it is on the critical path.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from typing import Any

import numpy as np
from mpi4py import MPI

import cai_mpi
from cai_mpi._src.transport import post

COMM = MPI.COMM_WORLD
ME = COMM.Get_rank()
PEER = 1 - ME
_posted: list[float] = []


def _timed_post_recv(original: Any) -> Any:
    def post_recv(plan: Any, pc: Any, poster: Any) -> Any:
        if plan.payload:  # (an inline message has none to post)
            _posted.append(time.perf_counter())
        return original(plan, pc, poster)
    return post_recv


def cai_once(x: np.ndarray, out: np.ndarray) -> dict[str, float]:
    _posted.clear()
    COMM.Barrier()
    t0 = time.perf_counter()
    r = cai_mpi.irecv_array(PEER, 0, out=out)
    t1 = time.perf_counter()
    s = cai_mpi.isend_array(x, PEER, 0)
    t2 = time.perf_counter()
    cai_mpi.waitall([r, s])
    t3 = time.perf_counter()
    phases = {"irecv": t1 - t0, "isend": t2 - t1, "total": t3 - t0}
    if _posted:
        phases["payload receive posted at"] = _posted[0] - t0
    return phases


def raw_once(x: np.ndarray, out: np.ndarray) -> dict[str, float]:
    COMM.Barrier()
    t0 = time.perf_counter()
    r = COMM.Irecv(out, PEER, 5)
    t1 = time.perf_counter()
    s = COMM.Isend(x, PEER, 5)
    t2 = time.perf_counter()
    MPI.Request.Waitall([r, s])
    return {"irecv": t1 - t0, "isend": t2 - t1, "total": time.perf_counter() - t0}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cells", default="1024,131072", help="face sizes in float64 cells (8 KiB, 1 MiB)")
    parser.add_argument("--rounds", type=int, default=300)
    parser.add_argument("--json", help="write every rank's medians here (rank 0 writes)")
    args = parser.parse_args()
    if COMM.Get_size() != 2:
        raise SystemExit("run it on 2 ranks")
    post.post_recv = _timed_post_recv(post.post_recv)  # (the receive path looks it up in its module)
    results: dict[str, Any] = {"mpi": MPI.Get_library_version().splitlines()[0], "rounds": args.rounds, "sizes": {}}
    for cells in (int(c) for c in args.cells.split(",")):
        x, out, raw_out = np.full(cells, ME, np.float64), np.empty(cells), np.empty(cells)
        for _ in range(20):  # warm-up
            cai_once(x, out)
            raw_once(x, raw_out)
        rows: dict[str, list[dict[str, float]]] = {"cai": [], "raw": []}
        for _ in range(args.rounds):
            rows["cai"].append(cai_once(x, out))
            rows["raw"].append(raw_once(x, raw_out))
        if not (np.all(out == PEER) and np.all(raw_out == PEER)):
            raise SystemExit(f"rank {ME}: the received face is not the peer's")
        medians = {kind: {key: statistics.median(r[key] for r in kind_rows if key in r) * 1e6
                          for key in kind_rows[0]} for kind, kind_rows in rows.items()}
        everyone = COMM.gather(medians)
        if ME == 0:
            assert everyone is not None
            results["sizes"][str(cells * 8)] = everyone
            for rank, per in enumerate(everyone):
                for kind, phases in per.items():
                    text = ", ".join(f"{key} {value:.1f} us" for key, value in phases.items())
                    print(f"{cells * 8:>8} B  rank {rank}  {kind:3s}: {text}")
    if ME == 0 and args.json:
        with open(args.json, "w") as f:
            json.dump(results, f, indent=1)


if __name__ == "__main__":
    main()
