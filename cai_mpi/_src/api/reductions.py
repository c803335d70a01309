"""Shape-free reductions: reduce_array and allreduce_array, on MPI's Reduce/Allreduce with typed datatypes.

The ranks first exchange their descriptions (``transport.agreement``: one Allgather of fixed-size slots), so
every rank knows that they reduce alike (same shape, exactly, and same dtype) or who had what. When every
rank's data is small host data that numpy reduces as MPI would, the slots carry the values too and each rank
reduces them itself (``reduce_ops.combine``): the whole call is that one collective. Otherwise MPI's
Reduce/Allreduce follows, on typed datatypes. The result keeps the input dtype, as MPI does (no numpy-style
promotion), in native byte order: MPI computes on native values, so host input of the other byte order is
converted first (ranks may mix byte orders). Device data is reduced by a CUDA-aware MPI where it lies, otherwise on the
host and copied back.
"""

from __future__ import annotations

import ctypes
import math
from typing import Any

import numpy as np
from mpi4py import MPI

from ..arrays.array import Array
from ..arrays.operands import DeviceSource, RecvTarget, Target, describe_target, mismatch, recv_target, send_source
from ..core.header import MessageInfo, encode_header
from ..errors import CollectiveMismatchError
from ..runtime.base import Runtime
from ..transport.agreement import Contribution, Exchange, exchange, raise_failures
from ..transport.bigcount import reduce
from ..transport.contiguous import Landing, outgoing
from .collective_call import setup
from .reduce_ops import ReduceOp, combine, divide, parse_op, reduce_datatype
from .validation import check_sync

__all__ = ["allreduce_array", "reduce_array"]


class _Plan:
    """This rank's part of a reduction, once its arguments are checked: the source (native byte order), what it
    is (``info``), the op and MPI datatype, and the ``out=`` target."""

    __slots__ = ("datatype", "info", "op", "source", "target")

    def __init__(self, source: np.ndarray[Any, Any] | DeviceSource, info: MessageInfo, op: ReduceOp,
                 datatype: MPI.Datatype, target: Target | None) -> None:
        self.source, self.info, self.op, self.datatype, self.target = source, info, op, datatype, target


def _native(fn: str, src: np.ndarray[Any, Any] | DeviceSource) -> np.ndarray[Any, Any] | DeviceSource:
    """``src`` with its values in native byte order: MPI's arithmetic reads native values, and would compute
    nonsense on swapped bytes. Host data is converted (a copy); device data is refused, since converting it
    is the device library's job."""
    dtype = src.dtype if isinstance(src, np.ndarray) else src.desc.dtype
    if dtype.isnative or dtype.names is not None or dtype.subdtype is not None:
        return src  # (structured dtypes are refused by reduce_datatype, whatever their byte order)
    if isinstance(src, np.ndarray):
        return src.astype(dtype.newbyteorder("="), order="C")
    raise TypeError(f"{fn}: a device array of dtype {dtype.str} is not in native byte order, and MPI reduces "
                    f"native values: convert it on the device first (to {dtype.newbyteorder('=').str})")


def _plan(fn: str, obj: Any, op: Any, out: Any, gets_result: bool, sync: Any, rt: Runtime) -> tuple[bytes, _Plan]:
    """This rank's header (C order, as reductions move their elements) and plan; raises on a bad argument."""
    src = _native(fn, send_source(fn, obj, check_sync(fn, sync), rt))
    shape, dtype = (src.shape, src.dtype) if isinstance(src, np.ndarray) else (src.desc.shape, src.desc.dtype)
    key = (op if isinstance(op, str) else op.py2f() if isinstance(op, MPI.Op) else None, dtype, shape)
    known = _known.get(key)
    if known is None:
        how = parse_op(fn, op)
        datatype = reduce_datatype(fn, dtype, how)
        if dtype.kind == "b":
            how = how.for_bool(fn)
        info = MessageInfo(dtype, shape, False, math.prod(shape) * dtype.itemsize, 0, None, False, False, 0)
        known = (encode_header(dtype, shape, fortran=False, payload_tag=0), info, how, datatype)
        if key[0] is not None:
            if len(_known) >= 256:
                _known.clear()
            _known[key] = known
    blob, info, how, datatype = known
    target = None
    if out is not None and gets_result:
        target = recv_target(fn, out, rt)
        why = mismatch(target, shape, dtype)
        if why is not None:
            raise ValueError(f"{fn}: out= ({describe_target(target)}) cannot hold the result "
                             f"(shape={shape} dtype={dtype.str}): {why}")
    return blob, _Plan(src, info, how, datatype, target)


