"""Streams, fences and events of the CUDA driver double: work queues run by worker threads, in CUDA's order."""

from __future__ import annotations

import queue
import threading
import time
from collections.abc import Callable
from typing import Any

__all__ = ["Fence", "Stream"]


class Fence:
    """Set when the operation it follows has run (a point in a stream's order). Waiting on it is a
    synchronization: on a lazy stream it makes the work up to this point run now."""

    __slots__ = ("_done", "_seq", "_stream")

    def __init__(self, done: bool = False, stream: Stream | None = None, seq: int = 0) -> None:
        self._done = threading.Event()
        self._stream, self._seq = stream, seq
        if done:
            self._done.set()

    def wait(self) -> None:
        if self._stream is not None and not self._done.is_set():
            self._stream.demand(self._seq)
        self._done.wait()

    def is_set(self) -> bool:
        """Whether it has run (a query: it makes nothing run sooner)."""
        return self._done.is_set()

    def set(self) -> None:
        self._done.set()


DONE = Fence(done=True)


class Stream:
    """One in-order queue of operations, run by its own worker thread.

    ``blocking`` streams (and per-thread default streams) are ordered against the legacy default stream of
    their context; non-blocking ones are not (CUDA's ``CU_STREAM_NON_BLOCKING``). ``delay`` is added before
    each operation that asks for it (slow copies expose missing waits).

    ``lazy`` (seconds, 0: off): an operation runs only once something synchronizes on it (waits for a fence at
    or after it, from the host or from another stream) or after ``lazy`` seconds, so a read that skips its wait
    sees the old bytes every time instead of by luck of timing. A query (``Fence.is_set``) makes nothing run.

    ``eager``: every operation has run when ``enqueue`` returns (a GPU that always keeps up), so what a caller
    asks the driver, queries included, does not depend on timing: for counting driver calls.
    """

    def __init__(self, handle: int, context: int, blocking: bool, name: str, lazy: float = 0.0,
                 eager: bool = False) -> None:
        self.handle, self.context, self.blocking, self.name, self.lazy = handle, context, blocking, name, lazy
        self.eager = eager
        self.tail: Fence = DONE
        self._queue: queue.Queue[tuple[Callable[[], Any], list[Fence], float, Fence] | None] = queue.Queue()
        self._lock = threading.Lock()
        self._seq = 0
        self._demanded = 0  # the latest operation something waits for
        self._closing = False
        self._wake = threading.Condition()
        self._thread = threading.Thread(target=self._run, name=name, daemon=True)
        self._thread.start()

    def enqueue(self, op: Callable[[], Any], waits: list[Fence] | None = None, delay: float = 0.0) -> Fence:
        """Run ``op`` after everything enqueued before it and after ``waits``; the returned fence marks it done."""
        with self._lock:
            self._seq += 1
            done = Fence(stream=self, seq=self._seq)
            self._queue.put((op, list(waits or []), delay, done))
            self.tail = done
        if self.eager and not self._closing and not self.runs_in(threading.current_thread()):
            done.wait()  # (a finalizer running on this worker must not wait for itself, nor anyone for a closed one)
        return done

    def demand(self, seq: int) -> None:
        """Something waits for operation ``seq``: a lazy stream runs up to it now."""
        with self._wake:
            if seq > self._demanded:
                self._demanded = seq
                self._wake.notify_all()

    def _run(self) -> None:
        while True:
            item = self._queue.get()
            if item is None:
                return
            op, waits, delay, done = item
            if self.lazy:
                self._until_demanded(done._seq)
            for fence in waits:
                fence.wait()
            if delay:
                time.sleep(delay)
            try:
                op()
            finally:
                done.set()

    def _until_demanded(self, seq: int) -> None:
        with self._wake:
            self._wake.wait_for(lambda: self._closing or self._demanded >= seq, timeout=self.lazy)

    def close(self) -> None:
        """Pending work still runs, at once (as cuStreamDestroy documents); then the worker ends."""
        with self._wake:
            self._closing = True
            self._wake.notify_all()
        self._queue.put(None)

    def runs_in(self, thread: threading.Thread) -> bool:
        return thread is self._thread

    def join(self, timeout: float) -> None:
        """Wait until the worker has run what was enqueued before ``close()``."""
        self._thread.join(timeout)
