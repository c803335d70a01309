"""DLPack export of device memory: the ``__dlpack__`` capsule of a device Array, built with ctypes.

The DLPack Python specification (data-apis.org, "DLPack: __dlpack__"): the producer returns a PyCapsule named
``dltensor_versioned`` (a ``DLManagedTensorVersioned``, when the consumer's ``max_version`` is 1.0 or newer) or
``dltensor`` (a ``DLManagedTensor``, for older consumers). The consumer renames the capsule ``used_...`` and
calls the tensor's ``deleter`` when it is done with the memory; a capsule never consumed calls it when it is
garbage collected. The deleter drops the reference that kept the Array (and so its memory) alive.

The stream handshake (CUDA): the consumer passes the stream it will use the data on; the data is ready on the
Array's stream, so that stream's pending work is made to come first on the consumer's stream (an event and a
stream wait, no host synchronization).
"""

from __future__ import annotations

import ctypes
from typing import Any

import numpy as np

from ..config import config
from ..core.descriptor import CAIDescriptor
from ..runtime.base import LEGACY_STREAM, PER_THREAD_STREAM, Runtime

__all__ = ["KDL_CPU", "KDL_CUDA", "device_capsule"]

KDL_CPU = 1  # DLDeviceType values
KDL_CUDA = 2
DLPACK_VERSION = (1, 0)  # what the versioned capsules declare
FLAG_READ_ONLY = 1 << 0  # DLPACK_FLAG_BITMASK_READ_ONLY

# DLDataTypeCode, by numpy dtype kind
_TYPE_CODES = {"i": 0, "u": 1, "f": 2, "c": 5, "b": 6}  # kDLInt, kDLUInt, kDLFloat, kDLComplex, kDLBool


class DLDevice(ctypes.Structure):
    _fields_ = [("device_type", ctypes.c_int32), ("device_id", ctypes.c_int32)]


class DLDataType(ctypes.Structure):
    _fields_ = [("code", ctypes.c_uint8), ("bits", ctypes.c_uint8), ("lanes", ctypes.c_uint16)]


class DLTensor(ctypes.Structure):
    _fields_ = [
        ("data", ctypes.c_void_p),
        ("device", DLDevice),
        ("ndim", ctypes.c_int32),
        ("dtype", DLDataType),
        ("shape", ctypes.POINTER(ctypes.c_int64)),
        ("strides", ctypes.POINTER(ctypes.c_int64)),
        ("byte_offset", ctypes.c_uint64),
    ]


class DLPackVersion(ctypes.Structure):
    _fields_ = [("major", ctypes.c_uint32), ("minor", ctypes.c_uint32)]


class DLManagedTensor(ctypes.Structure):
    pass


class DLManagedTensorVersioned(ctypes.Structure):
    pass


_Deleter = ctypes.CFUNCTYPE(None, ctypes.c_void_p)  # void (*deleter)(DLManagedTensor[Versioned]* self)
DLManagedTensor._fields_ = [("dl_tensor", DLTensor), ("manager_ctx", ctypes.c_void_p), ("deleter", _Deleter)]
DLManagedTensorVersioned._fields_ = [
    ("version", DLPackVersion),
    ("manager_ctx", ctypes.c_void_p),
    ("deleter", _Deleter),
    ("flags", ctypes.c_uint64),
    ("dl_tensor", DLTensor),
]

# Exported tensors not yet deleted, by the address of their DLManagedTensor[Versioned]: each entry holds the
# structs (the consumer reads them in place) and the Array whose memory they describe. No lock: the consumer may
# call the deleter from any thread, and the collector from any allocation (a lock held there would be waited for by
# the very thread holding it); one dict store or pop with an int key is atomic.
_alive: dict[int, tuple[Any, ...]] = {}


def _forget(address: int | None) -> None:
    """The tensor's ``deleter``: forget the structs and release the Array (its memory may then be freed; releasing
    it may release another export, an Array received into a tensor adopted from one, whose deleter comes back here
    on the same thread)."""
    entry = _alive.pop(address or 0, None)
    del entry


_delete = _Deleter(_forget)  # one C function for every tensor (kept alive here, as C may call it at any time)


_VERSIONED_NAME = b"dltensor_versioned"  # module constants: a capsule keeps the name's address
_LEGACY_NAME = b"dltensor"

# Prototypes that take the capsule's address: its destructor runs while the capsule is being freed, when no
# new reference to it may be made.
_capsule_is_valid = ctypes.PYFUNCTYPE(ctypes.c_int, ctypes.c_void_p, ctypes.c_char_p)(
    ("PyCapsule_IsValid", ctypes.pythonapi)
)
_capsule_pointer = ctypes.PYFUNCTYPE(ctypes.c_void_p, ctypes.c_void_p, ctypes.c_char_p)(
    ("PyCapsule_GetPointer", ctypes.pythonapi)
)
_Destructor = ctypes.CFUNCTYPE(None, ctypes.c_void_p)  # void (*)(PyObject* capsule)
_capsule_new = ctypes.PYFUNCTYPE(ctypes.py_object, ctypes.c_void_p, ctypes.c_char_p, _Destructor)(
    ("PyCapsule_New", ctypes.pythonapi)
)


