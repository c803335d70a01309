"""Halo exchange on a 2-D non-periodic Cartesian grid of ranks, with Fortran-ordered fields.

Each rank holds a block of a global field plus one layer of ghost cells, and fills its ghost faces
with its neighbours' edge faces, as HPC codes do: post a receive into each ghost face
(``irecv_array(out=)``, a strided view: no copies, no shapes exchanged), send each edge face
(``isend_array``), then ``waitall``. At the edges of the grid ``Cart.Shift`` returns
``MPI.PROC_NULL``: nothing is sent there, and the ghost face is left as it was (the wall value), as
MPI does.

Run:  mpiexec -n 4 python examples/halo_exchange.py
      mpiexec -n 4 python examples/halo_exchange.py --bench [--json halo.json]

A code that exchanges the same faces every step can open persistent channels once instead
(``HaloChannels``): the faces are described by the first exchange, and each later one moves only the
data, at nearly MPI's own cost. A channel takes ``PROC_NULL`` as MPI's persistent requests do, so the
walls need no special case there either. A strided face goes through a contiguous buffer there, as
hand-written mpi4py does.

``--bench`` times both forms against hand-written mpi4py that knows every shape (``Irecv`` into
contiguous buffers copied into the ghost faces, ``Isend`` of contiguous copies of the edge faces,
``Waitall``), side by side in one run: the median of ``--samples`` interleaved samples of ``--iters``
exchanges each, per face size; rank 0 prints the table.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from typing import Any

import numpy as np
from mpi4py import MPI

import cai_mpi

WALL = -1.0  # what a ghost face at the edge of the grid keeps
THIN = 8  # --bench: interior cells along axis 0


def block(rank: int, nx: int, ny: int) -> np.ndarray[Any, Any]:
    """The interior of ``rank``'s block: values that say whose they are and where (exact in float64)."""
    return rank * 1_000_000.0 + np.arange(nx * ny, dtype=np.float64).reshape(nx, ny, order="F")


def _faces(axis: int) -> tuple[tuple[slice | int, ...], ...]:
    """Across ``axis``: (my first edge, my last edge, my lower ghost face, my upper ghost face)."""
    first, last, ghost_lo, ghost_hi = ([slice(1, -1), slice(1, -1)] for _ in range(4))
    first[axis], last[axis], ghost_lo[axis], ghost_hi[axis] = 1, -2, 0, -1
    return tuple(first), tuple(last), tuple(ghost_lo), tuple(ghost_hi)


def exchange(cart: MPI.Cartcomm, field: np.ndarray[Any, Any]) -> list[int]:
    """Fill ``field``'s ghost faces from the neighbours; returns the four neighbours (PROC_NULL at a wall)."""
    neighbours, recvs, sends = [], [], []
    for axis in (0, 1):
        lower, upper = cart.Shift(axis, 1)  # (source, dest) of a shift towards higher coordinates
        first, last, ghost_lo, ghost_hi = _faces(axis)  # (Fortran order: axis 0's faces strided, axis 1's not)
        recvs += [cai_mpi.irecv_array(lower, 2 * axis, cart, out=field[ghost_lo]),
                  cai_mpi.irecv_array(upper, 2 * axis + 1, cart, out=field[ghost_hi])]
        sends += [cai_mpi.isend_array(field[last], upper, 2 * axis, cart),
                  cai_mpi.isend_array(field[first], lower, 2 * axis + 1, cart)]
        neighbours += [lower, upper]
    cai_mpi.waitall(recvs + sends)
    return neighbours


