"""What a real GPU runs out of and how it breaks, for the CUDA driver double: finite device (and, on request,
pinned) memory, and sticky errors that poison a context until it is reset."""

from __future__ import annotations

import threading
from typing import Any

from ._cuda_types import Block, CUresult, value

__all__ = ["DEFAULT_DEVICE_MEMORY_BYTES", "Faults"]

#: Each device's memory unless the double is given another capacity: large, but an allocation can exceed it.
DEFAULT_DEVICE_MEMORY_BYTES = 16 << 30

# The calls a context with a sticky error still answers on hardware: initialization, device queries, error
# names, and context management (so the context can be made current, popped, released and reset).
_UNAFFECTED = frozenset({
    "cuInit", "cuDriverGetVersion", "cuDeviceGetCount", "cuDeviceGet", "cuGetErrorName", "cuGetErrorString",
    "cuDevicePrimaryCtxRetain", "cuDevicePrimaryCtxRelease", "cuCtxGetCurrent", "cuCtxSetCurrent",
    "cuCtxPushCurrent", "cuCtxPopCurrent", "cuCtxGetDevice",
})


class Faults:
    """Capacity bookkeeping and sticky errors (mixed into ``CudaDriverDouble``)."""

    devices: int
    _lock: threading.RLock
    pinned_bytes_outstanding: int

    def _current(self) -> int:
        raise NotImplementedError

    def context_of(self, ordinal: int) -> int:
        raise NotImplementedError

    def ordinal_of(self, context: int) -> int:
        raise NotImplementedError

    def _init_faults(self, device_memory_bytes: int, pinned_memory_bytes: int | None) -> None:
        if device_memory_bytes <= 0:
            raise ValueError(f"CudaDriverDouble: device_memory_bytes={device_memory_bytes}; give a positive capacity")
        #: Each device's memory in bytes; cuMemAlloc, cuMemAllocManaged and cuMemAllocAsync beyond it fail with
        #: CUDA_ERROR_OUT_OF_MEMORY. A test may lower it at any time.
        self.device_memory_bytes = device_memory_bytes
        #: Page-locked host memory in bytes (None: unbounded); cuMemHostAlloc beyond it fails likewise.
        self.pinned_memory_bytes = pinned_memory_bytes
        self._device_in_use = [0] * self.devices
        self._poisoned: set[int] = set()

    # -- finite memory --------------------------------------------------------------------------------------------

    def device_memory_in_use(self, ordinal: int) -> int:
        """Bytes of device ``ordinal``'s memory allocated and not freed."""
        return self._device_in_use[ordinal]

    def _out_of_device_memory(self, nbytes: int) -> bool:
        """Reserve ``nbytes`` on the current context's device; True (nothing reserved) if they do not fit."""
        ordinal = self.ordinal_of(self._current())
        with self._lock:
            if self._device_in_use[ordinal] + nbytes > self.device_memory_bytes:
                return True
            self._device_in_use[ordinal] += nbytes
            return False

    def _give_back(self, block: Block) -> None:
        """A freed device allocation's bytes are the device's again."""
        with self._lock:
            self._device_in_use[block.ordinal] -= block.reserved

    def _out_of_pinned_memory(self, nbytes: int) -> bool:
        limit = self.pinned_memory_bytes
        return limit is not None and self.pinned_bytes_outstanding + nbytes > limit

    # -- sticky errors ----------------------------------------------------------------------------------------------

    def _context(self, where: Any) -> int:
        """A context handle, or a device ordinal meaning its primary context."""
        v = value(where)
        return self.context_of(v) if 0 <= v < self.devices else v

    def fault(self, where: Any) -> None:
        """A sticky error in context ``where`` (a context, or an ordinal for its primary context), as an illegal
        address in a kernel: from now on every call made in that context but context management returns
        CUDA_ERROR_ILLEGAL_ADDRESS, and syncs waiting when it happens report it, until ``clear_fault``."""
        with self._lock:
            self._poisoned.add(self._context(where))

    def clear_fault(self, where: Any) -> None:
        """What resetting the device does to its context's error (``cuDevicePrimaryCtxReset``)."""
        with self._lock:
            self._poisoned.discard(self._context(where))

    def _sticky(self, name: str) -> CUresult | None:
        """CUDA_ERROR_ILLEGAL_ADDRESS for ``name`` called in a poisoned context, else None."""
        if self._poisoned and name not in _UNAFFECTED and self._current() in self._poisoned:
            return CUresult.CUDA_ERROR_ILLEGAL_ADDRESS
        return None

    def _poisoned_after_wait(self, context: int | None = None) -> CUresult | None:
        """A sync that waited reports a sticky error that happened meanwhile (in ``context``, or the current one)."""
        ctx = self._current() if context is None else context
        return CUresult.CUDA_ERROR_ILLEGAL_ADDRESS if ctx in self._poisoned else None
