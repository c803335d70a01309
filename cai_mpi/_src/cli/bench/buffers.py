"""Buffer kinds the benchmark sends: host numpy, the simulated device, CuPy, PyTorch and Numba arrays."""

from __future__ import annotations

from typing import Any

import numpy as np

__all__ = ["BUFFER_KINDS", "BufferKind", "BufferUnavailable", "make_buffer_kind"]


class BufferUnavailable(RuntimeError):
    """This buffer kind cannot be used on this rank (library missing, no GPU, ...)."""


def _pattern(nbytes: int) -> np.ndarray[Any, Any]:
    """Non-zero bytes, so every page is really written (calloc'ed zero pages would flatter reads)."""
    return (np.arange(nbytes, dtype=np.uint32) % 251 + 1).astype(np.uint8)


class BufferKind:
    """One kind of array: how to allocate it, and how to copy it to and from host memory.

    ``device`` kinds live in (real or simulated) GPU memory. The raw-MPI modes hand them to
    mpi4py directly only when the MPI library is CUDA-aware; otherwise they stage through a
    host buffer from ``host_empty`` (pinned where the library offers it), as a user would.
    """

    name = "host"
    device = False

    def setup(self) -> None:
        """Import what is needed and select the runtime/GPU; raise BufferUnavailable with a reason."""

    def teardown(self) -> None:
        """Undo ``setup`` (the process-wide cai_mpi runtime)."""

    def alloc(self, nbytes: int) -> Any:
        """A filled 1-d uint8 array of ``nbytes`` bytes."""
        return _pattern(nbytes)

    def host_empty(self, nbytes: int) -> np.ndarray[Any, Any]:
        """A host staging buffer (page-locked where possible)."""
        return np.empty(nbytes, np.uint8)

    def mpi_object(self, obj: Any) -> Any:
        """What mpi4py's Send/Recv receive for direct transfers of ``obj``."""
        return obj

    def to_host(self, obj: Any, host: np.ndarray[Any, Any]) -> None:
        """Copy ``obj`` into ``host`` and wait for the copy."""
        np.copyto(host, obj)

    def from_host(self, host: np.ndarray[Any, Any], obj: Any) -> None:
        """Copy ``host`` into ``obj`` and wait for the copy."""
        np.copyto(obj, host)

    def host_copy(self, obj: Any) -> Any:
        """A host object to pickle (users pickle host copies of device arrays)."""
        return obj

    def from_host_new(self, arr: Any) -> Any:
        """A new array of this kind holding the unpickled host array ``arr``."""
        return arr


class SimulatedKind(BufferKind):
    """``cai_mpi.testing.FakeCudaArray`` in simulated device memory under the simulated runtime.

    Each array exports a busy-capable SimulatedStream (CAI v3), so every send synchronizes its
    producer stream and every ``out=`` receive waits for it, as with a real GPU array.
    """

    name = "simulated"
    device = True

    def setup(self) -> None:
        from ....testing import SimulatedRuntime, SimulatedStream
        from ...runtime import set_runtime

        self._previous = set_runtime(SimulatedRuntime())
        self.stream = SimulatedStream("bench-producer")

    def teardown(self) -> None:
        from ...runtime import set_runtime

        set_runtime(self._previous)

    def alloc(self, nbytes: int) -> Any:
        from ....testing import FakeCudaArray

        return FakeCudaArray(_pattern(nbytes), device=True, stream=self.stream)

    def mpi_object(self, obj: Any) -> Any:
        return obj.host

    def to_host(self, obj: Any, host: np.ndarray[Any, Any]) -> None:
        np.copyto(host, obj.host)

    def from_host(self, host: np.ndarray[Any, Any], obj: Any) -> None:
        np.copyto(obj.host, host)

    def host_copy(self, obj: Any) -> Any:
        return np.array(obj.host)

    def from_host_new(self, arr: Any) -> Any:
        from ....testing import FakeCudaArray

        return FakeCudaArray(arr, device=True)


def _cuda_ordinal() -> int:
    """The GPU cai_mpi's runtime chose for this rank; BufferUnavailable when there is none."""
    from ...runtime import get_runtime

    rt = get_runtime()
    ordinal = rt.current_device()
    if rt.name != "cuda" or ordinal is None:
        raise BufferUnavailable(
            f"cai_mpi's runtime on this rank is {rt.name!r} with no usable GPU "
            "(python -m cai_mpi info says why); device buffers need a GPU node"
        )
    return ordinal


