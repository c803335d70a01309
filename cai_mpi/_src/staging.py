"""Device memory through a non-CUDA-aware MPI: chunked, double-buffered copies via pinned host buffers."""

from __future__ import annotations

import threading
from collections.abc import Generator

from mpi4py import MPI

from .runtime.base import Event, PinnedBuffer, Runtime, Stream
from .waitables import EventWait, MPIWait, Waitable

__all__ = ["PinnedPool", "staged_recv", "staged_send", "internal_stream"]


class PinnedPool:
    """Page-locked staging buffers reused across messages (allocating pinned memory costs milliseconds)."""

    def __init__(self, max_cached: int = 8) -> None:
        self._free: dict[int, list[PinnedBuffer]] = {}
        self._max_cached = max_cached
        self._lock = threading.Lock()

    def take(self, runtime: Runtime, nbytes: int) -> PinnedBuffer:
        with self._lock:
            bucket = self._free.get(nbytes)
            if bucket:
                return bucket.pop()
        return runtime.alloc_pinned(nbytes)

    def give(self, buf: PinnedBuffer) -> None:
        with self._lock:
            bucket = self._free.setdefault(buf.nbytes, [])
            if len(bucket) < self._max_cached:
                bucket.append(buf)
                return
        buf.free()


_pinned_pool = PinnedPool()
_tls = threading.local()


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


def _chunks(nbytes: int, chunk: int) -> list[tuple[int, int]]:
    return [(off, min(chunk, nbytes - off)) for off in range(0, nbytes, chunk)]


def staged_send(
    runtime: Runtime, comm: MPI.Comm, dest: int, tag: int, src: int, nbytes: int, chunk: int, ordinal: int
) -> Generator[Waitable, None, None]:
    """Send ``nbytes`` of device memory at ``src`` as chunks of ``chunk`` bytes through two pinned buffers.

    The device-to-host copy of chunk k+1 runs while chunk k is on the wire.
    """
    stream = internal_stream(runtime, ordinal)
    pieces = _chunks(nbytes, chunk)
    slots = [_pinned_pool.take(runtime, chunk) for _ in range(min(2, len(pieces)))]
    sends: list[MPI.Request | None] = [None] * len(slots)
    copied: list[Event | None] = [None] * len(slots)
    try:

        def stage(k: int) -> None:
            off, n = pieces[k]
            slot = k % len(slots)
            runtime.copy_async(slots[slot].ptr, src + off, n, stream)
            copied[slot] = runtime.record_event(stream)

        stage(0)
        for k, (_off, n) in enumerate(pieces):
            slot = k % len(slots)
            if k + 1 < len(pieces):
                nxt = (k + 1) % len(slots)
                prev = sends[nxt]
                if prev is not None:  # the buffer of chunk k+1 still carries chunk k-1
                    yield MPIWait([prev])
                    sends[nxt] = None
                stage(k + 1)
            ev = copied[slot]
            assert ev is not None
            yield EventWait(ev)
            sends[slot] = comm.Isend([MPI.buffer.fromaddress(slots[slot].ptr, n), n, MPI.BYTE], dest, tag)
        pending = [r for r in sends if r is not None]
        if pending:
            yield MPIWait(pending)
    finally:
        for s in slots:
            _pinned_pool.give(s)


def staged_recv(
    runtime: Runtime, comm: MPI.Comm, source: int, tag: int, dst: int, nbytes: int, chunk: int, ordinal: int
) -> Generator[Waitable, None, None]:
    """Receive chunks into two pinned buffers and copy each to device memory at ``dst``.

    The host-to-device copy of chunk k overlaps the receive of chunk k+1.
    """
    stream = internal_stream(runtime, ordinal)
    pieces = _chunks(nbytes, chunk)
    slots = [_pinned_pool.take(runtime, chunk) for _ in range(min(2, len(pieces)))]
    recvs: list[MPI.Request | None] = [None] * len(slots)
    try:

        def post(k: int) -> None:
            _off, n = pieces[k]
            slot = k % len(slots)
            buf = MPI.buffer.fromaddress(slots[slot].ptr, n)
            recvs[slot] = comm.Irecv([buf, n, MPI.BYTE], source, tag)

        for k in range(len(slots)):
            post(k)
        last: Event | None = None
        for k, (off, n) in enumerate(pieces):
            slot = k % len(slots)
            req = recvs[slot]
            assert req is not None
            yield MPIWait([req])
            runtime.copy_async(dst + off, slots[slot].ptr, n, stream)
            last = runtime.record_event(stream)
            if k + len(slots) < len(pieces):
                yield EventWait(last)  # the slot is free again once its copy is done
                post(k + len(slots))
        if last is not None:
            yield EventWait(last)
    finally:
        for s in slots:
            _pinned_pool.give(s)