class HaloChannels:
    """The same exchange over persistent channels, opened once for ``field`` (its faces' memory stays bound to them):
    ``exchange()`` fills the ghost faces with the neighbours' edges as they are now. At a wall the channels' peer is
    ``PROC_NULL``: nothing is sent there, and nothing comes (the ghost face keeps its value). A strided face goes
    through a contiguous buffer on both sides, as in hand-written mpi4py (MPI's derived datatypes are slow on some
    MPIs)."""

    def __init__(self, cart: MPI.Cartcomm, field: np.ndarray[Any, Any]) -> None:
        self.neighbours: list[int] = []
        self.receivers: list[cai_mpi.RecvChannel] = []
        self.senders: list[cai_mpi.SendChannel] = []
        self.packs: list[tuple[np.ndarray[Any, Any], np.ndarray[Any, Any]]] = []  # (buffer, strided edge)
        self.unpacks: list[tuple[int, np.ndarray[Any, Any], np.ndarray[Any, Any]]] = []  # (receiver, ghost, buffer)
        for axis in (0, 1):
            lower, upper = cart.Shift(axis, 1)
            first, last, ghost_lo, ghost_hi = _faces(axis)
            for peer, tag, ghost in ((lower, 2 * axis, field[ghost_lo]), (upper, 2 * axis + 1, field[ghost_hi])):
                into = _contiguous(ghost)
                if into is not ghost:
                    self.unpacks.append((len(self.receivers), ghost, into))
                self.receivers.append(cai_mpi.recv_channel(peer, tag, cart, out=into))
            for peer, tag, edge in ((upper, 2 * axis, field[last]), (lower, 2 * axis + 1, field[first])):
                sent = _contiguous(edge)
                if sent is not edge:
                    self.packs.append((sent, edge))
                self.senders.append(cai_mpi.send_channel(sent, peer, tag, cart))
            self.neighbours += [lower, upper]

    def exchange(self) -> list[int]:
        recvs = [rx.irecv() for rx in self.receivers]
        for buf, edge in self.packs:
            buf[...] = edge
        got = cai_mpi.waitall(recvs + [tx.isend() for tx in self.senders])
        for i, ghost, buf in self.unpacks:
            if got[i].source != MPI.PROC_NULL:  # (from a wall nothing came: the buffer holds nothing)
                ghost[...] = buf
        return self.neighbours

    def close(self) -> None:
        for end in (*self.receivers, *self.senders):
            end.close()


def _contiguous(face: np.ndarray[Any, Any]) -> np.ndarray[Any, Any]:
    """``face`` itself, or a contiguous buffer for it (copied from it before each send, into it after each receive)."""
    return face if face.flags.c_contiguous else np.empty(face.shape, face.dtype)


def exchange_raw(cart: MPI.Cartcomm, field: np.ndarray[Any, Any], bufs: list[np.ndarray[Any, Any]]) -> None:
    """The same exchange in hand-written mpi4py, every shape known: contiguous buffers for the faces."""
    reqs, landings = [], []
    for axis in (0, 1):
        lower, upper = cart.Shift(axis, 1)
        first, last, ghost_lo, ghost_hi = _faces(axis)
        into_lo, into_hi, out_hi, out_lo = bufs[4 * axis : 4 * axis + 4]
        reqs += [cart.Irecv(into_lo, lower, 2 * axis), cart.Irecv(into_hi, upper, 2 * axis + 1)]
        out_hi[...] = field[last]
        out_lo[...] = field[first]
        reqs += [cart.Isend(out_hi, upper, 2 * axis), cart.Isend(out_lo, lower, 2 * axis + 1)]
        landings += [(ghost_lo, into_lo, lower), (ghost_hi, into_hi, upper)]
    MPI.Request.Waitall(reqs)
    for ghost, buf, peer in landings:
        if peer != MPI.PROC_NULL:
            field[ghost] = buf


def check(field: np.ndarray[Any, Any], neighbours: list[int], nx: int, ny: int) -> bool:
    """Each ghost face holds the neighbour's facing edge, or WALL where there is no neighbour."""
    x_lo, x_hi, y_lo, y_hi = neighbours
    faces = [
        (field[0, 1:-1], x_lo, lambda b: b[-1, :]), (field[-1, 1:-1], x_hi, lambda b: b[0, :]),
        (field[1:-1, 0], y_lo, lambda b: b[:, -1]), (field[1:-1, -1], y_hi, lambda b: b[:, 0]),
    ]
    ok = True
    for ghost, peer, edge in faces:
        want = np.full(ghost.shape, WALL) if peer == MPI.PROC_NULL else edge(block(peer, nx, ny))
        ok &= bool(np.array_equal(ghost, want))
    return ok


