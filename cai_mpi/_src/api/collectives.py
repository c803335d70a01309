"""Shape-free collectives that move data: bcast, gather, allgather, scatter, alltoall.

Each starts with an exchange in which every rank learns what the others contribute, or that one cannot
(``transport.agreement``). For bcast, gather and allgather that exchange is one collective of fixed-size
slots that also carries every contribution small enough to fit (host data): when all do, the call is that
one collective. Otherwise MPI's own collective follows on cai_mpi's private duplicate of ``comm``, moving
every contribution as one contiguous piece (``transport.contiguous``). Per-rank shapes and dtypes may differ
where the operation allows it; receivers never need them in advance.
"""

from __future__ import annotations

import ctypes
from collections.abc import Sequence
from typing import Any

import numpy as np
from mpi4py import MPI

from ..arrays.array import Array
from ..arrays.operands import DeviceSource, Target, describe_target, mismatch, recv_target, send_source
from ..core.header import MessageInfo
from ..errors import CollectiveMismatchError, RecvMismatchError
from ..progress.deadlines import Deadline
from ..runtime.base import Runtime
from ..transport import internal_stream
from ..transport.agreement import (
    Contribution,
    Exchange,
    broadcast,
    describe_source,
    exchange,
    joined,
    pack,
    raise_failures,
    read,
    unpack,
)
from ..transport.bigcount import INT_MAX, allgatherv, alltoallw, bcast, gatherv
from ..transport.contiguous import ALIGN, Gathered, Landing, outgoing
from ..transport.privcomm import PrivateComms
from .collective_call import NO_TAG, setup
from .validation import check_meta, check_sync, receive_device

__all__ = ["allgather_array", "alltoall_array", "bcast_array", "gather_array", "scatter_array"]


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
    pc: PrivateComms, rt: Runtime,
) -> tuple[Landing, Exception | None]:
    """Where this rank's piece lands; on a bad ``out=`` a scratch buffer, and the error to raise afterwards."""
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
    return Landing.plan(info, target, ordinal, source, NO_TAG, rt, direct=pc.aware.aware), None


def _own_array(src: np.ndarray[Any, Any] | DeviceSource, owner: Any, rank: int, meta: dict[str, Any] | None) -> Array:
    """An Array viewing a rank's own data (no copy)."""
    if isinstance(src, np.ndarray):
        return Array._over_host(src, rank, NO_TAG, meta, owner)
    return Array(src.desc.replace(stream=None), device=src.ordinal, owner=src.owner, source=rank, tag=NO_TAG,
                 meta=meta)


def _put(landing: Landing, payload: np.ndarray[Any, Any], rt: Runtime, ordinal: int | None) -> None:
    """Write a payload carried in the exchange (``payload``: its bytes) where ``landing`` wants it."""
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


def _from_slots(ex: Exchange, infos: Sequence[MessageInfo], pc: PrivateComms, rt: Runtime) -> list[Array]:
    """Every rank's Array from a fused exchange: views of its buffer in host memory, copies on this rank's GPU."""
    ordinal = rt.current_device()
    if ordinal is None:
        return [Array._over_host(_view(ex, r, info), r, NO_TAG, info.meta) for r, info in enumerate(infos)]
    out = []
    for r, info in enumerate(infos):
        landing = Landing.plan(info, None, ordinal, r, NO_TAG, rt, direct=pc.aware.aware)
        _put(landing, ex.payload(r), rt, ordinal)
        out.append(landing.finish())
    return out


