"""Numpy views of raw host memory described by a CAIDescriptor, and a pool of reusable receive buffers."""

from __future__ import annotations

import ctypes
import threading
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

    Buffers are numpy uint8 arrays; a buffer returns to the pool when the
    last reference to it (an Array, a numpy view) is dropped. Only sizes
    from ``min_bytes`` to ``max_bytes`` are pooled; ``max_cached`` bounds the
    bytes held idle, evicting the size classes returned to least recently.
    """

    def __init__(self, min_bytes: int = 1 << 16, max_bytes: int = 1 << 30, max_cached: int = 1 << 30) -> None:
        self.min_bytes = min_bytes
        self.max_bytes = max_bytes
        self.max_cached = max_cached
        self._free: dict[int, list[np.ndarray[Any, Any]]] = {}
        self._cached = 0
        self._lock = threading.Lock()

    def take(self, nbytes: int) -> np.ndarray[Any, Any]:
        """A writable uint8 array of at least ``nbytes`` (exactly ``nbytes`` long)."""
        if nbytes < self.min_bytes or nbytes > self.max_bytes:
            return np.empty(nbytes, np.uint8)
        cls = 1 << (nbytes - 1).bit_length()
        with self._lock:
            bucket = self._free.get(cls)
            block = bucket.pop() if bucket else None
            if block is not None:
                self._cached -= cls
        if block is None:
            block = np.empty(cls, np.uint8)
        # Every receive without out= passes here: three views, and no Python call but the lease's __del__.
        # The slice is what keeps the lease alive: numpy points a view's base past any view whose own
        # base has the view's type, so lease.view(np.ndarray) would hold the block, not the lease.
        lease = block.view(_PooledView)
        lease._pool_ref = (block, self)
        return lease[:nbytes].view(np.ndarray)

    def take_array(
        self, nbytes: int, shape: tuple[int, ...], dtype: np.dtype[Any], fortran: bool = False
    ) -> np.ndarray[Any, Any]:
        """A writable array of ``shape`` and ``dtype`` (``nbytes`` in all), C or Fortran ordered, in pooled memory."""
        if nbytes < self.min_bytes or nbytes > self.max_bytes:
            return np.empty(shape, dtype, order="F" if fortran else "C")
        flat = self.take(nbytes)
        if dtype is not _UINT8:
            flat = flat.view(dtype)
        if len(shape) == 1:
            return flat
        return flat.reshape(shape, order="F") if fortran else flat.reshape(shape)

    def _give_back(self, block: np.ndarray[Any, Any]) -> None:
        cls = block.nbytes
        if cls > self.max_cached:
            return
        with self._lock:
            # The newest size class goes last (dicts keep insertion order); when the cache is full the
            # size classes used longest ago make room, so a run that moves on to new sizes keeps pooling.
            bucket = self._free.pop(cls, None) or []
            bucket.append(block)
            self._free[cls] = bucket
            self._cached += cls
            while self._cached > self.max_cached:
                oldest = next(iter(self._free))
                victims = self._free[oldest]
                if victims:
                    victims.pop()
                    self._cached -= oldest
                if not victims:
                    del self._free[oldest]

    def clear(self) -> None:
        with self._lock:
            self._free.clear()
            self._cached = 0

    @property
    def cached_bytes(self) -> int:
        return self._cached


class _PooledView(np.ndarray):  # type: ignore[type-arg]
    """The view handed out by the pool: when it (and every view of it) dies, the block goes back."""

    # Set on the one view ``take`` makes; views numpy derives from it get the class default (no
    # __array_finalize__: a Python call per view that the receive path would pay).
    _pool_ref: tuple[np.ndarray[Any, Any], HostBufferPool] | None = None

    def __del__(self) -> None:
        ref = self._pool_ref
        if ref is not None:
            ref[1]._give_back(ref[0])


_pool = HostBufferPool()


def host_pool() -> HostBufferPool:
    return _pool
