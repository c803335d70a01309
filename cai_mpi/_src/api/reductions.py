"""Shape-free reductions: reduce_array and allreduce_array, on MPI's Reduce/Allreduce with typed datatypes.

Every rank votes (``transport.agreement``: one small Allreduce whatever the number of ranks) on what it
reduces: shape, exactly, dtype, op and root; any difference, or a rank that cannot take part, is an error on
every rank naming what each had. MPI's own Reduce/Allreduce computes the result at every size, so the answer
is the user's MPI's. A call like the last one on the communicator (the steady state of a solver or a training
loop) posts its payload reduction with the vote, speculatively: one round. The result keeps the input dtype, as
MPI does (no numpy-style promotion), in native byte order: MPI computes on native values, so host input of the
other byte order is converted first (ranks may mix byte orders). Device data is reduced by a CUDA-aware MPI
where it lies, otherwise on the host and copied back.
"""

from __future__ import annotations

from typing import Any

import numpy as np
from mpi4py import MPI

from ..arrays.array import NO_SOURCE, NO_TAG, Array
from ..arrays.operands import DeviceSource, RecvTarget, Target, describe_target, mismatch, recv_target, send_source
from ..core.header import MessageInfo
from ..core.memo import Memo
from ..runtime.base import Runtime
from ..transport.agreement import SPECULATE_BYTES, Ballot, fingerprint, reason, vote
from ..transport.bigcount import INT_MAX, reduce
from ..transport.contiguous import Landing, Outgoing, outgoing
from ..transport.engine import Call, steady, verdict
from ..transport.pieces import counted
from ..transport.pool import host_receive_pool
from ..transport.privcomm import PrivateComms
from ..transport.signature import Bucket, Signature
from .collective_call import bytes_at, checked_root, setup
from .reduce_ops import ReduceOp, divide, native_dtype, parse_op, reduce_datatype
from .validation import check_sync

__all__ = ["allreduce_array", "reduce_array"]


