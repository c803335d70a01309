"""Operands: user objects turned into what the transport reads (send sources) and writes (receive targets).

A send source is a numpy array over host-accessible memory (pageable, pinned or managed: MPI reads it
directly) or a ``DeviceSource`` (device memory). A receive target (``out=``) is a ``RecvTarget``. This is
where the stream policy is applied to what the user hands in.
"""

from __future__ import annotations

import ctypes
import dataclasses
from typing import Any

import numpy as np

from ..core.descriptor import CAIDescriptor, byte_extent, descriptor_from_dict, may_self_overlap
from ..errors import CAIError
from ..runtime.base import HOST, LEGACY_STREAM, PER_THREAD_STREAM, Location, MemoryKind, Runtime
from .array import NO_SOURCE, NO_TAG, Array, host_memory
from .sync import sync_enabled, sync_producer, sync_unnamed

__all__ = [
    "DeviceSource", "RecvTarget", "Target", "as_host_array", "describe_target", "host_view", "mismatch",
    "proc_null_array", "recv_target", "replaces", "send_source",
]

_NO_CAI = object()


def _read_cai(fn: str, obj: Any) -> Any:
    """``obj.__cuda_array_interface__``, read exactly once (it may compute or synchronize), or _NO_CAI.

    AttributeError means "no interface" (PyTorch raises it for CPU tensors, which then go as host arrays);
    any other exception from the exporter becomes a CAIError naming ``fn``, chained to the original.
    """
    try:
        return obj.__cuda_array_interface__
    except AttributeError:
        return _NO_CAI
    except Exception as exc:
        raise CAIError(f"{fn}: reading it from a {type(obj).__name__} object raised {type(exc).__name__}: {exc} "
                       "(the exporter's error is this one's cause)") from exc


def host_view(desc: CAIDescriptor, *, readonly: bool | None = None) -> np.ndarray[Any, Any]:
    """A numpy array viewing the host memory ``desc`` describes (no copy, no ownership)."""
    if desc.size == 0 or desc.ptr == 0:
        return np.empty(desc.shape, desc.dtype)
    low, high = desc.byte_extent
    raw = (ctypes.c_char * (high - low)).from_address(desc.ptr + low)
    arr: np.ndarray[Any, Any] = np.ndarray(
        desc.shape, desc.dtype, buffer=raw, offset=-low, strides=desc.byte_strides  # type: ignore[arg-type]
    )
    if desc.readonly if readonly is None else readonly:
        arr.flags.writeable = False
    return arr


def as_host_array(fn: str, obj: Any) -> np.ndarray[Any, Any]:
    """A zero-copy plain-ndarray view of a host buffer, or TypeError naming what was given."""
    if isinstance(obj, np.ndarray):
        return _plain(fn, obj)
    try:
        return np.asarray(memoryview(obj))
    except TypeError:
        pass
    if hasattr(obj, "__array_interface__"):  # zero-copy by definition (``__array__`` may copy: not accepted)
        return np.asarray(obj)
    raise TypeError(
        f"{fn}: cannot send or receive an object of type {type(obj).__name__!r}: expected an object exporting "
        "__cuda_array_interface__, a cai_mpi.Array, or a host array (numpy array or buffer-protocol object)"
    )


def _plain(fn: str, arr: np.ndarray[Any, Any]) -> np.ndarray[Any, Any]:
    """An ndarray subclass (memmap, matrix, a user's) is its data; the transport handles plain ndarrays only. A
    masked array is refused: its data alone would silently lose the mask (as CAI refuses ``mask``)."""
    if type(arr) is np.ndarray:
        return arr
    if isinstance(arr, np.ma.MaskedArray):
        raise TypeError(f"{fn}: a numpy masked array cannot be sent or received as one array: pass its .data and "
                        "its .mask (np.ma.getmaskarray) separately")
    return np.ndarray.view(arr, np.ndarray)  # (not the subclass's own view(), which may do more)


@dataclasses.dataclass(slots=True, frozen=True)
class DeviceSource:
    """Device memory to send: ``desc`` (element 0 at ``desc.ptr``) on GPU ``ordinal``; ``owner`` keeps it alive."""

    desc: CAIDescriptor
    ordinal: int
    owner: Any


def _locate(desc: CAIDescriptor, runtime: Runtime) -> Location:
    if desc.ptr:
        return runtime.locate(desc.ptr)
    ordinal = runtime.current_device()  # zero-size arrays export NULL: they "live" where this rank works
    return HOST if ordinal is None else Location(MemoryKind.DEVICE, ordinal)


def _at_host_address(desc: CAIDescriptor, location: Location) -> CAIDescriptor:
    """``desc`` where the host reads it (memory CUDA maps at a device alias is read at its host address)."""
    return desc if location.host_address is None else desc.replace(ptr=location.host_address)


