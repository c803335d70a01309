"""The buffer-protocol base class of cai_mpi.Array (cai_mpi._src.bufexport and its C extension)."""

from __future__ import annotations

import contextlib
import ctypes
import gc
import pickle
import sys
import tracemalloc
import weakref
from collections.abc import Callable
from typing import Any

import numpy as np
import pytest

from cai_mpi._src import bufexport
from cai_mpi._src.bufexport import HAVE_C_BUFFER_EXPORT, BufferExporterBase, PyBufferExporter

PY312 = sys.version_info >= (3, 12)

# The C type cai_mpi._src._bufexport.BufferExporter, where it was built.
CBufferExporter: Any = BufferExporterBase if HAVE_C_BUFFER_EXPORT else None

NO_C_REASON = "the C extension cai_mpi._src._bufexport was not built (no C compiler at install time?)"
NO_PEP688_REASON = (
    f"the pure-Python fallback exports buffers through PEP 688 __buffer__, which needs Python >= 3.12 "
    f"(this is {sys.version_info.major}.{sys.version_info.minor})"
)


# --- subclasses under test, built for each base ------------------------------------------------


def make_classes(base: type) -> dict[str, type]:
    class Holder(base):  # type: ignore[misc]
        """Like cai_mpi.Array holding host memory: re-exports a numpy array."""

        def __init__(self, arr: Any) -> None:
            self.arr = arr

        def _host_buffer_target(self) -> Any:
            return self.arr

        @property
        def __array_interface__(self) -> dict[str, Any]:
            return self.arr.__array_interface__  # type: ignore[no-any-return]

    class FreshView(base):  # type: ignore[misc]
        """Returns a new numpy view on every call (like hostmem.host_view)."""

        def __init__(self, arr: Any) -> None:
            self.arr = arr
            self.last: Any = None

        def _host_buffer_target(self) -> Any:
            view = self.arr.view()
            self.last = weakref.ref(view)
            return view

    class Device(base):  # type: ignore[misc]
        """Like cai_mpi.Array holding device memory."""

        def __init__(self, arr: Any) -> None:
            self.arr = arr

        def _host_buffer_target(self) -> Any:
            raise BufferError("device memory has no host buffer; copy it to the host first")

        @property
        def __array_interface__(self) -> dict[str, Any]:
            return self.arr.__array_interface__  # type: ignore[no-any-return]

    class Returns(base):  # type: ignore[misc]
        """Returns whatever it was given (even things that are not buffers)."""

        def __init__(self, thing: Any) -> None:
            self.thing = thing

        def _host_buffer_target(self) -> Any:
            return self if self.thing is None else self.thing

    return {"Holder": Holder, "FreshView": FreshView, "Device": Device, "Returns": Returns}


BASES: dict[str, type | None] = {"c": CBufferExporter, "py": PyBufferExporter}
CLASSES = {name: make_classes(base) for name, base in BASES.items() if base is not None}


@pytest.fixture(
    params=[
        pytest.param("c", marks=pytest.mark.skipif(not HAVE_C_BUFFER_EXPORT, reason=NO_C_REASON)),
        pytest.param("py", marks=pytest.mark.skipif(not PY312, reason=NO_PEP688_REASON)),
    ]
)
def cls(request: pytest.FixtureRequest) -> dict[str, type]:
    """The test subclasses of whichever exporter base can export buffers on this Python."""
    return CLASSES[request.param]


# --- arrays ----------------------------------------------------------------------------------

STRUCT = np.dtype([("x", "<i4"), ("y", "<f8"), ("s", "S3"), ("v", "<f4", (2,))])
ALIGNED = np.dtype([("a", "u1"), ("b", "<f8")], align=True)


def _struct_array() -> np.ndarray[Any, Any]:
    arr = np.zeros(3, STRUCT)
    arr["x"] = [1, 2, 3]
    arr["y"] = [0.5, 1.5, 2.5]
    arr["s"] = [b"ab", b"cde", b""]
    arr["v"] = [[1, 2], [3, 4], [5, 6]]
    return arr


def _aligned_array() -> np.ndarray[Any, Any]:
    arr = np.zeros((2, 2), ALIGNED)
    arr["a"] = [[1, 2], [3, 4]]
    arr["b"] = [[0.25, 0.5], [0.75, 1.0]]
    return arr


def _readonly() -> np.ndarray[Any, Any]:
    arr = np.arange(6, dtype=np.int16)
    arr.flags.writeable = False
    return arr