# (op, dtype, shape) -> (header, MessageInfo, ReduceOp, MPI datatype): what checking the arguments found, for the
# next call with the same (a step of a solver or a training loop reduces the same arrays every time).
_known: dict[tuple[Any, ...], tuple[bytes, MessageInfo, ReduceOp, MPI.Datatype]] = {}


def _reduce(
    fn: str, obj: Any, op: Any, root: int | None, comm: Any, out: Any, sync: Any, timeout: Any
) -> Array | None:
    pc, comm_, _root, rt, cfg, due = setup(fn, comm, root, timeout)
    me = comm_.Get_rank()
    gets_result = root is None or me == root
    try:
        blob, plan = _plan(fn, obj, op, out, gets_result, sync, rt)
        mine = Contribution(blob, plan)
    except Exception as exc:
        mine, plan = Contribution.failed(exc), None
    # Small host data travels in the exchange and is reduced here; the exchange says whether every rank's did.
    local = plan is not None and plan.op.local(plan.info.dtype)
    ex = exchange(fn, comm_, mine, 0 if plan is None else plan.info.payload_nbytes, due,
                  payload=plan.source if local and plan is not None and isinstance(plan.source, np.ndarray) else None,
                  c_order=True)
    if not ex.alike:  # (alike: every rank sent this rank's header, so none failed and all reduce alike)
        raise_failures(fn, ex.described, mine, me)
        _alike(fn, ex, mine)
    assert plan is not None
    if ex.fused:
        return _reduced_here(plan, ex, comm_.Get_size(), rt) if gets_result else None
    src, info = plan.source, plan.info
    target = plan.target
    on_device = target.desc is not None if isinstance(target, RecvTarget) else (
        target is None and isinstance(src, DeviceSource))
    # MPI reduces where both buffers lie: on the device only through a CUDA-aware MPI, and only when
    # input and result are both device memory; otherwise on the host, staged both ways.
    # The mean divides the sum on the host, so a device result of op="mean" is staged through the host.
    direct = (pc.aware.aware and isinstance(src, DeviceSource) and (on_device or not gets_result)
              and not (plan.op.mean and gets_result))
    piece = outgoing(src, rt, direct=direct, c_order=True)
    landing = None
    if gets_result:
        ordinal = src.ordinal if target is None and isinstance(src, DeviceSource) else None
        landing = Landing.plan(info, target, ordinal, -1, -1, rt, direct=direct)
    count = info.payload_nbytes // max(plan.datatype.Get_size(), 1)
    reduce(comm_, piece.address, piece.address if landing is None else landing.address, count, plan.datatype,
           plan.op.mpi, root, cfg.max_message_bytes)
    piece.release()
    if landing is not None and plan.op.mean:
        assert not landing.device
        divide(landing.address, count, info.dtype, comm_.Get_size())
    return None if landing is None else landing.finish()


def _alike(fn: str, ex: Exchange, mine: Contribution) -> None:
    """Every rank reduces the same shape and dtype, or CollectiveMismatchError on every rank saying who had what."""
    infos = ex.infos()
    if all(i.dtype == infos[0].dtype and i.shape == infos[0].shape for i in infos):
        return
    had = "; ".join(f"rank {r}: shape={d.shape} dtype={d.dtype.str}" for r, d in enumerate(infos))
    raise CollectiveMismatchError(f"{fn}: the ranks must reduce arrays of one shape and dtype, but {had}")


def _reduced_here(plan: _Plan, ex: Exchange, size: int, rt: Runtime) -> Array:
    """The reduction of the values every rank's slot carried, computed in numpy, where the result goes."""
    info = plan.info
    dtype, shape = info.dtype, info.shape
    parts = [np.ndarray(shape, dtype, ex.slots, ex.start(r)) for r in range(size)]
    result = combine(plan.op, parts, size)
    target = plan.target
    if target is None:
        return Array._over_host(result, -1, -1, None)
    if isinstance(target, np.ndarray):
        np.copyto(target, result, casting="no")
        return Array._over_host(target, -1, -1, None, target)
    if target.host is not None:
        np.copyto(target.host, result, casting="no")
        return Array._over_host(target.host, -1, -1, None, target.owner)
    landing = Landing.plan(info, target, None, -1, -1, rt, direct=False)  # a device out=: through the host
    if info.payload_nbytes:
        ctypes.memmove(landing.address, result.ctypes.data, info.payload_nbytes)
    return landing.finish()


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