def _on_capsule_freed(capsule: int) -> None:
    """A capsule nobody consumed (its name is still ``dltensor...``) deletes its tensor; a consumed one, renamed
    ``used_...``, leaves that to its consumer."""
    for name in (_VERSIONED_NAME, _LEGACY_NAME):
        if _capsule_is_valid(capsule, name):
            _forget(_capsule_pointer(capsule, name))
            return


_capsule_gone = _Destructor(_on_capsule_freed)


def device_capsule(
    owner: Any, desc: CAIDescriptor, ordinal: int, *, versioned: bool, runtime: Runtime, stream: int | None
) -> Any:
    """The DLPack capsule of ``owner`` (a device Array described by ``desc`` on GPU ``ordinal``), after making
    the consumer's ``stream`` wait for the data (see ``wait_on_consumer_stream``)."""
    dtype = desc.dtype
    code = _TYPE_CODES.get(dtype.kind)
    if code is None or not dtype.isnative or dtype.fields is not None or dtype.subdtype is not None:
        raise BufferError(
            f"__dlpack__: dtype {dtype} has no DLPack type (DLPack holds native-endian bool, int, uint, float "
            "and complex): use the Array's __cuda_array_interface__ (cupy.asarray(a)) instead"
        )
    itemsize = dtype.itemsize
    if any(s % itemsize for s in desc.byte_strides):
        raise BufferError(
            f"__dlpack__: byte strides {desc.byte_strides} are not multiples of the itemsize {itemsize}: DLPack "
            "counts strides in elements; use the Array's __cuda_array_interface__ (cupy.asarray(a)) instead"
        )
    wait_on_consumer_stream(runtime, desc, ordinal, stream)
    if stream is not None and stream != -1:  # its work there may read the memory after the Array is gone
        runtime.read_on(desc.ptr, ordinal, stream)
    ndim = len(desc.shape)
    shape = (ctypes.c_int64 * max(ndim, 1))(*desc.shape)
    strides = (ctypes.c_int64 * max(ndim, 1))(*(s // itemsize for s in desc.byte_strides))
    managed = DLManagedTensorVersioned() if versioned else DLManagedTensor()
    tensor = managed.dl_tensor
    tensor.data = desc.ptr or None
    tensor.device = DLDevice(KDL_CUDA, ordinal)
    tensor.ndim = ndim
    tensor.dtype = DLDataType(code, itemsize * 8, 1)
    tensor.shape = ctypes.cast(shape, ctypes.POINTER(ctypes.c_int64))
    tensor.strides = ctypes.cast(strides, ctypes.POINTER(ctypes.c_int64))
    tensor.byte_offset = 0
    managed.deleter = _delete
    if isinstance(managed, DLManagedTensorVersioned):
        managed.version = DLPackVersion(*DLPACK_VERSION)
        managed.flags = FLAG_READ_ONLY if desc.readonly else 0
    address = ctypes.addressof(managed)
    _alive[address] = (managed, shape, strides, owner)
    try:
        return _capsule_new(address, _VERSIONED_NAME if versioned else _LEGACY_NAME, _capsule_gone)
    except BaseException:
        _forget(address)
        raise


def wait_on_consumer_stream(runtime: Runtime, desc: CAIDescriptor, ordinal: int, stream: int | None) -> None:
    """The handshake: work queued so far where the Array's data is ready (the legacy default stream, through which
    every blocking stream's earlier work, and the Array's own CAI ``stream``) comes first on the consumer's
    ``stream`` (None: the legacy default stream; -1: the consumer asks for nothing). ``CAI_MPI_SYNC=device``
    waits for the whole device instead."""
    if stream == -1:
        return
    consumer = LEGACY_STREAM if stream is None else stream
    if config().sync_device:
        runtime.sync_device(ordinal)
        return
    producers = [LEGACY_STREAM]
    if desc.stream is not None and desc.stream not in (LEGACY_STREAM, PER_THREAD_STREAM):
        producers.append(desc.stream)
    for producer in producers:
        if producer == consumer:
            continue  # stream order already puts the consumer's work after it
        runtime.stream_wait_event(consumer, runtime.record_event_on(producer, ordinal), ordinal)


def check_request(
    where: str, stream: Any, max_version: Any, dl_device: Any, copy: Any, device: tuple[int, int]
) -> bool:
    """Validate ``__dlpack__``'s arguments for a device Array on ``device``; True for a versioned capsule."""
    if stream is not None and (isinstance(stream, bool) or not isinstance(stream, (int, np.integer))):
        raise TypeError(f"{where}: stream must be an int CUDA stream handle, -1 or None, got {stream!r}")
    if stream is not None and (int(stream) == 0 or int(stream) < -1):
        raise ValueError(
            f"{where}: stream={stream!r} is not a CUDA stream for DLPack: pass 1 (the legacy default stream), "
            "2 (the per-thread default stream), a cudaStream_t handle, -1 (no synchronization) or None"
        )
    if dl_device is not None and tuple(dl_device) != device:
        raise BufferError(f"{where}: the data is on DLPack device {device}, it cannot be exported to {dl_device!r}")
    if copy:
        raise BufferError(
            f"{where}: copy=True is not supported for device memory: export without a copy and copy on the "
            "consumer's side (cupy.from_dlpack(a).copy(), torch.from_dlpack(a).clone())"
        )
    if max_version is None:
        return False
    return int(max_version[0]) >= DLPACK_VERSION[0]
