"""Runtime selection: CUDA when a driver and a GPU are usable, else host (``CAI_MPI_RUNTIME`` may insist on either).

Tests and tools install another runtime, the test package's simulated GPU say, as an instance with
``set_runtime``: the library itself knows no runtime but these two."""

from __future__ import annotations

import threading

from ..config import config
from ..errors import RuntimeUnavailableError
from .base import HOST, DeviceBuffer, Event, Location, MemoryKind, PinnedBuffer, Runtime, Stream
from .host import HostRuntime

__all__ = [
    "HOST",
    "DeviceBuffer",
    "Event",
    "Location",
    "MemoryKind",
    "PinnedBuffer",
    "Runtime",
    "Stream",
    "get_runtime",
    "set_runtime",
]

_runtime: Runtime | None = None
_lock = threading.Lock()


def _make(name: str | None) -> Runtime:
    if name == "host":
        return HostRuntime()
    if name not in (None, "cuda"):
        raise ValueError(f"runtime {name!r}: expected 'cuda', 'host' or a Runtime instance (a test double is "
                         "installed as an instance)")
    from .cuda import CudaRuntime
    from .cudadriver import probe, visible_device_count

    usable, reason = probe()
    if not usable:
        if name == "cuda":
            raise RuntimeUnavailableError(f"CAI_MPI_RUNTIME=cuda but CUDA is not usable here: {reason}")
        return HostRuntime()
    from .device import choose_device

    choice = choose_device(visible_count=visible_device_count())
    return CudaRuntime(choice.ordinal or 0)


def get_runtime() -> Runtime:
    """The process-wide runtime, chosen on first use (CAI_MPI_RUNTIME overrides the choice)."""
    global _runtime
    rt = _runtime
    if rt is None:
        with _lock:
            if _runtime is None:
                _runtime = _make(config().runtime)
            rt = _runtime
    return rt


def set_runtime(runtime: Runtime | str | None) -> Runtime | None:
    """Install a runtime (an instance, or 'cuda' / 'host'); None re-selects lazily.

    Returns the previous runtime so tests can restore it.
    """
    global _runtime
    with _lock:
        previous = _runtime
        _runtime = _make(runtime) if isinstance(runtime, str) else runtime
    return previous
