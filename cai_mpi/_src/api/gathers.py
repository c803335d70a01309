"""Shape-free gathers: gather and allgather, of arrays whose shapes and dtypes may differ from rank to rank.

A vote (``transport.agreement``) on the operation, its root and each rank's description comes first, so a rank
that names another root, or cannot contribute, is an error on every rank. Every rank's description travels only
when they differ (alike, every rank already knows them all: its own); then MPI's Gather/Allgather (or their
v-forms, large-count where needed) move the pieces back to back into one buffer (``transport.contiguous``). A
gather like the last one of its kind on the communicator posts its payload collective with the vote (one round);
an allgather like the last one is one MPI call, with no vote: each rank's payload carries its ballot's words, and
every rank reads every rank's (``_one_round``).
"""

from __future__ import annotations

import ctypes
from collections.abc import Sequence
from typing import Any

import numpy as np
from mpi4py import MPI

from ..arrays.array import Array
from ..arrays.operands import send_source
from ..core.header import MessageInfo
from ..runtime.base import Runtime
from ..transport.agreement import (
    NOBODY,
    SPECULATE_BYTES,
    WORD_BYTES,
    WORDS,
    Ballot,
    Contribution,
    Joined,
    described,
    read,
    vote,
)
from ..transport.bigcount import INT_MAX, allgatherv, gatherv
from ..transport.contiguous import ALIGN, Gathered, Outgoing, host_block, host_pieces, outgoing
from ..transport.engine import Call, steady, verdict
from ..transport.pieces import counted, host_address
from ..transport.privcomm import PrivateComms
from ..transport.signature import Signature
from .collective_call import NO_TAG, bytes_at, checked_root, common_fingerprint, setup
from .validation import check_sync

__all__ = ["allgather_array", "gather_array"]

def _contribute(fn: str, obj: Any, sync: Any, rt: Runtime) -> tuple[Contribution, int]:
    """This rank's contribution and its own fingerprint (``NOBODY`` when it has none)."""
    try:
        src = send_source(fn, obj, check_sync(fn, sync), rt)
        blob, own = described(src)
    except Exception as exc:
        return Contribution.failed(exc), NOBODY
    return Contribution(blob, src), own


