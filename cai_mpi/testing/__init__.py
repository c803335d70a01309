"""GPU-free test tools: a host-backed CAI exporter, simulated streams, and a simulated GPU runtime.

Everything cai_mpi does with device memory can be exercised on a laptop:

    >>> from cai_mpi.testing import FakeCudaArray, SimulatedStream
    >>> s = SimulatedStream()
    >>> x = FakeCudaArray.zeros(4, "f8", stream=s)
    >>> s.enqueue(x.host.fill, 1.0, delay=0.05)   # a slow "kernel"
    >>> # cai_mpi.send_array(x, 1) synchronizes s before MPI reads x
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

import numpy as np

from .._src.runtime import Runtime, get_runtime, set_runtime
from ._runtime import SimulatedDeviceBuffer, SimulatedRuntime
from ._streams import SimulatedEvent, SimulatedStream
from .cuda_driver import CudaDriverDouble
from .double_array import DoubleDeviceArray

__all__ = [
    "CudaDriverDouble", "DoubleDeviceArray", "FakeCudaArray", "SimulatedEvent", "SimulatedRuntime", "SimulatedStream",
    "double_runtime", "use_runtime",
]


class FakeCudaArray:
    """A host-memory object exporting ``__cuda_array_interface__`` like a GPU array would.

    Args:
        data: the contents (copied into the array's own memory, C order).
        version: CAI version to export, 0-3 (``stream`` is only exported for 3).
        stream: a SimulatedStream, an int handle, or None.
        readonly: export ``data`` as read-only.
        strides: view the memory with these byte strides (and ``shape``), e.g. to export a
            transposed or negative-stride view; element 0 is at ``offset`` bytes.
        device: put the memory in simulated device memory (only SimulatedRuntime treats it as
            device memory; MPI must then never read it directly).

    Attributes:
        host: a numpy view of the exported elements (read it to check results; write it, or
            enqueue writes on the stream, to play the producer).
        cai_reads: how many times ``__cuda_array_interface__`` was read.
    """

    def __init__(
        self,
        data: Any,
        *,
        version: int = 3,
        stream: SimulatedStream | int | None = None,
        readonly: bool = False,
        shape: tuple[int, ...] | None = None,
        strides: tuple[int, ...] | None = None,
        offset: int = 0,
        device: bool = False,
        mask: Any = None,
        extra: dict[str, Any] | None = None,
    ) -> None:
        src = np.asarray(data)
        self._nbytes = src.nbytes
        if device:
            self._mem: Any = SimulatedDeviceBuffer(src.nbytes, 0)
            raw = self._mem.host_array
        else:
            self._mem = raw = np.empty(src.nbytes, np.uint8)
        raw.view(src.dtype)[:] = src.reshape(-1)
        self.dtype = src.dtype
        self.shape = src.shape if shape is None else tuple(shape)
        self.strides = strides
        self.offset = offset
        self.version = version
        self.stream = stream
        self.readonly = readonly
        self.mask = mask
        self.extra = extra or {}
        self.cai_reads = 0
        base = raw.ctypes.data
        self.ptr = base + offset if src.nbytes else 0
        self.host: np.ndarray[Any, Any] = np.ndarray(
            self.shape, self.dtype, buffer=raw, offset=offset, strides=strides
        ) if src.nbytes else np.empty(self.shape, self.dtype)

    @classmethod
    def zeros(cls, shape: Any, dtype: Any = "f8", **kwargs: Any) -> FakeCudaArray:
        return cls(np.zeros(shape, dtype), **kwargs)

    @classmethod
    def empty_like(cls, arr: np.ndarray[Any, Any], **kwargs: Any) -> FakeCudaArray:
        return cls(np.zeros_like(arr, order="C"), **kwargs)

    @property
    def __cuda_array_interface__(self) -> dict[str, Any]:
        self.cai_reads += 1
        typestr = self.dtype.str
        d: dict[str, Any] = {
            "shape": self.shape,
            "typestr": typestr,
            "data": (self.ptr, self.readonly),
            "version": self.version,
        }
        if self.strides is not None or self.version >= 2:
            d["strides"] = self.strides
        if self.dtype.names is not None:
            d["descr"] = self.dtype.descr
        if self.version >= 1:
            d["mask"] = self.mask
        if self.version >= 3:
            s = self.stream
            d["stream"] = s.handle if isinstance(s, SimulatedStream) else s
        d.update(self.extra)
        return d

    def copy_to_host(self) -> np.ndarray[Any, Any]:
        return np.array(self.host)

    def __repr__(self) -> str:
        return f"FakeCudaArray(shape={self.shape}, dtype={self.dtype}, version={self.version})"


@contextlib.contextmanager
def use_runtime(runtime: Runtime | str) -> Iterator[Runtime]:
    """Temporarily install a runtime: an instance, or 'host', 'cuda', or 'simulated' (a new ``SimulatedRuntime()``,
    which the library does not know by name)."""
    previous = set_runtime(SimulatedRuntime() if runtime == "simulated" else runtime)
    try:
        yield get_runtime()
    finally:
        set_runtime(previous)


def double_runtime(devices: int = 2, ordinal: int = 0, *, cuda_aware: bool = False, lazy: float = 0.0,
                   eager: bool = False) -> Runtime:
    """cai_mpi's real CUDA runtime on a fresh ``CudaDriverDouble`` (``runtime.driver_double`` is the double).

    ``cuda_aware``: device memory readable by the host, as a CUDA-aware MPI needs it (else any host access,
    a non-CUDA-aware MPI's included, faults as on a GPU). ``lazy``: queued device work runs only when something
    synchronizes on it, or after ``lazy`` seconds (``CudaDriverDouble(lazy=)``), so a missing wait fails every time.
    ``eager``: device work has run when its call returns, so the driver calls a message makes do not depend on timing.
    """
    from .._src.runtime.cuda import CudaRuntime

    double = CudaDriverDouble(devices, device_memory_host_accessible=cuda_aware, lazy=lazy, eager=eager)
    runtime = CudaRuntime(ordinal, driver=double)
    runtime.driver_double = double  # type: ignore[attr-defined]
    return runtime
