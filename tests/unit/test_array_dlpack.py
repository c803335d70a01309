"""A device Array as DLPack consumers take it (the capsule decoded here by the DLPack ABI, not by cai_mpi's own
structs), and as numpy must refuse it: on the CUDA driver double, a rank sending to itself."""

from __future__ import annotations

import ctypes
import gc
import threading
import weakref
from collections.abc import Iterator
from typing import Any

import numpy as np
import pytest
from mpi4py import MPI

import cai_mpi
from cai_mpi._src.config import reload_config
from cai_mpi._src.core.descriptor import CAIDescriptor
from cai_mpi._src.runtime.cuda import CudaRuntime
from cai_mpi.testing import DoubleDeviceArray, double_runtime, use_runtime

me = MPI.COMM_WORLD.Get_rank()


# -- the DLPack ABI (dlpack.h, v1), written out independently of cai_mpi._src.arrays.dlpack ----------------------------
class Device(ctypes.Structure):
    _fields_ = [("device_type", ctypes.c_int32), ("device_id", ctypes.c_int32)]


class DataType(ctypes.Structure):
    _fields_ = [("code", ctypes.c_uint8), ("bits", ctypes.c_uint8), ("lanes", ctypes.c_uint16)]


class Tensor(ctypes.Structure):
    _fields_ = [("data", ctypes.c_void_p), ("device", Device), ("ndim", ctypes.c_int32), ("dtype", DataType),
                ("shape", ctypes.POINTER(ctypes.c_int64)), ("strides", ctypes.POINTER(ctypes.c_int64)),
                ("byte_offset", ctypes.c_uint64)]


DELETER = ctypes.CFUNCTYPE(None, ctypes.c_void_p)


class Managed(ctypes.Structure):
    _fields_ = [("dl_tensor", Tensor), ("manager_ctx", ctypes.c_void_p), ("deleter", DELETER)]


class Versioned(ctypes.Structure):
    _fields_ = [("major", ctypes.c_uint32), ("minor", ctypes.c_uint32), ("manager_ctx", ctypes.c_void_p),
                ("deleter", DELETER), ("flags", ctypes.c_uint64), ("dl_tensor", Tensor)]


api = ctypes.pythonapi
api.PyCapsule_GetPointer.restype, api.PyCapsule_GetPointer.argtypes = ctypes.c_void_p, [ctypes.py_object,
                                                                                         ctypes.c_char_p]
api.PyCapsule_SetName.restype, api.PyCapsule_SetName.argtypes = ctypes.c_int, [ctypes.py_object, ctypes.c_char_p]
api.PyCapsule_GetName.restype, api.PyCapsule_GetName.argtypes = ctypes.c_char_p, [ctypes.py_object]

USED_NAME = {b"dltensor_versioned": b"used_dltensor_versioned", b"dltensor": b"used_dltensor"}


def consume(capsule: Any) -> tuple[Any, Tensor]:
    """What a consumer does: read the tensor and rename the capsule (from then on the consumer owns it)."""
    name = api.PyCapsule_GetName(capsule)
    address = api.PyCapsule_GetPointer(capsule, name)
    managed: Any = (Versioned if name == b"dltensor_versioned" else Managed).from_address(address)
    assert api.PyCapsule_SetName(capsule, USED_NAME[name]) == 0
    return managed, managed.dl_tensor


@pytest.fixture
def rt(monkeypatch: pytest.MonkeyPatch) -> Iterator[CudaRuntime]:
    monkeypatch.setenv("CAI_MPI_CUDA_AWARE", "0")
    reload_config({"CAI_MPI_INLINE_BYTES": "0"})
    runtime = double_runtime()
    with use_runtime(runtime):
        yield runtime  # type: ignore[misc]
        gc.collect()
    reload_config()
    gc.collect()
    runtime.driver_double.close()  # type: ignore[attr-defined]


def on_device(data: np.ndarray[Any, Any]) -> cai_mpi.Array:
    """``data`` sent to this rank and received on GPU 0 (with its layout: C or Fortran order)."""
    req = cai_mpi.isend_array(data, me, 3)
    got = cai_mpi.recv_array(me, 3, device=0)
    req.wait()
    assert got.device == 0
    return got


