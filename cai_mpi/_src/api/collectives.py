"""Shape-free collectives that move data from one rank or to every rank: bcast, scatter, alltoall.

Each starts with a vote (``transport.agreement``: one small Allreduce whatever the number of ranks) on what
every rank must share (the operation and its root) and on each rank's description, so a rank that names
another root, or cannot take part, is an error on every rank. Descriptions travel only where they are needed:
the root's (with its meta) in bcast and scatter, every rank's to every rank in alltoall. Then MPI's own
collective moves every contribution as one contiguous piece (``transport.contiguous``) on cai_mpi's private
duplicate of ``comm``. A bcast like the last one on the communicator posts its payload collective with the vote
(one round). Gathers are ``gathers.py``.
"""

from __future__ import annotations

import copy
import ctypes
from collections.abc import Sequence
from typing import Any

import numpy as np
from mpi4py import MPI

from ..arrays.array import Array
from ..arrays.operands import DeviceSource, Target, describe_target, mismatch, recv_target, send_source
from ..core.header import MessageInfo
from ..errors import CollectiveMismatchError, RecvMismatchError
from ..runtime.base import Runtime
from ..transport import internal_stream
from ..transport.agreement import (
    NOBODY,
    SPECULATE_BYTES,
    Ballot,
    Contribution,
    Exchange,
    Joined,
    broadcast,
    describe_source,
    described,
    disagree,
    pack,
    raise_failures,
    read,
    reason,
    unpack,
    vote,
)
from ..transport.bigcount import alltoallw, bcast
from ..transport.contiguous import Landing, Outgoing, outgoing
from ..transport.engine import SLOT_PAYLOAD_BYTES, Call, slotted, steady, verdict
from ..transport.pieces import counted
from ..transport.privcomm import PrivateComms
from ..transport.signature import Signature
from .collective_call import NO_TAG, bytes_at, checked_root, common_fingerprint, setup
from .validation import check_meta, check_sync, receive_device

__all__ = ["alltoall_array", "bcast_array", "scatter_array"]


def _receiver(fn: str, out: Any, device: Any, rt: Runtime) -> tuple[Target | None, int | None, Exception | None]:
    """``out=`` or the default device, resolved without raising: a collective must take part whatever happens."""
    try:
        if out is not None:
            return recv_target(fn, out, rt), None, None
        return None, receive_device(fn, device, rt), None
    except Exception as exc:
        return None, None, exc


def _land(
    fn: str, info: MessageInfo, target: Target | None, ordinal: int | None, trouble: Exception | None, source: int,
    pc: PrivateComms, rt: Runtime, held: bool,
) -> tuple[Landing, Exception | None]:
    """Where this rank's piece lands; on a bad ``out=`` a scratch buffer, and the error to raise afterwards.
    ``held``: MPI's write may be discarded or complete after a timeout, so it does not land in ``out=`` itself."""
    if trouble is None and target is not None:
        why = mismatch(target, info.shape, info.dtype)
        if why is not None:
            trouble = RecvMismatchError(
                f"{fn}: the piece from rank {source} ({info.describe()}) does not fit out= "
                f"({describe_target(target)}): {why}; it was received and discarded"
            )
    if trouble is not None:
        scratch = np.empty(max(info.payload_nbytes, 1), np.uint8)
        return Landing(scratch.ctypes.data, info.payload_nbytes, lambda: Array.from_host(scratch)), trouble
    return Landing.plan(info, target, ordinal, source, NO_TAG, rt, direct=pc.aware.aware, held=held), None


def _own_array(src: np.ndarray[Any, Any] | DeviceSource, owner: Any, rank: int, meta: dict[str, Any] | None) -> Array:
    """An Array viewing a rank's own data (no copy)."""
    if isinstance(src, np.ndarray):
        return Array.over_host(src, rank, NO_TAG, meta, owner)
    return Array(src.desc.replace(stream=None), device=src.ordinal, owner=src.owner, source=rank, tag=NO_TAG,
                 meta=meta)


