"""Shape-free collectives that move data: bcast, gather, allgather, scatter, alltoall.

Each is one agreement step (every rank learns what the others contribute, or that one cannot: see
``agreement``) and one of MPI's collectives on cai_mpi's private duplicate of ``comm``, moving every
contribution as one contiguous piece (``transport.contiguous``). Per-rank shapes and dtypes may differ
where the operation allows it; receivers never need them in advance.
"""

from __future__ import annotations

import ctypes
import struct
from collections.abc import Sequence
from typing import Any

import numpy as np
from mpi4py import MPI

from ..arrays.array import Array
from ..arrays.operands import DeviceSource, Target, describe_target, mismatch, recv_target, send_source
from ..config import Config, config
from ..core.header import MessageInfo, inline_message
from ..errors import CollectiveMismatchError, RecvMismatchError
from ..progress.deadlines import Deadline, collective_expired, deadline
from ..progress.requests import PostedRequest, complete_by
from ..progress.waits import MPIWait
from ..runtime import get_runtime
from ..runtime.base import Runtime
from ..transport import internal_stream
from ..transport.agreement import Contribution, describe_source, pack, raise_failures, read, unpack
from ..transport.bigcount import INT_MAX, allgatherv, alltoallw, bcast, gatherv
from ..transport.contiguous import Gathered, Landing, outgoing
from ..transport.privcomm import PrivateComms
from .validation import PROC_NULL, check_comm, check_meta, check_rank, check_sync, receive_device

__all__ = ["allgather_array", "alltoall_array", "bcast_array", "gather_array", "scatter_array"]

_NO_TAG = -1  # collectives have no tag: the Arrays they return say so
_BLOCK = 512  # bytes: what bcast_array broadcasts first (a header, with a small payload inline)
_SLOT = 256  # bytes per rank of the agreement Allgather: the length of a rank's header and its start
_LEN = struct.Struct("<q")


def joined(fn: str, comm: MPI.Intracomm, due: Deadline | None, collective: str, *args: Any) -> None:
    """A collective's first step, where every rank must arrive: ``comm.<collective>(*args)``; with a deadline its
    nonblocking form, which is abandoned (its buffers kept alive) with TimeoutError if some rank has not come."""
    if due is None:
        getattr(comm, collective)(*args)
        return
    req = getattr(comm, "I" + collective[0].lower() + collective[1:])(*args)
    if not complete_by(MPIWait([req]), due):
        error = collective_expired(fn, comm, due)
        PostedRequest([req], None, keep=args)._abandon(error)
        raise error


def setup(fn: str, comm: Any, root: Any = None, timeout: Any = None) -> tuple[
    PrivateComms, MPI.Intracomm, int, Runtime, Config, Deadline | None
]:
    """Validate the arguments every collective shares: ``(private comms, the communicator to use, root, ...,
    the deadline for every rank to join)``."""
    due = deadline(fn, timeout)
    pc = check_comm(fn, comm)
    if pc.header.Is_inter():
        raise TypeError(f"{fn}: collectives need an intracommunicator, got an MPI.Intercomm")
    if root is not None:
        root = check_rank(fn, "root", root, pc, wildcard=False)
        if root == PROC_NULL:
            raise ValueError(f"{fn}: root must be a rank of the communicator, not PROC_NULL")
    return pc, pc.header, -1 if root is None else root, get_runtime(), config(), due  # type: ignore[return-value]


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
    return Landing.plan(info, target, ordinal, source, _NO_TAG, rt, direct=pc.aware.aware), None


