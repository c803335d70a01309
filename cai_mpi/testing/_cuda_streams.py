"""Streams, fences and events of the CUDA driver double: work queues run by worker threads, in CUDA's order."""

from __future__ import annotations

import queue
import threading
import time
from collections.abc import Callable
from typing import Any

__all__ = ["Fence", "Stream"]


class Fence:
    """Set when the operation it follows has run (a point in a stream's order)."""

    __slots__ = ("_done",)

    def __init__(self, done: bool = False) -> None:
        self._done = threading.Event()
        if done:
            self._done.set()

    def wait(self) -> None:
        self._done.wait()

    def is_set(self) -> bool:
        return self._done.is_set()

    def set(self) -> None:
        self._done.set()


DONE = Fence(done=True)


class Stream:
    """One in-order queue of operations, run by its own worker thread.

    ``blocking`` streams (and per-thread default streams) are ordered against the legacy default stream of
    their context; non-blocking ones are not (CUDA's ``CU_STREAM_NON_BLOCKING``). ``delay`` is added before
    each operation that asks for it (slow copies expose missing waits).
    """

    def __init__(self, handle: int, context: int, blocking: bool, name: str) -> None:
        self.handle, self.context, self.blocking, self.name = handle, context, blocking, name
        self.tail: Fence = DONE
        self._queue: queue.Queue[tuple[Callable[[], Any], list[Fence], float, Fence] | None] = queue.Queue()
        self._lock = threading.Lock()
        self._thread = threading.Thread(target=self._run, name=name, daemon=True)
        self._thread.start()

    def enqueue(self, op: Callable[[], Any], waits: list[Fence] | None = None, delay: float = 0.0) -> Fence:
        """Run ``op`` after everything enqueued before it and after ``waits``; the returned fence marks it done."""
        with self._lock:
            done = Fence()
            self._queue.put((op, list(waits or []), delay, done))
            self.tail = done
            return done

    def _run(self) -> None:
        while True:
            item = self._queue.get()
            if item is None:
                return
            op, waits, delay, done = item
            for fence in waits:
                fence.wait()
            if delay:
                time.sleep(delay)
            try:
                op()
            finally:
                done.set()

    def close(self) -> None:
        """Pending work still runs (as cuStreamDestroy documents); then the worker ends."""
        self._queue.put(None)

    def runs_in(self, thread: threading.Thread) -> bool:
        return thread is self._thread

    def join(self, timeout: float) -> None:
        """Wait until the worker has run what was enqueued before ``close()``."""
        self._thread.join(timeout)