def bcast_array(
    obj: Any = None, root: int = 0, comm: MPI.Comm | None = None, *, out: Any = None, sync: bool | None = None,
    meta: dict[str, Any] | None = None, timeout: float | None = None,
) -> Array:
    """Broadcast ``obj`` from ``root`` to every rank of ``comm``; non-roots need no shape or dtype.

    Args:
        obj: on the root, anything ``send_array`` takes; ignored elsewhere.
        root: the broadcasting rank.
        comm: None for COMM_WORLD; any intracommunicator (its first use is collective).
        out: on a non-root, a buffer to receive into (checked against what the root sends).
        sync: the root's stream policy, as in ``send_array``.
        timeout: seconds to wait at most for every rank to join (None: ``CAI_MPI_TIMEOUT``, off by default).
        meta: a JSON dict given on the root; every rank's Array carries it.

    Returns:
        On every rank an Array: on the root a view of its own data (no copy), elsewhere the received copy
        (over ``out=`` when given), with ``source == root``.

    Raises:
        CollectiveMismatchError: on the non-roots, when the root could not send (the root raises its own error).
        RecvMismatchError: on a non-root whose ``out=`` does not fit (after the broadcast completed).
        TimeoutError: some rank did not join within ``timeout`` (the collectives of ``comm`` are then out of
            step: end the job).
    """
    fn = "bcast_array"
    pc, comm_, root, rt, cfg, due = setup(fn, comm, root, timeout)
    me = comm_.Get_rank()
    mine = Contribution(b"")
    if me == root:
        try:
            src = send_source(fn, obj, check_sync(fn, sync), rt)
            mine = Contribution(describe_source(src, check_meta(fn, meta)), src)
        except Exception as exc:
            mine = Contribution.failed(exc)
    src = mine.source
    ex = broadcast(fn, comm_, root, mine, _nbytes(mine), due, payload=src if isinstance(src, np.ndarray) else None)
    described = ex.described[0]
    if isinstance(described, str):
        if mine.error is not None:
            raise mine.error
        raise CollectiveMismatchError(f"{fn}: the root, rank {root}, could not send: {described}")
    info = described
    if me == root:
        if not ex.fused:
            piece = outgoing(src, rt, direct=pc.aware.aware)
            bcast(comm_, piece.address, piece.nbytes, root, cfg.max_message_bytes)
            piece.release()
        return _own_array(src, obj, root, info.meta)
    target, ordinal, trouble = _receiver(fn, out, None, rt)
    if ex.fused and target is None and ordinal is None and trouble is None:
        return Array._over_host(_view(ex, 0, info), root, NO_TAG, info.meta)  # over the broadcast slot
    landing, trouble = _land(fn, info, target, ordinal, trouble, root, pc, rt)
    if ex.fused:
        _put(landing, ex.payload(0), rt, ordinal if target is None else getattr(target, "ordinal", None))
    else:
        bcast(comm_, landing.address, landing.nbytes, root, cfg.max_message_bytes)
    if trouble is not None:
        raise trouble
    return landing.finish()


def _contribute(fn: str, obj: Any, sync: Any, rt: Runtime) -> Contribution:
    return Contribution.attempt(lambda: (describe_source(src := send_source(fn, obj, check_sync(fn, sync), rt)), src))


def _nbytes(c: Contribution) -> int:
    src = c.source
    return 0 if src is None else (src.nbytes if isinstance(src, np.ndarray) else src.desc.nbytes)


def _agree_all(fn: str, comm_: MPI.Intracomm, mine: Contribution, due: Deadline | None) -> Exchange:
    """Every rank's description (and small host payload), everywhere; failures raised on every rank."""
    src = mine.source
    ex = exchange(fn, comm_, mine, _nbytes(mine), due, payload=src if isinstance(src, np.ndarray) else None)
    if not ex.alike:  # (alike: every rank sent this rank's header, so none failed)
        raise_failures(fn, ex.described, mine, comm_.Get_rank())
    return ex


