"""Numpy views of raw host memory described by a CAIDescriptor, and a pool of reusable receive buffers."""

from __future__ import annotations

import ctypes
import threading
import weakref
from collections import OrderedDict
from collections.abc import Callable
from typing import Any

import numpy as np

from .descriptor import CAIDescriptor

__all__ = ["HostBufferPool", "host_view", "host_pool"]

_UINT8 = np.dtype(np.uint8)


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


class HostBufferPool:
    """Recycles host receive buffers by size class, so steady-state receives do not page-fault.

    A received array is a numpy view of a pooled block, held through a lease; when the
    last view dies the lease puts the block back (``_bufexport.PoolLease``, in C, or the
    pure-Python ``_PooledView``). Only sizes from ``min_bytes`` to ``max_bytes`` are pooled;
    at most ``max_cached`` bytes are held idle: a block coming back to a full pool makes room
    by evicting idle blocks of the size classes taken longest ago (a run that moves on to new
    sizes keeps pooling them), and is freed only if that is not enough.
    """

    def __init__(
        self, min_bytes: int = 1 << 16, max_bytes: int = 1 << 30, max_cached: int = 1 << 30, *,
        pure_python: bool = False,
    ) -> None:
        self.min_bytes = min_bytes
        self.max_bytes = max_bytes
        self._budget: Any = (_PyPoolBudget if pure_python else PoolBudget)(max_cached)
        self._take_lease: Callable[..., Any] = _py_take_lease if pure_python else take_lease
        # Size class -> its idle blocks, the class taken longest ago first. A list lives as long as the
        # pool (leases hold it to return to); only its place moves, by move_to_end: one call, so a
        # class is never missing for another thread.
        self._free: OrderedDict[int, list[np.ndarray[Any, Any]]] = OrderedDict()
        self._last_class = 0  # the class taken last: a run of one size never reorders
        # Eviction and clear(). Reentrant: a lease can die (and call _make_room) inside either.
        self._lock = threading.RLock()
        pool = weakref.ref(self)  # the budget must not keep the pool alive (it is not GC-tracked)

        def on_full(cls: int) -> None:
            p = pool()
            if p is not None:
                p._make_room(cls)

        self._budget.on_full = on_full

    @property
    def max_cached(self) -> int:
        return int(self._budget.max_cached)

    @property
    def cached_bytes(self) -> int:
        return int(self._budget.cached)

    def take(self, nbytes: int) -> np.ndarray[Any, Any]:
        """A writable uint8 array of ``nbytes`` (in a block of the next power of two, when pooled)."""
        return self.take_array(nbytes, (nbytes,), _UINT8)

    def take_array(
        self, nbytes: int, shape: tuple[int, ...], dtype: np.dtype[Any], fortran: bool = False
    ) -> np.ndarray[Any, Any]:
        """A writable array of ``shape`` and ``dtype`` (``nbytes`` in all), C or Fortran ordered, in pooled memory."""
        if nbytes < self.min_bytes or nbytes > self.max_bytes:
            return np.empty(shape, dtype, order="F" if fortran else "C")
        cls = 1 << (nbytes - 1).bit_length()
        free = self._free.get(cls)
        if free is None:
            free = self._free.setdefault(cls, [])
        if cls != self._last_class:
            self._last_class = cls
            self._free.move_to_end(cls)
        lease = self._take_lease(free, self._budget, cls, None)
        if lease is None:
            lease = self._take_lease(free, self._budget, cls, np.empty(cls, np.uint8))
        # The array's base is the lease (a memoryview of it for the pure-Python one): numpy does not
        # look past it, so every view of the array keeps the block lent.
        flat: np.ndarray[Any, Any] = np.frombuffer(lease, dtype, nbytes // dtype.itemsize)
        if len(shape) == 1:
            return flat
        return flat.reshape(shape, order="F") if fortran else flat.reshape(shape)

    def _make_room(self, cls: int) -> None:
        """A block of size class ``cls`` is coming back to a full budget: evict idle blocks of the other
        classes, those taken longest ago first, until it fits."""
        budget = self._budget
        with self._lock:
            for other, free in list(self._free.items()):
                if other == cls:
                    continue
                while budget.cached + cls > budget.max_cached and budget.evict(free, other):
                    pass
                if budget.cached + cls <= budget.max_cached:
                    return

    def clear(self) -> None:
        """Free every idle block."""
        with self._lock:
            for cls, free in list(self._free.items()):  # takes may add size classes meanwhile
                while self._budget.evict(free, cls):
                    pass


class _PyPoolBudget:
    """Pure-Python ``_bufexport.PoolBudget``: the idle bytes a pool holds and may hold."""

    __slots__ = ("cached", "max_cached", "on_full")

    def __init__(self, max_cached: int) -> None:
        self.cached = 0
        self.max_cached = max_cached
        self.on_full: Callable[[int], None] | None = None

    def evict(self, free_list: list[np.ndarray[Any, Any]], cls: int) -> bool:
        with _fallback_lock:
            if not free_list:
                return False
            free_list.pop()
            self.cached -= cls
            return True


# Reentrant: the garbage collector may run a lease's __del__ inside any of these critical sections.
_fallback_lock = threading.RLock()


def _py_take_lease(
    free_list: list[np.ndarray[Any, Any]], budget: _PyPoolBudget, cls: int, new_block: np.ndarray[Any, Any] | None
) -> memoryview | None:
    """Pure-Python ``_bufexport.take_lease``: a lease on an idle block, else on ``new_block``, else None."""
    with _fallback_lock:
        if free_list:
            block = free_list.pop()
            budget.cached -= cls
        elif new_block is None:
            return None
        else:
            block = new_block
    lease = block.view(_PooledView)
    lease._pool_ref = (block, free_list, budget)
    # A memoryview holds the lease itself: numpy.frombuffer(lease) would point at the block instead.
    # (Unlike the C lease, that base has a release(): calling it on a received array's base would
    # return the block early. Only deliberate misuse can.)
    return memoryview(lease)  # type: ignore[arg-type]


class _PooledView(np.ndarray):  # type: ignore[type-arg]
    """The pure-Python lease: when it (and every view of it) dies, the block goes back."""

    # Set on the one view ``_py_take_lease`` makes; views numpy derives from it get the class default.
    _pool_ref: tuple[np.ndarray[Any, Any], list[np.ndarray[Any, Any]], _PyPoolBudget] | None = None

    def __del__(self) -> None:
        ref = self._pool_ref
        if ref is None:
            return
        block, free_list, budget = ref
        cls = block.nbytes
        if budget.cached + cls > budget.max_cached and cls <= budget.max_cached and budget.on_full is not None:
            budget.on_full(cls)  # outside _fallback_lock: it takes the pool's lock, which evict() nests in
        with _fallback_lock:
            if budget.cached + cls <= budget.max_cached:
                free_list.append(block)
                budget.cached += cls


try:  # the C lease: returning a block costs no Python call
    from ._bufexport import PoolBudget, take_lease
except ImportError:  # pragma: no cover - built wherever a C compiler was present at install time
    PoolBudget, take_lease = _PyPoolBudget, _py_take_lease  # type: ignore[assignment,misc]


_pool = HostBufferPool()


def host_pool() -> HostBufferPool:
    return _pool