ARRAYS: dict[str, Callable[[], np.ndarray[Any, Any]]] = {
    "f32_2d": lambda: np.arange(12, dtype=np.float32).reshape(3, 4),
    "f32_fortran": lambda: np.asfortranarray(np.arange(12, dtype=np.float32).reshape(3, 4)),
    "negative_stride": lambda: np.arange(24, dtype=np.float64).reshape(4, 6)[::-1, ::-2],
    "structured": _struct_array,
    "structured_aligned": _aligned_array,
    "zero_d": lambda: np.array(3.5, dtype=np.float64),
    "zero_size": lambda: np.zeros((0, 3), dtype=np.float32),
    "float16": lambda: np.linspace(0, 1, 10, dtype=np.float16).reshape(2, 5),
    "complex64": lambda: (np.arange(4) + 1j).astype(np.complex64),
    "bool": lambda: np.array([True, False, True]),
    "big_endian": lambda: np.arange(5, dtype=">i4"),
    "unicode": lambda: np.array(["ab", "cde"]),
    "readonly": _readonly,
}


@pytest.fixture(params=sorted(ARRAYS))
def arr(request: pytest.FixtureRequest) -> np.ndarray[Any, Any]:
    return ARRAYS[request.param]()


def _same_layout(m: memoryview, ref: memoryview) -> None:
    assert m.format == ref.format
    assert m.itemsize == ref.itemsize
    assert m.ndim == ref.ndim
    assert m.shape == ref.shape
    assert m.strides == ref.strides
    assert m.suboffsets == ref.suboffsets
    assert m.readonly == ref.readonly
    assert m.nbytes == ref.nbytes
    assert (m.c_contiguous, m.f_contiguous, m.contiguous) == (
        ref.c_contiguous,
        ref.f_contiguous,
        ref.contiguous,
    )


# --- layout and contents ---------------------------------------------------------------------


def test_memoryview_matches_the_array(cls: dict[str, type], arr: np.ndarray[Any, Any]) -> None:
    obj = cls["Holder"](arr)
    with memoryview(obj) as m, memoryview(arr) as ref:  # type: ignore[arg-type]
        _same_layout(m, ref)
        assert m.readonly == (not arr.flags.writeable)
        assert m.tobytes() == arr.tobytes()
        if CBufferExporter is not None and isinstance(obj, CBufferExporter):
            assert m.obj is obj  # the C exporter owns the view (and so keeps obj alive)


def test_bytes_equals_the_array_bytes(cls: dict[str, type], arr: np.ndarray[Any, Any]) -> None:
    assert bytes(cls["Holder"](arr)) == arr.tobytes()


def test_np_asarray_is_zero_copy_with_dtype_shape_strides(
    cls: dict[str, type], arr: np.ndarray[Any, Any]
) -> None:
    obj = cls["Holder"](arr)
    out = np.asarray(obj)
    assert out.dtype == arr.dtype
    assert out.shape == arr.shape
    # numpy exports zero-size arrays with contiguous strides (numpy >= 2.4 gives them strides of 0)
    assert out.strides == (arr.strides if arr.size else np.asarray(memoryview(arr)).strides)  # type: ignore[arg-type]
    assert out.flags.writeable == arr.flags.writeable
    if arr.size:
        assert np.shares_memory(out, arr)
        assert out.__array_interface__["data"][0] == arr.__array_interface__["data"][0]
    np.testing.assert_array_equal(out, arr)


def test_np_asarray_takes_the_buffer_before_array_interface(cls: dict[str, type]) -> None:
    """numpy prefers the buffer protocol to __array_interface__ (so the buffer must carry the dtype)."""

    holder: Any = cls["Holder"]

    class Liar(holder):  # type: ignore[misc]
        @property
        def __array_interface__(self) -> dict[str, Any]:
            return np.zeros(1, np.uint8).__array_interface__

    arr = np.arange(6, dtype=np.float16).reshape(2, 3)
    out = np.asarray(Liar(arr))
    assert out.dtype == np.float16 and out.shape == (2, 3)
    assert np.shares_memory(out, arr)


def test_structured_dtypes_survive_np_asarray(cls: dict[str, type]) -> None:
    for arr in (_struct_array(), _aligned_array(), np.zeros(2, np.dtype([("a", "u1"), ("b", ">f2")]))):
        out = np.asarray(cls["Holder"](arr))
        assert out.dtype == arr.dtype
        assert out.dtype.names == arr.dtype.names
        assert out.dtype.fields == arr.dtype.fields  # names, dtypes and offsets
        assert out.dtype.itemsize == arr.dtype.itemsize
        assert out.tobytes() == arr.tobytes()
        assert np.shares_memory(out, arr)


