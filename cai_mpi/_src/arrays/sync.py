"""The stream policy: the one place where cai_mpi synchronizes a producer's work before MPI touches memory."""

from __future__ import annotations

from ..config import config
from ..core.descriptor import CAIDescriptor
from ..runtime.base import LEGACY_STREAM, PER_THREAD_STREAM, Location, MemoryKind, Runtime

__all__ = ["sync_enabled", "sync_producer", "sync_unnamed"]


def sync_enabled(sync: bool | None) -> bool:
    """``sync=None`` follows CAI_MPI_SYNC (default on); True/False force it."""
    return config().sync if sync is None else bool(sync)


def sync_producer(desc: CAIDescriptor, location: Location, runtime: Runtime) -> None:
    """Wait for pending producer work on ``desc``'s memory (CAI v3 consumer rules; docs/guide.md, "Streams").

    - v3 with an int stream: synchronize that stream;
    - no stream (v0-v2, or v3 ``stream`` None) on memory a GPU may write (device, managed, or pinned host memory
      CUDA knows, such as Numba's mapped arrays): ``sync_unnamed``. v3 says None means nothing is pending, but real
      exporters break that promise (Numba exports None with its default-stream kernels still running; PyTorch
      exports v2), and MPI reads memory outside any stream;
    - pageable host memory without a stream: nothing to wait for.
    """
    if desc.version >= 3 and desc.stream is not None:
        runtime.sync_stream(desc.stream, location.ordinal)
    elif location.kind is not MemoryKind.HOST or location.ordinal is not None:
        sync_unnamed(location.ordinal, runtime)


def sync_unnamed(ordinal: int | None, runtime: Runtime, stream: int | None = None) -> None:
    """Wait for work a producer that names no stream may have left on GPU ``ordinal``: everything queued on the
    legacy default stream and, through its order, on every blocking stream (the defaults of CuPy, PyTorch and
    Numba, per-thread default streams, and every stream not created non-blocking). Work on non-blocking streams
    is not waited for, so an unrelated asynchronous operation (an NCCL collective whose peer waits for this very
    message) cannot deadlock the call; ``CAI_MPI_SYNC=device`` waits for the whole device instead.

    ``stream``: a stream of the caller's to wait for as well (an Array's, when it names a non-default one).
    """
    if config().sync_device:
        runtime.sync_device(ordinal)
        return
    runtime.sync_legacy(ordinal)
    if stream is not None and stream not in (LEGACY_STREAM, PER_THREAD_STREAM):
        runtime.sync_stream(stream, ordinal)
