"""Array: what a receive returns, and how CAI libraries, numpy, DLPack consumers and mpi4py take it zero-copy."""

from __future__ import annotations

import gc
import sys
import weakref
from typing import Any

import numpy as np
import pytest
from mpi4py import MPI

import cai_mpi
from cai_mpi._src.arrays.array import Array
from cai_mpi._src.core.descriptor import descriptor_from_dict
from cai_mpi.testing import SimulatedRuntime, use_runtime
from cai_mpi.testing._runtime import SimulatedDeviceBuffer

STRUCT = np.dtype([("id", "<i4"), ("pos", "<f8", (3,)), ("flag", "?")])


def host_arrays() -> list[np.ndarray[Any, Any]]:
    base = np.arange(60, dtype="<f8").reshape(3, 4, 5)
    return [
        base,
        np.asfortranarray(base),
        base[::-1, 1:, ::2],
        np.zeros((0, 3), "<i2"),
        np.array(7, "u1"),
        np.zeros(4, STRUCT),
    ]


@pytest.mark.parametrize("arr", host_arrays(), ids=["C", "F", "strided", "empty", "0-d", "structured"])
def test_a_host_array_is_viewed_zero_copy_with_its_layout(arr: np.ndarray[Any, Any]) -> None:
    a = Array.from_host(arr, source=3, tag=9, meta={"k": 1})
    view = np.asarray(a)
    assert (view.shape, view.dtype) == (arr.shape, arr.dtype)
    assert view.strides == arr.strides or not arr.size
    assert (a.shape, a.dtype, a.nbytes, a.size, a.ndim) == (arr.shape, arr.dtype, arr.nbytes, arr.size, arr.ndim)
    assert view.__array_interface__["data"][0] == arr.__array_interface__["data"][0]
    assert (a.source, a.tag, a.meta, a.device, a.is_host) == (3, 9, {"k": 1}, "host", True)
    assert a.descriptor.ptr == (arr.ctypes.data if arr.size else 0)
    assert not hasattr(a, "__cuda_array_interface__")


def test_writes_through_the_view_land_in_the_array() -> None:
    arr = np.zeros(5)
    a = Array.from_host(arr)
    np.asarray(a)[2] = 4.0
    assert arr[2] == 4.0 and np.asarray(a)[2] == 4.0


@pytest.mark.parametrize("arr", host_arrays()[:5], ids=["C", "F", "strided", "empty", "0-d"])
def test_dlpack_export_is_numpys_zero_copy(arr: np.ndarray[Any, Any]) -> None:
    a = Array.from_host(arr)
    assert a.__dlpack_device__() == (1, 0)  # kDLCPU
    got = np.from_dlpack(a)
    assert got.shape == arr.shape and np.array_equal(got, arr)
    if arr.size:
        assert got.__array_interface__["data"][0] == arr.__array_interface__["data"][0]


def test_mpi4py_takes_a_host_array_as_a_buffer() -> None:
    """mpi4py 4 accepts DLPack exporters (and PEP 688 buffers on 3.12+): an Array goes straight to MPI."""
    me = MPI.COMM_SELF
    src = Array.from_host(np.arange(6, dtype="<i8"))
    dst = Array.from_host(np.zeros(6, "<i8"))
    req = me.Irecv(dst, 0, 5)
    me.Send(src, 0, 5)
    req.Wait()
    assert np.asarray(dst).tolist() == [0, 1, 2, 3, 4, 5]


@pytest.mark.skipif(sys.version_info < (3, 12), reason="the buffer protocol for Python classes (PEP 688) is 3.12+")
def test_memoryview_on_python_312() -> None:  # pragma: no cover - this interpreter is 3.11
    a = Array.from_host(np.arange(12, dtype="<i4").reshape(3, 4))
    mv = memoryview(a)
    assert mv.shape == (3, 4) and bytes(mv) == np.arange(12, dtype="<i4").tobytes()


def test_the_array_keeps_its_memory_alive() -> None:
    arr = np.arange(1000.0)
    a = Array.from_host(arr)
    ref = weakref.ref(arr)
    del arr
    gc.collect()
    assert ref() is not None and np.asarray(a)[999] == 999.0
    del a
    gc.collect()
    assert ref() is None