def test_np_frombuffer(cls: dict[str, type]) -> None:
    arr = np.arange(12, dtype=np.float32).reshape(3, 4)
    obj = cls["Holder"](arr)
    flat = np.frombuffer(obj, dtype=np.float32)
    assert flat.shape == (12,)
    assert np.shares_memory(flat, arr)
    assert flat.flags.writeable  # numpy asks for a writable buffer first
    assert not np.frombuffer(cls["Holder"](_readonly()), dtype=np.int16).flags.writeable
    np.testing.assert_array_equal(flat, arr.ravel())
    raw = np.frombuffer(obj, dtype=np.uint8)
    assert raw.nbytes == arr.nbytes
    np.testing.assert_array_equal(np.frombuffer(cls["Holder"](np.zeros((0, 3), np.float32)), np.float32), [])


def test_np_frombuffer_refuses_non_contiguous(cls: dict[str, type]) -> None:
    arr = np.arange(12, dtype=np.float32).reshape(3, 4)[:, ::2]
    with pytest.raises((BufferError, ValueError)):
        np.frombuffer(cls["Holder"](arr), dtype=np.float32)


def test_writes_through_memoryview_land_in_the_target(cls: dict[str, type]) -> None:
    arr = np.zeros((3, 4), dtype=np.float32)
    obj = cls["Holder"](arr)
    with memoryview(obj) as m:
        assert not m.readonly
        m[1, 2] = 7.5  # type: ignore[call-overload]
        m.cast("B")[0:4] = np.float32(2.0).tobytes()
    assert arr[1, 2] == 7.5
    assert arr[0, 0] == 2.0
    np.asarray(obj)[2, 3] = -1.0
    assert arr[2, 3] == -1.0
    ctypes.c_float.from_buffer(obj).value = 9.0  # a writable (PyBUF_WRITABLE) request
    assert arr[0, 0] == 9.0


def test_writes_through_a_negative_stride_view(cls: dict[str, type]) -> None:
    base = np.zeros((4, 6), dtype=np.float64)
    arr = base[::-1, ::-2]
    with memoryview(cls["Holder"](arr)) as m:
        m[0, 0] = 1.0  # type: ignore[call-overload]
    assert base[3, 5] == 1.0


def test_readonly_target_refuses_writable_requests(cls: dict[str, type]) -> None:
    obj = cls["Holder"](_readonly())
    with memoryview(obj) as m:
        assert m.readonly
        with pytest.raises(TypeError):
            m[0] = 1
    with pytest.raises((BufferError, TypeError)):
        ctypes.c_int16.from_buffer(obj)


# --- device memory and errors ------------------------------------------------------------------


def test_device_memory_raises_buffer_error(cls: dict[str, type]) -> None:
    obj = cls["Device"](np.arange(4.0))
    with pytest.raises(BufferError, match="device memory has no host buffer"):
        memoryview(obj)
    with pytest.raises(BufferError, match="device memory has no host buffer"):
        bytes(obj)
    with pytest.raises(BufferError, match="device memory has no host buffer"):
        np.frombuffer(obj, dtype=np.float64)


def test_np_asarray_falls_back_to_array_interface_when_the_buffer_fails(cls: dict[str, type]) -> None:
    """numpy swallows the buffer error and goes on to __array_interface__ (documenting numpy's behaviour)."""
    arr = np.arange(4.0)
    out = np.asarray(cls["Device"](arr))
    assert out.dtype == arr.dtype and np.shares_memory(out, arr)


def test_dtype_numpy_cannot_put_in_a_buffer(cls: dict[str, type]) -> None:
    """datetime64 has no PEP 3118 format: memoryview fails as it does on the bare array, numpy falls back."""
    arr = np.arange(3).astype("M8[s]")
    with pytest.raises(ValueError, match="cannot include dtype"):
        memoryview(arr)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="cannot include dtype"):
        memoryview(cls["Holder"](arr))
    out = np.asarray(cls["Holder"](arr))  # via __array_interface__
    assert out.dtype == arr.dtype and np.shares_memory(out, arr)


def test_default_target_raises_buffer_error() -> None:
    class Plain(BufferExporterBase):
        pass

    with pytest.raises(BufferError, match="does not export a host buffer"):
        Plain()._host_buffer_target()
    if HAVE_C_BUFFER_EXPORT or PY312:
        with pytest.raises(BufferError, match="does not export a host buffer"):
            memoryview(Plain())


def test_target_that_is_not_a_buffer(cls: dict[str, type]) -> None:
    with pytest.raises(TypeError):
        memoryview(cls["Returns"](12345))


