"""Shape-free reductions: reduce_array and allreduce_array, on MPI's Reduce/Allreduce with typed datatypes.

The ranks first agree that they reduce alike (same shape, exactly, and same dtype) with one small
Allreduce of a fingerprint; only when they do not do they exchange their descriptions, to say on every
rank who had what. The result keeps the input dtype, as MPI does (no numpy-style promotion), in native
byte order: MPI computes on native values, so host input of the other byte order is converted first
(ranks may mix byte orders). Device data is reduced by a CUDA-aware MPI where it lies, otherwise on the
host and copied back.
"""

from __future__ import annotations

import ctypes
import hashlib
from typing import Any

import numpy as np
from mpi4py import MPI

from ..arrays.array import Array
from ..arrays.operands import DeviceSource, RecvTarget, describe_target, mismatch, recv_target, send_source
from ..core.header import MessageInfo, encode_header
from ..errors import CollectiveMismatchError
from ..transport.agreement import Contribution, raise_failures, read, unpack
from ..transport.bigcount import reduce
from ..transport.contiguous import Landing, outgoing
from .collectives import joined, setup
from .validation import check_sync

__all__ = ["allreduce_array", "reduce_array"]

_OPS = {"sum": MPI.SUM, "prod": MPI.PROD, "min": MPI.MIN, "max": MPI.MAX}
_MEAN = ("mean", "avg")
_ORDERED = (MPI.MIN, MPI.MAX)
# every predefined op, by the name users write (mpi4py's Op has no name of its own)
_NAMES = [(getattr(MPI, name), f"MPI.{name}") for name in
          ("SUM", "PROD", "MIN", "MAX", "LAND", "LOR", "LXOR", "BAND", "BOR", "BXOR", "MINLOC", "MAXLOC",
           "REPLACE", "NO_OP") if hasattr(MPI, name)]
# bool arrays reduce with the logical ops; min and max of bools are logical and/or
_LOGICAL = (MPI.LAND, MPI.LOR, MPI.LXOR)
_BOOL_OPS = "MPI.LAND, MPI.LOR, MPI.LXOR, 'min' or MPI.MIN (logical and), 'max' or MPI.MAX (logical or)"
_OP_CHOICES = "'sum', 'prod', 'min', 'max', 'mean' (alias 'avg'), or an mpi4py MPI.Op such as MPI.SUM or MPI.LOR"


class _Op:
    """The op a reduction was asked for: MPI's op, whether the result is then divided by the size (mean),
    and the name to put in errors."""

    __slots__ = ("mean", "mpi", "name")

    def __init__(self, mpi: MPI.Op, name: str, mean: bool = False) -> None:
        self.mpi, self.name, self.mean = mpi, name, mean


def op_name(op: MPI.Op) -> str:
    """``MPI.SUM`` for MPI.SUM, not ``<mpi4py.MPI.Op object at ...>``."""
    for known, name in _NAMES:
        if op == known:
            return name
    return "a user-defined MPI.Op"


def _op(fn: str, op: Any) -> _Op:
    if isinstance(op, MPI.Op):
        return _Op(op, op_name(op))
    if isinstance(op, str) and op.lower() in _OPS:
        return _Op(_OPS[op.lower()], repr(op))
    if isinstance(op, str) and op.lower() in _MEAN:
        return _Op(MPI.SUM, repr(op), mean=True)
    raise ValueError(f"{fn}: op must be {_OP_CHOICES}; got {op!r}")


def _bool_op(fn: str, op: _Op) -> MPI.Op:
    """The MPI op that reduces bool arrays for ``op``: min and max are logical and/or (MPI defines MIN and
    MAX for integer and floating types only), the logical ops themselves; anything else is refused."""
    if op.mean:
        raise TypeError(f"{fn}: op={op.name} (the sum divided by the number of ranks) applies to floating or "
                        f"complex arrays, not to bool: convert to a floating dtype first")
    if op.mpi == MPI.MIN:
        return MPI.LAND
    if op.mpi == MPI.MAX:
        return MPI.LOR
    if any(op.mpi == logical for logical in _LOGICAL):
        return op.mpi
    raise TypeError(f"{fn}: {op.name} does not apply to a bool array: use {_BOOL_OPS}; "
                    "or convert to an integer dtype to count")


def _datatype(fn: str, dtype: np.dtype[Any], op: _Op) -> MPI.Datatype:
    """The MPI datatype that reduces ``dtype`` elements, or a clear refusal."""
    if dtype.names is not None or dtype.subdtype is not None:
        raise TypeError(f"{fn}: cannot reduce a structured dtype ({dtype}): reduce its fields separately")
    if dtype.kind == "b":
        return MPI.C_BOOL
    if op.mean and dtype.kind not in "fc":
        raise TypeError(f"{fn}: op={op.name} (the sum divided by the number of ranks) applies to floating or "
                        f"complex arrays, not to {dtype}: convert to a floating dtype first, or reduce with "
                        "'sum' and divide")
    if not dtype.isnative:  # (host input was converted by _native; this guards every other way in)
        raise TypeError(f"{fn}: dtype {dtype.str} is not in native byte order, and MPI reduces native values: "
                        "convert with x.astype(x.dtype.newbyteorder('='))")
    if dtype.kind == "c" and any(op.mpi == ordered for ordered in _ORDERED):
        raise TypeError(f"{fn}: complex values have no order: {op.name} does not apply to {dtype}; "
                        "use 'sum', 'prod' or 'mean'")
    try:
        datatype = MPI.Datatype.fromcode(dtype.char)  # predefined (reductions take no derived datatype)
    except (ValueError, KeyError, TypeError):
        datatype = None
    if datatype is None or datatype == MPI.DATATYPE_NULL or datatype.Get_size() != dtype.itemsize:
        raise TypeError(f"{fn}: MPI has no reduction datatype for {dtype} ({dtype.str})")
    return datatype


