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
    """Wait for pending producer work on ``desc``'s memory (CAI v3 consumer rules; docs/gpu-and-mpi.md).

    - v3 with an int stream: synchronize that stream;
    - no stream (v0-v2, or v3 ``stream`` None) on device or managed memory: synchronize the whole device.
      v3 says None means nothing is pending, but real exporters break that promise (Numba exports None with
      its default-stream kernels still running; a cai_mpi Array exports None once handed over, and the user
      may have launched work on it since), and MPI reads device memory outside any stream;
    - host memory without a stream: nothing to wait for.
    """
    if desc.version >= 3 and desc.stream is not None:
        runtime.sync_stream(desc.stream, location.ordinal)
    elif location.kind is not MemoryKind.HOST:
        runtime.sync_device(location.ordinal)
