"""What both directions of the transport are made of: message specs over memory, chunking, cai_mpi's own
device streams, and (from ``pool``) the pinned staging buffers."""

from __future__ import annotations

import threading
from collections.abc import Generator
from typing import Any

import numpy as np
from mpi4py import MPI

from ..progress.waits import Waitable
from ..runtime.base import Runtime, Stream
from .pool import give_back, pinned_pool

__all__ = ["BYTE", "Steps", "byte_chunks", "chunks", "give_back", "internal_stream", "pinned_pool", "raw"]

BYTE = MPI.BYTE
#: What is left of a transfer once its MPI operations are posted: a generator of what it waits for.
Steps = Generator[Waitable, None, None]


def chunks(nbytes: int, chunk: int) -> list[tuple[int, int]]:
    """``(offset, length)`` of each message a payload of ``nbytes`` travels in (``chunk`` 0: one message)."""
    if not chunk or chunk >= nbytes:
        return [(0, nbytes)]
    return [(off, min(chunk, nbytes - off)) for off in range(0, nbytes, chunk)]


def raw(ptr: int, nbytes: int, *, readonly: bool = False) -> list[Any]:
    """An MPI message spec over raw memory (device memory only ever reaches a CUDA-aware MPI this way)."""
    return [MPI.buffer.fromaddress(ptr, nbytes, readonly=readonly), nbytes, BYTE]


def byte_chunks(arr: np.ndarray[Any, Any], chunk: int) -> list[Any]:
    """Message specs covering the bytes of contiguous ``arr`` (in memory order) in messages of ``chunk``."""
    if not chunk or chunk >= arr.nbytes:
        return [[arr, BYTE]]
    whole = MPI.buffer(arr.reshape(-1, order="A"))
    return [[whole[off : off + n], n, BYTE] for off, n in chunks(arr.nbytes, chunk)]


# -- per-thread device streams -----------------------------------------------------------------------------------

_tls = threading.local()


def internal_stream(runtime: Runtime, ordinal: int) -> Stream:
    """cai_mpi's own stream for ``ordinal``, one per thread (the current device is per thread)."""
    streams: dict[tuple[int, int], Stream] | None = getattr(_tls, "streams", None)
    if streams is None:
        streams = _tls.streams = {}
    key = (id(runtime), ordinal)
    s = streams.get(key)
    if s is None:
        s = streams[key] = runtime.create_stream(ordinal)
    return s
