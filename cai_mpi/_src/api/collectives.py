"""The shape-free broadcast: ``bcast_array``.

It starts with a vote (``transport.agreement``: one small Allreduce whatever the number of ranks) on what every
rank must share (the operation and its root), so a rank that names another root, or cannot take part, is an error
on every rank. The root's description (with its meta, and its payload when it fits) travels in one slot; a larger
payload follows in MPI's own ``Bcast`` as one contiguous piece (``transport.contiguous``) on cai_mpi's private
duplicate of ``comm``. A bcast like the last one on the communicator posts its payload collective with the vote
(one round). Scatter and alltoall are ``scatters.py``, gathers ``gathers.py``.
"""

from __future__ import annotations

import copy
from typing import Any

import numpy as np
from mpi4py import MPI

from ..arrays.array import Array
from ..arrays.operands import DeviceSource, send_source
from ..errors import CollectiveMismatchError
from ..transport.agreement import (
    NOBODY,
    SPECULATE_BYTES,
    Ballot,
    Contribution,
    Joined,
    broadcast,
    describe_source,
    disagree,
    fingerprint,
    posted,
    reason,
    vote,
)
from ..transport.bigcount import bcast
from ..transport.contiguous import outgoing
from ..transport.pieces import counted
from .arrival import land as _land
from .arrival import put as _put
from .arrival import receiver as _receiver
from .arrival import slot_view as _view
from .arrival import source_nbytes as _nbytes
from .collective_call import NO_TAG, AgreedSignature, bytes_at, checked_root, common_fingerprint, setup
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
            mine = Contribution(describe_source(src, check_meta(fn, meta)), src)
            own = fingerprint(mine.blob)
        except Exception as exc:
            mine = Contribution.failed(exc)
    src = mine.source
    ballot = Ballot(common, own, failed=mine.error is not None)
    agreed: AgreedSignature | None = pc.agreed.get(fn)
    target, ordinal, trouble = _receiver(fn, out, None, rt) if me != root else (None, None, None)
    if agreed is not None and agreed.nbytes <= SPECULATE_BYTES:
        # The steady state: the payload of the last agreed signature goes with the vote (the root's data when it
        # is that signature's, scratch otherwise; every rank makes the same MPI calls whatever the vote says).
        expected = common == agreed.common
        piece = landing = spec_trouble = None
        buf: Any = None
        if me == agreed.root:
            if expected and own == agreed.own:
                if isinstance(src, np.ndarray) and src.flags.c_contiguous:
                    buf = src  # (MPI reads the array itself)
                else:
                    piece = outgoing(src, rt, direct=pc.aware.aware)
                    buf = bytes_at(piece.address, piece.nbytes)
        elif expected:
            landing, spec_trouble = _land(fn, agreed.fresh_info(), target, ordinal, trouble, root, pc, rt, True)
            buf = bytes_at(landing.address, landing.nbytes)
        if buf is None:
            buf = np.empty(agreed.nbytes, np.uint8)
        speculated = [posted(comm_, "Bcast", counted(buf, agreed.nbytes, MPI.BYTE), agreed.root)] if agreed.nbytes \
            else []
        vote(fn, pc, ballot, due, speculated, keep=(piece, landing, buf))
        if piece is not None:
            piece.release()
        if ballot.matches(agreed.common, agreed.own):
            if me == root:
                return _own_array(src, obj, root, agreed.fresh_info().meta)
            assert landing is not None
            result = landing.finish()
            if spec_trouble is not None:
                raise spec_trouble
            return result
        if landing is not None:
            landing.discard()
    else:
        vote(fn, pc, ballot, due)
    steps = Joined(fn, pc, due)
    if not ballot.same_common:
        text = f"root={root}" if mine.error is None else reason(mine.error)
        disagree(fn, steps, text, mine.error, "every rank must name the same root")
    if agreed is not None and ballot.matches(agreed.common, agreed.own):  # (large: the vote went first)
        info = agreed.fresh_info()
        fused = False
        ex = None
    else:
        ex = broadcast(steps, root, mine, _nbytes(mine), payload=src if isinstance(src, np.ndarray) else None)
        described = ex.described[0]
        if isinstance(described, str):
            if mine.error is not None:
                raise mine.error
            raise CollectiveMismatchError(f"{fn}: the root, rank {root}, could not send: {described}")
        info, fused = described, ex.fused
        pc.agreed[fn] = AgreedSignature(common, ballot.own, info._replace(meta=copy.deepcopy(info.meta)), root)
    if me == root:
        if not fused:
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
        steps.keep = landing
        bcast(steps, landing.address, landing.nbytes, root, cfg.max_message_bytes)
    if trouble is not None:
        raise trouble
    return landing.finish()
