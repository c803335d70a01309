"""Turn user objects (CAI exporters, host arrays, Arrays) into typed send sources and receive targets."""

from __future__ import annotations

import dataclasses
from typing import Any

import numpy as np

from .array import Array
from .descriptor import CAIDescriptor, descriptor_from_dict, may_self_overlap
from .errors import CAIError
from .hostmem import host_view
from .runtime.base import HOST, Location, MemoryKind, Runtime
from .sync import sync_enabled, sync_producer

__all__ = ["Outgoing", "Target", "as_host_array", "resolve_outgoing", "resolve_target"]

_NO_CAI = object()


def _read_cai(obj: Any) -> Any:
    """``obj.__cuda_array_interface__``, read exactly once (it may compute or synchronize), or _NO_CAI."""
    try:
        return obj.__cuda_array_interface__
    except AttributeError:
        return _NO_CAI


def as_host_array(obj: Any) -> np.ndarray[Any, Any]:
    """A zero-copy numpy view of a host buffer, or TypeError naming what was given."""
    if isinstance(obj, np.ndarray):
        return obj
    try:
        return np.asarray(memoryview(obj))
    except TypeError:
        pass
    if hasattr(obj, "__array_interface__"):
        return np.asarray(obj)
    raise TypeError(
        f"cannot send or receive a {type(obj).__name__}: expected an object exporting "
        "__cuda_array_interface__, a cai_mpi.Array, or a host array (numpy array or buffer-protocol object)"
    )


@dataclasses.dataclass(slots=True)
class Outgoing:
    """What a send reads: host-accessible memory as a numpy view (``host``), or device memory (``desc``)."""

    dtype: np.dtype[Any]
    shape: tuple[int, ...]
    nbytes: int
    ptr: int
    contiguous: bool  # C-contiguous
    fortran: bool  # F-contiguous and not C-contiguous: the payload travels in F order
    location: Location
    host: np.ndarray[Any, Any] | None
    desc: CAIDescriptor | None
    keep: Any

    @classmethod
    def from_host(cls, arr: np.ndarray[Any, Any], keep: Any, location: Location = HOST) -> Outgoing:
        flags = arr.flags
        c = flags.c_contiguous
        return cls(
            dtype=arr.dtype,
            shape=arr.shape,
            nbytes=arr.nbytes,
            ptr=arr.ctypes.data,
            contiguous=c,
            fortran=not c and flags.f_contiguous,
            location=location,
            host=arr,
            desc=None,
            keep=keep,
        )

    @classmethod
    def from_device(cls, desc: CAIDescriptor, location: Location, keep: Any) -> Outgoing:
        c = desc.is_c_contiguous
        return cls(
            dtype=desc.dtype,
            shape=desc.shape,
            nbytes=desc.nbytes,
            ptr=desc.ptr,
            contiguous=c,
            fortran=not c and desc.is_f_contiguous,
            location=location,
            host=None,
            desc=desc,
            keep=keep,
        )

    def wire_bytes(self) -> np.ndarray[Any, Any]:
        """The payload as a flat uint8 array in wire order (a view when contiguous, else a packed copy)."""
        assert self.host is not None
        arr = self.host
        if self.fortran:
            arr = arr.T
        elif not self.contiguous:
            arr = np.ascontiguousarray(arr)
        return arr.reshape(-1).view(np.uint8)


def resolve_outgoing(obj: Any, sync: bool | None, runtime: Runtime) -> Outgoing:
    """Describe ``obj`` for sending and synchronize its producer per the stream policy."""
    if type(obj) is np.ndarray:  # the common host case, without touching CAI
        return Outgoing.from_host(obj, obj)
    if isinstance(obj, Array):
        if obj.is_host:
            return Outgoing.from_host(obj.numpy(), obj)
        return Outgoing.from_device(obj.descriptor, Location(MemoryKind.DEVICE, int(obj.device)), obj)
    cai = _read_cai(obj)
    if cai is _NO_CAI:
        return Outgoing.from_host(as_host_array(obj), obj)
    desc = descriptor_from_dict(cai)
    location = runtime.locate(desc.ptr) if desc.ptr else _zero_size_location(runtime)
    if sync_enabled(sync):
        sync_producer(desc, location, runtime)
    if location.kind is MemoryKind.DEVICE:
        return Outgoing.from_device(desc, location, obj)
    return Outgoing.from_host(host_view(desc), obj, location)


