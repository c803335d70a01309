"""Bucketed allreduce: many arrays reduced with one collective per dtype, not one per array.

The arrays of a list or dict are grouped by dtype; each group is copied back to back into one contiguous
bucket, reduced with one MPI Allreduce (``allreduce_arrays``) or one MPI-4 persistent Allreduce bound once to
the bucket (``allreduce_init`` of a list or dict), and the results are views of the bucket. One agreement
Allreduce checks that every rank reduces the same arrays (keys, shapes, dtypes, op). Device arrays are copied
into and out of the host buckets (staged), whatever the MPI.
"""

from __future__ import annotations

import copy
import ctypes
import math
from collections.abc import Mapping
from typing import Any

import numpy as np
from mpi4py import MPI

from ..arrays.array import Array
from ..arrays.operands import DeviceSource, send_source
from ..runtime.base import Runtime
from ..transport import internal_stream, outgoing
from ..transport.bigcount import INT_MAX, reduce
from .agreed import agree
from .collective_call import setup
from .lifecycle import PersistentLifecycle
from .reduce_ops import parse_op, reduce_datatype
from .validation import check_sync

__all__ = ["BucketedAllreduce", "allreduce_arrays", "is_container"]

_NO_TAG = -1


class _Bucket:
    """The arrays of one dtype, back to back: for each, where it sits in the container, its shape, its first
    element in the bucket, its size, and (device arrays) its GPU and address."""

    __slots__ = ("count", "counts", "datatype", "dtype", "host", "objs", "op", "ordinals", "positions", "ptrs",
                 "shapes", "starts")

    def __init__(self, dtype: np.dtype[Any], datatype: MPI.Datatype, op: MPI.Op) -> None:
        self.dtype, self.datatype, self.op = dtype, datatype, op
        self.positions: list[int] = []
        self.shapes: list[tuple[int, ...]] = []
        self.starts: list[int] = []
        self.counts: list[int] = []
        self.ordinals: list[int | None] = []
        self.ptrs: list[int] = []
        self.objs: list[Any] = []
        self.count = 0
        self.host = True  # every array in host memory

    def add(self, obj: Any, position: int, shape: tuple[int, ...], ordinal: int | None, ptr: int) -> None:
        n = math.prod(shape)
        self.positions.append(position)
        self.shapes.append(shape)
        self.starts.append(self.count)
        self.counts.append(n)
        self.ordinals.append(ordinal)
        self.ptrs.append(ptr)
        self.objs.append(obj)
        self.count += n
        self.host = self.host and ordinal is None


def is_container(obj: Any) -> bool:
    """A list, tuple or dict of arrays (the bucketed forms), not one array."""
    return isinstance(obj, (list, tuple, Mapping))


def _entries(fn: str, objs: Any) -> tuple[list[Any] | None, list[Any]]:
    """``(keys or None for a list, values)``."""
    if isinstance(objs, Mapping):
        return list(objs.keys()), list(objs.values())
    if isinstance(objs, (list, tuple)):
        return None, list(objs)
    raise TypeError(f"{fn}: expected a list or a dict of arrays, got {type(objs).__name__}")


