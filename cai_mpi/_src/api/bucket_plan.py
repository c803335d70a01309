"""The plan of a bucketed allreduce (``bucketed``): what one rank reduces, grouped by dtype into buckets, which
large host arrays are reduced on their own (``split``), the text every rank votes on; the copies into buckets and
the result Arrays over them."""

from __future__ import annotations

import ctypes
import math
from collections.abc import Mapping
from typing import Any

import numpy as np
from mpi4py import MPI

from ..arrays.array import NO_SOURCE, NO_TAG, Array
from ..arrays.operands import DeviceSource, send_source
from ..arrays.sync import sync_enabled, sync_unnamed
from ..runtime.base import Runtime
from ..transport import internal_stream, outgoing
from ..transport.agreement import fingerprint
from .reduce_ops import ReduceOp, native_dtype, parse_op, reduce_datatype
from .validation import check_sync

__all__ = ["DIRECT_BYTES", "Bucket", "Direct", "Plan", "is_container"]

#: A host array of at least this many bytes is reduced by ``allreduce_arrays`` on its own, from its buffer, not
#: copied into its dtype's bucket (docs/benchmarks.md has the measurement that chose it). A constant, not a setting:
#: every rank must split the same arrays out, or their bucket collectives differ.
DIRECT_BYTES = 128 * 1024


class Bucket:
    """The arrays of one dtype, back to back: for each, where it sits in the container, its shape, its first
    element in the bucket, its size, and (device arrays) its GPU and address."""

    __slots__ = ("count", "counts", "datatype", "dtype", "host", "how", "native", "objs", "op", "ordinals",
                 "positions", "ptrs", "shapes", "starts")

    def __init__(self, dtype: np.dtype[Any], datatype: MPI.Datatype, how: ReduceOp) -> None:
        self.dtype, self.datatype, self.how, self.op = dtype, datatype, how, how.mpi
        self.positions: list[int] = []
        self.shapes: list[tuple[int, ...]] = []
        self.starts: list[int] = []
        self.counts: list[int] = []
        self.ordinals: list[int | None] = []
        self.ptrs: list[int] = []
        self.objs: list[Any] = []
        self.count = 0
        self.host = True  # every array in host memory
        self.native = True  # every array of the bucket's dtype (none to convert from the other byte order)

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


class Direct:
    """A large host array, reduced on its own from its buffer: where it sits in the container, its shape, native
    dtype, MPI datatype and op."""

    __slots__ = ("datatype", "dtype", "op", "position", "shape")

    def __init__(self, position: int, shape: tuple[int, ...], dtype: np.dtype[Any], datatype: MPI.Datatype,
                 op: MPI.Op) -> None:
        self.position, self.shape, self.dtype, self.datatype, self.op = position, shape, dtype, datatype, op


