"""Bandwidth of a window of persistent requests against fresh ones (issue 26: are persistent request pairs slower
than ``Isend``/``Irecv`` at 1-8 MiB?). Rank 0 sends windows of 64 messages to rank 1, which acknowledges each
window: mpi4py ``Isend``/``Irecv`` per message, mpi4py ``Send_init``/``Recv_init`` (``Startall`` + ``Waitall``), and
cai_mpi channels (one per slot of the window), interleaved; each figure the median of 9 samples.

    mpiexec -n 2 python scripts/bench/persistent_bw.py
"""

from __future__ import annotations

import time
from collections.abc import Callable

import numpy as np
from mpi4py import MPI

import cai_mpi

WINDOW = 64


def measure(comm: MPI.Intracomm, n: int) -> dict[str, float]:
    """MB/s of each way at messages of ``n`` bytes (medians of 9 samples)."""
    me, peer = comm.Get_rank(), 1 - comm.Get_rank()
    src, dst = np.ones(n, np.uint8), [np.empty(n, np.uint8) for _ in range(2)]
    ack = np.zeros(1, np.uint8)
    iters = max(2, (128 << 20) // (n * WINDOW))
    sends = [comm.Send_init(src, peer, 5) for _ in range(WINDOW)] if me == 0 else []
    recvs = [comm.Recv_init(dst[k & 1], peer, 5) for k in range(WINDOW)] if me == 1 else []
    txs = [cai_mpi.send_channel(src, peer, 7 + k) for k in range(WINDOW)] if me == 0 else []
    rxs = [cai_mpi.recv_channel(peer, 7 + k, out=dst[k & 1]) for k in range(WINDOW)] if me == 1 else []

    def acknowledge() -> None:
        if me == 0:
            comm.Recv(ack, peer, 6)
        else:
            comm.Send(ack, peer, 6)

    def fresh() -> None:
        reqs = ([comm.Isend(src, peer, 5) for _ in range(WINDOW)] if me == 0
                else [comm.Irecv(dst[k & 1], peer, 5) for k in range(WINDOW)])
        MPI.Request.Waitall(reqs)
        acknowledge()

    def persistent() -> None:
        reqs = sends if me == 0 else recvs
        MPI.Prequest.Startall(reqs)
        MPI.Request.Waitall(reqs)
        acknowledge()

    def channels() -> None:
        handles = [tx.isend() for tx in txs] if me == 0 else [rx.irecv() for rx in rxs]
        for handle in handles:
            handle.wait()
        acknowledge()

    modes: dict[str, Callable[[], None]] = {"Isend/Irecv": fresh, "persistent": persistent, "channel": channels}
    rates: dict[str, list[float]] = {name: [] for name in modes}
    for run in modes.values():
        run()
        run()
    for _ in range(9):
        for name, run in modes.items():
            comm.Barrier()
            t0 = time.perf_counter()
            for _ in range(iters):
                run()
            comm.Barrier()
            rates[name].append(n * WINDOW * iters / (time.perf_counter() - t0) / 1e6)
    for req in sends + recvs:
        req.Free()
    for ch in txs + rxs:
        ch.close()
    return {name: float(np.median(v)) for name, v in rates.items()}


def main() -> None:
    comm = MPI.COMM_WORLD
    rows = []
    for n in (1 << 20, 2 << 20, 4 << 20, 8 << 20):
        mid = measure(comm, n)
        base = mid["Isend/Irecv"]
        rows.append(f"{n >> 20:>4} MiB {base:12.0f} {mid['persistent']:12.0f} {mid['channel']:12.0f} "
                    f"{mid['persistent'] / base:10.2f}x {mid['channel'] / base:8.2f}x")
    if comm.Get_rank() == 0:
        print(f"# 2 ranks, {MPI.Get_library_version().splitlines()[0].strip(chr(0))[:60]}; MB/s, medians of 9 samples")
        print(f"{'size':>8} {'Isend/Irecv':>12} {'persistent':>12} {'channel':>12} {'pers/fresh':>11} "
              f"{'chan/fresh':>9}")
        print("\n".join(rows))


if __name__ == "__main__":
    main()
