"""Device and pinned memory of the CUDA runtime, and the rules for giving it back: a handed-out block is retired
until the user work that may read it has passed; stream-ordered memory is freed on its own stream."""

from __future__ import annotations

import collections
import threading
import weakref
from collections.abc import Callable
from typing import Any

import numpy as np

from .base import DeviceBuffer, Event, PinnedBuffer, Stream
from .cudacontexts import Driver

__all__ = ["CudaDeviceBuffer", "CudaPinnedBuffer", "HostAllocation", "Keep", "OrderedFree", "RetiredBlocks"]


class CudaDeviceBuffer(DeviceBuffer):
    """Device memory from a caching pool; ``free()``, or garbage collection, runs ``release`` (a finalizer that gives
    the block back: to CuPy's pool, the driver's stream-ordered pool, or first to the runtime's retired blocks)."""

    def __init__(self, ptr: int, nbytes: int, ordinal: int, stream: int | None = None) -> None:
        self.ptr = ptr
        self.nbytes = nbytes
        self.ordinal = ordinal
        self.stream = stream
        #: The streams the block's users compute on, each ``(CAI handle, the object keeping it alive)``: a handed-out
        #: block keeps them alive (``stream`` is the first's) and is retired behind each when it dies.
        self.consumers: list[tuple[int, Any]] = []
        self._release: weakref.finalize[Any, Any] | None = None

    def release_with(self, give_back: Callable[..., None], *args: Any) -> None:
        """``give_back(*args)`` runs once, at ``free()`` or when the buffer is collected."""
        self._release = weakref.finalize(self, give_back, *args)

    def free(self) -> None:
        """Release now (the block goes where ``release_with`` said)."""
        if self._release is not None:
            self._release()


class CudaPinnedBuffer(PinnedBuffer):
    """Page-locked host memory; ``array`` views keep it alive, so ``free()`` never leaves one dangling."""

    def __init__(self, ptr: int, nbytes: int, array: np.ndarray[Any, Any]) -> None:
        self.ptr = ptr
        self.nbytes = nbytes
        self._array: np.ndarray[Any, Any] | None = array

    @property
    def array(self) -> np.ndarray[Any, Any]:
        if self._array is None:
            raise ValueError("pinned buffer already freed")
        return self._array

    def free(self) -> None:
        """Drop this buffer's hold; the memory is released once no view of ``array`` remains."""
        self._array = None


class HostAllocation:
    """Owner of one cuMemHostAlloc block; frees it when the last numpy view is collected."""

    def __init__(self, driver: Driver, ptr: int, ordinal: int) -> None:
        self.ptr = ptr
        weakref.finalize(self, driver.release, ordinal, "cuMemFreeHost", ptr)


class Keep:
    """Holds an object (a CuPy allocation) until called: calling it lets the object go back to its pool."""

    __slots__ = ("held",)

    def __init__(self, held: Any) -> None:
        self.held = held

    def __call__(self) -> None:
        self.held = None


class OrderedFree:
    """Frees stream-ordered memory on the stream it was allocated on (keeping that stream alive until then)."""

    __slots__ = ("_driver", "_handle", "_ordinal", "_ptr", "_stream")

    def __init__(self, driver: Driver, ordinal: int, ptr: int, handle: int, stream: Stream | None) -> None:
        self._driver, self._ordinal, self._ptr, self._handle, self._stream = driver, ordinal, ptr, handle, stream

    def __call__(self) -> None:
        self._driver.release(self._ordinal, "cuMemFreeAsync", self._ptr, self._handle)
        self._stream = None


class RetiredBlocks:
    """Handed-out device blocks whose Array has died, each kept from its pool until the events recorded at its
    release (the user work that may still read it) have passed. One queue per GPU, so a GPU with work pending (or a
    sticky error) holds back none of another's blocks. Finalizers add to it from any thread."""

    def __init__(self, release_events: Callable[[int, list[tuple[int, Any]]], list[Event]]) -> None:
        """``release_events(ordinal, consumers)``: events recorded now on the streams user work may still run on
        (``consumers``: a buffer's, each a CAI handle and the object keeping it alive)."""
        self._release_events = release_events
        self._held: dict[int, collections.deque[tuple[list[Event], Callable[[], None]]]] = {}
        self._lost: list[Callable[[], None]] = []
        self._lock = threading.Lock()

    def hold(self, ordinal: int, consumers: list[tuple[int, Any]], give_back: Callable[[], None]) -> None:
        try:
            events = self._release_events(ordinal, consumers)
        except Exception:  # the driver is gone (interpreter exit) or the context is dead: never reuse the block
            with self._lock:
                self._lost.append(give_back)
            return
        with self._lock:
            self._held.setdefault(ordinal, collections.deque()).append((events, give_back))
        self.reap(ordinal)  # an Array's death is news: blocks retired before it may be free by now

    def drain(self, ordinal: int) -> bool:
        """Wait for the user work on every block GPU ``ordinal`` holds back, give them back, and say whether any went
        back: what an allocation that does not fit tries before it fails."""
        with self._lock:
            queue = self._held.pop(ordinal, collections.deque())
        given: list[Callable[[], None]] = []
        for events, give_back in queue:
            try:
                for event in events:
                    event.synchronize()
            except Exception:  # a sticky error: never reuse it
                with self._lock:
                    self._lost.append(give_back)
                continue
            given.append(give_back)
        for give_back in given:
            give_back()
        return bool(given)

    def reap(self, ordinal: int) -> None:
        """Give back, oldest first, GPU ``ordinal``'s blocks whose user work has passed (queries only: it never
        blocks). A block whose query fails (a sticky error in its context) is never reused, as a pool's idle check
        would treat it.

        The lock guards the queue only: the queries run Python that allocates, so the collector may finalize a dead
        Array right there and retire its block (``hold``) on this very thread; the blocks go back outside it too."""
        with self._lock:
            held = list(self._held.get(ordinal, ()))
        passed: list[tuple[list[Event], Callable[[], None]]] = []
        failed: list[tuple[list[Event], Callable[[], None]]] = []
        for entry in held:
            try:
                if not all(e.query() for e in entry[0]):
                    break
            except Exception:
                failed.append(entry)
                continue
            passed.append(entry)
        given: list[Callable[[], None]] = []
        with self._lock:
            queue = self._held.get(ordinal, collections.deque())
            for entry in passed + failed:
                try:
                    queue.remove(entry)  # (unless another thread reaped it meanwhile)
                except ValueError:
                    continue
                (given if any(entry is p for p in passed) else self._lost).append(entry[1])
        for give_back in given:
            give_back()

    def __len__(self) -> int:
        return sum(len(q) for q in self._held.values())