def send_source(fn: str, obj: Any, sync: bool | None, runtime: Runtime) -> np.ndarray[Any, Any] | DeviceSource:
    """What ``fn`` sends for ``obj``: a host array, or device memory; the producer is synchronized first."""
    if type(obj) is np.ndarray:
        return obj
    if isinstance(obj, Array):
        if (host := host_memory(obj)) is not None:
            return host
        ordinal = int(obj.device)
        desc = obj.descriptor
        if sync_enabled(sync):  # the user may have launched work on a received Array since (cupy.asarray(a) *= 2)
            sync_unnamed(ordinal, runtime, desc.stream)
        return DeviceSource(desc, ordinal, obj)
    cai = _read_cai(fn, obj)
    if cai is _NO_CAI:
        return as_host_array(fn, obj)
    desc = descriptor_from_dict(cai)
    with runtime.context_scope():  # (one context query for the pointer's place and the producer's stream)
        location = _locate(desc, runtime)
        if sync_enabled(sync):
            sync_producer(desc, location, runtime)
    if location.kind is MemoryKind.DEVICE:
        assert location.ordinal is not None
        return DeviceSource(desc, location.ordinal, obj)
    return host_view(_at_host_address(desc, location))


@dataclasses.dataclass(slots=True)
class RecvTarget:
    """A receive buffer given as ``out=``: host-accessible memory (``host``) or device memory (``desc``)."""

    shape: tuple[int, ...]
    dtype: np.dtype[Any]
    readonly: bool
    self_overlapping: bool
    host: np.ndarray[Any, Any] | None
    desc: CAIDescriptor | None
    ordinal: int | None
    owner: Any
    producer: CAIDescriptor | None  # the exporter's dict, when its stream must be synchronized before writing
    location: Location

    def describe(self) -> str:
        where = "host" if self.host is not None else f"GPU {self.ordinal}"
        dt = self.dtype.str if self.dtype.names is None else str(self.dtype)
        return f"shape={self.shape} dtype={dt} on {where}{', read-only' if self.readonly else ''}"

    def sync_before_write(self, runtime: Runtime) -> None:
        """The buffer's producer may still be using it: wait before anything writes into it. Called in the
        caller's thread (per-thread default streams belong to it), when the receive is posted."""
        if self.producer is not None and sync_enabled(None):
            sync_producer(self.producer, self.location, runtime)


#: A receive buffer: a numpy array (plain host memory, nothing to synchronize) or a RecvTarget.
Target = np.ndarray[Any, Any] | RecvTarget


def mismatch(target: Target, shape: tuple[int, ...], dtype: np.dtype[Any]) -> str | None:
    """Why a message of ``shape`` and ``dtype`` cannot be received into ``target``, or None."""
    if type(target) is np.ndarray:
        if shape != target.shape or (dtype is not target.dtype and dtype != target.dtype):
            return "shapes differ" if shape != target.shape else "dtypes differ"
        flags = target.flags
        if flags.writeable and (flags.c_contiguous or flags.f_contiguous):
            return None  # the common case, decided without describing the array
        target = _host_target(target, target)
    assert isinstance(target, RecvTarget)
    if shape != target.shape:
        return "shapes differ"
    if dtype != target.dtype:
        return "dtypes differ"
    if target.readonly:
        return "out= is read-only"
    if target.self_overlapping:
        return "out= has overlapping strides (elements share memory)"
    return None


def describe_target(target: Target) -> str:
    """``out=`` in an error message: shape, dtype, where it lives."""
    return (target if isinstance(target, RecvTarget) else _host_target(target, target)).describe()


def _host_target(arr: np.ndarray[Any, Any], owner: Any, producer: CAIDescriptor | None = None,
                 location: Location = HOST) -> RecvTarget:
    flags = arr.flags
    # No two elements of a contiguous array share memory: only other layouts need the stride test.
    overlap = not (flags.c_contiguous or flags.f_contiguous) and may_self_overlap(arr.shape, arr.strides, arr.itemsize)
    return RecvTarget(
        shape=arr.shape, dtype=arr.dtype, readonly=not flags.writeable, self_overlapping=overlap,
        host=arr, desc=None, ordinal=None, owner=owner, producer=producer, location=location,
    )


def recv_target(fn: str, out: Any, runtime: Runtime) -> Target:
    """Describe an ``out=`` receive buffer (TypeError or CAIError if it cannot be one) and wait for work still
    pending on it (see ``sync_before_write``).

    A numpy array is its own description: plain host memory with nothing to synchronize.
    """
    if type(out) is np.ndarray:
        return out
    target = _describe_out(fn, out, runtime)
    target.sync_before_write(runtime)
    return target


def proc_null_array(target: Target | None) -> Array:
    """What a receive from PROC_NULL gives (one-shot or channel): it completes at once with no data (MPI semantics),
    an Array over ``out=`` as it is (a plain numpy array is its own target), or an empty host Array without ``out=``;
    its source and tag are what MPI's status reports, PROC_NULL and ANY_TAG (``NO_SOURCE``, ``NO_TAG``)."""
    if target is None:
        return Array.over_host(np.empty(0, np.uint8), NO_SOURCE, NO_TAG, None)
    if type(target) is np.ndarray:
        return Array.over_host(target, NO_SOURCE, NO_TAG, None)
    assert isinstance(target, RecvTarget)
    if target.host is not None:
        return Array.over_host(target.host, NO_SOURCE, NO_TAG, None, target.owner)
    assert target.desc is not None and target.ordinal is not None
    return Array(target.desc.replace(stream=None), device=target.ordinal, owner=target.owner, source=NO_SOURCE,
                 tag=NO_TAG)