def test_target_that_is_the_exporter_itself(cls: dict[str, type]) -> None:
    with pytest.raises(BufferError, match="returned the exporter itself"):
        memoryview(cls["Returns"](None))


# --- lifetimes and reference counts -----------------------------------------------------------


def _settle() -> None:
    for _ in range(3):
        gc.collect()


def test_refcounts_return_to_baseline(cls: dict[str, type]) -> None:
    arr = np.arange(12, dtype=np.float32).reshape(3, 4)
    obj = cls["Holder"](arr)
    _settle()
    base_arr, base_obj = sys.getrefcount(arr), sys.getrefcount(obj)

    m = memoryview(obj)
    assert sys.getrefcount(arr) > base_arr  # the view holds the target
    m2 = m[1:]
    flat = np.frombuffer(obj, dtype=np.float32)
    view = np.asarray(obj)
    data = bytes(obj)
    del m2, flat, view, data
    m.release()
    del m
    _settle()
    assert sys.getrefcount(arr) == base_arr
    assert sys.getrefcount(obj) == base_obj

    for _ in range(200):
        with memoryview(obj) as m:
            m.tobytes()
        bytes(obj)
        np.frombuffer(obj, dtype=np.uint8)
        np.asarray(obj)
    del m
    _settle()
    assert sys.getrefcount(arr) == base_arr
    assert sys.getrefcount(obj) == base_obj


def test_error_paths_do_not_leak(cls: dict[str, type]) -> None:
    arr = np.arange(4.0)
    dev = cls["Device"](arr)
    thing = object()
    not_buffer = cls["Returns"](thing)
    ro = _readonly()
    ro_obj = cls["Holder"](ro)
    _settle()
    counts = [sys.getrefcount(x) for x in (arr, dev, thing, not_buffer, ro, ro_obj)]
    for _ in range(200):
        with pytest.raises(BufferError):
            memoryview(dev)
        with pytest.raises(TypeError):
            memoryview(not_buffer)
        with pytest.raises((BufferError, TypeError)):
            ctypes.c_int16.from_buffer(ro_obj)
    _settle()
    assert [sys.getrefcount(x) for x in (arr, dev, thing, not_buffer, ro, ro_obj)] == counts


def test_no_memory_leak_per_export(cls: dict[str, type]) -> None:
    obj = cls["Holder"](np.arange(64, dtype=np.float64).reshape(8, 8))
    dev = cls["Device"](np.arange(4.0))

    def churn(n: int) -> None:
        for _ in range(n):
            with memoryview(obj) as m:
                m.nbytes  # noqa: B018
            bytes(obj)
            with contextlib.suppress(BufferError):
                memoryview(dev)

    churn(100)  # warm caches
    _settle()
    tracemalloc.start()
    try:
        churn(100)
        _settle()
        before = tracemalloc.get_traced_memory()[0]
        churn(5000)
        _settle()
        after = tracemalloc.get_traced_memory()[0]
    finally:
        tracemalloc.stop()
    assert after - before < 20_000, f"{after - before} bytes retained over 5000 exports"


def test_view_keeps_exporter_and_target_alive(cls: dict[str, type]) -> None:
    arr = np.arange(6, dtype=np.int32)
    arr_ref = weakref.ref(arr)
    obj = cls["Holder"](arr)
    obj_ref = weakref.ref(obj)
    m = memoryview(obj)
    del arr, obj
    _settle()
    assert arr_ref() is not None
    # The view holds the exporter too (C: view.obj is obj; 3.12+ __buffer__: CPython's wrapper holds obj),
    # so memory that obj alone keeps alive (cai_mpi.Array's owner) stays valid while the view lives.
    assert obj_ref() is not None
    assert m.tolist() == [0, 1, 2, 3, 4, 5]
    m.release()
    _settle()
    assert obj_ref() is None
    assert arr_ref() is None


def test_view_outlives_the_exporters_own_reference(cls: dict[str, type]) -> None:
    arr = np.arange(6, dtype=np.int32)
    obj = cls["Holder"](arr)
    arr_ref = weakref.ref(arr)
    m = memoryview(obj)
    obj.arr = None  # type: ignore[attr-defined]
    del arr
    _settle()
    assert arr_ref() is not None
    assert m.tolist() == [0, 1, 2, 3, 4, 5]
    m.release()
    _settle()
    assert arr_ref() is None