def _own_array(src: np.ndarray[Any, Any] | DeviceSource, owner: Any, rank: int, meta: dict[str, Any] | None) -> Array:
    """An Array viewing a rank's own data (no copy)."""
    if isinstance(src, np.ndarray):
        return Array._over_host(src, rank, _NO_TAG, meta, owner)
    return Array(src.desc.replace(stream=None), device=src.ordinal, owner=src.owner, source=rank, tag=_NO_TAG,
                 meta=meta)


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
    block = bytearray(_BLOCK)
    mine = Contribution(b"")
    if me == root:

        def describe() -> tuple[bytes, Any]:
            src = send_source(fn, obj, check_sync(fn, sync), rt)
            meta_bytes = check_meta(fn, meta)
            if isinstance(src, np.ndarray) and src.nbytes <= min(cfg.inline_bytes, _BLOCK // 2):
                return inline_message(src, meta_bytes), src  # the whole broadcast is this one block
            return describe_source(src, meta_bytes), src

        mine = Contribution.attempt(describe)
        _LEN.pack_into(block, 0, len(mine.blob))
        head = mine.blob[: _BLOCK - _LEN.size]
        block[_LEN.size : _LEN.size + len(head)] = head
    joined(fn, comm_, due, "Bcast", block, root)
    nblob = _LEN.unpack_from(block)[0]
    blob = bytes(block[_LEN.size : _LEN.size + min(nblob, _BLOCK - _LEN.size)])
    if nblob > _BLOCK - _LEN.size:  # a long header (meta, a structured dtype): the rest follows
        rest = bytearray(mine.blob[_BLOCK - _LEN.size :]) if me == root else bytearray(nblob - len(blob))
        comm_.Bcast(rest, root)
        blob += bytes(rest)
    described = read(blob)
    if isinstance(described, str):
        if mine.error is not None:
            raise mine.error
        raise CollectiveMismatchError(f"{fn}: the root, rank {root}, could not send: {described}")
    info = described
    if me == root:
        if not info.inline:
            piece = outgoing(mine.source, rt, direct=pc.aware.aware)
            bcast(comm_, piece.address, piece.nbytes, root, cfg.max_message_bytes)
            piece.release()
        return _own_array(mine.source, obj, root, info.meta)
    target, ordinal, trouble = _receiver(fn, out, None, rt)
    landing, trouble = _land(fn, info, target, ordinal, trouble, root, pc, rt)
    if info.inline:
        _put(landing, blob, info, rt, ordinal if target is None else getattr(target, "ordinal", None))
    else:
        bcast(comm_, landing.address, landing.nbytes, root, cfg.max_message_bytes)
    if trouble is not None:
        raise trouble
    return landing.finish()


def _put(landing: Landing, blob: bytes, info: MessageInfo, rt: Runtime, ordinal: int | None) -> None:
    """Write an inline payload (the end of ``blob``) where ``landing`` wants it."""
    n = info.payload_nbytes
    if not n:
        return
    payload = np.frombuffer(blob, np.uint8, n, info.header_nbytes).copy()
    if landing.device and ordinal is not None:
        stream = internal_stream(rt, ordinal)
        rt.copy_async(landing.address, payload.ctypes.data, n, stream)
        rt.record_event(stream).synchronize()
    else:
        ctypes.memmove(landing.address, payload.ctypes.data, n)


def _contribute(fn: str, obj: Any, sync: Any, rt: Runtime) -> Contribution:
    return Contribution.attempt(lambda: (describe_source(src := send_source(fn, obj, check_sync(fn, sync), rt)), src))


def _nbytes(c: Contribution) -> int:
    src = c.source
    return 0 if src is None else (src.nbytes if isinstance(src, np.ndarray) else src.desc.nbytes)


def _agree_all(fn: str, comm_: MPI.Intracomm, mine: Contribution, due: Deadline | None) -> tuple[
    list[MessageInfo], np.ndarray[Any, Any]
]:
    """Every rank's description, everywhere (failures raised on every rank): ``(infos, payload sizes)``."""
    size = comm_.Get_size()
    # One Allgather of fixed slots (header length, payload size, the header's start) usually says it all;
    # only headers longer than a slot (meta, structured dtypes) send their rest in a second step.
    room = _SLOT - 16
    slot = bytearray(_SLOT)
    _LEN.pack_into(slot, 0, len(mine.blob))
    _LEN.pack_into(slot, 8, _nbytes(mine))
    slot[16 : 16 + min(len(mine.blob), room)] = mine.blob[:room]
    slots = bytearray(_SLOT * size)
    joined(fn, comm_, due, "Allgather", slot, slots)
    lengths = [_LEN.unpack_from(slots, _SLOT * r)[0] for r in range(size)]
    sizes = np.array([_LEN.unpack_from(slots, _SLOT * r + 8)[0] for r in range(size)], np.int64)
    blobs = [bytes(slots[_SLOT * r + 16 : _SLOT * r + 16 + min(n, room)]) for r, n in enumerate(lengths)]
    if any(n > room for n in lengths):
        counts = [max(n - room, 0) for n in lengths]
        rest = bytearray(max(sum(counts), 1))
        displs = [sum(counts[:i]) for i in range(size)]
        comm_.Allgatherv(mine.blob[room:], [rest, (counts, displs), MPI.BYTE])
        blobs = [b + tail for b, tail in zip(blobs, unpack(rest, counts), strict=True)]
    described = [read(b) for b in blobs]
    raise_failures(fn, described, mine, comm_.Get_rank())
    return described, sizes  # type: ignore[return-value]


def _small(sizes: Any, infos: Sequence[MessageInfo]) -> bool:
    """Do all counts and displacements of a v-collective over these pieces fit C ints?"""
    total = sum(-(-int(n) // 64) * 64 for n in sizes)
    return total <= INT_MAX and all(int(n) <= INT_MAX for n in sizes)


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
    infos, sizes = _agree_all(fn, comm_, mine, due)
    me = comm_.Get_rank()
    place = Gathered(infos, rt.current_device(), rt, direct=pc.aware.aware) if me == root else None
    piece = outgoing(mine.source, rt, direct=pc.aware.aware)
    recv = None if place is None else (place.address, [int(n) for n in sizes], place.displacements)
    gatherv(comm_, (piece.address, piece.nbytes), recv, root, small=_small(sizes, infos))
    piece.release()
    return None if place is None else place.finish(rt, _NO_TAG)


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
    infos, sizes = _agree_all(fn, comm_, mine, due)
    place = Gathered(infos, rt.current_device(), rt, direct=pc.aware.aware)
    piece = outgoing(mine.source, rt, direct=pc.aware.aware)
    allgatherv(comm_, (piece.address, piece.nbytes), (place.address, [int(n) for n in sizes], place.displacements),
               small=_small(sizes, infos))
    piece.release()
    return place.finish(rt, _NO_TAG)


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
    infos: list[MessageInfo] = described  # type: ignore[assignment]
    landings = [Landing.plan(info, None, rt.current_device(), r, _NO_TAG, rt, direct=pc.aware.aware)
                for r, info in enumerate(infos)]
    pieces = [outgoing(c.source, rt, direct=pc.aware.aware) for c in parts]
    alltoallw(comm_, [(p.address, p.nbytes) for p in pieces], [(land.address, land.nbytes) for land in landings])
    for p in pieces:
        p.release()
    return [land.finish() for land in landings]

