"""The stream policy: the one place where cai_mpi synchronizes a producer's work before MPI touches memory."""

from __future__ import annotations

from .config import config
from .descriptor import CAIDescriptor
from .runtime.base import Location, MemoryKind, Runtime

__all__ = ["sync_enabled", "sync_producer"]


def sync_enabled(sync: bool | None) -> bool:
    """``sync=None`` follows CAI_MPI_SYNC (default on); True/False force it."""
    return config().sync if sync is None else bool(sync)


def sync_producer(desc: CAIDescriptor, location: Location, runtime: Runtime) -> None:
    """Wait for pending producer work on ``desc``'s memory (CAI v3 consumer rules).

    - v3 with an int stream: synchronize that stream;
    - v3 with ``stream`` None: the producer promises nothing is pending;
    - v0-v2 pointing at device or managed memory: no stream is given, and real
      exporters (PyTorch v2, Numba on its default stream) do leave work
      pending, so synchronize the whole device conservatively.
    """
    if desc.version >= 3:
        if desc.stream is not None:
            runtime.sync_stream(desc.stream, location.ordinal)
    elif location.kind is not MemoryKind.HOST:
        runtime.sync_device(location.ordinal)