class _Plan:
    """What this rank reduces: buckets by dtype, and the text every rank compares."""

    __slots__ = ("buckets", "keys", "mean", "n", "sources", "sync", "text")

    def __init__(self, fn: str, objs: Any, op: Any, sync: Any, rt: Runtime) -> None:
        self.sync = check_sync(fn, sync)
        mpi_op = parse_op(fn, op)
        self.keys, values = _entries(fn, objs)
        self.n = len(values)
        self.mean = mpi_op.mean
        buckets: dict[np.dtype[Any], _Bucket] = {}
        self.sources: list[Any] = []
        shapes, dtypes = [], []
        for i, obj in enumerate(values):
            src = obj if type(obj) is np.ndarray else send_source(fn, obj, self.sync, rt)
            self.sources.append(src)
            if isinstance(src, DeviceSource):
                dtype, shape, ordinal, ptr = src.desc.dtype, src.desc.shape, src.ordinal, src.desc.ptr
                if not dtype.isnative and dtype.names is None:
                    raise TypeError(f"{fn}: array {self._name(i)}: a device array of dtype {dtype.str} is not in "
                                    "native byte order, and MPI reduces native values: convert it on the device first")
            else:
                dtype, shape, ordinal, ptr = src.dtype, src.shape, None, 0
            native = dtype if dtype.isnative or dtype.names is not None else dtype.newbyteorder("=")
            bucket = buckets.get(native)
            if bucket is None:
                try:
                    datatype = reduce_datatype(fn, native, mpi_op)
                    mop = mpi_op.for_bool(fn).mpi if native.kind == "b" else mpi_op.mpi
                except TypeError as exc:
                    raise TypeError(f"{exc} (array {self._name(i)})") from None
                bucket = buckets[native] = _Bucket(native, datatype, mop)
            bucket.add(obj, i, shape, ordinal, ptr)
            shapes.append(shape)
            dtypes.append(native.str)
        self.buckets = list(buckets.values())
        self.text = f"allreduce of {self.keys!r} shapes {shapes} dtypes {dtypes} op={mpi_op.name}"

    def _name(self, i: int) -> str:
        return f"{i}" if self.keys is None else repr(self.keys[i])

    def fill(self, bucket: _Bucket, buf: np.ndarray[Any, Any], sources: list[Any], rt: Runtime) -> None:
        """Copy each array of ``bucket`` (its current contents) into its place in ``buf``."""
        if bucket.host:  # one numpy call (each array flattened in C order, converted to native byte order)
            np.concatenate([sources[p] for p in bucket.positions], axis=None, out=buf, casting="equiv")
            return
        for pos, start, n in zip(bucket.positions, bucket.starts, bucket.counts, strict=True):
            src, part = sources[pos], buf[start : start + n]
            if isinstance(src, np.ndarray):
                part[...] = src.reshape(-1)
            elif n:
                piece = outgoing(src, rt, direct=False, c_order=True)  # staged through pinned host memory
                staged = (ctypes.c_char * piece.nbytes).from_address(piece.address)
                part.view(np.uint8)[...] = np.frombuffer(memoryview(staged), np.uint8)
                piece.release()

    def results(self, buckets: list[np.ndarray[Any, Any]], device: dict[int, Array], rt: Runtime) -> list[Array]:
        """Each array's result: a view of its bucket (host) or the device Array given for it, refreshed."""
        out: list[Any] = [None] * self.n
        streams = set()
        for bucket, buf in zip(self.buckets, buckets, strict=True):
            for pos, shape, start, n, ordinal in zip(bucket.positions, bucket.shapes, bucket.starts, bucket.counts,
                                                     bucket.ordinals, strict=True):
                part = buf[start : start + n]
                if ordinal is None:
                    out[pos] = Array.from_host(part.reshape(shape))  # (the view keeps the bucket alive)
                    continue
                stream = internal_stream(rt, ordinal)
                arr = device.get(pos)
                if arr is None:
                    arr = Array.from_device(rt.alloc_device(part.nbytes, ordinal, stream, handed_out=True), shape,
                                            bucket.dtype)
                if part.nbytes:
                    rt.copy_async(arr.descriptor.ptr, part.ctypes.data, part.nbytes, stream)
                    streams.add(stream)
                out[pos] = arr
        for stream in streams:
            rt.record_event(stream).synchronize()
        return out

    def container(self, arrays: list[Any]) -> Any:
        return arrays if self.keys is None else dict(zip(self.keys, arrays, strict=True))

    def divide(self, buckets: list[np.ndarray[Any, Any]], size: int) -> None:
        if self.mean:
            for bucket, buf in zip(self.buckets, buckets, strict=True):
                np.true_divide(buf, bucket.dtype.type(size), out=buf)


