"""One pool abstraction for reusable memory: size classes, a budget of idle bytes, eviction.

Host receive buffers and pinned staging buffers are both expensive to get fresh (page faults;
page-locking costs milliseconds) and both come and go in a few sizes. ``BlockPool`` keeps idle
blocks by power-of-two size class, at most ``budget`` idle bytes in all; a block coming back to a
full pool first evicts idle blocks of the classes used least recently, and is released itself only
if that is not enough. Its two uses live here too: ``host_receive_pool()`` lends its blocks as numpy
arrays that go back to the pool when the last view of them dies (a ``lease``, the one a Pipeline ring's items
use too); ``pinned_pool(runtime)`` holds the
pinned staging blocks of a device runtime, which ``give_back`` returns only once the MPI operations
and device copies using them have completed.
"""

from __future__ import annotations

import ctypes
import threading
import weakref
from collections import OrderedDict
from collections.abc import Callable
from typing import Any, Generic, TypeVar

import numpy as np
from mpi4py import MPI

from ..config import config
from ..errors import CudaError
from ..runtime.base import PINNED_SOURCES, Event, PinnedBuffer, Runtime

__all__ = [
    "BlockPool", "HostReceivePool", "give_back", "host_receive_pool", "idle_pooled_bytes", "lease", "pinned_pool",
    "size_class",
]

B = TypeVar("B")


def size_class(nbytes: int) -> int:
    """The power of two a request of ``nbytes`` is served from."""
    return 1 << (nbytes - 1).bit_length() if nbytes > 1 else 1


class BlockPool(Generic[B]):
    """Idle blocks by size class within a byte budget, evicting the least recently used classes first.

    Args:
        allocate: makes a new block of exactly the size class asked for.
        release: frees a block the pool will not keep.
        budget: the most idle bytes the pool holds, asked each time a block is taken (a setting may change).
            Not when one comes back: that may happen during interpreter teardown, when settings are gone.
    """

    def __init__(
        self, allocate: Callable[[int], B], release: Callable[[B], None], *, budget: Callable[[], int]
    ) -> None:
        self._allocate = allocate
        self._release = release
        self._read_budget = budget
        self.budget = budget()
        self.idle_bytes = 0
        self._idle: OrderedDict[int, list[B]] = OrderedDict()  # size class -> idle blocks, least recent first
        # Reentrant: the garbage collector can free a lease (which gives its block back) at any allocation.
        self._lock = threading.RLock()

    def take(self, nbytes: int) -> tuple[B, int]:
        """An idle block of ``nbytes``' size class, else a new one: ``(block, its size class)``."""
        cls = size_class(nbytes)
        self.budget = self._read_budget()
        with self._lock:
            idle = self._idle.get(cls)
            if idle:
                self._idle.move_to_end(cls)
                self.idle_bytes -= cls
                return idle.pop(), cls
        return self._allocate(cls), cls

    def give(self, block: B, cls: int) -> None:
        """Take back a block of size class ``cls``, evicting the least recently used idle blocks to fit the budget
        (or, if the block is larger than the budget, releasing it and trimming what a lowered budget left over)."""
        evicted: list[B] = []
        budget = self.budget
        fits = cls <= budget
        with self._lock:
            room = budget - cls if fits else budget
            if self.idle_bytes > room:  # (the steady state has room: a block goes back where it came from)
                if cls in self._idle:
                    self._idle.move_to_end(cls)  # in use: evicted last
                for other, idle in list(self._idle.items()):  # a copy: a lease may die in here and come back
                    while idle and self.idle_bytes > room:
                        evicted.append(idle.pop())
                        self.idle_bytes -= other
            if fits:
                self._idle.setdefault(cls, []).append(block)
                self._idle.move_to_end(cls)
                self.idle_bytes += cls
            else:
                evicted.append(block)
        for b in evicted:  # outside the lock: releasing may call into CUDA or the allocator
            self._release(b)

    def idle_blocks(self) -> dict[int, int]:
        """How many idle blocks the pool keeps, by size class (what ``idle_bytes`` counts)."""
        with self._lock:
            return {cls: len(idle) for cls, idle in self._idle.items() if idle}

    def clear(self) -> None:
        """Release every idle block."""
        with self._lock:
            evicted = [b for idle in self._idle.values() for b in idle]
            self._idle.clear()
            self.idle_bytes = 0
        for b in evicted:
            self._release(b)


# -- host receive buffers lent as numpy arrays ------------------------------------------------------------------

_lease_types: dict[int, type[ctypes.Array[ctypes.c_ubyte]]] = {}


def lease(address: int, nbytes: int, give: Callable[[Any], None], what: Any) -> ctypes.Array[ctypes.c_ubyte]:
    """A ctypes array over the ``nbytes`` at ``address`` that calls ``give(what)`` when it dies: the one lease of
    memory lent as numpy arrays (a receive pool's block, a Pipeline ring's buffer).

    numpy keeps the exporter of a buffer as the base of every array made from it (views included), so the lease
    lives exactly as long as the last array over the memory. (Cheaper per receive than a ``weakref.finalize`` per
    lease: docs/benchmarks.md.)
    """
    lease_type = _lease_types.get(nbytes)
    if lease_type is None:
        lease_type = _lease_types[nbytes] = type(f"_Lease{nbytes}", (ctypes.c_ubyte * nbytes,), {"__del__": _ended})
    lent = lease_type.from_address(address)
    lent._give, lent._what = give, what  # type: ignore[attr-defined]  # (a ctypes type made at run time)
    return lent


