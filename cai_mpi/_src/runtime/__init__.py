"""Runtime selection: CUDA when a driver and a GPU are usable, else host; overridable for tests."""

from __future__ import annotations

import importlib
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
    if name == "simulated":  # the test double of a GPU, injected by name: nothing here depends on it
        testing = importlib.import_module("cai_mpi.testing")
        return testing.SimulatedRuntime()  # type: ignore[no-any-return]
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
    """Install a runtime (an instance, or 'cuda' / 'host' / 'simulated'); None re-selects lazily.

    Returns the previous runtime so tests can restore it.
    """
    global _runtime
    with _lock:
        previous = _runtime
        _runtime = _make(runtime) if isinstance(runtime, str) else runtime
    return previous
