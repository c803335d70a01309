"""The shape-free broadcast: ``bcast_array``.

It starts with a vote (``transport.agreement``: one small Allreduce whatever the number of ranks) on what every
rank must share (the operation and its root), so a rank that names another root, or cannot take part, is an error
on every rank. The root's description (with its meta, and its payload when it fits) travels in one slot; a larger
payload follows in MPI's own ``Bcast`` as one contiguous piece (``transport.contiguous``) on cai_mpi's private
duplicate of ``comm``. A bcast like the last one on the communicator is one round (``transport.engine``): up to a small
slot, one collective (the vote's, carrying the root's bytes); above it, its payload collective posted with the
vote. Scatter and alltoall are ``scatters.py``, gathers ``gathers.py``.
"""

from __future__ import annotations

import copy
import ctypes
from typing import Any

import numpy as np
from mpi4py import MPI

from ..arrays.array import Array
from ..arrays.operands import DeviceSource, send_source
from ..errors import CollectiveMismatchError
from ..runtime.base import Runtime
from ..transport.agreement import (
    NOBODY,
    SPECULATE_BYTES,
    Ballot,
    Contribution,
    Joined,
    described,
    vote,
)
from ..transport.bigcount import bcast
from ..transport.contiguous import Landing, Outgoing, outgoing
from ..transport.engine import SLOT_PAYLOAD_BYTES, Call, slotted, steady, verdict
from ..transport.pieces import counted
from ..transport.signature import Signature
from ..transport.slots import Exchange, broadcast
from .arrival import land, put, receiver, slot_view, source_nbytes
from .collective_call import NO_TAG, bytes_at, checked_root, common_fingerprint, setup
from .validation import check_meta, check_sync

__all__ = ["bcast_array"]


def _own_array(src: np.ndarray[Any, Any] | DeviceSource, owner: Any, rank: int, meta: dict[str, Any] | None) -> Array:
    """An Array viewing a rank's own data (no copy)."""
    if isinstance(src, np.ndarray):
        return Array.over_host(src, rank, NO_TAG, meta, owner)
    return Array(src.desc.replace(stream=None), device=src.ordinal, owner=src.owner, source=rank, tag=NO_TAG,
                 meta=meta)