class CupyKind(BufferKind):
    name = "cupy"
    device = True

    def setup(self) -> None:
        try:
            import cupy
        except ImportError as exc:
            raise BufferUnavailable(f"--buffer cupy needs CuPy (pip install 'cai_mpi[cuda12]'): {exc}") \
                from None
        self.cp: Any = cupy
        self.ordinal = _cuda_ordinal()
        cupy.cuda.Device(self.ordinal).use()

    def _sync(self) -> None:
        self.cp.cuda.get_current_stream().synchronize()

    def alloc(self, nbytes: int) -> Any:
        x = self.cp.asarray(_pattern(nbytes))
        self._sync()
        return x

    def host_empty(self, nbytes: int) -> np.ndarray[Any, Any]:
        import cupyx

        arr: np.ndarray[Any, Any] = cupyx.empty_pinned(nbytes, np.uint8)
        return arr

    def to_host(self, obj: Any, host: np.ndarray[Any, Any]) -> None:
        obj.get(out=host)
        self._sync()

    def from_host(self, host: np.ndarray[Any, Any], obj: Any) -> None:
        obj.set(host)
        self._sync()

    def host_copy(self, obj: Any) -> Any:
        return self.cp.asnumpy(obj)

    def from_host_new(self, arr: Any) -> Any:
        x = self.cp.asarray(arr)
        self._sync()
        return x


class TorchKind(BufferKind):
    name = "torch"
    device = True

    def setup(self) -> None:
        try:
            import torch
        except ImportError as exc:
            raise BufferUnavailable(f"--buffer torch needs PyTorch with CUDA: {exc}") from None
        if not torch.cuda.is_available():
            raise BufferUnavailable("--buffer torch: torch.cuda.is_available() is False on this rank")
        self.torch: Any = torch
        self.ordinal = _cuda_ordinal()
        torch.cuda.set_device(self.ordinal)
        self.dev = torch.device("cuda", self.ordinal)

    def alloc(self, nbytes: int) -> Any:
        x = self.torch.from_numpy(_pattern(nbytes)).to(self.dev)
        self.torch.cuda.synchronize(self.dev)
        return x

    def host_empty(self, nbytes: int) -> np.ndarray[Any, Any]:
        t = self.torch.empty(nbytes, dtype=self.torch.uint8, pin_memory=True)
        self._pinned_keep = getattr(self, "_pinned_keep", [])
        self._pinned_keep.append(t)
        arr: np.ndarray[Any, Any] = t.numpy()
        return arr

    def to_host(self, obj: Any, host: np.ndarray[Any, Any]) -> None:
        self.torch.from_numpy(host).copy_(obj)
        self.torch.cuda.synchronize(self.dev)

    def from_host(self, host: np.ndarray[Any, Any], obj: Any) -> None:
        obj.copy_(self.torch.from_numpy(host))
        self.torch.cuda.synchronize(self.dev)

    def host_copy(self, obj: Any) -> Any:
        return obj.cpu().numpy()

    def from_host_new(self, arr: Any) -> Any:
        x = self.torch.from_numpy(arr).to(self.dev)
        self.torch.cuda.synchronize(self.dev)
        return x


class NumbaKind(BufferKind):
    name = "numba"
    device = True

    def setup(self) -> None:
        try:
            from numba import cuda
        except ImportError as exc:
            raise BufferUnavailable(f"--buffer numba needs Numba with CUDA: {exc}") from None
        if not cuda.is_available():
            raise BufferUnavailable("--buffer numba: numba.cuda.is_available() is False on this rank")
        self.cuda: Any = cuda
        self.ordinal = _cuda_ordinal()
        cuda.select_device(self.ordinal)

    def alloc(self, nbytes: int) -> Any:
        x = self.cuda.to_device(_pattern(nbytes))
        self.cuda.synchronize()
        return x

    def host_empty(self, nbytes: int) -> np.ndarray[Any, Any]:
        arr: np.ndarray[Any, Any] = self.cuda.pinned_array(nbytes, np.uint8)
        return arr

    def to_host(self, obj: Any, host: np.ndarray[Any, Any]) -> None:
        obj.copy_to_host(host)
        self.cuda.synchronize()

    def from_host(self, host: np.ndarray[Any, Any], obj: Any) -> None:
        obj.copy_to_device(host)
        self.cuda.synchronize()

    def host_copy(self, obj: Any) -> Any:
        return obj.copy_to_host()

    def from_host_new(self, arr: Any) -> Any:
        x = self.cuda.to_device(arr)
        self.cuda.synchronize()
        return x


BUFFER_KINDS: dict[str, type[BufferKind]] = {
    "host": BufferKind,
    "simulated": SimulatedKind,
    "cupy": CupyKind,
    "torch": TorchKind,
    "numba": NumbaKind,
}


def make_buffer_kind(name: str) -> BufferKind:
    return BUFFER_KINDS[name]()
