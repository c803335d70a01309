"""The types of the CUDA driver double: cuda-bindings' enums (real values), handles and the 2-D copy struct."""

from __future__ import annotations

import ctypes
import enum
import mmap
from typing import Any

__all__ = [
    "MAP_FAILED", "PAGE", "Block", "CUDA_MEMCPY2D", "CUcontext", "CUdevice", "CUdevice_attribute", "CUdeviceptr",
    "CUevent", "CUevent_flags", "CUmemorytype", "CUpointer_attribute", "CUresult", "CUstream", "CUstream_flags", "libc",
    "value",
]

libc = ctypes.CDLL(None, use_errno=True)
libc.mmap.restype = ctypes.c_void_p
libc.mmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_int, ctypes.c_int, ctypes.c_long]
libc.munmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t]
MAP_FAILED = ctypes.c_void_p(-1).value
PAGE = mmap.PAGESIZE


class CUresult(enum.IntEnum):
    CUDA_SUCCESS = 0
    CUDA_ERROR_INVALID_VALUE = 1
    CUDA_ERROR_OUT_OF_MEMORY = 2
    CUDA_ERROR_NOT_INITIALIZED = 3
    CUDA_ERROR_NO_DEVICE = 100
    CUDA_ERROR_INVALID_DEVICE = 101
    CUDA_ERROR_INVALID_CONTEXT = 201
    CUDA_ERROR_INVALID_HANDLE = 400
    CUDA_ERROR_NOT_READY = 600
    CUDA_ERROR_ILLEGAL_ADDRESS = 700
    CUDA_ERROR_NOT_SUPPORTED = 801


class CUpointer_attribute(enum.IntEnum):
    CU_POINTER_ATTRIBUTE_CONTEXT = 1
    CU_POINTER_ATTRIBUTE_MEMORY_TYPE = 2
    CU_POINTER_ATTRIBUTE_DEVICE_POINTER = 3
    CU_POINTER_ATTRIBUTE_HOST_POINTER = 4
    CU_POINTER_ATTRIBUTE_IS_MANAGED = 8
    CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL = 9
    CU_POINTER_ATTRIBUTE_RANGE_START_ADDR = 11
    CU_POINTER_ATTRIBUTE_RANGE_SIZE = 12
    CU_POINTER_ATTRIBUTE_MAPPED = 13


class CUmemorytype(enum.IntEnum):
    CU_MEMORYTYPE_HOST = 1
    CU_MEMORYTYPE_DEVICE = 2
    CU_MEMORYTYPE_ARRAY = 3
    CU_MEMORYTYPE_UNIFIED = 4


class CUstream_flags(enum.IntEnum):
    CU_STREAM_DEFAULT = 0
    CU_STREAM_NON_BLOCKING = 1


class CUevent_flags(enum.IntEnum):
    CU_EVENT_DEFAULT = 0
    CU_EVENT_BLOCKING_SYNC = 1
    CU_EVENT_DISABLE_TIMING = 2
    CU_EVENT_INTERPROCESS = 4


class _Handle:
    """A cuda-bindings handle: ``int(h)`` is its value; equal to handles of its class with the same value."""

    __slots__ = ("_value",)

    def __init__(self, init_value: Any = 0) -> None:
        self._value = int(init_value) if init_value is not None else 0

    def __int__(self) -> int:
        return self._value

    def getPtr(self) -> int:
        return self._value

    def __eq__(self, other: object) -> bool:
        return type(other) is type(self) and int(other) == self._value

    def __hash__(self) -> int:
        return hash((type(self).__name__, self._value))

    def __repr__(self) -> str:
        return f"<{type(self).__name__} {self._value:#x}>"


class _ByIdentity(_Handle):
    """Handles cuda-bindings compares by identity, not value (CUdeviceptr, CUdevice)."""

    __slots__ = ()
    __eq__ = object.__eq__
    __hash__ = object.__hash__


class CUdeviceptr(_ByIdentity): ...


class CUstream(_Handle): ...


class CUevent(_Handle): ...


class CUcontext(_Handle): ...


class CUdevice(_ByIdentity): ...


class CUdevice_attribute(enum.IntEnum):
    CU_DEVICE_ATTRIBUTE_MAX_PITCH = 11


class CUDA_MEMCPY2D:
    """The 2-D copy description: ``Height`` rows of ``WidthInBytes`` bytes, each side with its own pitch."""

    def __init__(self) -> None:
        self.srcXInBytes = self.srcY = self.srcPitch = self.srcHost = self.srcDevice = 0
        self.dstXInBytes = self.dstY = self.dstPitch = self.dstHost = self.dstDevice = 0
        self.srcMemoryType: Any = CUmemorytype.CU_MEMORYTYPE_HOST
        self.dstMemoryType: Any = CUmemorytype.CU_MEMORYTYPE_HOST
        self.WidthInBytes = self.Height = 0
        self.srcArray = self.dstArray = None


def value(handle: Any) -> int:
    return 0 if handle is None else int(handle)


class Block:
    """One allocation: ``address`` as handed out, ``twin`` where the double itself reads and writes it."""

    def __init__(self, kind: str, address: int, twin: int, nbytes: int, ordinal: int, context: int,
                 host: int = 0, fd: int = -1, maps: tuple[tuple[int, int], ...] = ()) -> None:
        self.kind, self.address, self.twin, self.nbytes = kind, address, twin, nbytes
        self.ordinal, self.context, self.host, self.fd, self.maps = ordinal, context, host, fd, maps
        self.alias = 0  # a pinned block's device alias (DEVICEMAP)


