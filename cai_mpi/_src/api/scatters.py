"""Shape-free collectives that hand each rank its own piece: ``scatter_array`` (from a root) and
``alltoall_array`` (from every rank).

Each piece's description (a header, or the text of why its sender could not send) travels in a fixed-size slot,
with its payload when that is host memory and fits (``transport.slots.scatter`` and ``exchange``), so a call
of small pieces costs one collective of slots: a ``Scatter`` after the vote on the root, or one ``Alltoall``
(nothing to vote on: alltoall has no root, and every rank hears every rank's failure in its slot). Pieces that do
not fit (and device memory) follow in one ``Alltoallw`` (``transport.bigcount``: any size), which every rank
joins or none: every slot says whether its sender has pieces outside their slots. All on cai_mpi's private
duplicate of ``comm``.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
from mpi4py import MPI

from ..arrays.array import Array
from ..arrays.operands import send_source
from ..errors import CollectiveMismatchError
from ..runtime.base import Runtime
from ..transport.agreement import (
    Ballot,
    Contribution,
    Joined,
    describe_source,
    disagree,
    raise_failures,
    reason,
    vote,
)
from ..transport.bigcount import alltoallw
from ..transport.contiguous import Landing, Outgoing, outgoing
from ..transport.privcomm import PrivateComms
from ..transport.slots import Dealt, exchange, scatter
from .arrival import land, put, receiver, slot_view, source_nbytes
from .collective_call import NO_TAG, checked_root, common_fingerprint, setup
from .validation import check_sync

__all__ = ["alltoall_array", "scatter_array"]


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


def _deal(steps: Joined, parts: list[Contribution], root: int | None) -> Dealt:
    """The slots' collective: ``scatter`` from ``root``, or (None) ``exchange`` between every pair."""
    sizes = [source_nbytes(c) for c in parts]
    payloads = [c.source if isinstance(c.source, np.ndarray) else None for c in parts]
    if root is None:
        return exchange(steps, parts, sizes, payloads)
    return scatter(steps, root, parts, sizes, payloads)


def _apart(steps: Joined, dealt: Dealt, parts: list[Contribution], landings: dict[int, Landing], rt: Runtime,
           pc: PrivateComms) -> None:
    """The pieces that did not travel in their slots, in one ``Alltoallw`` every rank joins (``dealt.apart`` is the
    same everywhere): this rank's ``parts`` whose slot could not hold them, into ``landings`` (by source rank)."""
    size = steps.comm.Get_size()
    pieces: list[Outgoing | None] = [None if whole else outgoing(c.source, rt, direct=pc.aware.aware)
                                     for c, whole in zip(parts, dealt.sent, strict=True)]
    steps.keep = (landings, pieces, steps.keep)
    sends: list[tuple[int, int] | None] = [None if p is None else (p.address, p.nbytes) for p in pieces] or \
        [None] * size
    recvs: list[tuple[int, int] | None] = [None] * size
    for r, landing in landings.items():
        recvs[r] = (landing.address, landing.nbytes)
    try:
        alltoallw(steps, sends, recvs)
    finally:
        for p in pieces:
            if p is not None:
                p.release()


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
        CollectiveMismatchError: on every rank, when the ranks name different roots; on the non-roots, when the
            root could not send (the root raises its own error).
        RecvMismatchError: on a rank whose ``out=`` does not fit (after the scatter completed).
        TimeoutError: some rank did not join within ``timeout`` (the collectives of ``comm`` are then out of
            step: end the job).
    """
    fn = "scatter_array"
    pc, comm_, _none, rt, _cfg, due = setup(fn, comm, None, timeout)
    root, bad_root = checked_root(fn, root, pc)
    me, size = comm_.Get_rank(), comm_.Get_size()
    parts = _per_rank(fn, objs, size, sync, rt) if me == root else []
    # (the vote is on the root only: the root's own failure travels in its slots, below)
    ballot = vote(fn, pc, Ballot(common_fingerprint(fn, root), failed=bad_root is not None), due)
    steps = Joined(fn, pc, due)
    if not ballot.agreed:
        text = f"root={root}" if bad_root is None else reason(bad_root)
        disagree(fn, steps, text, bad_root, "every rank must name the same root")
    dealt = _deal(steps, parts, root)
    info = dealt.described[0]
    if isinstance(info, str):  # (the root could not send: no rank has a piece apart, so none makes another call)
        if me == root and parts[0].error is not None:
            raise parts[0].error
        raise CollectiveMismatchError(f"{fn}: the root, rank {root}, could not send: {info}")
    target, ordinal, trouble = receiver(fn, out, None, rt)
    whole = dealt.whole[0]
    if whole and me != root and target is None and ordinal is None and trouble is None:
        result = Array.over_host(slot_view(dealt, 0, info), root, NO_TAG, None)  # (over the slot it came in)
        if dealt.apart:
            _apart(steps, dealt, parts, {}, rt, pc)
        return result
    landing, trouble = land(fn, info, target, ordinal, trouble, root, pc, rt, due is not None and not whole)
    if whole:
        put(landing, dealt.payload(0), rt, ordinal if target is None else getattr(target, "ordinal", None))
    if dealt.apart:
        _apart(steps, dealt, parts, {} if whole else {root: landing}, rt, pc)
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
    # No vote: there is no root or op to agree on, and a rank that could not contribute says so in every slot it
    # sends, so every rank reads every failure from the one Alltoall and raises before any other call.
    steps = Joined(fn, pc, due)
    dealt = _deal(steps, parts, None)
    raise_failures(fn, dealt.described, parts[me], me)
    ordinal = rt.current_device()
    results: list[Array | None] = [None] * size
    landings: dict[int, Landing] = {}
    for r, info in enumerate(dealt.infos()):
        if dealt.whole[r] and ordinal is None:
            results[r] = Array.over_host(slot_view(dealt, r, info), r, NO_TAG, None)  # (over the slot it came in)
            continue
        landings[r] = landing = Landing.plan(info, None, ordinal, r, NO_TAG, rt, direct=pc.aware.aware)
        if dealt.whole[r]:
            put(landing, dealt.payload(r), rt, ordinal)
    if dealt.apart:
        _apart(steps, dealt, parts, {r: landing for r, landing in landings.items() if not dealt.whole[r]}, rt, pc)
    for r, landing in landings.items():
        results[r] = landing.finish()
    return [a for a in results if a is not None]
