"""8-byte ping-pong through cai_mpi's public API only, so it runs against any revision of the library.

Run:  mpiexec -n 2 python scripts/bench/history_latency.py [--json FILE]
      (with PYTHONPATH pointing at another checkout to measure that revision; see
      scripts/bench/history_latency.sh, which does it for the revisions in docs/benchmarks.md)

Prints the one-way time of raw mpi4py Send/Recv, pickle send/recv, send_array/recv_array and
recv_array(out=), each the median of interleaved samples, and the ratios to raw.
"""

from __future__ import annotations

import argparse
import json
import time
from collections.abc import Callable

import numpy as np
from mpi4py import MPI

import cai_mpi

comm = MPI.COMM_WORLD
rank, peer = comm.Get_rank(), comm.Get_rank() ^ 1
x = np.arange(8, dtype=np.uint8)
buf = np.empty_like(x)


def raw() -> None:
    if rank == 0:
        comm.Send(x, peer, 0)
        comm.Recv(buf, peer, 0)
    else:
        comm.Recv(buf, peer, 0)
        comm.Send(buf, peer, 0)


def pickle() -> None:
    if rank == 0:
        comm.send(x, peer, 0)
        comm.recv(None, peer, 0)
    else:
        comm.send(comm.recv(None, peer, 0), peer, 0)


def cai() -> None:
    if rank == 0:
        cai_mpi.send_array(x, peer)
        cai_mpi.recv_array(peer)
    else:
        cai_mpi.send_array(cai_mpi.recv_array(peer), peer)


def cai_out() -> None:
    if rank == 0:
        cai_mpi.send_array(x, peer)
        cai_mpi.recv_array(peer, out=buf)
    else:
        cai_mpi.send_array(cai_mpi.recv_array(peer, out=buf), peer)


MODES: dict[str, Callable[[], None]] = {"raw": raw, "pickle": pickle, "cai": cai, "cai-out": cai_out}


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--iters", type=int, default=5000)
    p.add_argument("--samples", type=int, default=9)
    p.add_argument("--json")
    args = p.parse_args()
    if comm.Get_size() != 2:
        raise SystemExit("run with exactly 2 ranks")
    times: dict[str, list[float]] = {m: [] for m in MODES}
    for fn in MODES.values():  # warm-up
        for _ in range(args.iters // 10):
            fn()
    for _ in range(args.samples):  # interleaved: a disturbance hits every mode alike
        for name, fn in MODES.items():
            comm.Barrier()
            t0 = time.perf_counter()
            for _ in range(args.iters):
                fn()
            times[name].append((time.perf_counter() - t0) / args.iters / 2 * 1e6)
    if rank == 0:
        med = {m: float(np.median(t)) for m, t in times.items()}
        print("  ".join(f"{m} {v:.2f} us ({v / med['raw']:.2f}x raw)" for m, v in med.items()))
        if args.json:
            with open(args.json, "w") as f:
                json.dump({"library": MPI.Get_library_version().split("\n")[0].strip("\0 "),
                           "cai_mpi": cai_mpi.__file__, "median_us": med, "samples_us": times}, f, indent=1)


if __name__ == "__main__":
    main()
