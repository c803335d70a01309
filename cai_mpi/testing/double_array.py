"""A CAI exporter over the CUDA driver double's device memory: what a CuPy or Numba array is to cai_mpi."""

from __future__ import annotations

import weakref
from typing import Any

import numpy as np

from .._src.runtime.base import Runtime

__all__ = ["DoubleDeviceArray"]


class _UsersAllocation:
    """Device memory as CuPy's and PyTorch's default allocators make it: cuMemAlloc in the GPU's primary context
    (memory that belongs to a context), freed when collected."""

    def __init__(self, runtime: Any, nbytes: int, ordinal: int) -> None:
        self.nbytes, self.ordinal, self.ptr = nbytes, ordinal, 0
        if nbytes:
            driver = runtime.driver
            with driver.on(ordinal):
                (dptr,) = driver.check("cuMemAlloc", nbytes)
            self.ptr = int(dptr)
            weakref.finalize(self, driver.release, ordinal, "cuMemFree", self.ptr)


class DoubleDeviceArray:
    """``data`` copied into device memory of ``runtime`` (a ``double_runtime()``), exported as CAI ``version``.

    Args:
        stream: the CAI v3 ``stream`` to export (an int handle, or None).
        view: ``(shape, byte_strides)`` to export instead of ``data``'s own C-ordered layout (a strided view of
            the same memory; strides may be negative or 0).
        offset: where the view's element 0 lies, in bytes from the start of the memory (a reversed axis
            starts at its end).
        ordinal: the GPU to allocate on.

    Attributes:
        buf: the device buffer (``buf.ptr`` is the address); ``read()`` returns its bytes as ``data``'s dtype.
    """

    def __init__(self, runtime: Runtime, data: Any, *, stream: int | None = None, version: int = 3,
                 view: tuple[tuple[int, ...], tuple[int, ...]] | None = None, offset: int = 0,
                 ordinal: int = 0) -> None:
        src = np.ascontiguousarray(data)
        self.runtime, self.double = runtime, runtime.driver_double  # type: ignore[attr-defined]
        self.buf = _UsersAllocation(runtime, src.nbytes, ordinal)
        if src.nbytes:
            self.double.write_device(self.buf.ptr, src.tobytes())
        self.dtype, self.version, self.stream = src.dtype, version, stream
        self.shape: tuple[int, ...] = src.shape if view is None else view[0]
        self.strides: tuple[int, ...] | None = None if view is None else view[1]
        self._nbytes = src.nbytes
        self.offset = offset

    @property
    def __cuda_array_interface__(self) -> dict[str, Any]:
        cai: dict[str, Any] = {"shape": self.shape, "typestr": self.dtype.str, "version": self.version,
                               "data": (self.buf.ptr + self.offset, False), "strides": self.strides}
        if self.version >= 3:
            cai["stream"] = self.stream
        return cai

    def read(self) -> np.ndarray[Any, Any]:
        """The whole allocation's bytes now (after synchronizing the device), as a flat array of the dtype."""
        self.runtime.sync_device(self.buf.ordinal)
        raw = self.double.read_device(self.buf.ptr, self._nbytes) if self._nbytes else b""
        return np.frombuffer(raw, self.dtype).copy()