def _ended(lent: Any) -> None:
    lent._give(lent._what)


_HostBlock = tuple[np.ndarray[Any, Any], int]  # the memory, and its address (``.ctypes.data`` costs microseconds)


class HostReceivePool:
    """Host memory for received arrays: pooled blocks from ``min_bytes`` up, lent as numpy arrays.

    Smaller receives get plain ``numpy.empty`` (pooling them saves nothing); every pooled array is a
    view of a block that goes back to the pool when the array and every view of it are gone.
    """

    def __init__(
        self, *, min_bytes: int = 1 << 16, max_bytes: int = 1 << 30,
        budget: Callable[[], int] = lambda: config().pool_bytes,
    ) -> None:
        self.min_bytes = min_bytes
        self.max_bytes = max_bytes
        self.blocks: BlockPool[_HostBlock] = BlockPool(_new_block, _drop_block, budget=budget)

    def take_array(
        self, shape: tuple[int, ...], dtype: np.dtype[Any], nbytes: int, fortran: bool = False
    ) -> np.ndarray[Any, Any]:
        """A writable array of ``shape`` and ``dtype`` (``nbytes`` in all), C or Fortran ordered."""
        if nbytes < self.min_bytes or nbytes > self.max_bytes:
            return np.empty(shape, dtype, order="F" if fortran else "C")
        block, cls = self.blocks.take(nbytes)
        lent = lease(block[1], cls, self._returned, block)
        flat: np.ndarray[Any, Any] = np.frombuffer(lent, dtype, nbytes // dtype.itemsize)  # type: ignore[call-overload]
        if len(shape) == 1:
            return flat
        return flat.reshape(shape, order="F") if fortran else flat.reshape(shape)

    def _returned(self, block: _HostBlock) -> None:
        self.blocks.give(block, block[0].nbytes)  # (a block is exactly its size class)

    @property
    def idle_bytes(self) -> int:
        return self.blocks.idle_bytes

    def clear(self) -> None:
        self.blocks.clear()


def _new_block(cls: int) -> _HostBlock:
    block = np.empty(cls, np.uint8)
    return block, block.ctypes.data


def _drop_block(block: _HostBlock) -> None:
    """Nothing to do: the block's memory goes when its last reference does."""


_host_pool = HostReceivePool()


def host_receive_pool() -> HostReceivePool:
    return _host_pool


# -- pinned staging buffers, one pool per device runtime --------------------------------------------------------

_pinned_pools: weakref.WeakKeyDictionary[Runtime, BlockPool[PinnedBuffer]] = weakref.WeakKeyDictionary()


def pinned_pool(runtime: Runtime) -> BlockPool[PinnedBuffer]:
    """The pool of pinned staging blocks of ``runtime`` (at most CAI_MPI_PINNED_POOL_BYTES idle): the staging of
    device transfers and the runtime's own strided copies without CuPy (``PINNED_SOURCES``) take from it."""
    if _quarantine:
        _release_finished()
    pool = _pinned_pools.get(runtime)
    if pool is None:
        pool = _pinned_pools[runtime] = BlockPool(runtime.alloc_pinned, PinnedBuffer.free,
                                                  budget=lambda: config().pinned_pool_bytes)
    return pool


PINNED_SOURCES.append(pinned_pool)  # a runtime's own copies through pinned memory (no CuPy) draw on it too


def idle_pooled_bytes() -> int:
    """Bytes kept idle for reuse by the host receive pool and every pinned staging pool (each within its budget)."""
    return _host_pool.idle_bytes + sum(p.idle_bytes for p in list(_pinned_pools.values()))


class _Quarantined:
    """A staging block a failed or abandoned transfer may still have in use (an Isend or Irecv posted, a copy
    enqueued): MPI or the GPU would read or write it after the pool lent it out again, so it waits here until
    all of that has completed (possibly never, if the peer never matches: then it is never reused)."""

    __slots__ = ("block", "cls", "events", "pool", "reqs")

    def __init__(self, pool: BlockPool[PinnedBuffer], block: PinnedBuffer, cls: int, reqs: list[MPI.Request],
                 events: list[Event]) -> None:
        self.pool, self.block, self.cls, self.reqs, self.events = pool, block, cls, reqs, events

    def finished(self) -> bool:
        return _finished(self.reqs, self.events)


_quarantine: list[_Quarantined] = []
_releasing = threading.Lock()  # taken by _release_finished alone, never by give_back (a finalizer's way in)


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
    # No lock: a transfer's finalizer gives its block back, and the collector may run one inside _release_finished
    # (its queries allocate), on the thread that holds _releasing. A list's append is atomic.
    _quarantine.append(_Quarantined(pool, block, cls, pending_reqs, pending_events))


def _release_finished() -> None:
    """Give back the quarantined blocks whose transfers have finished: one thread at a time (others go on; a block
    quarantined meanwhile waits for the next call)."""
    if not _releasing.acquire(blocking=False):
        return
    try:
        done = [q for q in list(_quarantine) if q.finished()]
        for q in done:
            _quarantine.remove(q)
    finally:
        _releasing.release()
    for q in done:
        q.pool.give(q.block, q.cls)