def _describe_out(fn: str, out: Any, runtime: Runtime) -> RecvTarget:
    """What ``out=`` is, other than a plain numpy array (``recv_target``'s own case)."""
    if isinstance(out, np.ndarray):
        return _host_target(_plain(fn, out), out)
    if isinstance(out, Array):
        if (host := host_memory(out)) is not None:
            return _host_target(host, out)
        d = out.descriptor  # work the user launched on it since: its stream, and the default streams' order
        pending = d.replace(stream=None) if d.stream in (None, LEGACY_STREAM, PER_THREAD_STREAM) else d
        return RecvTarget(
            shape=d.shape, dtype=d.dtype, readonly=d.readonly, self_overlapping=d.may_self_overlap, host=None,
            desc=d, ordinal=int(out.device), owner=out, producer=pending,
            location=Location(MemoryKind.DEVICE, int(out.device)),
        )
    cai = _read_cai(fn, out)
    if cai is _NO_CAI:
        try:
            arr = as_host_array(fn, out)
        except TypeError:
            raise TypeError(
                f"{fn}: out= must be a writable CAI object or host array, got {type(out).__name__}"
            ) from None
        return _host_target(arr, out)
    desc = descriptor_from_dict(cai)
    location = _locate(desc, runtime)
    gpu_writable = location.kind is not MemoryKind.HOST or location.ordinal is not None
    producer = desc if (desc.stream is not None or gpu_writable) else None
    if location.kind is not MemoryKind.DEVICE:
        return _host_target(host_view(_at_host_address(desc, location), readonly=desc.readonly), out, producer,
                            location)
    return RecvTarget(
        shape=desc.shape, dtype=desc.dtype, readonly=desc.readonly, self_overlapping=desc.may_self_overlap,
        host=None, desc=desc, ordinal=location.ordinal, owner=out, producer=producer, location=location,
    )


def _layout(x: np.ndarray[Any, Any] | DeviceSource | Target) -> tuple[int | None, int, tuple[int, ...],
                                                                    tuple[int, ...], int]:
    """Where ``x``'s bytes are: (None for host memory, else the GPU), address of element 0, shape, byte strides,
    itemsize."""
    if isinstance(x, np.ndarray):
        return None, x.__array_interface__["data"][0], x.shape, x.strides, x.itemsize
    if isinstance(x, RecvTarget) and x.host is not None:
        return _layout(x.host)
    desc = x.desc
    assert desc is not None and x.ordinal is not None
    return x.ordinal, desc.ptr, desc.shape, desc.byte_strides, desc.itemsize


class _Extent:
    """A layout as numpy sees one, for ``np.shares_memory``: it reads addresses and strides, never the bytes (so a
    device address is as good as a host one)."""

    def __init__(self, ptr: int, shape: tuple[int, ...], strides: tuple[int, ...], itemsize: int) -> None:
        self.__array_interface__ = {"data": (ptr, True), "shape": shape, "strides": strides,
                                    "typestr": f"|V{itemsize}", "version": 3}


def replaces(fn: str, src: np.ndarray[Any, Any] | DeviceSource, target: Target) -> bool:
    """Whether a call that sends ``src`` and receives into ``target`` receives in place of what it sends (the same
    memory in the same layout: MPI's ``Sendrecv_replace``). Any other shared byte is a ValueError: what arrives
    would overwrite what is still being sent."""
    s_where, s_ptr, s_shape, s_strides, s_item = _layout(src)
    t_where, t_ptr, t_shape, t_strides, t_item = _layout(target)
    if s_where != t_where or 0 in s_shape or 0 in t_shape:
        return False
    if (s_ptr, s_shape, s_strides, s_item) == (t_ptr, t_shape, t_strides, t_item):
        return True
    s_low, s_high = byte_extent(s_shape, s_strides, s_item)
    t_low, t_high = byte_extent(t_shape, t_strides, t_item)
    if s_ptr + s_high <= t_ptr + t_low or t_ptr + t_high <= s_ptr + s_low:
        return False  # (the common case, decided without numpy's exact test)
    if not np.shares_memory(np.asarray(_Extent(s_ptr, s_shape, s_strides, s_item)),
                            np.asarray(_Extent(t_ptr, t_shape, t_strides, t_item))):
        return False  # interleaved, sharing no byte (the even and the odd elements of one buffer)
    how = "in another layout" if s_ptr + s_low == t_ptr + t_low and s_high - s_low == t_high - t_low else "partly"
    raise ValueError(
        f"{fn}: out= shares memory with the array sent, {how} (sent: shape={s_shape} strides={s_strides}, out=: "
        f"shape={t_shape} strides={t_strides}, element 0 {t_ptr - s_ptr:+d} bytes from the sent one's): what "
        "arrives would overwrite what is still being sent. To receive in place of the array sent, pass the same "
        "array as out=; else receive into memory apart from it"
    )