class _Plan:
    """What reducing a (shape, dtype) with an op at a root means, once checked: the description every rank votes on
    (``text``, ``fp``: its common fingerprint), the result's ``info``, the op, and the reduction MPI makes
    (``bucket``). Shared by calls alike."""

    __slots__ = ("bucket", "fp", "info", "op", "root", "text")

    def __init__(self, info: MessageInfo, op: ReduceOp, datatype: MPI.Datatype, root: int | None) -> None:
        self.info, self.op, self.root = info, op, -1 if root is None else root
        self.text = f"shape={info.shape} dtype={info.dtype.str} op={op.name}" + ("" if root is None else
                                                                                f" root={root}")
        self.fp = fingerprint(self.text)
        self.bucket: Bucket = (info.payload_nbytes // max(datatype.Get_size(), 1), datatype, op.mpi)


def _native(fn: str, src: np.ndarray[Any, Any] | DeviceSource) -> np.ndarray[Any, Any] | DeviceSource:
    """``src`` with its values in native byte order (``native_dtype``: host data converted, a copy)."""
    if isinstance(src, np.ndarray):
        native = native_dtype(fn, src.dtype, device=False)
        return src if native is src.dtype else src.astype(native, order="C")
    native_dtype(fn, src.desc.dtype, device=True)
    return src


def _plan(fn: str, obj: Any, op: Any, sync: Any, rt: Runtime, root: int | None
          ) -> tuple[np.ndarray[Any, Any] | DeviceSource, _Plan]:
    """This rank's source (native byte order) and plan; raises on a bad argument."""
    src = _native(fn, send_source(fn, obj, check_sync(fn, sync), rt))
    shape, dtype = (src.shape, src.dtype) if isinstance(src, np.ndarray) else (src.desc.shape, src.desc.dtype)
    key = (op if isinstance(op, str) else op.py2f() if isinstance(op, MPI.Op) else None, dtype, shape, root)
    plan = _known.get(key)
    if plan is None:
        how = parse_op(fn, op)
        datatype = reduce_datatype(fn, dtype, how)
        if dtype.kind == "b":
            how = how.for_bool(fn)
        size = 1
        for n in shape:
            size *= n
        plan = _Plan(MessageInfo(dtype, shape, False, size * dtype.itemsize, 0, None, False, False, 0), how, datatype,
                     root)
        if key[0] is not None:
            _known.remember(key, plan)
    return src, plan


# (op, dtype, shape, root) -> _Plan: what checking the arguments found, for the next call with the same (a step of a
# solver or a training loop reduces the same arrays every time).
_known: Memo[tuple[Any, ...], _Plan] = Memo()


def _out(fn: str, out: Any, plan: _Plan, rt: Runtime) -> tuple[Target | None, Exception | None]:
    """``out=`` checked against the result: the target, or the error this rank raises once the call is over (a
    bad ``out=`` is this rank's own error: the others complete, as in ``bcast_array``)."""
    try:
        target = recv_target(fn, out, rt)
        why = mismatch(target, plan.info.shape, plan.info.dtype)
    except Exception as exc:
        return None, exc
    if why is not None:
        return None, ValueError(f"{fn}: out= ({describe_target(target)}) cannot hold the result "
                                f"({plan.info.describe()}): {why}; the reduction completed without it")
    return target, None


class _Buffers:
    """Where this rank's reduction reads (``send``) and writes (``recv``: None off the root), as buffers MPI takes
    (``in_place``: they are the same memory), and how the result is made: ``result`` (host numpy memory, copied from
    ``recv`` into ``out=``, ``into``, when held apart from it), or the ``landing`` of staged or device memory; neither
    when ``out=`` was refused (``recv`` is then scratch)."""

    __slots__ = ("in_place", "into", "landing", "piece", "recv", "result", "send")

    def __init__(self, send: Any, recv: Any, *, piece: Outgoing | None = None, landing: Landing | None = None,
                 result: Array | None = None, in_place: bool = False, into: np.ndarray[Any, Any] | None = None
                 ) -> None:
        self.send, self.recv, self.piece, self.landing, self.result = send, recv, piece, landing, result
        self.in_place, self.into = in_place, into

    def release(self) -> None:
        """Discard what was received (the call is made again, or fails): ``out=`` untouched, staging given back."""
        if self.piece is not None:
            self.piece.release()
        if self.landing is not None:
            self.landing.discard()

    def finish(self, plan: _Plan, size: int) -> Array | None:
        """The result, once MPI has written it (the mean divided); the staging given back."""
        if self.piece is not None:
            self.piece.release()
        if self.result is None and self.landing is None:
            return None
        if plan.op.mean:
            if isinstance(self.recv, np.ndarray):
                np.true_divide(self.recv, self.recv.dtype.type(size), out=self.recv)
            else:
                assert self.landing is not None and not self.landing.device
                divide(self.landing.address, plan.info.payload_nbytes // plan.info.dtype.itemsize, plan.info.dtype,
                       size)
        if self.into is not None:
            np.copyto(self.into, self.recv, casting="no")
        return self.result if self.landing is None else self.landing.finish()


def _buffers(src: np.ndarray[Any, Any] | DeviceSource, plan: _Plan, target: Target | None, gets_result: bool,
             trouble: Exception | None, pc: PrivateComms, rt: Runtime, held: bool) -> _Buffers:
    """This rank's buffers; ``held``: MPI's write may be discarded or complete after a timeout, so it does not land
    in ``out=`` itself (``Landing.plan``)."""
    info = plan.info
    if isinstance(src, np.ndarray) and src.flags.c_contiguous and (
            target is None or (type(target) is np.ndarray and target.flags.c_contiguous)):
        # host data, C-ordered: MPI reads and writes the numpy arrays themselves
        if not gets_result:
            return _Buffers(src, None)
        if trouble is not None:
            return _Buffers(src, np.empty(info.shape, info.dtype))
        if target is None:
            recv = host_receive_pool().take_array(info.shape, info.dtype, info.payload_nbytes)
            return _Buffers(src, recv, result=Array.over_host(recv, NO_SOURCE, NO_TAG, None))
        assert isinstance(target, np.ndarray)
        result = Array.over_host(target, NO_SOURCE, NO_TAG, None, target)
        if held:
            return _Buffers(src, np.empty(info.shape, info.dtype), result=result, into=target)
        return _Buffers(src, target, result=result, in_place=target.size > 0 and target.ctypes.data == src.ctypes.data)
    on_device = target.desc is not None if isinstance(target, RecvTarget) else (
        target is None and isinstance(src, DeviceSource))
    # MPI reduces where both buffers lie: on the device only through a CUDA-aware MPI, and only when input and
    # result are both device memory; otherwise on the host, staged both ways. The mean divides the sum on the
    # host, so a device result of op="mean" is staged through the host.
    direct = (pc.aware.aware and isinstance(src, DeviceSource) and (on_device or not gets_result)
              and not (plan.op.mean and gets_result))
    piece = outgoing(src, rt, direct=direct, c_order=True)
    send = bytes_at(piece.address, piece.nbytes, readonly=True)
    if not gets_result:
        return _Buffers(send, None, piece=piece)
    if trouble is not None:
        return _Buffers(send, np.empty(max(info.payload_nbytes, 1), np.uint8), piece=piece)
    ordinal = src.ordinal if target is None and isinstance(src, DeviceSource) else None
    landing = Landing.plan(info, target, ordinal, NO_SOURCE, NO_TAG, rt, direct=direct, held=held)
    return _Buffers(send, bytes_at(landing.address, landing.nbytes), piece=piece, landing=landing,
                    in_place=landing.nbytes > 0 and landing.address == piece.address)


def _address(buf: Any) -> int:
    return int(buf.ctypes.data) if isinstance(buf, np.ndarray) else int(buf.address)


def _call(send: Any, recv: Any, in_place: bool, bucket: Bucket, root: int) -> Call:
    """MPI's reduction of ``bucket`` at ``root`` (-1: every rank; ``recv`` None off the root): its name and its
    arguments."""
    n, dt, op = bucket
    src: Any = MPI.IN_PLACE if in_place else counted(send, n, dt)
    out = None if recv is None else counted(recv, n, dt)
    return ("Allreduce", (src, out, op)) if root < 0 else ("Reduce", (src, out, op, root))


def _calls(sig: Signature, bufs: _Buffers | None, comm: MPI.Comm) -> list[Call]:
    """The steady state's reduction of ``sig``: into ``bufs``, or scratch of its size (``engine.steady``)."""
    if bufs is None:
        scratch = np.empty((2, sig.nbytes), np.uint8)
        gets_result = sig.root < 0 or comm.Get_rank() == sig.root
        return [_call(scratch[0], scratch[1] if gets_result else None, False, sig.buckets[0], sig.root)]
    return [_call(bufs.send, bufs.recv, bufs.in_place, sig.buckets[0], sig.root)]


def _reduce(
    fn: str, obj: Any, op: Any, root: int | None, comm: Any, out: Any, sync: Any, timeout: Any
) -> Array | None:
    pc, comm_, _none, rt, cfg, due = setup(fn, comm, None, timeout)
    bad_root = None
    if root is not None:
        root, bad_root = checked_root(fn, root, pc)
    gets_result = root is None or comm_.Get_rank() == root
    plan: _Plan | None = None
    error: Exception | None = None
    try:
        if bad_root is not None:
            raise bad_root
        src, plan = _plan(fn, obj, op, sync, rt, root)
        common = plan.fp
        target, trouble = _out(fn, out, plan, rt) if out is not None and gets_result else (None, None)
    except Exception as exc:
        error, common = exc, fingerprint(reason(exc))
    ballot = Ballot(common, failed=error is not None)
    sig = pc.agreed.get(fn)
    if sig is not None and 0 < sig.nbytes <= SPECULATE_BYTES:
        own = _buffers(src, plan, target, gets_result, trouble, pc, rt, True) if plan is not None and \
            error is None and plan.fp == sig.common else None
        bufs = steady(fn, pc, ballot, due, sig, own, _calls)
        if bufs is not None:
            assert plan is not None
            return _finished(bufs, plan, comm_.Get_size(), trouble)
    else:
        vote(fn, pc, ballot, due)
    steps = verdict(fn, pc, ballot, due, "" if plan is None else plan.text, error,
                    "the ranks must reduce arrays of one shape and dtype with one op" + ("" if root is None else
                                                                                          " and root"))
    assert plan is not None
    info, (count, datatype, mpi_op) = plan.info, plan.bucket
    if not mpi_op.is_predefined:  # (a user's op may be freed before the next call: never posted ahead)
        pc.agreed.pop(fn, None)
    elif sig is None or not ballot.matches(sig.head):  # (else this call is the agreed one: kept as it is)
        pc.agreed[fn] = Signature(plan.fp, info=info, root=plan.root, buckets=[plan.bucket])
    bufs = steps.keep = _buffers(src, plan, target, gets_result, trouble, pc, rt, due is not None)
    if info.payload_nbytes <= cfg.max_message_bytes and count <= INT_MAX:
        if count:
            name, args = _call(bufs.send, bufs.recv, bufs.in_place, plan.bucket, plan.root)
            steps(name, *args)
    else:
        send = _address(bufs.send)
        reduce(steps, send, send if bufs.in_place else _address(bufs.recv) if bufs.recv is not None else send,
               count, datatype, mpi_op, root, cfg.max_message_bytes)
    return _finished(bufs, plan, comm_.Get_size(), trouble)


def _finished(bufs: _Buffers, plan: _Plan, size: int, trouble: Exception | None) -> Array | None:
    """The result, or this rank's own error (a bad ``out=``) once the reduction is over."""
    result = bufs.finish(plan, size)
    if trouble is not None:
        raise trouble
    return result


def reduce_array(
    obj: Any, op: Any = "sum", root: int = 0, comm: MPI.Comm | None = None, *, out: Any = None,
    sync: bool | None = None, timeout: float | None = None,
) -> Array | None:
    """Reduce every rank's array element by element onto ``root``.

    Args:
        obj: this rank's array (anything ``send_array`` takes); every rank's has the same shape and dtype.
        op: "sum", "prod", "min", "max", "mean" (alias "avg": the sum divided by the communicator size, in
            ``obj``'s dtype; floating and complex arrays only), or an mpi4py ``MPI.Op``. Bool arrays reduce
            with ``MPI.LAND``, ``MPI.LOR``, ``MPI.LXOR``, and "min"/"max" (or ``MPI.MIN``/``MPI.MAX``), which
            are logical and/or. A device result of "mean" is divided on the host (staged).
        root: the rank that gets the result.
        comm: None for COMM_WORLD; any intracommunicator (its first use is collective).
        out: on the root, where to put the result (same shape and dtype, in native byte order).
        sync: the stream policy, as in ``send_array``.
        timeout: seconds to wait at most for every rank to join (None: ``CAI_MPI_TIMEOUT``, off by default).

    Returns:
        On the root an Array holding the result, in ``obj``'s dtype in native byte order (a host ``obj`` of
        the other byte order is converted first), on the device ``obj`` is on (or over ``out=``); None
        elsewhere.

    Raises:
        CollectiveMismatchError: on every rank, when shapes or dtypes differ (naming every rank's), or a rank
            could not take part (that rank raises its own error: a structured dtype, an ``op`` that does not apply
            to the dtype, such as "mean" of integers or "sum" of bools...).
        TimeoutError: some rank did not join within ``timeout`` (the collectives of ``comm`` are then out of
            step: end the job).
    """
    return _reduce("reduce_array", obj, op, root, comm, out, sync, timeout)


def allreduce_array(
    obj: Any, op: Any = "sum", comm: MPI.Comm | None = None, *, out: Any = None, sync: bool | None = None,
    timeout: float | None = None,
) -> Array:
    """Reduce every rank's array element by element; every rank gets the result.

    Args:
        obj: this rank's array (anything ``send_array`` takes); every rank's has the same shape and dtype.
        op: "sum", "prod", "min", "max", "mean" (alias "avg": the sum divided by the communicator size, in
            ``obj``'s dtype; floating and complex arrays only), or an mpi4py ``MPI.Op``. Bool arrays reduce
            with ``MPI.LAND``, ``MPI.LOR``, ``MPI.LXOR``, and "min"/"max" (or ``MPI.MIN``/``MPI.MAX``), which
            are logical and/or. A device result of "mean" is divided on the host (staged).
        comm: None for COMM_WORLD; any intracommunicator (its first use is collective).
        out: where to put the result on this rank (same shape and dtype, in native byte order).
        sync: None follows ``CAI_MPI_SYNC`` (default on); False skips the synchronization of this rank's
            producer stream.
        timeout: seconds to wait at most for every rank to join (None: ``CAI_MPI_TIMEOUT``, off by default).

    Returns:
        An Array holding the result, in ``obj``'s dtype in native byte order, on the device ``obj`` is on (or
        over ``out=``).

    Raises:
        CollectiveMismatchError, TimeoutError: as in ``reduce_array``.
    """
    got = _reduce("allreduce_array", obj, op, None, comm, out, sync, timeout)
    assert got is not None
    return got