def _divide(address: int, count: int, dtype: np.dtype[Any], size: int) -> None:
    """op="mean": the sum at ``address`` (host memory) divided by the number of ranks, in place, in ``dtype``."""
    if count == 0:
        return
    total = np.frombuffer(memoryview((ctypes.c_char * (count * dtype.itemsize)).from_address(address)).cast("B"), dtype)
    np.true_divide(total, dtype.type(size), out=total)


def _native(fn: str, src: np.ndarray[Any, Any] | DeviceSource) -> np.ndarray[Any, Any] | DeviceSource:
    """``src`` with its values in native byte order: MPI's arithmetic reads native values, and would compute
    nonsense on swapped bytes. Host data is converted (a copy); device data is refused, since converting it
    is the device library's job."""
    dtype = src.dtype if isinstance(src, np.ndarray) else src.desc.dtype
    if dtype.isnative or dtype.names is not None or dtype.subdtype is not None:
        return src  # (structured dtypes are refused by _datatype, whatever their byte order)
    if isinstance(src, np.ndarray):
        return src.astype(dtype.newbyteorder("="), order="C")
    raise TypeError(f"{fn}: a device array of dtype {dtype.str} is not in native byte order, and MPI reduces "
                    f"native values: convert it on the device first (to {dtype.newbyteorder('=').str})")


def _fingerprint(info: bytes) -> int:
    return int.from_bytes(hashlib.blake2b(info, digest_size=8).digest(), "little", signed=True)


def _reduce(
    fn: str, obj: Any, op: Any, root: int | None, comm: Any, out: Any, sync: Any, timeout: Any
) -> Array | None:
    pc, comm_, _root, rt, cfg, due = setup(fn, comm, root, timeout)
    me = comm_.Get_rank()
    gets_result = root is None or me == root
    target: Any = None

    def describe() -> tuple[bytes, Any]:
        nonlocal target
        mpi_op = _op(fn, op)
        src = _native(fn, send_source(fn, obj, check_sync(fn, sync), rt))
        desc_shape, dtype = (src.shape, src.dtype) if isinstance(src, np.ndarray) else (src.desc.shape, src.desc.dtype)
        datatype = _datatype(fn, dtype, mpi_op)
        if dtype.kind == "b":
            mpi_op = _Op(_bool_op(fn, mpi_op), mpi_op.name)
        if out is not None and gets_result:
            target = recv_target(fn, out, rt)
            why = mismatch(target, desc_shape, dtype)
            if why is not None:
                raise ValueError(f"{fn}: out= ({describe_target(target)}) cannot hold the result "
                                 f"(shape={desc_shape} dtype={dtype.str}): {why}")
        blob = encode_header(dtype, desc_shape, fortran=False, payload_tag=0)
        return blob, (src, mpi_op, datatype)

    mine = Contribution.attempt(describe)
    print_ = _fingerprint(mine.blob)
    failed = mine.error is not None
    votes = np.array([print_, -print_, -int(failed)], np.int64)
    joined(fn, comm_, due, "Allreduce", MPI.IN_PLACE, votes, MPI.MIN)
    if votes[0] != -votes[1] or votes[2] != 0:
        _disagree(fn, comm_, mine)
    src, mpi_op, datatype = mine.source
    info = read(mine.blob)
    assert isinstance(info, MessageInfo)
    on_device = target.desc is not None if isinstance(target, RecvTarget) else (
        target is None and isinstance(src, DeviceSource))
    # MPI reduces where both buffers lie: on the device only through a CUDA-aware MPI, and only when
    # input and result are both device memory; otherwise on the host, staged both ways.
    # The mean divides the sum on the host, so a device result of op="mean" is staged through the host.
    direct = (pc.aware.aware and isinstance(src, DeviceSource) and (on_device or not gets_result)
              and not (mpi_op.mean and gets_result))
    piece = outgoing(src, rt, direct=direct, c_order=True)
    landing = None
    if gets_result:
        ordinal = src.ordinal if target is None and isinstance(src, DeviceSource) else None
        landing = Landing.plan(info, target, ordinal, -1, -1, rt, direct=direct)
    count = info.payload_nbytes // max(datatype.Get_size(), 1)
    reduce(comm_, piece.address, piece.address if landing is None else landing.address, count, datatype,
           mpi_op.mpi, root, cfg.max_message_bytes)
    piece.release()
    if landing is not None and mpi_op.mean:
        assert not landing.device
        _divide(landing.address, count, info.dtype, comm_.Get_size())
    return None if landing is None else landing.finish()


def _disagree(fn: str, comm_: MPI.Intracomm, mine: Contribution) -> None:
    """The ranks do not reduce alike: tell every rank who had what, and raise."""
    size = comm_.Get_size()
    counts = np.empty(size, np.int64)
    comm_.Allgather(np.array([len(mine.blob)], np.int64), counts)
    data = bytearray(max(int(counts.sum()), 1))
    displs = [int(counts[:i].sum()) for i in range(size)]
    comm_.Allgatherv(mine.blob, [data, ([int(c) for c in counts], displs), MPI.BYTE])
    described = [read(b) for b in unpack(data, [int(c) for c in counts])]
    raise_failures(fn, described, mine, comm_.Get_rank())
    had = "; ".join(f"rank {r}: shape={d.shape} dtype={d.dtype.str}" for r, d in enumerate(described)
                    if isinstance(d, MessageInfo))
    raise CollectiveMismatchError(f"{fn}: the ranks must reduce arrays of one shape and dtype, but {had}")


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


parse_op, bool_op, datatype_for = _op, _bool_op, _datatype  # public for persistent.py and bucketed.py (issue 26)
