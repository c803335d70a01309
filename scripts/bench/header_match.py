"""Which atomic matching operation should take a cai_mpi header: Recv into a bounded buffer, or Mprobe+Mrecv?

Run:  mpiexec -n 2 python scripts/bench/header_match.py [--json FILE]
Ping-pongs a 51-byte message (an 8-byte payload inline) both ways and prints the one-way time of each.
"""

from __future__ import annotations

import argparse
import json
import time

from mpi4py import MPI

comm = MPI.COMM_WORLD
rank, peer = comm.Get_rank(), comm.Get_rank() ^ 1
MSG = bytes(51)
BOUNDED = bytearray(100_000)
ITERS, SAMPLES = 20_000, 5


def bounded() -> None:
    status = MPI.Status()
    if rank == 0:
        comm.Send([MSG, MPI.BYTE], peer, 0)
        comm.Recv([BOUNDED, MPI.BYTE], peer, 0, status)
    else:
        comm.Recv([BOUNDED, MPI.BYTE], peer, 0, status)
        comm.Send([MSG, MPI.BYTE], peer, 0)
    status.Get_count(MPI.BYTE)


def mprobe() -> None:
    def take() -> None:
        status = MPI.Status()
        msg = comm.Mprobe(peer, 0, status)
        buf = bytearray(status.Get_count(MPI.BYTE))
        msg.Recv([buf, MPI.BYTE])

    if rank == 0:
        comm.Send([MSG, MPI.BYTE], peer, 0)
        take()
    else:
        take()
        comm.Send([MSG, MPI.BYTE], peer, 0)


def measure(fn) -> float:  # type: ignore[no-untyped-def]
    best = []
    for _ in range(SAMPLES):
        comm.Barrier()
        t0 = time.perf_counter()
        for _ in range(ITERS):
            fn()
        best.append((time.perf_counter() - t0) / ITERS / 2 * 1e6)
    return sorted(best)[len(best) // 2]


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--json")
    args = p.parse_args()
    if comm.Get_size() != 2:
        raise SystemExit("run with exactly 2 ranks: mpiexec -n 2 python scripts/bench/header_match.py")
    results = {name: measure(fn) for name, fn in [("bounded Recv", bounded), ("Mprobe + Mrecv", mprobe)]}
    if rank == 0:
        lib = MPI.Get_library_version().splitlines()[0].strip().strip(chr(0))
        print(f"# {lib}\n# header matching, one-way us (median of {SAMPLES} x {ITERS})")
        for name, us in results.items():
            print(f"{name:16s} {us:6.2f}")
        if args.json:
            with open(args.json, "w") as f:
                json.dump({"mpi_library": lib, "one_way_us": results}, f, indent=2)


if __name__ == "__main__":
    main()
