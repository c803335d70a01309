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

__all__ = [
    "UNTIL_IDLE", "CudaDeviceBuffer", "CudaPinnedBuffer", "HostAllocation", "Keep", "OrderedFree", "RetiredBlocks",
    "UntilIdle",
]


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


#: A retired block's consumer whose stream nothing keeps alive (``CudaAllocation.read_on``).
UNTIL_IDLE = object()


class UntilIdle(Event):
    """What a block read on a stream nobody keeps alive waits for: the whole device idle. Never found passed by a
    query (so ``reap`` passes over it), it is waited for by ``drain`` only, in an allocation, never in a finalizer."""

    def __init__(self, sync_device: Callable[[], None]) -> None:
        self._sync_device = sync_device

    def synchronize(self) -> None:
        self._sync_device()

    def query(self) -> bool:
        return False


class RetiredBlocks:
    """Handed-out device blocks whose Array has died, each kept from its pool until the events recorded at its
    release (the user work that may still read it) have passed. One queue per GPU, so a GPU with work pending (or a
    sticky error) holds back none of another's blocks.

    Finalizers add to it from any thread, and may run at any allocation of the code they interrupt, this class's
    own included: so a finalizer takes no lock it could wait for. ``hold`` records its events with no lock held,
    appends to ``_arrived`` (a deque: its appends and pops need no lock) and reaps only if the lock is free at once;
    the queues are sorted out under the lock by whoever reaps next."""

    def __init__(self, release_events: Callable[[int, list[tuple[int, Any]]], list[Event]]) -> None:
        """``release_events(ordinal, consumers)``: events recorded now on the streams user work may still run on
        (``consumers``: a buffer's, each a CAI handle and the object keeping it alive)."""
        self._release_events = release_events
        self._held: dict[int, collections.deque[tuple[list[Event], Callable[[], None]]]] = {}
        self._arrived: collections.deque[tuple[int, list[Event], Callable[[], None]]] = collections.deque()
        self._lost: list[Callable[[], None]] = []  # (appended to only: never reused, so never taken back)
        self._lock = threading.Lock()

    def hold(self, ordinal: int, consumers: list[tuple[int, Any]], give_back: Callable[[], None]) -> None:
        """Retire a block (a finalizer's call: no lock waited for)."""
        try:
            events = self._release_events(ordinal, consumers)
        except Exception:  # the driver is gone (interpreter exit) or the context is dead: never reuse the block
            self._lost.append(give_back)
            return
        self._arrived.append((ordinal, events, give_back))
        self.reap(ordinal, wait=False)  # an Array's death is news: blocks retired before it may be free by now

    def _sort_arrived(self) -> None:
        """Move the blocks finalizers retired into their GPU's queue (under the lock)."""
        while self._arrived:
            try:
                ordinal, events, give_back = self._arrived.popleft()
            except IndexError:  # (another thread took the last one)
                return
            self._held.setdefault(ordinal, collections.deque()).append((events, give_back))

    def drain(self, ordinal: int) -> bool:
        """Wait for the user work on every block GPU ``ordinal`` holds back, give them back, and say whether any went
        back: what an allocation that does not fit tries before it fails."""
        with self._lock:
            self._sort_arrived()
            queue = self._held.pop(ordinal, None) or ()
        given: list[Callable[[], None]] = []
        for events, give_back in queue:
            try:
                for event in events:
                    event.synchronize()
            except Exception:  # a sticky error: never reuse it
                self._lost.append(give_back)
                continue
            given.append(give_back)
        for give_back in given:
            give_back()
        return bool(given)

    def reap(self, ordinal: int, *, wait: bool = True) -> None:
        """Give back, oldest first, GPU ``ordinal``'s blocks whose user work has passed (queries only: it never
        blocks on the GPU). A block whose query fails (a sticky error in its context) is never reused, as a pool's
        idle check would treat it. ``wait=False`` (a finalizer's): if the lock is taken, leave it to the next reap.

        The lock guards the queues only: the queries and the blocks going back run outside it."""
        if not self._lock.acquire(wait):
            return
        try:
            self._sort_arrived()
            held = list(self._held.get(ordinal, ()))
        finally:
            self._lock.release()
        passed: list[tuple[list[Event], Callable[[], None]]] = []
        failed: list[tuple[list[Event], Callable[[], None]]] = []
        for entry in held:
            if isinstance(entry[0][-1], UntilIdle):
                continue  # (only an allocation that waits for the device gives it back: ``drain``)
            try:
                if not all(e.query() for e in entry[0]):
                    break
            except Exception:
                failed.append(entry)
                continue
            passed.append(entry)
        if not passed and not failed:
            return
        given: list[Callable[[], None]] = []
        if not self._lock.acquire(wait):
            return  # (they are still queued: a later reap finds them passed)
        try:
            queue = self._held.get(ordinal) or collections.deque()
            for entry in passed + failed:
                try:
                    queue.remove(entry)  # (unless another thread reaped it meanwhile)
                except ValueError:
                    continue
                (given if any(entry is p for p in passed) else self._lost).append(entry[1])
        finally:
            self._lock.release()
        for give_back in given:
            give_back()

    def __len__(self) -> int:
        return sum(len(q) for q in self._held.values()) + len(self._arrived)
