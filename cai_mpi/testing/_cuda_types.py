"""The types of the CUDA driver double: cuda-bindings' enums (real values), handles and the 2-D copy struct."""

from __future__ import annotations

import ctypes
import enum
import mmap
import operator
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


_SIZE_T_LIMIT = 1 << 64


def _size_t(value: Any) -> int:
    """A ``size_t`` field as cuda-bindings converts it: negative or too large overflows; only integers (the real
    struct also truncates floats: the double refuses them)."""
    if isinstance(value, float) or not hasattr(value, "__index__"):
        raise TypeError("an integer is required")
    number = operator.index(value)
    if number < 0:
        raise OverflowError("can't convert negative value to size_t")
    if number >= _SIZE_T_LIMIT:
        raise OverflowError("Python int too large to convert to C unsigned long")
    return number


def _device_pointer(value: Any) -> CUdeviceptr:
    if value is None:
        return CUdeviceptr(0)
    if isinstance(value, CUdeviceptr):
        return value
    if isinstance(value, float) or not hasattr(value, "__index__"):
        raise TypeError("an integer is required")
    number = operator.index(value)
    if number < 0:
        raise OverflowError("can't convert negative value to unsigned PY_LONG_LONG")
    if number >= _SIZE_T_LIMIT:
        raise OverflowError("Python int too large to convert to C unsigned long")
    return CUdeviceptr(number)


def _host_pointer(value: Any) -> int:
    if value is None:
        return 0
    if isinstance(value, int) and not isinstance(value, bool) and 0 <= value < _SIZE_T_LIMIT:
        return value
    raise TypeError(f"Provided argument is of type {type(value)} but expected Type None or int (the double takes no "
                    "buffer objects)")


def _memory_type(value: Any) -> int:
    """Stored as the C enum's 32 bits, as cuda-bindings does: an invalid value is taken, and refused when read and
    by the copy."""
    if value is None or isinstance(value, (float, str)) or not hasattr(value, "__index__"):
        raise TypeError(f"srcMemoryType/dstMemoryType must be a CUmemorytype, got {value!r}")
    number = operator.index(value)
    if not -(1 << 63) <= number < 1 << 63:
        raise OverflowError("Python int too large to convert to C long")
    return number & 0xFFFF_FFFF


class _Field:
    """A typed struct field: ``convert`` runs on every assignment, as cuda-bindings' setters do."""

    def __init__(self, convert: Any, default: Any) -> None:
        self.convert, self.default = convert, default

    def __set_name__(self, owner: type, name: str) -> None:
        self.slot = "_" + name

    def __get__(self, obj: Any, owner: type | None = None) -> Any:
        if obj is None:
            return self
        return getattr(obj, self.slot, self.default)

    def __set__(self, obj: Any, value: Any) -> None:
        setattr(obj, self.slot, self.convert(value))


class _MemoryTypeField(_Field):
    """A memory type: 0 until set, which is no CUmemorytype, so reading it raises, as in cuda-bindings."""

    def __get__(self, obj: Any, owner: type | None = None) -> Any:
        if obj is None:
            return self
        return CUmemorytype(getattr(obj, self.slot, 0))  # ValueError: "... is not a valid CUmemorytype"


class CUDA_MEMCPY2D:
    """The 2-D copy description: ``Height`` rows of ``WidthInBytes`` bytes, each side with its own pitch.

    Its fields have the real struct's C types: offsets, pitches, width and height are ``size_t`` (a negative pitch,
    as a reversed axis would need, raises OverflowError on assignment, as it does in cuda-bindings), device pointers
    are ``CUdeviceptr``, memory types the C enum's 32 bits (0, the value before assignment, is no memory type, and
    reading it raises ValueError, as reading any invalid value does).
    """

    srcXInBytes = _Field(_size_t, 0)
    srcY = _Field(_size_t, 0)
    srcPitch = _Field(_size_t, 0)
    dstXInBytes = _Field(_size_t, 0)
    dstY = _Field(_size_t, 0)
    dstPitch = _Field(_size_t, 0)
    WidthInBytes = _Field(_size_t, 0)
    Height = _Field(_size_t, 0)
    srcHost = _Field(_host_pointer, 0)
    dstHost = _Field(_host_pointer, 0)
    srcDevice = _Field(_device_pointer, CUdeviceptr(0))
    dstDevice = _Field(_device_pointer, CUdeviceptr(0))
    srcMemoryType = _MemoryTypeField(_memory_type, 0)
    dstMemoryType = _MemoryTypeField(_memory_type, 0)

    def __init__(self) -> None:
        self.srcArray = self.dstArray = None

    def _memory_types(self) -> tuple[CUmemorytype | None, CUmemorytype | None]:
        """(source, destination) memory types, None for a value that is none (never set, or invalid)."""
        kinds = (getattr(self, "_srcMemoryType", 0), getattr(self, "_dstMemoryType", 0))
        return tuple(CUmemorytype(k) if k in CUmemorytype._value2member_map_ else None  # type: ignore[return-value]
                     for k in kinds)


def value(handle: Any) -> int:
    return 0 if handle is None else int(handle)


class Block:
    """One allocation: ``address`` as handed out, ``twin`` where the double itself reads and writes it."""

    def __init__(self, kind: str, address: int, twin: int, nbytes: int, ordinal: int, context: int,
                 host: int = 0, fd: int = -1, maps: tuple[tuple[int, int], ...] = ()) -> None:
        self.kind, self.address, self.twin, self.nbytes = kind, address, twin, nbytes
        self.ordinal, self.context, self.host, self.fd, self.maps = ordinal, context, host, fd, maps
        self.alias = 0  # a pinned block's device alias (DEVICEMAP)
        self.reserved = nbytes  # the device memory counted for it (a pooled block keeps it when reused smaller)


