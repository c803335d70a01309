"""What both directions of the transport are made of: message specs over memory, chunking, cai_mpi's own
device streams, and the pool of pinned staging buffers."""

from __future__ import annotations

import threading
import weakref
from collections.abc import Generator
from typing import Any

import numpy as np
from mpi4py import MPI

from ..config import config
from ..errors import CudaError
from ..progress.waits import Waitable
from ..runtime.base import Event, PinnedBuffer, Runtime, Stream
from .pool import BlockPool

__all__ = ["BYTE", "Steps", "byte_chunks", "chunks", "give_back", "internal_stream", "pinned_pool", "raw"]

BYTE = MPI.BYTE
#: What is left of a transfer once its MPI operations are posted: a generator of what it waits for.
Steps = Generator[Waitable, None, None]


def chunks(nbytes: int, chunk: int) -> list[tuple[int, int]]:
    """``(offset, length)`` of each message a payload of ``nbytes`` travels in (``chunk`` 0: one message)."""
    if not chunk or chunk >= nbytes:
        return [(0, nbytes)]
    return [(off, min(chunk, nbytes - off)) for off in range(0, nbytes, chunk)]


def raw(ptr: int, nbytes: int, *, readonly: bool = False) -> list[Any]:
    """An MPI message spec over raw memory (device memory only ever reaches a CUDA-aware MPI this way)."""
    return [MPI.buffer.fromaddress(ptr, nbytes, readonly=readonly), nbytes, BYTE]


def byte_chunks(arr: np.ndarray[Any, Any], chunk: int) -> list[Any]:
    """Message specs covering the bytes of contiguous ``arr`` (in memory order) in messages of ``chunk``."""
    if not chunk or chunk >= arr.nbytes:
        return [[arr, BYTE]]
    whole = MPI.buffer(arr.reshape(-1, order="A"))
    return [[whole[off : off + n], n, BYTE] for off, n in chunks(arr.nbytes, chunk)]


# -- per-thread device streams and the pinned staging pool ------------------------------------------------------

_tls = threading.local()
_pinned_pools: weakref.WeakKeyDictionary[Runtime, BlockPool[PinnedBuffer]] = weakref.WeakKeyDictionary()


def internal_stream(runtime: Runtime, ordinal: int) -> Stream:
    """cai_mpi's own stream for ``ordinal``, one per thread (the current device is per thread)."""
    streams: dict[tuple[int, int], Stream] | None = getattr(_tls, "streams", None)
    if streams is None:
        streams = _tls.streams = {}
    key = (id(runtime), ordinal)
    s = streams.get(key)
    if s is None:
        s = streams[key] = runtime.create_stream(ordinal)
    return s


def pinned_pool(runtime: Runtime) -> BlockPool[PinnedBuffer]:
    if _quarantine:
        _release_finished()
    pool = _pinned_pools.get(runtime)
    if pool is None:
        pool = _pinned_pools[runtime] = BlockPool(runtime.alloc_pinned, PinnedBuffer.free,
                                                  budget=lambda: config().pinned_pool_bytes)
    return pool




# Staging blocks a failed or abandoned transfer may still have in use (an Isend or Irecv posted, a copy
# enqueued): MPI or the GPU would read or write them after the pool lent them out again, so they wait here
# until all of that has completed (possibly never, if the peer never matches: then they are never reused).
_quarantine: list[tuple[BlockPool[PinnedBuffer], PinnedBuffer, int, list[MPI.Request], list[Event]]] = []
_quarantine_lock = threading.Lock()


def _finished(reqs: list[MPI.Request], events: list[Event]) -> bool:
    return all(_idle(e) for e in events) and bool(MPI.Request.Testall(reqs))


def _idle(event: Event) -> bool:
    try:
        return event.query()
    except CudaError:  # a sticky error: the context runs nothing more, so its copies never touch the block again
        return True


def give_back(pool: BlockPool[PinnedBuffer], block: PinnedBuffer, cls: int, reqs: list[MPI.Request | None],
              events: list[Event | None]) -> None:
    """Return a staging block to ``pool`` once the MPI operations and device copies that use it have completed."""
    pending_reqs = [r for r in reqs if r is not None]
    pending_events = [e for e in events if e is not None]
    if _finished(pending_reqs, pending_events):
        pool.give(block, cls)
        return
    with _quarantine_lock:
        _quarantine.append((pool, block, cls, pending_reqs, pending_events))


def _release_finished() -> None:
    with _quarantine_lock:
        done = [q for q in _quarantine if _finished(q[3], q[4])]
        for q in done:
            _quarantine.remove(q)
    for pool, block, cls, _reqs, _events in done:
        pool.give(block, cls)