def test_fresh_target_per_export_is_released(cls: dict[str, type]) -> None:
    arr = np.arange(6, dtype=np.int32)
    obj = cls["FreshView"](arr)
    m = memoryview(obj)
    view_ref = obj.last  # type: ignore[attr-defined]
    _settle()
    assert view_ref() is not None
    assert m.tolist() == [0, 1, 2, 3, 4, 5]
    m.release()
    _settle()
    assert view_ref() is None


def test_cycles_through_the_view_are_collected(cls: dict[str, type]) -> None:
    arr = np.arange(6, dtype=np.int32)
    base_arr = sys.getrefcount(arr)
    obj: Any = cls["Holder"](arr)
    obj.me = obj  # type: ignore[attr-defined]
    obj.view = memoryview(obj)  # type: ignore[attr-defined]  # obj -> __dict__ -> view -> obj
    obj_ref = weakref.ref(obj)
    del obj
    _settle()
    assert obj_ref() is None
    assert sys.getrefcount(arr) == base_arr


# --- the base class as a Python base ----------------------------------------------------------

BASE_PARAMS = [
    pytest.param(
        CBufferExporter, id="c", marks=pytest.mark.skipif(not HAVE_C_BUFFER_EXPORT, reason=NO_C_REASON)
    ),
    pytest.param(PyBufferExporter, id="py"),
]


@pytest.mark.parametrize("base", BASE_PARAMS)
def test_subclass_attributes_weakrefs_and_gc(base: type) -> None:
    holder = make_classes(base)["Holder"]
    obj: Any = holder(np.arange(3))
    obj.extra = "x"
    assert vars(obj)["extra"] == "x"
    assert set(obj.__dict__) == {"arr", "extra"}
    obj.__dict__ = {"arr": np.arange(2)}
    assert not hasattr(obj, "extra")

    called = []
    ref = weakref.ref(obj, lambda _: called.append(True))
    proxy = weakref.proxy(obj)
    obj.me = obj  # a cycle through the instance dict
    assert ref() is obj
    assert proxy.arr.tolist() == [0, 1]
    del obj
    _settle()
    assert ref() is None
    assert called == [True]

    direct: Any = base()
    direct.attr = 1
    assert direct.attr == 1
    assert weakref.ref(direct)() is direct
    assert gc.is_tracked(holder(None))


@pytest.mark.parametrize("base", BASE_PARAMS)
def test_subclass_pickles(base: type) -> None:
    obj = _PICKLABLE[base](np.arange(4.0))
    obj.tag = "t"
    back = pickle.loads(pickle.dumps(obj))
    assert type(back) is type(obj)
    assert back.tag == "t"
    np.testing.assert_array_equal(back.arr, obj.arr)


def test_c_type_is_the_base_when_built() -> None:
    if not HAVE_C_BUFFER_EXPORT:
        pytest.skip(NO_C_REASON)
    assert BufferExporterBase is CBufferExporter
    assert CBufferExporter.__flags__ & (1 << 10)  # Py_TPFLAGS_BASETYPE
    assert CBufferExporter.__flags__ & (1 << 14)  # Py_TPFLAGS_HAVE_GC
    assert bufexport.HAVE_BUFFER_EXPORT


@pytest.mark.skipif(PY312, reason="checks the fallback's behaviour on Python < 3.12")
def test_py_fallback_without_pep688_refuses_quietly() -> None:
    """Below 3.12 the fallback has no buffer protocol: memoryview raises TypeError, nothing else breaks."""
    obj = make_classes(PyBufferExporter)["Holder"](np.arange(3.0))
    with pytest.raises(TypeError):
        memoryview(obj)
    np.testing.assert_array_equal(np.asarray(obj), [0.0, 1.0, 2.0])  # via __array_interface__
    assert bufexport.HAVE_BUFFER_EXPORT == HAVE_C_BUFFER_EXPORT


@pytest.mark.skipif(not PY312, reason="collections.abc.Buffer is new in Python 3.12")
def test_is_a_collections_abc_buffer(cls: dict[str, type]) -> None:
    from collections.abc import Buffer  # type: ignore[attr-defined,unused-ignore]

    assert isinstance(cls["Holder"](np.arange(3)), Buffer)


# Module-level subclasses, so pickle can find them by name.
class _PicklableC(CBufferExporter or object):  # type: ignore[misc]
    def __init__(self, arr: Any) -> None:
        self.arr = arr

    def _host_buffer_target(self) -> Any:
        return self.arr


class _PicklablePy(PyBufferExporter):
    def __init__(self, arr: Any) -> None:
        self.arr = arr

    def _host_buffer_target(self) -> Any:
        return self.arr


_PICKLABLE: dict[Any, type] = {CBufferExporter: _PicklableC, PyBufferExporter: _PicklablePy}
