"""MPI derived datatypes that let MPI read or write a strided host array in place (byte-based hvectors)."""

from __future__ import annotations

import threading
from collections import OrderedDict

from mpi4py import MPI

__all__ = ["strided_type"]

_CACHE_SIZE = 64
_cache: OrderedDict[tuple[tuple[int, ...], tuple[int, ...], int], tuple[MPI.Datatype, int]] = OrderedDict()
_lock = threading.Lock()


def _build(shape: tuple[int, ...], strides: tuple[int, ...], itemsize: int) -> tuple[MPI.Datatype, int]:
    dims = [(n, s) for n, s in zip(shape, strides) if n != 1]
    temps: list[MPI.Datatype] = []
    block = itemsize
    # An innermost run of adjacent elements is one contiguous block.
    if dims and dims[-1][1] == itemsize:
        block = itemsize * dims[-1][0]
        dims = dims[:-1]
    t = MPI.BYTE.Create_contiguous(block)
    temps.append(t)
    low = 0
    for n, s in reversed(dims):
        t = t.Create_hvector(n, 1, s)
        temps.append(t)
        if s < 0:
            low += s * (n - 1)
    # Shift so every displacement is >= 0 relative to the lowest byte the array touches.
    final = MPI.Datatype.Create_struct([1], [-low], [t])
    final.Commit()
    for tmp in temps:
        tmp.Free()
    return final, low


def strided_type(shape: tuple[int, ...], strides: tuple[int, ...], itemsize: int) -> tuple[MPI.Datatype, int]:
    """A committed datatype covering the array, and the byte offset (<= 0) of its lowest byte from element 0.

    Pass ``[MPI.buffer.fromaddress(ptr + low, extent), 1, datatype]`` to MPI.
    Its type signature is ``nbytes`` BYTEs, so it matches a contiguous byte
    receive (or send) on the other side. Datatypes are cached (LRU).
    """
    key = (shape, strides, itemsize)
    with _lock:
        hit = _cache.get(key)
        if hit is not None:
            _cache.move_to_end(key)
            return hit
    built = _build(shape, strides, itemsize)
    with _lock:
        _cache[key] = built
        while len(_cache) > _CACHE_SIZE:
            _, (old, _low) = _cache.popitem(last=False)
            if not MPI.Is_finalized():
                old.Free()
    return built