def _small(sizes: Any, infos: Sequence[MessageInfo]) -> bool:
    """Do all counts and displacements of a v-collective over these pieces fit C ints?"""
    total = sum(-(-int(n) // 64) * 64 for n in sizes)
    return total <= INT_MAX and all(int(n) <= INT_MAX for n in sizes)


def _regular(sizes: Sequence[int]) -> bool:
    """Are the pieces all one size, each right after the one before in a ``Gathered`` buffer? Then MPI's
    ``Gather``/``Allgather`` take them (as fast as MPI gathers arrays of known shape) instead of the v-forms."""
    return sizes[0] > 0 and sizes[0] % ALIGN == 0 and all(n == sizes[0] for n in sizes)


def gather_array(
    obj: Any, root: int = 0, comm: MPI.Comm | None = None, *, sync: bool | None = None, timeout: float | None = None
) -> list[Array] | None:
    """Gather every rank's array at ``root``; shapes and dtypes may differ from rank to rank.

    Args:
        obj: this rank's contribution: anything ``send_array`` takes.
        root: the gathering rank.
        comm: None for COMM_WORLD; any intracommunicator (its first use is collective).
        sync: None follows ``CAI_MPI_SYNC`` (default on); False skips the synchronization of this rank's
            producer stream.
        timeout: seconds to wait at most for every rank to join (None: ``CAI_MPI_TIMEOUT``, off by default).

    Returns:
        On the root, one Array per rank in rank order (``source`` is the rank; on its GPU when the root has
        one, else in host memory); None elsewhere.

    Raises:
        CollectiveMismatchError: on every rank, when some rank could not contribute (that rank raises its
            own error).
        TimeoutError: some rank did not join within ``timeout`` (the collectives of ``comm`` are then out of
            step: end the job).
    """
    fn = "gather_array"
    pc, comm_, root, rt, _cfg, due = setup(fn, comm, root, timeout)
    mine = _contribute(fn, obj, sync, rt)
    ex = _agree_all(fn, comm_, mine, due)
    infos, sizes = ex.infos(), ex.sizes
    me = comm_.Get_rank()
    if ex.fused:
        return _from_slots(ex, infos, pc, rt) if me == root else None
    place = Gathered(infos, rt.current_device(), rt, direct=pc.aware.aware) if me == root else None
    piece = outgoing(mine.source, rt, direct=pc.aware.aware)
    recv = None if place is None else (place.address, [int(n) for n in sizes], place.displacements)
    gatherv(comm_, (piece.address, piece.nbytes), recv, root, small=_small(sizes, infos), regular=_regular(sizes))
    piece.release()
    return None if place is None else place.finish(rt, NO_TAG)


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
            step: end the job).
    """
    fn = "allgather_array"
    pc, comm_, _root, rt, _cfg, due = setup(fn, comm, None, timeout)
    mine = _contribute(fn, obj, sync, rt)
    ex = _agree_all(fn, comm_, mine, due)
    infos, sizes = ex.infos(), ex.sizes
    if ex.fused:
        return _from_slots(ex, infos, pc, rt)
    place = Gathered(infos, rt.current_device(), rt, direct=pc.aware.aware)
    piece = outgoing(mine.source, rt, direct=pc.aware.aware)
    allgatherv(comm_, (piece.address, piece.nbytes), (place.address, [int(n) for n in sizes], place.displacements),
               small=_small(sizes, infos), regular=_regular(sizes))
    piece.release()
    return place.finish(rt, NO_TAG)


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
    pc, comm_, root, rt, _cfg, due = setup(fn, comm, root, timeout)
    me, size = comm_.Get_rank(), comm_.Get_size()
    parts = _per_rank(fn, objs, size, sync, rt) if me == root else []
    heads = np.array([[len(c.blob), _nbytes(c)] for c in parts], np.int64) if parts else None
    head = np.empty(2, np.int64)
    joined(fn, comm_, due, "Scatter", heads, head, root)
    blob = bytearray(max(int(head[0]), 1))
    data, counts, displs = pack([c.blob for c in parts]) if parts else (None, None, None)
    comm_.Scatterv(None if data is None else [data, (counts, displs), MPI.BYTE], [blob, int(head[0]), MPI.BYTE], root)
    described = read(bytes(blob[: int(head[0])]))
    if isinstance(described, str):
        if me == root and parts[0].error is not None:
            raise parts[0].error
        raise CollectiveMismatchError(f"{fn}: the root, rank {root}, could not send: {described}")
    info = described
    target, ordinal, trouble = _receiver(fn, out, None, rt)
    landing, trouble = _land(fn, info, target, ordinal, trouble, root, pc, rt)
    pieces = [outgoing(c.source, rt, direct=pc.aware.aware) for c in parts]
    sends = [(p.address, p.nbytes) for p in pieces] if parts else [None] * size
    recvs: list[tuple[int, int] | None] = [None] * size
    recvs[root] = (landing.address, landing.nbytes)
    alltoallw(comm_, sends, recvs)
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
    joined(fn, comm_, due, "Alltoall", heads, theirs)
    data, counts, displs = pack([c.blob for c in parts])
    rcounts = [int(n) for n in theirs[:, 0]]
    rdispls = [sum(rcounts[:i]) for i in range(size)]
    incoming = bytearray(max(sum(rcounts), 1))
    comm_.Alltoallv([data, (counts, displs), MPI.BYTE], [incoming, (rcounts, rdispls), MPI.BYTE])
    described = [read(b) for b in unpack(incoming, rcounts)]
    raise_failures(fn, described, parts[me], me)
    infos = [d for d in described if isinstance(d, MessageInfo)]  # (all of them: no rank failed)
    landings = [Landing.plan(info, None, rt.current_device(), r, NO_TAG, rt, direct=pc.aware.aware)
                for r, info in enumerate(infos)]
    pieces = [outgoing(c.source, rt, direct=pc.aware.aware) for c in parts]
    alltoallw(comm_, [(p.address, p.nbytes) for p in pieces], [(land.address, land.nbytes) for land in landings])
    for p in pieces:
        p.release()
    return [land.finish() for land in landings]

