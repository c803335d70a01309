"""Packing strided device arrays into contiguous bytes and back: CuPy's copy kernels (``cudastrided`` without CuPy)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

__all__ = ["as_cupy", "byte_view"]



def byte_view(
    shape: Sequence[int], strides: Sequence[int], itemsize: int, pointers: Sequence[int]
) -> tuple[np.dtype[Any], tuple[int, ...], tuple[int, ...]]:
    """An unsigned-int dtype, shape and byte strides describing the same bytes as the array.

    Packing only moves bytes, so it runs on u1/u2/u4/u8 elements: CuPy copies them
    bit-exactly and refuses none (it refuses structured, big-endian and other
    dtypes). The widest word that divides the itemsize, every stride that is
    stepped and every pointer is used (misaligned wide loads fault); an itemsize
    wider than the word becomes a trailing axis.
    """
    stepped = [s for n, s in zip(shape, strides, strict=True) if n > 1]
    for word in (8, 4, 2, 1):
        if (
            itemsize % word == 0
            and all(s % word == 0 for s in stepped)
            and all(p % word == 0 for p in pointers)
        ):
            break
    dtype = np.dtype(f"u{word}")
    if word == itemsize:
        return dtype, tuple(shape), tuple(strides)
    return dtype, (*shape, itemsize // word), (*strides, word)


def as_cupy(
    cp: Any,
    ptr: int,
    shape: tuple[int, ...],
    dtype: np.dtype[Any],
    strides: tuple[int, ...] | None,
    ordinal: int,
) -> Any:
    """A cupy.ndarray over raw device memory (no copy, no pointer query, no ownership).

    ``ptr`` addresses element 0; strides are bytes and may be negative, so the
    UnownedMemory spans the whole extent and the MemoryPointer offset points at element 0.
    Passing ``device_id`` spares CuPy a pointer-attribute query.
    """
    low = high = 0
    if strides is not None:
        for n, s in zip(shape, strides, strict=True):
            if s < 0:
                low += s * (n - 1)
            else:
                high += s * (n - 1)
        high += dtype.itemsize
    else:
        high = int(np.prod(shape, dtype=np.int64)) * dtype.itemsize
    mem = cp.cuda.UnownedMemory(ptr + low, high - low, None, ordinal)
    memptr = cp.cuda.MemoryPointer(mem, -low)
    return cp.ndarray(shape, dtype, memptr=memptr, strides=strides)
