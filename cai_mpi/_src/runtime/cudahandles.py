"""cai_mpi's own CUDA streams and events, and the idle handles of dead ones, used again instead of creating new ones."""

from __future__ import annotations

import contextlib
from typing import Protocol

from ..errors import CudaError
from .base import Event, Stream
from .cudacontexts import Driver
from .cudadriver import NOT_READY, SUCCESS, error_text, raw_call

__all__ = ["CudaEvent", "CudaStream", "CudaStreamRef", "HandleOwner", "Idle"]


class HandleOwner(Protocol):
    """What a stream or event of cai_mpi's needs of the runtime that made it (``CudaStreams`` is one)."""

    driver: Driver
    idle_streams: Idle
    idle_events: Idle

    def on_gpu(self, ordinal: int | None) -> contextlib.AbstractContextManager[None]: ...


class Idle:
    """Handles of cai_mpi's streams or events whose objects have died, per GPU, handed to the next one made:
    creating and destroying one per message costs two driver calls and tens of microseconds of Python. At most
    ``KEEP`` per GPU are kept; the others are destroyed. (A handle goes back only once its object is gone, so no one
    can still query or synchronize it; a stream wait already enqueued on an event keeps the recording it saw.)"""

    KEEP = 64

    def __init__(self, driver: Driver, destroy: str) -> None:
        self._driver, self._destroy = driver, destroy
        self._free: dict[int, list[int]] = {}

    def take(self, ordinal: int) -> int | None:
        free = self._free.get(ordinal)
        try:
            return free.pop() if free else None
        except IndexError:  # (another thread took the last one)
            return None

    def put(self, ordinal: int, handle: int) -> None:
        free = self._free.setdefault(ordinal, [])
        if len(free) < self.KEEP:
            free.append(handle)
        else:
            self._driver.release(ordinal, self._destroy, handle)


class CudaStream(Stream):
    """A stream owned by cai_mpi; its handle goes back to the runtime's idle streams when the object dies."""

    def __init__(self, runtime: HandleOwner, handle: int, ordinal: int) -> None:
        self.handle = handle
        self.ordinal = ordinal
        self._runtime = runtime

    def __del__(self) -> None:
        try:  # (builtins only: at interpreter exit module globals may be gone already, and leaking is harmless)
            self._runtime.idle_streams.put(self.ordinal, self.handle)
        except Exception:
            pass

    def synchronize(self) -> None:
        """Wait for cai_mpi's own work on it (a failure is the CudaError of the call, not a user stream's)."""
        with self._runtime.on_gpu(self.ordinal):
            self._runtime.driver.check("cuStreamSynchronize", self.handle)

    def __repr__(self) -> str:
        return f"<CudaStream {self.handle:#x} on GPU {self.ordinal}>"


class CudaEvent(Event):
    """An event created with DISABLE_TIMING and recorded on a stream; its handle goes back to the runtime's idle
    events when the object dies (``Idle``), to be recorded again."""

    def __init__(self, runtime: HandleOwner, handle: int, ordinal: int) -> None:
        self.handle = handle
        self.ordinal = ordinal
        self._runtime = runtime
        #: Found complete: it stays so (an object is recorded once; its handle is recorded again only once the
        #: object is dead), so later waits on it (a staging block given back after its copy was waited for) ask
        #: the driver nothing.
        self._passed = False

    def __del__(self) -> None:
        try:  # (as CudaStream's)
            self._runtime.idle_events.put(self.ordinal, self.handle)
        except Exception:
            pass

    def synchronize(self) -> None:
        if self._passed:
            return
        with self._runtime.on_gpu(self.ordinal):
            self._runtime.driver.check("cuEventSynchronize", self.handle)
        self._passed = True

    def query(self) -> bool:
        if self._passed:
            return True
        drv = self._runtime.driver.drv
        with self._runtime.on_gpu(self.ordinal):
            code, status, _ = raw_call(drv, "cuEventQuery", self.handle)
        if code == NOT_READY:
            return False
        if code != SUCCESS:
            name, desc = error_text(drv, status)
            raise CudaError(f"cuEventQuery failed with {name} ({code}): {desc}", "cuEventQuery", code, name)
        self._passed = True
        return True


class CudaStreamRef:
    """The CUDA stream protocol (``__cuda_stream__``) for a raw handle, for CuPy 14's Stream.from_external."""

    def __init__(self, handle: int) -> None:
        self.handle = int(handle)

    def __cuda_stream__(self) -> tuple[int, int]:
        return (0, self.handle)