@pytest.mark.parametrize(
    ("data", "code", "bits"),
    [
        (np.arange(12, dtype=np.float64).reshape(3, 4), 2, 64),
        (np.asfortranarray(np.arange(12, dtype=np.int32).reshape(3, 4)), 0, 32),
        (np.arange(5, dtype=np.uint8), 1, 8),
        (np.array([True, False]), 6, 8),
        (np.arange(4, dtype=np.complex64), 5, 64),
        (np.array(2.5, np.float16), 2, 16),
    ],
    ids=["f8-C", "i4-F", "u1", "bool", "c8", "f2-0d"],
)
@pytest.mark.parametrize("max_version", [(1, 0), None], ids=["versioned", "legacy"])
def test_a_device_array_exports_a_kdlcuda_capsule_over_its_memory(
    rt: CudaRuntime, data: np.ndarray[Any, Any], code: int, bits: int, max_version: tuple[int, int] | None
) -> None:
    a = on_device(data)
    assert a.__dlpack_device__() == (2, 0)
    capsule = a.__dlpack__(stream=-1, max_version=max_version)
    managed, t = consume(capsule)
    if max_version is None:
        assert isinstance(managed, Managed)
    else:
        assert (managed.major, managed.minor, managed.flags) == (1, 0, 0)
    assert t.data == a.descriptor.ptr and t.byte_offset == 0
    assert (t.device.device_type, t.device.device_id) == (2, 0)
    assert (t.dtype.code, t.dtype.bits, t.dtype.lanes) == (code, bits, 1)
    assert t.ndim == data.ndim
    assert tuple(t.shape[i] for i in range(t.ndim)) == data.shape
    assert tuple(t.strides[i] for i in range(t.ndim)) == tuple(s // data.itemsize for s in data.strides)
    ref = weakref.ref(a)
    del a
    gc.collect()
    assert ref() is not None  # the consumer holds the memory until it calls the deleter
    managed.deleter(ctypes.addressof(managed))
    del capsule, managed, t
    gc.collect()
    assert ref() is None


def test_a_capsule_nobody_consumed_releases_the_array(rt: CudaRuntime) -> None:
    a = on_device(np.arange(6.0))
    capsule = a.__dlpack__(max_version=(1, 1))
    ref = weakref.ref(a)
    del a
    gc.collect()
    assert ref() is not None
    del capsule
    gc.collect()
    assert ref() is None


def test_the_consumers_stream_waits_for_work_queued_on_the_data(rt: CudaRuntime) -> None:
    # A producer "kernel" still writes the data on the legacy default stream; the consumer reads it on a
    # non-blocking stream of its own (which CUDA orders after nothing): the handshake must order it.
    new = np.arange(1 << 12, dtype=np.float64) + 1
    a = on_device(np.zeros_like(new))
    double = rt.driver_double  # type: ignore[attr-defined]
    with rt.driver.on(0):
        double.kernel_write(1, a.descriptor.ptr, new.tobytes(), delay=0.3)
        (consumer,) = rt.driver.check("cuStreamCreate", double.CUstream_flags.CU_STREAM_NON_BLOCKING)
    capsule = a.__dlpack__(stream=int(consumer), max_version=(1, 0))
    seen: list[bytes] = []
    with rt.driver.on(0):
        double.launch(int(consumer), lambda: seen.append(double.read_device(a.descriptor.ptr, new.nbytes)))
    rt.sync_stream(int(consumer), 0)
    assert seen == [new.tobytes()]
    del capsule


def non_blocking_stream(rt: CudaRuntime) -> int:
    double = rt.driver_double  # type: ignore[attr-defined]
    with rt.driver.on(0):
        (handle,) = rt.driver.check("cuStreamCreate", double.CUstream_flags.CU_STREAM_NON_BLOCKING)
    return int(handle)


def test_the_consumers_stream_waits_for_the_stream_the_array_names(rt: CudaRuntime) -> None:
    # An Array received while a CuPy stream was current names that stream (here a non-blocking one, which the
    # legacy default stream does not order): work a kernel still does there must come first on the consumer's.
    new = np.arange(1 << 12, dtype=np.float64) + 1
    producer, consumer = non_blocking_stream(rt), non_blocking_stream(rt)
    memory = DoubleDeviceArray(rt, np.zeros_like(new))
    desc = CAIDescriptor.for_new_buffer(memory.buf.ptr, new.shape, new.dtype, stream=producer)
    a = cai_mpi.Array(desc, device=0, owner=memory)
    double = rt.driver_double  # type: ignore[attr-defined]
    with rt.driver.on(0):
        double.kernel_write(producer, a.descriptor.ptr, new.tobytes(), delay=0.3)
    capsule = a.__dlpack__(stream=consumer, max_version=(1, 0))
    seen: list[bytes] = []
    with rt.driver.on(0):
        double.launch(consumer, lambda: seen.append(double.read_device(a.descriptor.ptr, new.nbytes)))
    rt.sync_stream(consumer, 0)
    assert seen == [new.tobytes()]
    del capsule


def test_a_consumer_may_release_the_tensor_from_another_thread(rt: CudaRuntime) -> None:
    a = on_device(np.arange(6.0))
    capsule = a.__dlpack__(stream=-1, max_version=(1, 0))
    managed, _ = consume(capsule)
    ref = weakref.ref(a)
    del a, capsule
    worker = threading.Thread(target=managed.deleter, args=(ctypes.addressof(managed),))
    worker.start()
    worker.join()
    del managed
    gc.collect()
    assert ref() is None


def test_the_request_is_checked(rt: CudaRuntime) -> None:
    a = on_device(np.arange(4.0))
    with pytest.raises(ValueError, match="stream=0"):
        a.__dlpack__(stream=0)
    with pytest.raises(TypeError, match="stream must be an int"):
        a.__dlpack__(stream=1.5)
    with pytest.raises(BufferError, match=r"cannot be exported to \(1, 0\)"):
        a.__dlpack__(dl_device=(1, 0))
    with pytest.raises(BufferError, match="copy=True"):
        a.__dlpack__(copy=True)
    assert a.__dlpack__(dl_device=(2, 0), copy=False, stream=1) is not None
    swapped = on_device(np.arange(4, dtype=">f8"))
    with pytest.raises(BufferError, match="no DLPack type"):
        swapped.__dlpack__()


def test_numpy_refuses_a_device_array_and_says_what_to_do(rt: CudaRuntime) -> None:
    a = on_device(np.arange(6.0).reshape(2, 3))
    for convert in (np.asarray, np.array, np.ascontiguousarray):
        with pytest.raises(TypeError, match=r"a\.to_host\(\).*cupy\.asarray\(a\).*torch\.as_tensor"):
            convert(a)
    host = a.to_host()
    assert isinstance(host, np.ndarray) and np.array_equal(host, np.arange(6.0).reshape(2, 3))
    assert np.array_equal(a.numpy(), host)


def test_host_arrays_stay_zero_copy_and_to_host_copies() -> None:
    data = np.arange(6.0).reshape(2, 3)
    a = cai_mpi.Array.from_host(data)
    assert np.shares_memory(np.asarray(a), data) and np.shares_memory(a.numpy(), data)
    assert np.shares_memory(np.from_dlpack(a), data)
    assert np.shares_memory(np.array(a, copy=False), data)
    assert not np.shares_memory(np.array(a), data)
    assert np.asarray(a, dtype=np.float32).dtype == np.float32
    copied = a.to_host()
    assert np.array_equal(copied, data) and not np.shares_memory(copied, data)


@pytest.mark.parametrize("readonly", [True, False], ids=["read-only", "writable"])
def test_a_read_only_device_array_exports_a_read_only_capsule(rt: CudaRuntime, readonly: bool) -> None:
    """A versioned capsule carries DLPack's read-only flag exactly when the Array is read-only, so a consumer
    never writes into memory it was lent read-only; a legacy capsule has no flags (consumers must not write)."""
    a = on_device(np.arange(6.0))
    lent = cai_mpi.Array(a.descriptor.replace(readonly=readonly), device=0, owner=a)
    managed, _t = consume(lent.__dlpack__(stream=-1, max_version=(1, 0)))
    assert managed.flags == (1 if readonly else 0)  # DLPACK_FLAG_BITMASK_READ_ONLY
    managed.deleter(ctypes.addressof(managed))