class Plan:
    """What this rank reduces: buckets by dtype (and, ``split``, the large host arrays reduced on their own), and
    the text every rank compares and its fingerprint."""

    __slots__ = ("buckets", "direct", "fp", "keys", "mean", "n", "sources", "sync", "text")

    def __init__(self, fn: str, objs: Any, op: Any, sync: Any, rt: Runtime, split: bool = False) -> None:
        self.sync = check_sync(fn, sync)
        mpi_op = parse_op(fn, op)
        self.keys, values = _entries(fn, objs)
        self.n = len(values)
        self.mean = mpi_op.mean
        buckets: dict[np.dtype[Any], Bucket] = {}
        self.direct: list[Direct] = []
        self.sources: list[Any] = []
        shapes, dtypes = [], []
        for i, obj in enumerate(values):
            src = obj if type(obj) is np.ndarray else send_source(fn, obj, self.sync, rt)
            self.sources.append(src)
            if isinstance(src, DeviceSource):
                dtype, shape, ordinal, ptr = src.desc.dtype, src.desc.shape, src.ordinal, src.desc.ptr
            else:
                dtype, shape, ordinal, ptr = src.dtype, src.shape, None, 0
            native = native_dtype(f"{fn}: array {self._name(i)}", dtype, device=ordinal is not None)
            shapes.append(shape)
            dtypes.append(native.str)
            bucket = buckets.get(native)
            if bucket is None:
                try:
                    datatype = reduce_datatype(fn, native, mpi_op)
                    how = mpi_op.for_bool(fn) if native.kind == "b" else mpi_op
                except TypeError as exc:
                    raise TypeError(f"{exc} (array {self._name(i)})") from None
                bucket = buckets[native] = Bucket(native, datatype, how)
            if split and ordinal is None and math.prod(shape) * native.itemsize >= DIRECT_BYTES:
                self.direct.append(Direct(i, shape, native, bucket.datatype, bucket.op))
                continue
            bucket.add(obj, i, shape, ordinal, ptr)
            bucket.native = bucket.native and dtype == native
        self.buckets = [b for b in buckets.values() if b.positions]
        self.text = f"allreduce of {self.keys!r} shapes {shapes} dtypes {dtypes} op={mpi_op.name}"
        self.fp = fingerprint(self.text)

    def _name(self, i: int) -> str:
        return f"{i}" if self.keys is None else repr(self.keys[i])

    def fill(self, bucket: Bucket, buf: np.ndarray[Any, Any], sources: list[Any], rt: Runtime) -> None:
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

    def results(self, buckets: list[np.ndarray[Any, Any]], alone: list[np.ndarray[Any, Any]],
                device: dict[int, Array], rt: Runtime) -> list[Array]:
        """Each array's result: a view of its bucket (host), the device Array given for it (refreshed), or the array
        it was reduced into on its own (``alone``, in ``direct``'s order)."""
        out: list[Any] = [None] * self.n
        streams = set()
        waited: set[tuple[int, int | None]] = set()
        over_host = Array.over_host
        view = np.ndarray
        for bucket, buf in zip(self.buckets, buckets, strict=True):
            if bucket.host:  # (each a view of buf, which it keeps alive)
                dtype, size = bucket.dtype, bucket.dtype.itemsize
                for pos, shape, start in zip(bucket.positions, bucket.shapes, bucket.starts, strict=True):
                    out[pos] = over_host(view(shape, dtype, buf, start * size), NO_SOURCE, NO_TAG, None)
                continue
            for pos, shape, start, n, ordinal in zip(bucket.positions, bucket.shapes, bucket.starts, bucket.counts,
                                                     bucket.ordinals, strict=True):
                part = buf[start : start + n]
                if ordinal is None:
                    out[pos] = over_host(part.reshape(shape), NO_SOURCE, NO_TAG, None)  # (the view keeps the bucket)
                    continue
                stream = internal_stream(rt, ordinal)
                arr = device.get(pos)
                if arr is None:
                    arr = Array.from_device(rt.alloc_device(part.nbytes, ordinal, stream, handed_out=True), shape,
                                            bucket.dtype)
                elif part.nbytes and sync_enabled(None) and (ordinal, arr.descriptor.stream) not in waited:
                    # The last use's result may still be read on the user's streams: wait before overwriting it, as
                    # PersistentCollective does (sync_before_write); sync=False concerns the inputs only.
                    sync_unnamed(ordinal, rt, arr.descriptor.stream)
                    waited.add((ordinal, arr.descriptor.stream))
                if part.nbytes:
                    rt.copy_async(arr.descriptor.ptr, part.ctypes.data, part.nbytes, stream)
                    streams.add(stream)
                out[pos] = arr
        for d, result in zip(self.direct, alone, strict=True):
            out[d.position] = over_host(result, NO_SOURCE, NO_TAG, None)
        for stream in streams:
            rt.record_event(stream).synchronize()
        return out

    def container(self, arrays: list[Any]) -> Any:
        return arrays if self.keys is None else dict(zip(self.keys, arrays, strict=True))

    def divide(self, buckets: list[np.ndarray[Any, Any]], alone: list[np.ndarray[Any, Any]], size: int) -> None:
        """For a mean, the sums divided by the world's size: the buckets' and those of the arrays reduced alone."""
        if self.mean:
            for bucket, buf in zip(self.buckets, buckets, strict=True):
                np.true_divide(buf, bucket.dtype.type(size), out=buf)
            for d, result in zip(self.direct, alone, strict=True):
                np.true_divide(result, d.dtype.type(size), out=result)
