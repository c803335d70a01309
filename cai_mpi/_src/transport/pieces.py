"""What both directions of the transport are made of: message specs over memory, chunking, cai_mpi's own
device streams, and (from ``pool``) the pinned staging buffers."""

from __future__ import annotations

import threading
import weakref
from collections.abc import Generator
from typing import Any, TypeVar

import numpy as np
from mpi4py import MPI

from ..progress.waits import Waitable
from ..runtime.base import DeviceBuffer, Runtime, Stream
from .pool import give_back, pinned_pool

__all__ = ["BYTE", "Steps", "byte_chunks", "chunks", "counted", "device_landing", "give_back", "host_address",
           "in_context_scope", "internal_stream", "pinned_pool", "raw"]

BYTE = MPI.BYTE
#: What is left of a transfer once its MPI operations are posted: a generator of what it waits for.
Steps = Generator[Waitable, None, None]
T = TypeVar("T")


def in_context_scope(rt: Runtime, steps: Generator[Waitable, None, T]) -> Generator[Waitable, None, T]:
    """``steps`` with each part between two waits run in one ``rt.context_scope()``: the device calls of a part ask
    which context is current once. The scope ends at every yield, since the user may switch contexts before the
    steps resume (perhaps in another thread)."""
    scope = rt.context_scope
    try:
        with scope():
            waitable = next(steps)
        while True:
            try:
                yield waitable
            except GeneratorExit:
                with scope():
                    steps.close()
                raise
            except BaseException as exc:  # a failed wait goes into the steps, which clean up
                with scope():
                    waitable = steps.throw(exc)
            else:
                with scope():
                    waitable = next(steps)
    except StopIteration as stop:
        return stop.value  # type: ignore[no-any-return]


def chunks(nbytes: int, chunk: int) -> list[tuple[int, int]]:
    """``(offset, length)`` of each message a payload of ``nbytes`` travels in (``chunk`` 0: one message)."""
    if not chunk or chunk >= nbytes:
        return [(0, nbytes)]
    return [(off, min(chunk, nbytes - off)) for off in range(0, nbytes, chunk)]


def host_address(arr: np.ndarray[Any, Any]) -> int:
    """The address of host array ``arr``'s element 0. mpi4py's buffer reads it through the buffer protocol, several
    times cheaper than numpy's ``arr.ctypes.data`` (docs/benchmarks.md); numpy answers for what the protocol cannot
    export (strided layouts, dtypes without a buffer format)."""
    flags = arr.flags
    if flags.c_contiguous or flags.f_contiguous:
        try:
            return int(MPI.buffer(arr).address)
        except (BufferError, ValueError, TypeError):
            pass
    return int(arr.ctypes.data)


def raw(ptr: int, nbytes: int, *, readonly: bool = False) -> list[Any]:
    """An MPI message spec over raw memory (device memory only ever reaches a CUDA-aware MPI this way)."""
    return [MPI.buffer.fromaddress(ptr, nbytes, readonly=readonly), nbytes, BYTE]


def counted(buf: Any, count: int, datatype: MPI.Datatype, ranks: int = 1) -> list[Any]:
    """The message spec ``[buf, count, datatype]`` (``ranks`` times that, back to back, for a gather's receive),
    once ``buf`` is seen to hold it: MPI takes an explicit count on trust and would write past the end of a buffer
    too small for it, so a scratch buffer sized wrong is an internal error here, before MPI sees it."""
    need = count * datatype.Get_size() * ranks
    have = buf.nbytes if isinstance(buf, np.ndarray) else memoryview(buf).nbytes
    if have < need:
        raise AssertionError(f"cai_mpi internal error: a buffer of {have} bytes handed to MPI for {need} bytes "
                             f"({ranks} x {count} x {datatype.Get_size()}-byte elements)")
    return [buf, count, datatype]


def byte_chunks(arr: np.ndarray[Any, Any], chunk: int) -> list[Any]:
    """Message specs covering the bytes of contiguous ``arr`` (in memory order) in messages of ``chunk``."""
    if not chunk or chunk >= arr.nbytes:
        return [[arr, BYTE]]
    whole = MPI.buffer(arr.reshape(-1, order="A"))
    return [[whole[off : off + n], n, BYTE] for off, n in chunks(arr.nbytes, chunk)]


# -- per-thread device streams -----------------------------------------------------------------------------------

_tls = threading.local()


def internal_stream(runtime: Runtime, ordinal: int) -> Stream:
    """cai_mpi's own stream for ``ordinal``, one per thread (the current device is per thread). Kept per runtime
    object, not per ``id``: a runtime made after another died may get the dead one's id, never its streams. Weakly:
    a dead runtime's entry goes (a CUDA runtime's streams hold it, so it lives while its thread's entry does)."""
    per_runtime: weakref.WeakKeyDictionary[Runtime, dict[int, Stream]] | None = getattr(_tls, "streams", None)
    if per_runtime is None:
        per_runtime = _tls.streams = weakref.WeakKeyDictionary()
    streams = per_runtime.get(runtime)
    if streams is None:
        streams = per_runtime[runtime] = {}
    s = streams.get(ordinal)
    if s is None:
        s = streams[ordinal] = runtime.create_stream(ordinal)
    return s


def device_landing(rt: Runtime, nbytes: int, ordinal: int, *, direct: bool, handed_out: bool = False) -> DeviceBuffer:
    """New device memory on cai_mpi's stream for a payload to land in (``handed_out``: as a received Array).

    ``direct``: a CUDA-aware MPI writes it from the host, ordered after no device work, so the stream is synchronized
    first. The pool may hand out a block whose previous user's work is still pending: on this stream (a block freed
    on it goes to its next allocation at once), or on another stream that CUDA's default pool made this one wait for
    (cudaMemPoolReuseAllowInternalDependencies); that work would land after MPI's data. Staged, the copies into the
    block run on this stream, after the same work: nothing to wait for.
    """
    stream = internal_stream(rt, ordinal)
    with rt.context_scope():  # (one context query for both calls)
        buffer = rt.alloc_device(nbytes, ordinal, stream, handed_out=handed_out)
        if direct and nbytes:
            stream.synchronize()
    return buffer
