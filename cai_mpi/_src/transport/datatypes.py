"""MPI derived datatypes that let MPI read or write a strided host array in place (byte-based hvectors), and when
that beats packing it with numpy."""

from __future__ import annotations

import functools
import threading
from collections import OrderedDict

from mpi4py import MPI

from ..config import Config

__all__ = ["describable", "host_datatype_bytes", "library_is_mpich", "strided_type"]

# MPICH's derived datatypes past its eager size (a strided row of 8 KiB or more, between two processes) ran several
# times slower than numpy packing plus a contiguous message; Open MPI's ran faster than packing at every size
# (docs/benchmarks.md, "Strided host payloads"). So MPICH takes derived datatypes only for payloads it sends eagerly.
_MPICH_DATATYPE_BYTES = 4096


@functools.cache
def library_is_mpich() -> bool:
    try:
        return "MPICH" in MPI.Get_library_version().upper()
    except Exception:  # (a library that will not say keeps the default)
        return False


def host_datatype_bytes(cfg: Config) -> int:
    """The largest strided host payload handed to MPI through a derived datatype; larger ones are packed with numpy
    (CAI_MPI_HOST_DATATYPE_BYTES, else by library)."""
    if cfg.host_datatype_bytes is not None:
        return cfg.host_datatype_bytes
    return _MPICH_DATATYPE_BYTES if library_is_mpich() else 2**63

_CACHE_SIZE = 64
# key -> (committed datatype, low offset, every datatype it was built from)
_Entry = tuple[MPI.Datatype, int, list[MPI.Datatype]]
_cache: OrderedDict[tuple[tuple[int, ...], tuple[int, ...], int], _Entry] = OrderedDict()
_lock = threading.Lock()


def describable(shape: tuple[int, ...], strides: tuple[int, ...]) -> bool:
    """Can strided_type describe this layout safely?

    Open MPI 5.0 builds a wrong type map for an hvector whose byte stride is exactly -1 (it reads the
    blocks forwards), so such layouts (1-byte elements walked backwards) are copied instead.
    """
    return all(s != -1 for n, s in zip(shape, strides) if n > 1)


def _build(shape: tuple[int, ...], strides: tuple[int, ...], itemsize: int) -> _Entry:
    dims = [(n, s) for n, s in zip(shape, strides) if n != 1]
    block = itemsize
    # An innermost run of adjacent elements is one contiguous block.
    if dims and dims[-1][1] == itemsize:
        block = itemsize * dims[-1][0]
        dims = dims[:-1]
    parts = [MPI.BYTE.Create_contiguous(block)]
    low = 0
    for n, s in reversed(dims):
        parts.append(parts[-1].Create_hvector(n, 1, s))
        if s < 0:
            low += s * (n - 1)
    if low:
        # Shift so every displacement is >= 0 relative to the lowest byte the array touches.
        parts.append(MPI.Datatype.Create_struct([1], [-low], [parts[-1]]))
    final = parts.pop()
    final.Commit()
    # The building blocks stay alive as long as the final type: some MPI libraries have mishandled
    # types whose components were freed early, and keeping a handful of handles costs nothing.
    return final, low, parts


def _free(entry: _Entry) -> None:
    if MPI.Is_finalized():
        return
    final, _low, parts = entry
    for t in (final, *parts):
        t.Free()


def strided_type(shape: tuple[int, ...], strides: tuple[int, ...], itemsize: int) -> tuple[MPI.Datatype, int]:
    """A committed datatype covering the array, and the byte offset (<= 0) of its lowest byte from element 0.

    Pass ``[MPI.buffer.fromaddress(ptr + low, extent), 1, datatype]`` to MPI.
    Its type signature is ``nbytes`` BYTEs, so it matches a contiguous byte
    receive (or send) on the other side. Datatypes are cached (LRU).
    """
    key = (tuple(shape), tuple(strides), itemsize)
    with _lock:
        hit = _cache.get(key)
        if hit is not None:
            _cache.move_to_end(key)
            return hit[0], hit[1]
        entry = _build(*key)
        _cache[key] = entry
        while len(_cache) > _CACHE_SIZE:
            _free(_cache.popitem(last=False)[1])
    return entry[0], entry[1]