def _small(sizes: Any, infos: Sequence[MessageInfo]) -> bool:
    """Do all counts and displacements of a v-collective over these pieces fit C ints?"""
    total = sum(-(-int(n) // 64) * 64 for n in sizes)
    return total <= INT_MAX and all(int(n) <= INT_MAX for n in sizes)


def _regular(sizes: Sequence[int]) -> bool:
    """Are the pieces all one size, each right after the one before in a ``Gathered`` buffer? Then MPI's
    ``Gather``/``Allgather`` take them (as fast as MPI gathers arrays of known shape) instead of the v-forms."""
    return sizes[0] > 0 and sizes[0] % ALIGN == 0 and all(n == sizes[0] for n in sizes)


def _gather_call(comm: MPI.Comm, send: Any, recv: Any, n: int, root: int | None) -> tuple[str, tuple[Any, ...]]:
    """MPI's Gather (at ``root``) or Allgather (``root`` None) of ``n`` bytes per rank into ``recv`` (pieces back to
    back; None off the root): its name and its arguments."""
    out = None if recv is None else counted(recv, n, MPI.BYTE, comm.Get_size())
    if root is None:
        return "Allgather", (counted(send, n, MPI.BYTE), out)
    return "Gather", (counted(send, n, MPI.BYTE), out, root)


def _sending(src: Any, rt: Runtime, pc: PrivateComms) -> tuple[Any, Outgoing | None]:
    """This rank's bytes as a buffer MPI takes: a C-ordered host array itself, else its piece (staged or packed)."""
    if isinstance(src, np.ndarray) and src.flags.c_contiguous:
        return src, None
    piece = outgoing(src, rt, direct=pc.aware.aware)
    return bytes_at(piece.address, piece.nbytes, readonly=True), piece


def _record(nbytes: int) -> int:
    """Bytes per rank of an allgather's steady state: the payload, then (8-aligned) the ballot's words."""
    return -(-nbytes // 8) * 8 + 8 * WORDS


def _one_round(fn: str, pc: PrivateComms, mine: Contribution, common: int, own: int, sig: Signature, due: Any,
               rt: Runtime, ordinal: int | None) -> list[Array] | Ballot:
    """allgather's steady state, the gather form of ``engine.steady``: one Allgather of a record per rank, shaped by
    the last agreed signature: this rank's payload (when its call is the agreed one; nothing usable otherwise), then
    its ballot's words. Every rank then holds every rank's words, so each reads the vote's verdict from the same
    bytes without a vote. The Arrays when every rank's call was the agreed one (host results are views of the one
    buffer); else the Ballot that the vote would have made, its verdict tallied from the words."""
    comm = pc.header
    me, size = comm.Get_rank(), comm.Get_size()
    n, record = sig.nbytes, _record(sig.nbytes)
    at = record - WORD_BYTES.size  # (where the words start in a record)
    total = record * size
    agreed = common == sig.common and own == sig.own and mine.error is None
    words = sig.words if agreed else WORD_BYTES.pack(common, own, int(mine.error is not None))
    # Host memory whatever the data's: the words are read here, and device results are copied from it
    place = None if ordinal is None else Gathered([sig.described()] * size, ordinal, rt, direct=False, packed=True,
                                                  stride=record)
    block = host_block(total) if place is None else np.frombuffer(bytes_at(place.address, total), np.uint8)
    here = me * record  # (this rank's record)
    if n and agreed:
        src = mine.source
        if isinstance(src, np.ndarray) and src.flags.c_contiguous:
            block[here : here + n] = src.reshape(-1).view(np.uint8)
        else:
            piece = outgoing(src, rt, direct=False)  # (in wire order: F-contiguous stays so, as described)
            ctypes.memmove(host_address(block) + here, piece.address, n)
            piece.release()
    memoryview(block)[here + at : here + record] = words  # type: ignore[arg-type]  # (numpy's arrays are buffers)
    Joined(fn, pc, due, keep=(place, block))("Allgather", MPI.IN_PLACE, counted(block, record, MPI.BYTE, size))
    if np.ndarray((size, WORD_BYTES.size), np.uint8, block, at, (record, 1)).tobytes() == sig.words * size:
        # (every rank's words are the agreed ones: what ``ballot.matches`` reads)
        if place is not None:
            return place.finish(rt, NO_TAG)
        return host_pieces(block, [sig.described()] * size, range(0, total, record), NO_TAG)
    ballot = Ballot(common, own, failed=mine.error is not None)
    ballot.tally(np.ndarray((size, WORDS), np.int64, block, at, (record, 8)))
    if place is not None:
        place.discard(rt)
    return ballot


class _Mine:
    """This rank's buffers of a steady-state gather whose call is the agreed one: what it sends (``send``; its
    ``piece`` when staged or packed) and, on a gathering rank, where every piece lands (``place``)."""

    __slots__ = ("piece", "place", "rt", "send")

    def __init__(self, send: Any, piece: Outgoing | None, place: Gathered | None, rt: Runtime) -> None:
        self.send, self.piece, self.place, self.rt = send, piece, place, rt

    def release(self) -> None:
        if self.piece is not None:
            self.piece.release()
        if self.place is not None:
            self.place.finish(self.rt, NO_TAG)  # (discarded: the staging given back)


def _calls(sig: Signature, mine: _Mine | None, comm: MPI.Comm) -> list[Call]:
    """The steady state's Gather or Allgather of ``sig``: from and into ``mine``, or scratch of its sizes."""
    n, root = sig.nbytes, None if sig.root == -1 else sig.root
    if not n:
        return []
    if mine is None:
        gets = root is None or comm.Get_rank() == root
        return [_gather_call(comm, np.empty(n, np.uint8), np.empty(n * comm.Get_size(), np.uint8) if gets else None,
                             n, root)]
    place = mine.place
    return [_gather_call(comm, mine.send, None if place is None else bytes_at(place.address, n * comm.Get_size()),
                         n, root)]


def _gathered(fn: str, pc: PrivateComms, mine: Contribution, own: int, root: int | None, due: Any, rt: Runtime,
              max_message: int) -> list[Array] | None:
    """gather (at ``root``) or allgather (``root`` None) of every rank's contribution: the vote (with the payloads
    of the last agreed signature, in the steady state), then the payloads."""
    comm = pc.header
    assert isinstance(comm, MPI.Intracomm)
    me, size = comm.Get_rank(), comm.Get_size()
    common = common_fingerprint(fn, -1 if root is None else root)
    gets = root is None or me == root
    ordinal = rt.current_device() if gets else None
    sig = pc.agreed.get(fn)
    if sig is not None and sig.root == -1 and not pc.aware.aware and sig.nbytes <= SPECULATE_BYTES \
            and _record(sig.nbytes) * size <= INT_MAX:
        # (the records are host memory: a CUDA-aware MPI, agreed on by every rank, keeps a device payload's direct
        # route below, with its vote)
        got = _one_round(fn, pc, mine, common, own, sig, due, rt, ordinal)
        if not isinstance(got, Ballot):
            return got
        ballot = got
    else:
        ballot = Ballot(common, own, failed=mine.error is not None)
        if sig is not None and sig.nbytes <= SPECULATE_BYTES and sig.nbytes * size <= INT_MAX:
            # The steady state of a gather (and of an allgather on a CUDA-aware MPI): ``engine.steady``
            ours = None
            if common == sig.common and own == sig.own:
                place = Gathered([sig.described()] * size, ordinal, rt, direct=pc.aware.aware, packed=True) \
                    if sig.root == -1 or me == sig.root else None
                ours = _Mine(*_sending(mine.source, rt, pc), place, rt)
            ours = steady(fn, pc, ballot, due, sig, ours, _calls)
            if ours is not None:
                if ours.piece is not None:
                    ours.piece.release()
                return None if ours.place is None else ours.place.finish(rt, NO_TAG)
        else:
            vote(fn, pc, ballot, due)
    steps = verdict(fn, pc, ballot, due, f"root={root}", mine.error, "every rank must name the same root")
    if sig is not None and ballot.matches(sig.head):  # the call the last one agreed on (large: the vote went first)
        infos = [sig.described()] * size
    elif ballot.alike:  # every rank described what this one did: the pieces go back to back
        info = read(mine.blob)
        assert isinstance(info, MessageInfo)
        infos = [info] * size
        pc.agreed[fn] = Signature(common, own, info=info, root=-1 if root is None else root)
    else:  # descriptions differ: they travel (every rank needs the sizes), and nothing is remembered
        infos = [info for info in map(read, steps.allgather(mine.blob)) if isinstance(info, MessageInfo)]
        pc.agreed.pop(fn, None)
    sizes = [i.payload_nbytes for i in infos]
    packed = ballot.alike and 0 < sizes[0] <= INT_MAX and sizes[0] * size <= max_message
    place = Gathered(infos, ordinal, rt, direct=pc.aware.aware, packed=packed) if gets else None
    send, piece = _sending(mine.source, rt, pc)
    steps.keep = (place, piece)
    if packed:
        name, args = _gather_call(comm, send, None if place is None else bytes_at(place.address, sizes[0] * size),
                                  sizes[0], root)
        steps(name, *args)
    elif any(sizes):
        address = piece.address if piece is not None else int(send.ctypes.data)
        recv = None if place is None else (place.address, sizes, place.displacements)
        if root is None:
            assert recv is not None
            allgatherv(steps, (address, sizes[me]), recv, small=_small(sizes, infos), regular=_regular(sizes))
        else:
            gatherv(steps, (address, sizes[me]), recv, root, small=_small(sizes, infos), regular=_regular(sizes))
    if piece is not None:
        piece.release()
    return None if place is None else place.finish(rt, NO_TAG)


def gather_array(
    obj: Any, root: int = 0, comm: MPI.Comm | None = None, *, sync: bool | None = None, timeout: float | None = None
) -> list[Array] | None:
    """Gather every rank's array at ``root``; shapes and dtypes may differ from rank to rank.

    Args:
        obj: this rank's contribution: anything ``send_array`` takes.
        root: the gathering rank; every rank names the same.
        comm: None for COMM_WORLD; any intracommunicator (its first use is collective).
        sync: None follows ``CAI_MPI_SYNC`` (default on); False skips the synchronization of this rank's
            producer stream.
        timeout: seconds to wait at most for every rank to join (None: ``CAI_MPI_TIMEOUT``, off by default).

    Returns:
        On the root, one Array per rank in rank order (``source`` is the rank; on its GPU when the root has
        one, else in host memory); None elsewhere.

    Raises:
        CollectiveMismatchError: on every rank, when the ranks name different roots, or some rank could not
            contribute (that rank raises its own error).
        TimeoutError: some rank did not join within ``timeout`` (the collectives of ``comm`` are then out of
            step: later ones on it raise ``CollectiveMismatchError``).
    """
    fn = "gather_array"
    pc, _comm, _none, rt, cfg, due = setup(fn, comm, None, timeout)
    root, bad_root = checked_root(fn, root, pc)
    mine, own = _contribute(fn, obj, sync, rt) if bad_root is None else (Contribution.failed(bad_root), NOBODY)
    return _gathered(fn, pc, mine, own, root, due, rt, cfg.max_message_bytes)


def allgather_array(
    obj: Any, comm: MPI.Comm | None = None, *, sync: bool | None = None, timeout: float | None = None
) -> list[Array]:
    """Every rank's array, on every rank; shapes and dtypes may differ from rank to rank.

    Args:
        obj: this rank's contribution: anything ``send_array`` takes.
        comm: None for COMM_WORLD; any intracommunicator (its first use is collective).
        sync: None follows ``CAI_MPI_SYNC`` (default on); False skips the synchronization of this rank's
            producer stream.
        timeout: seconds to wait at most for every rank to join (None: ``CAI_MPI_TIMEOUT``, off by default).

    Returns:
        One Array per rank in rank order (``source`` is the rank), on this rank's GPU when it has one.

    Raises:
        CollectiveMismatchError: on every rank, when some rank could not contribute (that rank raises its
            own error).
        TimeoutError: some rank did not join within ``timeout`` (the collectives of ``comm`` are then out of
            step: later ones on it raise ``CollectiveMismatchError``).
    """
    fn = "allgather_array"
    pc, _comm, _root, rt, cfg, due = setup(fn, comm, None, timeout)
    got = _gathered(fn, pc, *_contribute(fn, obj, sync, rt), None, due, rt, cfg.max_message_bytes)
    assert got is not None
    return got
