"""Simulated CUDA streams and events: worker threads that make CAI v3 stream rules observable on a CPU."""

from __future__ import annotations

import itertools
import queue
import threading
import time
import weakref
from collections.abc import Callable
from typing import Any

from .._src.errors import StreamError
from .._src.runtime.base import LEGACY_STREAM, PER_THREAD_STREAM, Event

__all__ = ["SimulatedEvent", "SimulatedStream", "resolve_stream", "all_streams"]

# Handles look like device addresses and never collide with 0, 1 or 2.
_handles = itertools.count(0x7F5A_0000_1000, 0x100)
_registry: weakref.WeakValueDictionary[int, SimulatedStream] = weakref.WeakValueDictionary()
_registry_lock = threading.Lock()
_legacy: SimulatedStream | None = None
_per_thread = threading.local()


class SimulatedEvent(Event):
    """Set when every callable enqueued on its stream before the record point has run."""

    def __init__(self) -> None:
        self._done = threading.Event()

    def synchronize(self) -> None:
        self._done.wait()

    def query(self) -> bool:
        return self._done.is_set()


class SimulatedStream:
    """An in-order work queue run by one worker thread, with an integer CAI ``handle``.

    Use it as the ``stream`` of a fake CAI exporter to test stream-safety
    without a GPU: work enqueued here runs later (optionally after ``delay``
    seconds), exactly like a kernel launched on a CUDA stream, and cai_mpi
    resolves the handle and synchronizes it before MPI reads the data.

    Example:
        >>> s = SimulatedStream()
        >>> buf = bytearray(1)
        >>> s.enqueue(lambda: buf.__setitem__(0, 7), delay=0.01)
        >>> s.synchronize(); buf[0]
        7
    """

    def __init__(self, name: str | None = None, *, handle: int | None = None) -> None:
        self.handle = next(_handles) if handle is None else handle
        self.name = name or f"simulated-stream-{self.handle:#x}"
        self.ordinal = 0
        self._queue: queue.Queue[tuple[Callable[..., Any], tuple[Any, ...], float] | None] = queue.Queue()
        self._errors: list[BaseException] = []
        self._closed = False
        # The worker holds the queue and the error list, never the stream, so an unclosed stream
        # can still be collected (its finalizer then stops the worker).
        self._thread = threading.Thread(
            target=_work, args=(self._queue, self._errors), name=self.name, daemon=True
        )
        self._thread.start()
        if handle is None:
            with _registry_lock:
                _registry[self.handle] = self
        # The worker thread must not keep the stream alive: close it when collected.
        weakref.finalize(self, self._queue.put, None)

    def enqueue(self, fn: Callable[..., Any], *args: Any, delay: float = 0.0) -> None:
        """Run ``fn(*args)`` on the stream after everything enqueued before it (after ``delay`` s)."""
        if self._closed:
            raise StreamError(f"{self.name} is closed")
        self._queue.put((fn, args, delay))

    def synchronize(self) -> None:
        """Block until all enqueued work has run; re-raise the first error it raised."""
        self._queue.join()
        if self._errors:
            err = self._errors[0]
            self._errors.clear()
            raise StreamError(f"work on {self.name} failed: {err!r}") from err

    def query(self) -> bool:
        return self._queue.unfinished_tasks == 0

    def record_event(self) -> SimulatedEvent:
        ev = SimulatedEvent()
        self.enqueue(ev._done.set)
        return ev

    def wait_event(self, event: Event) -> None:
        """Later work on this stream waits until ``event`` completes (cuStreamWaitEvent)."""
        self.enqueue(event.synchronize)

    def close(self) -> None:
        if not self._closed:
            self.synchronize()
            self._closed = True
            self._queue.put(None)
            with _registry_lock:
                if _registry.get(self.handle) is self:
                    del _registry[self.handle]

    def __enter__(self) -> SimulatedStream:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"<SimulatedStream {self.name} handle={self.handle:#x}>"

    # -- the default streams -------------------------------------------
    @staticmethod
    def legacy() -> SimulatedStream:
        """The simulated legacy default stream (CAI handle 1)."""
        global _legacy
        with _registry_lock:
            if _legacy is None:
                _legacy = SimulatedStream("simulated-legacy-stream", handle=LEGACY_STREAM)
            return _legacy

    @staticmethod
    def per_thread() -> SimulatedStream:
        """The calling thread's simulated per-thread default stream (CAI handle 2)."""
        s: SimulatedStream | None = getattr(_per_thread, "stream", None)
        if s is None:
            s = SimulatedStream(f"simulated-per-thread-{threading.get_ident()}", handle=PER_THREAD_STREAM)
            _per_thread.stream = s
        return s


def _work(
    q: queue.Queue[tuple[Callable[..., Any], tuple[Any, ...], float] | None], errors: list[BaseException]
) -> None:
    while True:
        item = q.get()
        try:
            if item is None:
                return
            fn, args, delay = item
            if delay:
                time.sleep(delay)
            try:
                fn(*args)
            except BaseException as exc:  # surfaced at the next synchronize()
                errors.append(exc)
        finally:
            q.task_done()
            del item


def resolve_stream(handle: int) -> SimulatedStream | None:
    """The simulated stream behind a CAI handle, or None if nobody here knows it."""
    if handle == LEGACY_STREAM:
        return _legacy
    if handle == PER_THREAD_STREAM:
        return getattr(_per_thread, "stream", None)
    return _registry.get(handle)


def all_streams() -> list[SimulatedStream]:
    with _registry_lock:
        streams = list(_registry.values())
        if _legacy is not None:
            streams.append(_legacy)
    s = getattr(_per_thread, "stream", None)
    if s is not None:
        streams.append(s)
    return streams