def _zero_size_location(runtime: Runtime) -> Location:
    ordinal = runtime.current_device()
    return HOST if ordinal is None else Location(MemoryKind.DEVICE, ordinal)


@dataclasses.dataclass(slots=True)
class Target:
    """A receive buffer given as ``out=``: host-accessible (``host``) or device memory (``desc``)."""

    shape: tuple[int, ...]
    dtype: np.dtype[Any]
    readonly: bool
    self_overlapping: bool
    host: np.ndarray[Any, Any] | None
    desc: CAIDescriptor | None
    ordinal: int | None
    owner: Any
    stream_desc: CAIDescriptor | None  # the exporter's dict, when its stream must be synced before writing
    location: Location

    def describe(self) -> str:
        where = "host" if self.host is not None else f"GPU {self.ordinal}"
        dt = self.dtype.str if self.dtype.names is None else str(self.dtype)
        return f"shape={self.shape} dtype={dt} on {where}{', read-only' if self.readonly else ''}"

    def sync_before_write(self, runtime: Runtime) -> None:
        if self.stream_desc is not None and sync_enabled(None):
            sync_producer(self.stream_desc, self.location, runtime)


def _host_target(arr: np.ndarray[Any, Any], owner: Any, stream_desc: CAIDescriptor | None = None,
                 location: Location = HOST) -> Target:
    flags = arr.flags
    # No two elements of a contiguous array share memory: only other layouts need the stride test.
    overlap = not (flags.c_contiguous or flags.f_contiguous) and may_self_overlap(arr.shape, arr.strides, arr.itemsize)
    return Target(
        shape=arr.shape, dtype=arr.dtype, readonly=not flags.writeable, self_overlapping=overlap,
        host=arr, desc=None, ordinal=None, owner=owner, stream_desc=stream_desc, location=location,
    )


def resolve_target(out: Any, runtime: Runtime) -> Target:
    """Describe an ``out=`` receive buffer (TypeError/CAIError if it cannot be one)."""
    if isinstance(out, np.ndarray):
        return _host_target(out, out)
    if isinstance(out, Array):
        if out.is_host:
            return _host_target(out.numpy(), out)
        d = out.descriptor
        return Target(
            shape=d.shape, dtype=d.dtype, readonly=d.readonly, self_overlapping=d.may_self_overlap, host=None,
            desc=d, ordinal=int(out.device), owner=out, stream_desc=None,
            location=Location(MemoryKind.DEVICE, int(out.device)),
        )
    cai = _read_cai(out)
    if cai is _NO_CAI:
        try:
            arr = as_host_array(out)
        except TypeError:
            raise TypeError(
                f"out= must be a writable CAI object or host array, got {type(out).__name__}"
            ) from None
        return _host_target(arr, out)
    desc = descriptor_from_dict(cai)
    location = runtime.locate(desc.ptr) if desc.ptr else _zero_size_location(runtime)
    stream_desc = desc if (desc.stream is not None or desc.version < 3) else None
    if location.kind is not MemoryKind.DEVICE:
        target = _host_target(host_view(desc, readonly=desc.readonly), out, stream_desc, location)
        return target
    if desc.ptr == 0 and desc.size != 0:
        raise CAIError("'data' pointer is 0 for a non-empty out= buffer")
    return Target(
        shape=desc.shape, dtype=desc.dtype, readonly=desc.readonly, self_overlapping=desc.may_self_overlap,
        host=None, desc=desc, ordinal=location.ordinal, owner=out, stream_desc=stream_desc, location=location,
    )