def _attempt(fn: str, objs: Any, op: Any, sync: Any, rt: Runtime) -> tuple[str, _Plan, bool]:
    plan = _Plan(fn, objs, op, sync, rt)
    return plan.text, plan, False


# Plans of calls on host numpy arrays, by (op, keys, shapes, dtypes): a training loop reduces the same arrays
# every step, and the plan depends on nothing else (the arrays themselves are this call's).
_PLANS: dict[Any, _Plan] = {}


def _reused(fn: str, objs: Any, op: Any, sync: Any, rt: Runtime) -> tuple[str, _Plan, bool]:
    values = objs if type(objs) is list else (list(objs.values()) if type(objs) is dict else None)
    if values is None or not isinstance(op, str) or not all(type(v) is np.ndarray for v in values):
        return _attempt(fn, objs, op, sync, rt)
    key = (op, None if type(objs) is list else tuple(objs), tuple([v.shape for v in values]),
           tuple([v.dtype for v in values]))
    cached = _PLANS.get(key)
    if cached is None:
        if len(_PLANS) >= 64:
            _PLANS.clear()
        cached = _PLANS[key] = _Plan(fn, objs, op, sync, rt)
    plan = copy.copy(cached)  # (the cached plan is shared; this call's arrays are its own)
    plan.sources = values
    return plan.text, plan, False


def allreduce_arrays(
    objs: Any, op: Any = "sum", comm: MPI.Comm | None = None, *, sync: bool | None = None,
    timeout: float | None = None,
) -> Any:
    """Reduce many arrays at once, element by element; every rank gets the results.

    The arrays are grouped by dtype and each group is reduced with one MPI Allreduce over a contiguous bucket
    (plus one small agreement Allreduce for the whole call), not one collective per array.

    Args:
        objs: a list or a dict of arrays (anything ``send_array`` takes, mixed dtypes and shapes); every rank
            passes the same keys, shapes and dtypes, in the same order.
        op: "sum", "prod", "min", "max", "mean" (alias "avg": the sum divided by the communicator size, in
            the input's dtype; floating and complex arrays only), or an mpi4py ``MPI.Op``. Bool arrays reduce with
            ``MPI.LAND``, ``MPI.LOR``, ``MPI.LXOR``, and "min"/"max" (logical and/or). Applied to every array.
        comm: None for COMM_WORLD; any intracommunicator.
        sync: None follows ``CAI_MPI_SYNC`` (default on); False skips the synchronization of this rank's
            producer streams.
        timeout: seconds to wait at most for every rank to join (None: ``CAI_MPI_TIMEOUT``, off by default).

    Returns:
        The same container (a list, or a dict with the same keys) of Arrays, each in its input's dtype in native
        byte order: host arrays are views of one buffer per dtype; a device input's result is on its device
        (device arrays are staged through host memory and reduced there).

    Raises:
        CollectiveMismatchError: on every rank, when the ranks' keys, shapes, dtypes or ops differ (naming every
            rank's), or a rank could not take part (that rank raises its own error).
        TimeoutError: some rank did not join within ``timeout``.
    """
    fn = "allreduce_arrays"
    _pc, comm_, _root, rt, cfg, due = setup(fn, comm, None, timeout)
    plan: _Plan
    plan, _device = agree(fn, comm_, due, lambda: _reused(fn, objs, op, sync, rt))
    buffers = []
    for bucket in plan.buckets:
        buf = np.empty(bucket.count, bucket.dtype)
        plan.fill(bucket, buf, plan.sources, rt)
        if bucket.count * bucket.dtype.itemsize <= cfg.max_message_bytes and bucket.count <= INT_MAX:
            comm_.Allreduce(MPI.IN_PLACE, [buf, bucket.datatype], bucket.op)  # the common case, one call
        else:
            address = buf.ctypes.data
            reduce(comm_, address, address, bucket.count, bucket.datatype, bucket.op, None, cfg.max_message_bytes)
        buffers.append(buf)
    plan.divide(buffers, comm_.Get_size())
    return plan.container(plan.results(buffers, {}, rt))


