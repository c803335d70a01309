"""Array: a received buffer plus its CAI descriptor and provenance, consumable zero-copy by any CAI library."""

from __future__ import annotations

from typing import Any

import numpy as np
from mpi4py import MPI

from ..core.descriptor import CAIDescriptor, descriptor_from_numpy
from ..runtime.base import DeviceBuffer
from . import dlpack
from .sync import sync_unnamed

__all__ = ["NO_SOURCE", "NO_TAG", "Array", "host_memory"]

_new = object.__new__

NO_SOURCE: int = MPI.PROC_NULL  # MPI's status of a message from no rank: source PROC_NULL, tag ANY_TAG
NO_TAG: int = MPI.ANY_TAG
_SOURCE_NAMES = {MPI.PROC_NULL: "PROC_NULL"}  # -1 on MPICH, -2 on Open MPI: printed by name
_TAG_NAMES = {MPI.ANY_TAG: "ANY_TAG"}


class Array:
    """What ``recv_array`` returns: the data, its descriptor, and where it came from.

    Device memory exports ``__cuda_array_interface__`` (v3; ``stream`` names
    the stream the data is ready on: the caller's current stream when it was
    received, usually the legacy default stream, 1) and DLPack (``kDLCUDA``,
    with the stream handshake), so ``cupy.asarray(a)``,
    ``torch.as_tensor(a, device="cuda")``, ``torch.from_dlpack(a)``,
    ``cupy.from_dlpack(a)``, ``jax.dlpack.from_dlpack(a)`` and
    ``numba.cuda.as_cuda_array(a)`` adopt it without a copy; ``a.to_host()``
    copies it to a numpy array, and ``numpy.asarray(a)`` raises TypeError
    (numpy cannot read device memory). Host memory exports
    ``__array_interface__``, DLPack (``__dlpack__``) and, on Python 3.12+, the
    buffer protocol, so ``numpy.asarray(a)``, ``numpy.from_dlpack(a)`` and
    mpi4py see it without a copy. Pass an Array straight back to
    ``send_array`` to forward it.

    Attributes:
        source: the rank it came from (in the communicator it was received on). What MPI's status says where
            no one rank sent it: ``PROC_NULL`` for a receive from ``PROC_NULL`` and for an Array made with
            ``from_host``/``from_device``. Collective results: the root for ``bcast_array``/``scatter_array``
            (and their persistent forms), the sending rank for each piece of a gather, allgather or alltoall,
            ``PROC_NULL`` for a reduction's result (every rank contributed). The repr prints ``PROC_NULL`` by
            name (its value differs between MPI libraries).
        tag: the user tag it was sent with; ``ANY_TAG`` where there is none (a receive from ``PROC_NULL``, as
            MPI reports it, and every collective's result).
        meta: the sender's ``meta`` dict, or None.
    """

    # One is built per received message: a host Array's descriptor is made only when asked for (``descriptor``).
    __slots__ = ("__weakref__", "_descriptor", "_host", "_ordinal", "_owner", "meta", "source", "tag")

    def __init__(
        self,
        descriptor: CAIDescriptor | None,
        *,
        device: str | int,
        owner: Any,
        host: np.ndarray[Any, Any] | None = None,
        source: int = NO_SOURCE,
        tag: int = NO_TAG,
        meta: dict[str, Any] | None = None,
    ) -> None:
        self._descriptor = descriptor
        self._ordinal = device
        self.source = source
        self.tag = tag
        self.meta = meta
        self._owner = owner  # keeps the memory alive (host ndarray, DeviceBuffer, or the user's out=)
        self._host = host

    @classmethod
    def from_host(
        cls,
        host: np.ndarray[Any, Any],
        *,
        owner: Any = None,
        source: int = NO_SOURCE,
        tag: int = NO_TAG,
        meta: dict[str, Any] | None = None,
    ) -> Array:
        """Wrap a host numpy array (no copy); ``owner`` keeps the memory alive if ``host`` does not."""
        return cls.over_host(host, source, tag, meta, owner)

    @classmethod
    def over_host(
        cls, host: np.ndarray[Any, Any], source: int, tag: int, meta: dict[str, Any] | None, owner: Any = None
    ) -> Array:
        """``from_host`` without keyword parsing, for the library's modules (not part of the public API): every host
        receive builds one, so it skips ``__init__``'s keywords and sets each slot itself."""
        self = _new(cls)
        self._descriptor = None
        self._host = host
        self._ordinal = "host"
        self._owner = owner
        self.source = source
        self.tag = tag
        self.meta = meta
        return self

    @classmethod
    def from_device(
        cls,
        buffer: DeviceBuffer,
        shape: tuple[int, ...],
        dtype: np.dtype[Any],
        *,
        fortran: bool = False,
        source: int = NO_SOURCE,
        tag: int = NO_TAG,
        meta: dict[str, Any] | None = None,
    ) -> Array:
        """Wrap a device allocation holding ``shape``/``dtype`` elements in C (or F) order."""
        desc = CAIDescriptor.for_new_buffer(buffer.ptr, shape, dtype, fortran=fortran, stream=buffer.stream)
        return cls(desc, device=buffer.ordinal, owner=buffer, source=source, tag=tag, meta=meta)

    @property
    def descriptor(self) -> CAIDescriptor:
        """The CAIDescriptor of the data (``ptr`` is its address)."""
        d = self._descriptor
        if d is None:  # a host Array describes itself on first use
            assert self._host is not None
            d = self._descriptor = descriptor_from_numpy(self._host)
        return d

    @property
    def device(self) -> str | int:
        """``"host"`` or the ordinal of the GPU holding the data."""
        return "host" if self._host is not None else self._ordinal

    # -- array metadata ----------------------------------------------------
    @property
    def shape(self) -> tuple[int, ...]:
        """The shape, as in numpy."""
        return self._host.shape if self._host is not None else self.descriptor.shape

    @property
    def dtype(self) -> np.dtype[Any]:
        """The numpy dtype (structured dtypes included)."""
        return self._host.dtype if self._host is not None else self.descriptor.dtype

    @property
    def nbytes(self) -> int:
        """The size of the data in bytes."""
        return int(self._host.nbytes) if self._host is not None else self.descriptor.nbytes

    @property
    def size(self) -> int:
        """The number of elements."""
        return int(self._host.size) if self._host is not None else self.descriptor.size

    @property
    def ndim(self) -> int:
        """The number of dimensions."""
        return len(self.shape)

    @property
    def is_host(self) -> bool:
        """True for host memory, False for GPU memory (then ``device`` is the GPU's ordinal)."""
        return self._host is not None

    # -- export protocols --------------------------------------------------
    @property
    def __cuda_array_interface__(self) -> dict[str, Any]:
        if self._host is not None:
            raise AttributeError("this cai_mpi.Array holds host memory: use numpy.asarray(a) (__array_interface__)")
        return self.descriptor.to_dict()

    @property
    def __array_interface__(self) -> dict[str, Any]:
        if self._host is None:
            raise AttributeError(
                f"this cai_mpi.Array lives on GPU {self.device}: use cupy.asarray(a) or "
                "torch.as_tensor(a, device='cuda') (__cuda_array_interface__)"
            )
        return self._host.__array_interface__

    def __array__(self, dtype: Any = None, copy: bool | None = None) -> np.ndarray[Any, Any]:
        """numpy's fallback: host Arrays are read through ``__array_interface__`` first (zero-copy), so this
        only runs when numpy asks for a copy or a dtype, or for device Arrays, which it refuses: a silent
        0-d object array would fail far from here."""
        if self._host is None:
            raise TypeError(
                f"numpy.asarray() of a cai_mpi.Array on GPU {self.device}: numpy cannot read device memory. "
                "For host data copy it: a.to_host() (or a.numpy()); for a device array adopt it without a copy: "
                "cupy.asarray(a), torch.as_tensor(a, device=\"cuda\") or torch.from_dlpack(a)"
            )
        if copy is False and dtype is not None and np.dtype(dtype) != self._host.dtype:
            raise ValueError(
                f"cai_mpi.Array: a {self._host.dtype} array cannot become {np.dtype(dtype)} without a copy"
            )
        out = self._host if dtype is None else self._host.astype(dtype, copy=False)
        return out.copy() if copy and out is self._host else out

    def __dlpack__(
        self, *, stream: Any = None, max_version: tuple[int, int] | None = None, dl_device: Any = None,
        copy: bool | None = None,
    ) -> Any:
        """DLPack export, zero-copy: numpy's for host memory; for device memory a ``kDLCUDA`` capsule made
        after ``stream`` (the consumer's: None the legacy default stream, -1 none) is made to wait for the data
        (see ``cai_mpi._src.arrays.dlpack``). The Array stays alive until the consumer releases the capsule."""
        if self._host is not None:
            given = {"stream": stream, "max_version": max_version, "dl_device": dl_device, "copy": copy}
            return self._host.__dlpack__(**{k: v for k, v in given.items() if v is not None})
        from ..runtime import get_runtime

        ordinal = int(self.device)
        versioned = dlpack.check_request("cai_mpi.Array.__dlpack__", stream, max_version, dl_device, copy,
                                         (dlpack.KDL_CUDA, ordinal))
        return dlpack.device_capsule(self, self.descriptor, ordinal, versioned=versioned, runtime=get_runtime(),
                                     stream=None if stream is None else int(stream))

    def __dlpack_device__(self) -> tuple[int, int]:
        return (dlpack.KDL_CPU, 0) if self._host is not None else (dlpack.KDL_CUDA, int(self.device))

    def __buffer__(self, flags: int, /) -> memoryview:
        """The buffer protocol (PEP 688, Python >= 3.12): host memory only."""
        if self._host is None:
            raise BufferError(f"cai_mpi.Array on GPU {self.device} has no host buffer")
        return memoryview(self._host)  # type: ignore[arg-type]

    def numpy(self) -> np.ndarray[Any, Any]:
        """The data as a numpy array: a zero-copy view for host memory, a copy to host for device memory."""
        if self._host is not None:
            return self._host
        return self.to_host()

    def to_host(self) -> np.ndarray[Any, Any]:
        """A copy of the data in host memory, as a new numpy array (for host Arrays too: ``numpy()`` is the
        zero-copy view there). Waits for work queued on the data (see ``numpy``)."""
        if self._host is not None:
            return self._host.copy(order="K")
        from ..runtime import get_runtime

        rt = get_runtime()
        desc = self.descriptor
        low, high = desc.byte_extent
        raw = np.empty(high - low, np.uint8)
        if self.nbytes:
            sync_unnamed(int(self.device), rt, desc.stream)  # work the user launched on it since it was received
            stream = rt.create_stream(int(self.device))
            rt.copy_async(raw.ctypes.data, desc.ptr + low, high - low, stream)
            stream.synchronize()
        # Same layout as on the device (the copy spans the whole extent), then a compact copy.
        view: np.ndarray[Any, Any] = np.ndarray(
            self.shape, self.dtype, buffer=raw, offset=-low, strides=desc.byte_strides
        )
        return np.array(view, order="K")

    def __len__(self) -> int:
        if not self.shape:
            raise TypeError("len() of a 0-d cai_mpi.Array")
        return self.shape[0]

    def __repr__(self) -> str:
        where = "host" if self.device == "host" else f"cuda:{self.device}"
        meta = f", meta={self.meta!r}" if self.meta else ""
        return (
            f"cai_mpi.Array(shape={self.shape}, dtype={self.dtype}, device={where}, "
            f"source={_SOURCE_NAMES.get(self.source, self.source)}, tag={_TAG_NAMES.get(self.tag, self.tag)}{meta})"
        )


def host_memory(array: Array) -> np.ndarray[Any, Any] | None:
    """The numpy array a host Array holds (its memory, not a copy); None for a device Array. For the library's
    modules: users have ``Array.numpy``."""
    return array._host
