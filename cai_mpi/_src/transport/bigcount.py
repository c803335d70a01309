"""MPI's collectives on contiguous payload bytes, whatever their size.

Counts and displacements of MPI's collectives are C ints: a piece over 2**31-1 bytes cannot be described
in bytes on an MPI without large-count calls. ``bcast`` then splits the piece, ``reduce`` splits it by
elements, and the v-collectives become ``Alltoallw`` over datatypes that each describe one piece at its
absolute address (``MPI.BOTTOM``), however large. Each MPI call is a step of the collective call (``Joined``): bounded
by its deadline when it has one.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from mpi4py import MPI

from .pieces import BYTE, chunks, raw

if TYPE_CHECKING:
    from .agreement import Joined

__all__ = ["INT_MAX", "allgatherv", "alltoallw", "bcast", "gatherv", "reduce"]

INT_MAX = 2**31 - 1
_GIB = 1 << 30


def bcast(steps: Joined, address: int, nbytes: int, root: int, max_message: int) -> None:
    """Broadcast ``nbytes`` at ``address`` (the root's bytes, everyone else's landing) in messages of at most
    ``max_message`` bytes."""
    for off, n in chunks(nbytes, max_message):
        if n:
            steps("Bcast", raw(address + off, n), root)


def reduce(
    steps: Joined, send: int, recv: int, count: int, datatype: MPI.Datatype, op: MPI.Op, root: int | None,
    max_message: int,
) -> None:
    """Reduce ``count`` elements at ``send`` into ``recv`` (at ``root``; everywhere when ``root`` is None), in
    pieces of at most ``max_message`` bytes and 2**31-1 elements. ``send == recv`` reduces in place."""
    size = datatype.Get_size()
    step = max(1, min(max_message // size, INT_MAX))
    rank = steps.comm.Get_rank()
    for first in range(0, count, step):
        n = min(step, count - first)
        off = first * size
        out = [MPI.buffer.fromaddress(recv + off, n * size), n, datatype]
        if send == recv and (root is None or rank == root):
            src: Any = MPI.IN_PLACE
        else:
            src = [MPI.buffer.fromaddress(send + off, n * size, readonly=True), n, datatype]
        if root is None:
            steps("Allreduce", src, out, op)
        else:
            steps("Reduce", src, out if rank == root else None, op, root)


def _segment(address: int, nbytes: int) -> MPI.Datatype:
    """A committed datatype for ``nbytes`` bytes at absolute ``address`` (use with MPI.BOTTOM), any size."""
    whole, rest = divmod(nbytes, _GIB)
    if whole == 0:
        t = MPI.Datatype.Create_struct([rest], [address], [BYTE])
    else:
        gib = BYTE.Create_contiguous(_GIB)
        t = MPI.Datatype.Create_struct([whole, rest], [address, address + whole * _GIB], [gib, BYTE])
        gib.Free()
    t.Commit()
    return t


def alltoallw(
    steps: Joined, sends: Sequence[tuple[int, int] | None], recvs: Sequence[tuple[int, int] | None]
) -> None:
    """Every rank sends piece ``sends[p]`` (``(address, nbytes)``, or None) to rank p and receives ``recvs[p]``
    from it: one ``Alltoallw`` over pieces at their absolute addresses."""
    types: list[MPI.Datatype] = []

    def spec(pieces: Sequence[tuple[int, int] | None]) -> list[Any]:
        counts, dtypes = [], []
        for piece in pieces:
            if piece is None or piece[1] == 0:
                counts.append(0)
                dtypes.append(BYTE)
            else:
                t = _segment(*piece)
                types.append(t)
                counts.append(1)
                dtypes.append(t)
        return [MPI.BOTTOM, counts, [0] * len(counts), dtypes]

    try:
        steps("Alltoallw", spec(sends), spec(recvs))
    finally:
        for t in types:
            t.Free()


def _each(address: int, nbytes: int, size: int) -> list[Any]:
    """A receive spec of ``size`` pieces of ``nbytes`` back to back at ``address`` (the count is per rank)."""
    return [MPI.buffer.fromaddress(address, nbytes * size), nbytes, BYTE]


def gatherv(
    steps: Joined, send: tuple[int, int], recv: tuple[int, Sequence[int], Sequence[int]] | None, root: int,
    *, small: bool, regular: bool = False,
) -> None:
    """Gather every rank's ``send`` piece at ``root`` into ``recv``: ``(address, counts, displacements)``.

    ``small``: every count and displacement of every rank fits a C int; ``regular``: besides, every piece has the
    same size and follows the one before (``Gather``, not ``Gatherv``). All ranks must pass the same.
    """
    rank, size = steps.comm.Get_rank(), steps.comm.Get_size()
    if not small:
        pieces: list[tuple[int, int] | None] = [None] * size
        pieces[root] = send
        landing = [None] * size if recv is None else [(recv[0] + d, c) for c, d in zip(recv[1], recv[2], strict=True)]
        alltoallw(steps, pieces, landing)
        return
    if regular:  # every piece the same size, back to back: MPI's Gather (no v)
        out = None if rank != root or recv is None else _each(recv[0], send[1], size)
        steps("Gather", raw(send[0], send[1], readonly=True), out, root)
        return
    out = None if rank != root or recv is None else [MPI.buffer.fromaddress(recv[0], max(recv[2][-1] + recv[1][-1], 1)),
                                                       (list(recv[1]), list(recv[2])), BYTE]
    steps("Gatherv", raw(send[0], send[1], readonly=True), out, root)


def allgatherv(
    steps: Joined, send: tuple[int, int], recv: tuple[int, Sequence[int], Sequence[int]], *, small: bool,
    regular: bool = False,
) -> None:
    """Every rank's ``send`` piece, everywhere, into ``recv``: ``(address, counts, displacements)``; ``small`` and
    ``regular`` as for ``gatherv``."""
    if not small:
        size = steps.comm.Get_size()
        alltoallw(steps, [send] * size, [(recv[0] + d, c) for c, d in zip(recv[1], recv[2], strict=True)])
        return
    if regular:
        steps("Allgather", raw(send[0], send[1], readonly=True), _each(recv[0], send[1], steps.comm.Get_size()))
        return
    end = max(recv[2][-1] + recv[1][-1], 1)
    steps("Allgatherv", raw(send[0], send[1], readonly=True),
                    [MPI.buffer.fromaddress(recv[0], end), (list(recv[1]), list(recv[2])), BYTE])