def test_a_device_array_exports_cai_v3_and_refuses_host_protocols() -> None:
    with use_runtime(SimulatedRuntime()):
        buf = SimulatedDeviceBuffer(24, 0)
        buf.host_array[:] = np.arange(6, dtype="<f4").view(np.uint8)
        a = Array.from_device(buf, (2, 3), np.dtype("<f4"), source=1, tag=2)
        cai = a.__cuda_array_interface__
        assert cai["version"] == 3 and cai["stream"] is None and cai["data"] == (buf.ptr, False)
        assert descriptor_from_dict(cai).shape == (2, 3)
        assert (a.device, a.is_host) == (0, False)
        assert a.__dlpack_device__() == (2, 0)  # kDLCUDA
        with pytest.raises(AttributeError, match="lives on GPU 0"):
            np.asarray(a.__array_interface__)
        with pytest.raises(TypeError, match="to_host"):
            np.asarray(a)
        with pytest.raises(BufferError):
            a.__buffer__(0)
        assert np.array_equal(a.numpy(), np.arange(6, dtype="<f4").reshape(2, 3))


def test_repr_names_what_and_where() -> None:
    a = Array.from_host(np.zeros((2, 3), "<f4"), source=1, tag=4, meta={"m": 1})
    assert repr(a) == "cai_mpi.Array(shape=(2, 3), dtype=float32, device=host, source=1, tag=4, meta={'m': 1})"
    assert len(a) == 2
    with pytest.raises(TypeError, match="0-d"):
        len(Array.from_host(np.array(1.0)))
    assert isinstance(a, cai_mpi.Array)


def test_repr_names_mpi_s_special_values() -> None:
    """PROC_NULL is -1 on MPICH and -2 on Open MPI: the repr prints the name, as for ANY_TAG."""
    a = Array.from_host(np.zeros(2, "<f4"), source=MPI.PROC_NULL, tag=MPI.ANY_TAG)
    assert repr(a) == "cai_mpi.Array(shape=(2,), dtype=float32, device=host, source=PROC_NULL, tag=ANY_TAG)"


def test_an_array_made_by_hand_comes_from_no_rank() -> None:
    """``from_host`` and ``from_device`` without ``source``/``tag``: MPI's values for no sender."""
    a = Array.from_host(np.zeros(2, "<f4"))
    assert (a.source, a.tag, a.meta) == (MPI.PROC_NULL, MPI.ANY_TAG, None)


def test_every_constructor_sets_every_slot() -> None:
    host = np.arange(6.0).reshape(2, 3)
    built = [Array.over_host(host, 1, 2, None), Array.over_host(host, 1, 2, {"k": 1}, owner=host),
             Array.from_host(host), Array(None, device="host", owner=host, host=host)]
    for a in built:
        unset = [slot for slot in Array.__slots__ if slot != "__weakref__" and not hasattr(a, slot)]
        assert not unset, unset
        assert a.descriptor.shape == (2, 3) and a.device == "host"
        np.testing.assert_array_equal(np.asarray(a), host)


# numpy reads a host Array through __array_interface__ and never calls __array__; other consumers call the
# protocol method itself, so these call it directly.
def test_the_array_protocol_converts_only_when_a_dtype_is_asked() -> None:
    a = Array.from_host(np.arange(4, dtype=np.int32))
    same = a.__array__()
    assert same.dtype == np.int32 and np.shares_memory(same, np.asarray(a))
    converted = a.__array__(np.float64)
    assert converted.dtype == np.float64 and converted.tolist() == [0.0, 1.0, 2.0, 3.0]
    assert a.__array__(np.int32, copy=False).dtype == np.int32


def test_the_array_protocol_refuses_another_dtype_without_a_copy() -> None:
    a = Array.from_host(np.arange(3.0))
    for dtype in (np.int8, np.float32, np.complex128):
        with pytest.raises(ValueError, match=r"^cai_mpi.Array: a float64 array cannot become .* without a copy"):
            a.__array__(dtype, copy=False)
    assert a.__array__(np.float64, copy=False).tolist() == [0.0, 1.0, 2.0]


@pytest.mark.parametrize("values", [[5.0], [1.0, 2.0, 3.0]], ids=["one-element", "several"])
def test_the_array_protocol_copies_when_asked(values: list[float]) -> None:
    host = np.array(values)
    copied = Array.from_host(host).__array__(copy=True)
    assert copied.tolist() == values and not np.shares_memory(copied, host)
    assert np.array(Array.from_host(host), copy=True).tolist() == values