def bcast_array(
    obj: Any = None, root: int = 0, comm: MPI.Comm | None = None, *, out: Any = None, sync: bool | None = None,
    meta: dict[str, Any] | None = None, timeout: float | None = None,
) -> Array:
    """Broadcast ``obj`` from ``root`` to every rank of ``comm``; non-roots need no shape or dtype.

    Args:
        obj: on the root, anything ``send_array`` takes; ignored elsewhere.
        root: the broadcasting rank; every rank names the same.
        comm: None for COMM_WORLD; any intracommunicator (its first use is collective).
        out: on a non-root, a buffer to receive into (checked against what the root sends).
        sync: the root's stream policy, as in ``send_array``.
        timeout: seconds to wait at most for every rank to join (None: ``CAI_MPI_TIMEOUT``, off by default).
        meta: a JSON dict given on the root; every rank's Array carries it.

    Returns:
        On every rank an Array: on the root a view of its own data (no copy), elsewhere the received copy
        (over ``out=`` when given), with ``source == root``.

    Raises:
        CollectiveMismatchError: on every rank, when the ranks name different roots; on the non-roots, when the
            root could not send (the root raises its own error).
        RecvMismatchError: on a non-root whose ``out=`` does not fit (after the broadcast completed; the other
            ranks are not affected).
        TimeoutError: some rank did not join within ``timeout`` (the collectives of ``comm`` are then out of
            step: later ones on it raise ``CollectiveMismatchError``).
    """
    fn = "bcast_array"
    pc, comm_, _none, rt, cfg, due = setup(fn, comm, None, timeout)
    root, bad_root = checked_root(fn, root, pc)
    me = comm_.Get_rank()
    common = common_fingerprint(fn, root)
    mine = Contribution(b"") if bad_root is None else Contribution.failed(bad_root)
    own = NOBODY
    if me == root:
        try:
            src = send_source(fn, obj, check_sync(fn, sync), rt)
            blob, own = described(src, check_meta(fn, meta))
            mine = Contribution(blob, src)
        except Exception as exc:
            mine = Contribution.failed(exc)
    src = mine.source
    ballot = Ballot(common, own, failed=mine.error is not None)
    sig = pc.agreed.get(fn)
    target, ordinal, trouble = receiver(fn, out, None, rt) if me != root else (None, None, None)
    ex: Exchange | None = None
    steps: Joined | None = None
    if sig is not None and sig.nbytes <= SLOT_PAYLOAD_BYTES:  # the steady state in one collective: the vote's slot
        mine_agreed = me == root == sig.root and common == sig.common and own == sig.own
        slot = slotted(fn, pc, ballot, due, sig, _slot_bytes(src, sig, rt) if mine_agreed else None)
        if slot is not None:
            info = sig.fresh_info()
            ex = Exchange(np.frombuffer(slot, np.uint8), [info], [sig.nbytes], [0], True)
    elif sig is not None and sig.nbytes <= SPECULATE_BYTES:
        ours = None  # (the steady state: ``engine.steady``, the root's data or this rank's landing when its call
        if common == sig.common:  # is the agreed one)
            if me != sig.root:
                landing, spec_trouble = land(fn, sig.fresh_info(), target, ordinal, trouble, root, pc, rt, True)
                ours = _Bcasting(bytes_at(landing.address, landing.nbytes), None, landing, spec_trouble)
            elif own == sig.own:
                ours = _Bcasting(src, None) if isinstance(src, np.ndarray) and src.flags.c_contiguous else \
                    _Bcasting.of(outgoing(src, rt, direct=pc.aware.aware))
        ours = steady(fn, pc, ballot, due, sig, ours, _bcast_calls)
        if ours is not None:
            if ours.piece is not None:
                ours.piece.release()
            if me == root:
                return _own_array(src, obj, root, sig.fresh_info().meta)
            assert ours.landing is not None
            result = ours.landing.finish()
            if ours.trouble is not None:
                raise ours.trouble
            return result
    else:
        vote(fn, pc, ballot, due)
    if ex is not None:
        fused = True
    elif sig is not None and ballot.matches(sig.head):  # (large: the vote went first)
        steps = verdict(fn, pc, ballot, due, f"root={root}", mine.error, "every rank must name the same root",
                        failures=False)
        info = sig.fresh_info()
        fused = False
    else:
        steps = verdict(fn, pc, ballot, due, f"root={root}", mine.error, "every rank must name the same root",
                        failures=False)
        ex = broadcast(steps, root, mine, source_nbytes(mine), payload=src if isinstance(src, np.ndarray) else None)
        described_ = ex.described[0]
        if isinstance(described_, str):
            if mine.error is not None:
                raise mine.error
            raise CollectiveMismatchError(f"{fn}: the root, rank {root}, could not send: {described_}")
        info, fused = described_, ex.fused
        pc.agreed[fn] = Signature(common, ballot.own, info=info._replace(meta=copy.deepcopy(info.meta)), root=root)
    if me == root:
        if not fused:
            assert steps is not None
            piece = steps.keep = outgoing(src, rt, direct=pc.aware.aware)
            bcast(steps, piece.address, piece.nbytes, root, cfg.max_message_bytes)
            piece.release()
        return _own_array(src, obj, root, info.meta)
    if fused and target is None and ordinal is None and trouble is None:
        assert ex is not None
        return Array.over_host(slot_view(ex, 0, info), root, NO_TAG, info.meta)  # over the broadcast slot
    landing, trouble = land(fn, info, target, ordinal, trouble, root, pc, rt, due is not None and not fused)
    if fused:
        assert ex is not None
        put(landing, ex.payload(0), rt, ordinal if target is None else getattr(target, "ordinal", None))
    else:
        assert steps is not None
        steps.keep = landing
        bcast(steps, landing.address, landing.nbytes, root, cfg.max_message_bytes)
    if trouble is not None:
        raise trouble
    return landing.finish()


def _slot_bytes(src: np.ndarray[Any, Any] | DeviceSource, sig: Signature, rt: Runtime) -> bytes:
    """The root's payload in the wire order its agreed description says, as bytes for the vote's slot."""
    if isinstance(src, np.ndarray):
        return src.tobytes("F" if sig.described().fortran else "C")
    piece = outgoing(src, rt, direct=False)  # (host memory, in wire order)
    try:
        return ctypes.string_at(piece.address, piece.nbytes)
    finally:
        piece.release()


class _Bcasting:
    """This rank's buffer of a steady-state bcast whose call is the agreed one: the root's data (``buf``; its
    ``piece`` when staged or packed), or where a non-root's copy lands (``landing``, with the error of a bad
    ``out=``, ``trouble``, raised once the call is over)."""

    __slots__ = ("buf", "landing", "piece", "trouble")

    def __init__(self, buf: Any, piece: Outgoing | None, landing: Landing | None = None,
                 trouble: Exception | None = None) -> None:
        self.buf, self.piece, self.landing, self.trouble = buf, piece, landing, trouble

    @classmethod
    def of(cls, piece: Outgoing) -> _Bcasting:
        return cls(bytes_at(piece.address, piece.nbytes), piece)

    def release(self) -> None:
        if self.piece is not None:
            self.piece.release()
        if self.landing is not None:
            self.landing.discard()


def _bcast_calls(sig: Signature, ours: _Bcasting | None, comm: MPI.Comm) -> list[Call]:
    """The steady state's Bcast of ``sig``: of ``ours``, or of scratch of its size."""
    if not sig.nbytes:
        return []
    buf = np.empty(sig.nbytes, np.uint8) if ours is None else ours.buf
    return [("Bcast", (counted(buf, sig.nbytes, MPI.BYTE), sig.root))]