class BucketedAllreduce(PersistentLifecycle):
    """A persistent allreduce of a list or dict of arrays, made by ``allreduce_init`` given one.

    Used as a ``PersistentCollective`` is (``start``, ``wait``, call, ``close``, context manager): each use copies
    the arrays' current contents into one bucket per dtype and runs one MPI-4 persistent Allreduce per bucket;
    ``wait()`` returns the same container of Arrays at every use, over memory allocated once at creation (host
    results are views of the buckets; device results are device buffers, copied into at each use): the next use
    overwrites them. ``close()`` is collective; shapes are fixed at creation (an array reshaped or reallocated
    since is refused with ``ValueError``, as is any use after ``close()``).
    """

    __slots__ = ("_device", "_plan", "_recv", "_result", "_rt", "_send")

    def __init__(self, objs: Any, op: Any, comm: Any, sync: Any) -> None:
        fn = "allreduce_init"
        self._begin_life(fn, "bucketed allreduce")
        _pc, comm_, _root, rt, _cfg, due = setup(fn, comm, None, None)
        self._comm, self._rt = comm_, rt
        self._plan, _dev = agree(fn, comm_, due, lambda: _attempt(fn, objs, op, sync, rt))
        self._send = [np.empty(b.count, b.dtype) for b in self._plan.buckets]
        self._recv = [np.empty(b.count, b.dtype) for b in self._plan.buckets]
        for bucket, s, r in zip(self._plan.buckets, self._send, self._recv, strict=True):
            sbuf = [MPI.buffer.fromaddress(s.ctypes.data if s.size else 0, s.nbytes, readonly=True), bucket.count,
                    bucket.datatype]
            rbuf = [MPI.buffer.fromaddress(r.ctypes.data if r.size else 0, r.nbytes), bucket.count, bucket.datatype]
            self._reqs.append(comm_.Allreduce_init(sbuf, rbuf, bucket.op))
        self._device: dict[int, Array] = {}
        self._result = self._plan.results(self._recv, self._device, rt)
        self._device = {i: a for i, a in enumerate(self._result) if not a.is_host}
        self._open()

    def _begin(self) -> list[MPI.Request]:
        """Every array's current contents copied into its bucket, then every bucket's persistent Allreduce."""
        plan, rt = self._plan, self._rt
        ordered: list[Any] = [None] * plan.n
        for bucket in plan.buckets:
            for obj, pos, shape0, ptr0 in zip(bucket.objs, bucket.positions, bucket.shapes, bucket.ptrs, strict=True):
                src = obj if type(obj) is np.ndarray else send_source(self._fn, obj, plan.sync, rt)
                shape = src.desc.shape if isinstance(src, DeviceSource) else src.shape
                ptr = src.desc.ptr if isinstance(src, DeviceSource) else 0
                if shape != shape0 or ptr != ptr0:
                    raise self._changed("an array was reshaped or reallocated", shape0, shape)
                ordered[pos] = src
        for bucket, buf in zip(plan.buckets, self._send, strict=True):
            plan.fill(bucket, buf, ordered, rt)
        MPI.Prequest.Startall(self._reqs)  # type: ignore[arg-type]  # (every one from Allreduce_init)
        return self._reqs

    def _done(self) -> Any:
        """The container of results (the same Arrays at every use), the mean divided and device copies made."""
        plan = self._plan
        plan.divide(self._recv, self._comm.Get_size())
        if self._device:
            plan.results(self._recv, self._device, self._rt)
        return plan.container(list(self._result))

    def _memory(self) -> Any:
        return (self._send, self._recv)

    def __repr__(self) -> str:
        return f"<cai_mpi persistent bucketed allreduce of {self._plan.n} arrays {self._state()}>"