def _put(landing: Landing, payload: np.ndarray[Any, Any], rt: Runtime, ordinal: int | None) -> None:
    """Write a payload carried in the description's slot (``payload``: its bytes) where ``landing`` wants it."""
    n = payload.nbytes
    if not n:
        return
    if landing.device and ordinal is not None:
        stream = internal_stream(rt, ordinal)
        rt.copy_async(landing.address, payload.ctypes.data, n, stream)
        rt.record_event(stream).synchronize()
    else:
        ctypes.memmove(landing.address, payload.ctypes.data, n)


def _view(ex: Exchange, rank: int, info: MessageInfo) -> np.ndarray[Any, Any]:
    """Rank ``rank``'s payload as an array over the exchange's own buffer (no copy)."""
    return np.ndarray(info.shape, info.dtype, ex.slots, ex.start(rank), order="F" if info.fortran else "C")


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
    target, ordinal, trouble = _receiver(fn, out, None, rt) if me != root else (None, None, None)
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
                landing, spec_trouble = _land(fn, sig.fresh_info(), target, ordinal, trouble, root, pc, rt, True)
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
        ex = broadcast(steps, root, mine, _nbytes(mine), payload=src if isinstance(src, np.ndarray) else None)
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
        return Array.over_host(_view(ex, 0, info), root, NO_TAG, info.meta)  # over the broadcast slot
    landing, trouble = _land(fn, info, target, ordinal, trouble, root, pc, rt, due is not None and not fused)
    if fused:
        assert ex is not None
        _put(landing, ex.payload(0), rt, ordinal if target is None else getattr(target, "ordinal", None))
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


def _nbytes(c: Contribution) -> int:
    src = c.source
    return 0 if src is None else (src.nbytes if isinstance(src, np.ndarray) else src.desc.nbytes)


def _per_rank(fn: str, objs: Any, size: int, sync: Any, rt: Runtime) -> list[Contribution]:
    """One contribution per destination rank, or the same failure for all of them."""
    try:
        if isinstance(objs, (str, bytes)) or not isinstance(objs, Sequence) or len(objs) != size:
            got = f"a {type(objs).__name__}" + (f" of {len(objs)}" if isinstance(objs, Sequence) else "")
            raise TypeError(f"{fn}: expected a sequence of {size} arrays (one per rank of the communicator), got {got}")
        sources = [send_source(fn, o, check_sync(fn, sync), rt) for o in objs]
    except Exception as exc:
        return [Contribution.failed(exc)] * size
    return [Contribution(describe_source(s), s) for s in sources]


def scatter_array(
    objs: Sequence[Any] | None = None, root: int = 0, comm: MPI.Comm | None = None, *, out: Any = None,
    sync: bool | None = None, timeout: float | None = None,
) -> Array:
    """Send ``objs[r]`` from ``root`` to rank ``r``; shapes and dtypes may differ from rank to rank.

    Args:
        objs: on the root, ``comm.size`` arrays (anything ``send_array`` takes); ignored elsewhere.
        root: the scattering rank.
        comm: None for COMM_WORLD; any intracommunicator (its first use is collective).
        sync: None follows ``CAI_MPI_SYNC`` (default on); False skips the synchronization of this rank's
            producer stream.
        timeout: seconds to wait at most for every rank to join (None: ``CAI_MPI_TIMEOUT``, off by default).
        out: a buffer to receive this rank's piece into (checked against it).

    Returns:
        This rank's piece as an Array (``source == root``), over ``out=`` when given.

    Raises:
        CollectiveMismatchError: on the non-roots, when the root could not send (the root raises its own error).
        RecvMismatchError: on a rank whose ``out=`` does not fit (after the scatter completed).
        TimeoutError: some rank did not join within ``timeout`` (the collectives of ``comm`` are then out of
            step: end the job).
    """
    fn = "scatter_array"
    pc, comm_, _none, rt, _cfg, due = setup(fn, comm, None, timeout)
    root, bad_root = checked_root(fn, root, pc)
    me, size = comm_.Get_rank(), comm_.Get_size()
    parts = _per_rank(fn, objs, size, sync, rt) if me == root else []
    # (the root's own failure travels in its descriptions, below)
    ballot = vote(fn, pc, Ballot(common_fingerprint(fn, root), failed=bad_root is not None), due)
    steps = Joined(fn, pc, due)
    if not ballot.agreed:
        text = f"root={root}" if bad_root is None else reason(bad_root)
        disagree(fn, steps, text, bad_root, "every rank must name the same root")
    heads = np.array([[len(c.blob), _nbytes(c)] for c in parts], np.int64) if parts else None
    head = np.empty(2, np.int64)
    steps("Scatter", heads, head, root)
    blob = bytearray(max(int(head[0]), 1))
    data, counts, displs = pack([c.blob for c in parts]) if parts else (None, None, None)
    steps("Scatterv", None if data is None else [data, (counts, displs), MPI.BYTE], [blob, int(head[0]), MPI.BYTE],
          root)
    described = read(bytes(blob[: int(head[0])]))
    if isinstance(described, str):
        if me == root and parts[0].error is not None:
            raise parts[0].error
        raise CollectiveMismatchError(f"{fn}: the root, rank {root}, could not send: {described}")
    info = described
    target, ordinal, trouble = _receiver(fn, out, None, rt)
    landing, trouble = _land(fn, info, target, ordinal, trouble, root, pc, rt, due is not None)
    pieces = [outgoing(c.source, rt, direct=pc.aware.aware) for c in parts]
    steps.keep = (landing, pieces)
    sends = [(p.address, p.nbytes) for p in pieces] if parts else [None] * size
    recvs: list[tuple[int, int] | None] = [None] * size
    recvs[root] = (landing.address, landing.nbytes)
    alltoallw(steps, sends, recvs)
    for p in pieces:
        p.release()
    if trouble is not None:
        raise trouble
    return landing.finish()