def bench(cart: MPI.Cartcomm, sizes: list[int], iters: int, samples: int) -> list[dict[str, Any]]:
    """Per face size (cells): the median time of one exchange, cai_mpi's one-shot calls, its channels and raw
    mpi4py, sampled alternately."""
    rows = []
    for n in sizes:
        # THIN x n interior cells: the faces across axis 0 (strided rows, in Fortran order) are n cells, those across
        # axis 1 (contiguous columns) THIN cells; a 2-rank grid (2 x 1) exchanges the n-cell rows.
        field = np.full((THIN + 2, n + 2), WALL, order="F")
        bufs = [np.empty(n if i < 4 else THIN) for i in range(8)]
        channels = HaloChannels(cart, field)
        times: dict[str, list[float]] = {"cai": [], "channels": [], "raw": []}
        runs = {"cai": lambda f=field: exchange(cart, f), "channels": channels.exchange,
                "raw": lambda f=field, b=bufs: exchange_raw(cart, f, b)}
        for run in runs.values():  # warm-up: first messages, pools, caches
            for _ in range(max(iters // 10, 2)):
                run()
        for _ in range(samples):
            for name, run in runs.items():
                cart.Barrier()
                start = time.perf_counter()
                for _ in range(iters):
                    run()
                times[name].append((time.perf_counter() - start) / iters)
        channels.close()
        # every rank's exchange ends when its slowest neighbour's does: report the slowest rank's median
        cai, chan, raw = (cart.allreduce(statistics.median(times[k]), op=MPI.MAX) for k in ("cai", "channels", "raw"))
        rows.append({"face_bytes": 8 * n, "cai_us": cai * 1e6, "channels_us": chan * 1e6, "raw_us": raw * 1e6,
                     "ratio": cai / raw, "channels_ratio": chan / raw, "raw_per_cai_throughput": raw / cai,
                     "raw_per_channels_throughput": raw / chan})
    return rows


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--nx", type=int, default=96, help="interior cells per rank along axis 0")
    parser.add_argument("--ny", type=int, default=64, help="interior cells per rank along axis 1")
    parser.add_argument("--bench", action="store_true", help="time the exchange against hand-written mpi4py")
    parser.add_argument("--sizes", default="1024,131072", help="--bench: cells per face (8 KiB and 1 MiB faces)")
    parser.add_argument("--iters", type=int, default=50, help="--bench: exchanges per sample")
    parser.add_argument("--samples", type=int, default=7, help="--bench: interleaved samples per size")
    parser.add_argument("--json", help="--bench: write the table here as JSON")
    args = parser.parse_args()
    world = MPI.COMM_WORLD
    dims = MPI.Compute_dims(world.Get_size(), 2)
    cart = world.Create_cart(dims, periods=[False, False], reorder=False)
    rank = cart.Get_rank()
    field = np.full((args.nx + 2, args.ny + 2), WALL, order="F")  # one ghost layer around the interior
    field[1:-1, 1:-1] = block(rank, args.nx, args.ny)
    neighbours = exchange(cart, field)
    ok = check(field, neighbours, args.nx, args.ny)
    channels = HaloChannels(cart, field)
    for _ in range(2):  # again over channels: the first exchange carries the description, the second only the data
        field[[0, -1], :] = field[:, [0, -1]] = WALL  # (the ghost faces as they were first)
        ok &= channels.exchange() == neighbours and check(field, neighbours, args.nx, args.ny)
    channels.close()
    walls = sum(peer == MPI.PROC_NULL for peer in neighbours)
    print(f"rank {rank} at {tuple(cart.Get_coords(rank))} of {tuple(dims)}: {4 - walls} neighbours, "
          f"{walls} walls: {'ok' if ok else 'WRONG'}", flush=True)
    failed = cart.allreduce(int(not ok))
    if args.bench and not failed:
        rows = bench(cart, [int(n) for n in args.sizes.split(",")], args.iters, args.samples)
        if rank == 0:
            print(f"# halo exchange, {cart.Get_size()} ranks on a {dims[0]} x {dims[1]} grid ({THIN} x n cells per "
                  f"rank: faces of n cells across axis 0, strided), median of {args.samples} interleaved samples of "
                  f"{args.iters} exchanges (slowest rank)")
            print(f"{'face bytes':>12} {'cai_mpi (us)':>14} {'channels (us)':>15} {'mpi4py (us)':>13} "
                  f"{'cai / raw':>10} {'channels / raw':>15}")
            for r in rows:
                print(f"{r['face_bytes']:>12} {r['cai_us']:>14.1f} {r['channels_us']:>15.1f} {r['raw_us']:>13.1f} "
                      f"{r['ratio']:>9.2f}x {r['channels_ratio']:>14.2f}x")
            if args.json:
                with open(args.json, "w") as f:
                    json.dump({"ranks": cart.Get_size(), "dims": dims, "samples": args.samples,
                               "iters": args.iters, "rows": rows}, f, indent=1)
    cart.Free()
    return 0 if failed == 0 else 1


if __name__ == "__main__":
    cai_mpi.abort_on_error()  # an exception on one rank ends the job, with its traceback, instead of a hang
    sys.exit(main())
