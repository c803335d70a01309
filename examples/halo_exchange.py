"""Halo exchange on a 2-D non-periodic Cartesian grid of ranks, with Fortran-ordered fields.

Each rank holds a block of a global field plus one layer of ghost cells, and fills its ghost faces
with its neighbours' edge faces: ``sendrecv_array`` sends one face and receives the opposite one
straight into the ghost face (``out=``, a strided view: no copies, no shapes exchanged, no deadlock).
At the edges of the grid ``Cart.Shift`` returns ``MPI.PROC_NULL``: nothing is sent there, and the
ghost face is left as it was (the wall value), as MPI does.

Run:  mpiexec -n 4 python examples/halo_exchange.py
"""

from __future__ import annotations

import argparse
import sys
from typing import Any

import numpy as np
from mpi4py import MPI

import cai_mpi

WALL = -1.0  # what a ghost face at the edge of the grid keeps


def block(rank: int, nx: int, ny: int) -> np.ndarray[Any, Any]:
    """The interior of ``rank``'s block: values that say whose they are and where (exact in float64)."""
    return rank * 1_000_000.0 + np.arange(nx * ny, dtype=np.float64).reshape(nx, ny, order="F")


def exchange(cart: MPI.Cartcomm, field: np.ndarray[Any, Any]) -> list[int]:
    """Fill ``field``'s ghost faces from the neighbours; returns the four neighbours (PROC_NULL at a wall)."""
    neighbours = []
    for axis in (0, 1):
        lower, upper = cart.Shift(axis, 1)  # (source, dest) of a shift towards higher coordinates
        # The faces across ``axis``: in Fortran order, axis 0's are strided rows, axis 1's contiguous columns.
        first, last = [slice(1, -1)] * 2, [slice(1, -1)] * 2
        ghost_lo, ghost_hi = [slice(1, -1)] * 2, [slice(1, -1)] * 2
        first[axis], last[axis], ghost_lo[axis], ghost_hi[axis] = 1, -2, 0, -1
        # Towards higher coordinates: my last face goes up, the lower neighbour's lands in my lower ghost face.
        cai_mpi.sendrecv_array(field[tuple(last)], upper, 2 * axis, source=lower, recvtag=2 * axis,
                               comm=cart, out=field[tuple(ghost_lo)])
        # And back down.
        cai_mpi.sendrecv_array(field[tuple(first)], lower, 2 * axis + 1, source=upper, recvtag=2 * axis + 1,
                               comm=cart, out=field[tuple(ghost_hi)])
        neighbours += [lower, upper]
    return neighbours


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


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--nx", type=int, default=96, help="interior cells per rank along axis 0")
    parser.add_argument("--ny", type=int, default=64, help="interior cells per rank along axis 1")
    args = parser.parse_args()
    world = MPI.COMM_WORLD
    dims = MPI.Compute_dims(world.Get_size(), 2)
    cart = world.Create_cart(dims, periods=[False, False], reorder=False)
    rank = cart.Get_rank()
    field = np.full((args.nx + 2, args.ny + 2), WALL, order="F")  # one ghost layer around the interior
    field[1:-1, 1:-1] = block(rank, args.nx, args.ny)
    neighbours = exchange(cart, field)
    ok = check(field, neighbours, args.nx, args.ny)
    walls = sum(peer == MPI.PROC_NULL for peer in neighbours)
    print(f"rank {rank} at {tuple(cart.Get_coords(rank))} of {tuple(dims)}: {4 - walls} neighbours, "
          f"{walls} walls: {'ok' if ok else 'WRONG'}")
    failed = cart.allreduce(int(not ok))
    cart.Free()
    return 0 if failed == 0 else 1


if __name__ == "__main__":
    cai_mpi.abort_on_error()  # an exception on one rank ends the job, with its traceback, instead of a hang
    sys.exit(main())