def alltoall_array(
    objs: Sequence[Any], comm: MPI.Comm | None = None, *, sync: bool | None = None, timeout: float | None = None
) -> list[Array]:
    """Send ``objs[r]`` to rank ``r`` and receive one array from every rank; shapes and dtypes may differ.

    Args:
        objs: ``comm.size`` arrays, one per destination rank (anything ``send_array`` takes).
        comm: None for COMM_WORLD; any intracommunicator (its first use is collective).
        sync: None follows ``CAI_MPI_SYNC`` (default on); False skips the synchronization of this rank's
            producer stream.
        timeout: seconds to wait at most for every rank to join (None: ``CAI_MPI_TIMEOUT``, off by default).

    Returns:
        One Array per source rank in rank order (``source`` is the rank), on this rank's GPU when it has one.

    Raises:
        CollectiveMismatchError: on every rank, when some rank could not contribute (that rank raises its
            own error).
        TimeoutError: some rank did not join within ``timeout`` (the collectives of ``comm`` are then out of
            step: end the job).
    """
    fn = "alltoall_array"
    pc, comm_, _root, rt, _cfg, due = setup(fn, comm, None, timeout)
    me, size = comm_.Get_rank(), comm_.Get_size()
    parts = _per_rank(fn, objs, size, sync, rt)
    heads = np.array([[len(c.blob), _nbytes(c)] for c in parts], np.int64)
    theirs = np.empty((size, 2), np.int64)
    steps = Joined(fn, pc, due)
    steps("Alltoall", heads, theirs)
    data, counts, displs = pack([c.blob for c in parts])
    rcounts = [int(n) for n in theirs[:, 0]]
    rdispls = [sum(rcounts[:i]) for i in range(size)]
    incoming = bytearray(max(sum(rcounts), 1))
    steps("Alltoallv", [data, (counts, displs), MPI.BYTE], [incoming, (rcounts, rdispls), MPI.BYTE])
    described = [read(b) for b in unpack(incoming, rcounts)]
    raise_failures(fn, described, parts[me], me)
    infos = [d for d in described if isinstance(d, MessageInfo)]  # (all of them: no rank failed)
    landings = [Landing.plan(info, None, rt.current_device(), r, NO_TAG, rt, direct=pc.aware.aware)
                for r, info in enumerate(infos)]
    pieces = [outgoing(c.source, rt, direct=pc.aware.aware) for c in parts]
    steps.keep = (landings, pieces)
    alltoallw(steps, [(p.address, p.nbytes) for p in pieces], [(land.address, land.nbytes) for land in landings])
    for p in pieces:
        p.release()
    return [land.finish() for land in landings]
