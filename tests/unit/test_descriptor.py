"""descriptor_from_dict / describe: every validation rule of a CAI dict, the derived properties of
CAIDescriptor, and (with hypothesis) agreement with numpy for arbitrary strided host views."""

from __future__ import annotations

import warnings
from typing import Any

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import cai_mpi
from cai_mpi._src.arrays.operands import host_view
from cai_mpi._src.core.descriptor import CAIDescriptor, describe, descriptor_from_dict, may_self_overlap
from cai_mpi._src.errors import CAI_PREFIX, CAIError
from cai_mpi.testing import FakeCudaArray

pytestmark = pytest.mark.one_wheel  # (CAI descriptors are pure Python: the MPI library cannot change its outcome)

PTR = 0x7F00_0000_1000  # any non-zero address: descriptor_from_dict never dereferences it


def cai(**changes: Any) -> dict[str, Any]:
    """A valid v3 dict of a (2, 3) float32 C-ordered array, with ``changes`` applied (None-valued
    changes are kept: use ``drop`` to remove a key)."""
    d: dict[str, Any] = {"shape": (2, 3), "typestr": "<f4", "data": (PTR, False), "version": 3}
    d.update(changes)
    return d


def drop(d: dict[str, Any], key: str) -> dict[str, Any]:
    d = dict(d)
    del d[key]
    return d


def refuse(d: Any, match: str) -> CAIError:
    """descriptor_from_dict(d) must raise a CAIError whose message matches ``match``."""
    with pytest.raises(CAIError, match=match) as info:
        descriptor_from_dict(d)
    err = info.value
    assert str(err).startswith("__cuda_array_interface__: ")
    assert isinstance(err, BufferError)
    assert isinstance(err, cai_mpi.CaiMpiError)
    return err


def accept(d: Any) -> CAIDescriptor:
    """descriptor_from_dict(d) without any warning."""
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        return descriptor_from_dict(d)


# ---------------------------------------------------------------------------------------------
# the error class


def test_caierror_is_bufferror_and_caimpierror_with_prefix() -> None:
    err = CAIError("'shape' is wrong")
    assert str(err) == "__cuda_array_interface__: 'shape' is wrong"
    assert isinstance(err, BufferError)
    assert isinstance(err, cai_mpi.CaiMpiError)
    assert cai_mpi.CAIError is CAIError
    # the prefix is never doubled
    assert str(CAIError(CAI_PREFIX + "x")) == "__cuda_array_interface__: x"


def test_a_valid_dict_gives_the_exact_descriptor() -> None:
    d = accept(cai())
    assert d == CAIDescriptor(
        ptr=PTR, shape=(2, 3), typestr="<f4", readonly=False, strides=None, descr=None, version=3, stream=None
    )


# ---------------------------------------------------------------------------------------------
# required keys


@pytest.mark.parametrize("key", ["shape", "typestr", "data", "version"])
def test_each_required_key_missing_is_refused(key: str) -> None:
    err = refuse(drop(cai(), key), "missing required key")
    assert repr(key) in str(err)


def test_all_required_keys_missing_are_named() -> None:
    err = refuse({"strides": None}, "missing required key")
    assert "['shape', 'typestr', 'data', 'version']" in str(err)


@pytest.mark.parametrize("obj", [None, [("shape", (1,))], "shape", 3])
def test_non_mapping_is_refused(obj: Any) -> None:
    refuse(obj, f"expected a dict, got {type(obj).__name__}")


# ---------------------------------------------------------------------------------------------
# shape


@pytest.mark.parametrize(
    "shape", [3, "23", None, (2, -1), (-1,), (True, 3), (2, False), (2.0, 3), (2, None), {2: 3}, b"\x02"]
)
def test_bad_shape_is_refused(shape: Any) -> None:
    refuse(cai(shape=shape, data=(PTR, False)), "'shape' must be a tuple of non-negative ints")


def test_shape_numpy_ints_and_lists_are_normalised_to_a_tuple_of_python_ints() -> None:
    d = accept(cai(shape=[np.int64(2), np.uint8(3)]))
    assert d.shape == (2, 3)
    assert all(type(n) is int for n in d.shape)


@pytest.mark.parametrize("shape", [(), (0,), (5,), (1, 1, 1), (0, 7), (2, 3, 4, 5)])
def test_valid_shapes(shape: tuple[int, ...]) -> None:
    d = accept(cai(shape=shape))
    assert d.shape == shape
    assert d.ndim == len(shape)
    assert d.size == int(np.prod(shape))


# ---------------------------------------------------------------------------------------------
# typestr and descr


@pytest.mark.parametrize("typestr", ["<x4", "abc", "", "<f3", "f4[3]"])
def test_invalid_typestr_is_refused(typestr: str) -> None:
    err = refuse(cai(typestr=typestr), "is not a numpy array-interface type")
    assert f"'typestr' {typestr!r}" in str(err)


@pytest.mark.parametrize("typestr", [4, None, b"<f4", np.dtype("f4")])
def test_non_str_typestr_is_refused(typestr: Any) -> None:
    refuse(cai(typestr=typestr), "'typestr' must be a str")


@pytest.mark.parametrize("typestr", ["|O", "|O8", "O"])
def test_object_typestr_is_refused(typestr: str) -> None:
    refuse(cai(typestr=typestr), "holds Python objects")


def test_object_field_in_structured_descr_is_refused() -> None:
    refuse(cai(typestr="|V16", descr=[("a", "<f8"), ("o", "|O")]), "holds Python objects")


@pytest.mark.parametrize("typestr", ["|V0", "|S0"])
def test_zero_itemsize_typestr_is_refused(typestr: str) -> None:
    refuse(cai(typestr=typestr), "has itemsize 0")


@pytest.mark.parametrize(
    ("typestr", "itemsize"),
    [("<f4", 4), (">f8", 8), ("|u1", 1), ("<c16", 16), ("|V12", 12), ("|b1", 1), ("<i2", 2), ("<M8[ns]", 8)],
)
def test_valid_typestrs(typestr: str, itemsize: int) -> None:
    d = accept(cai(typestr=typestr))
    assert d.typestr == typestr
    assert d.dtype == np.dtype(typestr)
    assert d.dtype.str == typestr
    assert d.itemsize == itemsize
    assert d.descr is None


STRUCTURED = [
    np.dtype([("a", "<f4"), ("b", "<i8")]),
    np.dtype([("x", ">f8"), ("y", "|u1", (3,))]),
    np.dtype([("p", [("q", "<i2"), ("r", ">c8")]), ("s", "|S5")]),  # nested
    np.dtype([("m", [("n", [("o", "<u4", (2, 2))])]), ("z", "<f2")]),  # doubly nested, subarray
    np.dtype([(("a title", "t"), "<f4"), ("u", "<i4")]),  # a titled field
]


@pytest.mark.parametrize("dtype", STRUCTURED, ids=str)
def test_structured_descr_round_trips(dtype: np.dtype[Any]) -> None:
    d = accept(cai(typestr=dtype.str, descr=dtype.descr))
    assert d.dtype == dtype
    assert d.typestr == dtype.str == f"|V{dtype.itemsize}"
    assert d.itemsize == dtype.itemsize
    out = d.to_dict()
    assert out["descr"] == dtype.descr
    assert np.dtype(out["descr"]) == dtype
    again = accept(out)
    assert again == d
    assert again.dtype == dtype


def test_default_descr_is_ignored() -> None:
    d = accept(cai(typestr="<f4", descr=[("", "<f4")]))
    assert d.descr is None
    assert d.dtype == np.dtype("<f4")
    assert "descr" not in d.to_dict()


def test_default_descr_never_overrides_typestr() -> None:
    # [('', x)] restates typestr; typestr is what counts
    d = accept(cai(typestr="<f8", descr=[("", "<f4")]))
    assert d.dtype == np.dtype("<f8")
    assert d.typestr == "<f8"
    assert d.descr is None


def test_structured_descr_with_non_void_typestr_is_refused() -> None:
    refuse(
        cai(typestr="<f8", descr=[("a", "<f4"), ("b", "<f4")]),
        r"'typestr' '<f8' does not match 'descr' itemsize 8",
    )


def test_structured_descr_with_wrong_void_size_is_refused() -> None:
    refuse(cai(typestr="|V12", descr=[("a", "<f4"), ("b", "<f4")]), "does not match 'descr' itemsize 8")


@pytest.mark.parametrize("typestr", ["|Vabc", "xV8"])
def test_garbage_void_typestr_with_structured_descr_is_refused(typestr: str) -> None:
    refuse(cai(typestr=typestr, descr=[("a", "<f4"), ("b", "<f4")]), "'typestr'")


def test_invalid_descr_is_refused_and_named() -> None:
    err = refuse(
        cai(typestr="|V8", descr=[("a", "nonsense"), ("b", "<f4")]), "is not a numpy array-interface type"
    )
    assert "'descr'" in str(err)


def test_structured_typestr_is_normalised_to_numpy_spelling() -> None:
    dtype = np.dtype([("a", "<f4"), ("b", "<f4")])
    d = accept(cai(typestr="<V8", descr=dtype.descr))
    assert d.typestr == "|V8"
    assert d.dtype == dtype


def test_padded_struct_keeps_offsets_and_itemsize() -> None:
    # numpy's descr for a padded struct has '' padding fields; the named fields must keep their offsets
    dtype = np.dtype({"names": ["a", "b"], "formats": ["u1", "<f8"], "offsets": [0, 8]})
    d = accept(cai(typestr=dtype.str, descr=dtype.descr))
    assert d.itemsize == 16
    assert d.dtype.fields is not None
    assert d.dtype.fields["a"][1] == 0
    assert d.dtype.fields["b"][1] == 8


# ---------------------------------------------------------------------------------------------
# data


@pytest.mark.parametrize(
    "data",
    [
        None,
        PTR,
        (PTR,),
        (PTR, False, 0),
        (float(PTR), False),
        (str(PTR), False),
        (PTR, 0),
        (PTR, None),
        (True, False),
        (PTR, "False"),
        {PTR: False},
    ],
)
def test_bad_data_is_refused(data: Any) -> None:
    refuse(cai(data=data), r"'data' must be a \(pointer: int, readonly: bool\) tuple")


def test_negative_pointer_is_refused() -> None:
    refuse(cai(data=(-8, False)), "'data' pointer must be non-negative, got -8")


@pytest.mark.parametrize(
    ("shape", "msg"),
    [
        ((2, 3), r"shape \(2, 3\) has 6 elements"),
        ((1,), r"shape \(1,\) has 1 elements"),
        ((), r"shape \(\) has 1 elements"),
    ],
)
def test_null_pointer_with_elements_is_refused(shape: tuple[int, ...], msg: str) -> None:
    refuse(cai(shape=shape, data=(0, False)), r"'data' pointer is 0 \(NULL\) but " + msg)


@pytest.mark.parametrize("shape", [(0,), (3, 0), (0, 0, 5)])
def test_null_pointer_is_allowed_for_zero_size(shape: tuple[int, ...]) -> None:
    d = accept(cai(shape=shape, data=(0, False)))
    assert (d.ptr, d.size, d.nbytes, d.byte_extent) == (0, 0, 0, (0, 0))


@pytest.mark.parametrize("readonly", [True, False, np.True_, np.False_])
def test_data_readonly_flag_and_numpy_scalars(readonly: Any) -> None:
    d = accept(cai(data=[np.uint64(PTR), readonly]))
    assert d.ptr == PTR
    assert type(d.ptr) is int
    assert d.readonly is bool(readonly)


# ---------------------------------------------------------------------------------------------
# version


@pytest.mark.parametrize("version", [0, 1, 2, 3, np.int32(2)])
def test_known_versions_are_accepted_without_warning(version: Any) -> None:
    d = accept(cai(version=version))
    assert d.version == int(version)
    assert type(d.version) is int


def test_version_4_is_accepted_with_a_warning_and_read_as_v3() -> None:
    with pytest.warns(UserWarning, match=r"^__cuda_array_interface__: version 4 is newer than 3"):
        d = descriptor_from_dict(cai(version=4, stream=7))
    assert d.stream == 7
    assert d.shape == (2, 3)


@pytest.mark.parametrize("version", [-1, -3, True, False, 3.0, "3", None])
def test_bad_version_is_refused(version: Any) -> None:
    refuse(cai(version=version), "'version' must be a non-negative int")


# ---------------------------------------------------------------------------------------------
# strides


def test_absent_and_none_strides_mean_c_order() -> None:
    assert accept(cai()).strides is None
    assert accept(cai(strides=None)).strides is None


@pytest.mark.parametrize(
    ("shape", "strides"),
    [
        ((2, 3), (12, 4)),
        ((2, 3), [12, 4]),
        ((4,), (4,)),
        ((2, 1, 3), (12, 999, 4)),
        ((1, 5), (-7, 4)),
        ((2, 0), (-4, 100)),
        ((0,), (12,)),
        ((), ()),
    ],
)
def test_c_contiguous_strides_are_normalised_to_none(shape: tuple[int, ...], strides: Any) -> None:
    d = accept(cai(shape=shape, strides=strides))
    assert d.strides is None
    assert d.is_c_contiguous


def test_fortran_strides_are_kept() -> None:
    d = accept(cai(shape=(2, 3), strides=(4, 8)))
    assert d.strides == (4, 8)
    assert d.is_f_contiguous
    assert not d.is_c_contiguous
    assert d.is_contiguous


@pytest.mark.parametrize("strides", [(-12, 4), (12, -4), (-12, -4), (24, 8), (0, 4), (4, 0)])
def test_negative_and_gapped_strides_are_kept(strides: tuple[int, int]) -> None:
    d = accept(cai(strides=list(strides)))
    assert d.strides == strides
    assert type(d.strides) is tuple
    assert not d.is_c_contiguous


@pytest.mark.parametrize("strides", [(12,), (12, 4, 4), ()])
def test_strides_of_wrong_length_are_refused(strides: tuple[int, ...]) -> None:
    refuse(cai(strides=strides), r"must have one entry per dimension of shape \(2, 3\)")


@pytest.mark.parametrize("strides", [12, "12,4", (12.0, 4), (12, True), (None, 4), (12, "4")])
def test_non_int_strides_are_refused(strides: Any) -> None:
    refuse(cai(strides=strides), "'strides' must be None or a tuple of ints")


def test_numpy_int_strides_become_python_ints() -> None:
    d = accept(cai(strides=(np.int64(4), np.intp(8))))
    assert d.strides == (4, 8)
    assert all(type(s) is int for s in d.strides)


# ---------------------------------------------------------------------------------------------
# mask


def test_mask_none_is_accepted() -> None:
    assert accept(cai(mask=None)).shape == (2, 3)


@pytest.mark.parametrize("mask", [FakeCudaArray(np.zeros((2, 3), bool)), np.zeros((2, 3), bool), 0, False])
def test_mask_not_none_is_refused(mask: Any) -> None:
    err = refuse(cai(mask=mask), "'mask' must be None")
    assert type(mask).__name__ in str(err)


# ---------------------------------------------------------------------------------------------
# stream


def test_stream_zero_is_refused() -> None:
    refuse(cai(stream=0), r"'stream' 0 is forbidden by CAI v3 \(ambiguous\): use 1 for the legacy default")


@pytest.mark.parametrize("stream", [True, False, 1.0, "1", np.True_])
def test_non_int_stream_is_refused(stream: Any) -> None:
    refuse(cai(stream=stream), "'stream' must be None or an int handle")


@pytest.mark.parametrize("stream", [-1, -(2**63)])
def test_negative_stream_is_refused(stream: int) -> None:
    refuse(cai(stream=stream), f"'stream' must be a positive handle, got {stream}")


@pytest.mark.parametrize("stream", [1, 2, 3, 0x7F5A_0000_1000, 2**64 - 1, np.uint64(2**63)])
def test_positive_stream_handles_are_kept(stream: Any) -> None:
    d = accept(cai(stream=stream))
    assert d.stream == int(stream)
    assert type(d.stream) is int


def test_stream_none_or_absent_is_none() -> None:
    assert accept(cai(stream=None)).stream is None
    assert accept(cai()).stream is None


@pytest.mark.parametrize("version", [0, 1, 2])
@pytest.mark.parametrize("stream", [5, 0, -1, True])
def test_stream_key_in_a_pre_v3_dict_is_ignored_with_a_warning(version: int, stream: Any) -> None:
    with pytest.warns(
        UserWarning, match=rf"^__cuda_array_interface__: 'stream' key ignored in a version {version}"
    ):
        d = descriptor_from_dict(cai(version=version, stream=stream))
    assert d.stream is None


@pytest.mark.parametrize("version", [0, 1, 2])
def test_stream_none_in_a_pre_v3_dict_gives_no_warning(version: int) -> None:
    assert accept(cai(version=version, stream=None)).stream is None


# ---------------------------------------------------------------------------------------------
# describe()


class CountingExporter:
    def __init__(self, d: dict[str, Any]) -> None:
        self.d = d
        self.reads = 0

    @property
    def __cuda_array_interface__(self) -> dict[str, Any]:
        self.reads += 1
        return dict(self.d)


def test_describe_reads_the_property_exactly_once() -> None:
    obj = CountingExporter(cai(stream=2, strides=(4, 8)))
    d = describe(obj)
    assert obj.reads == 1
    assert (d.ptr, d.shape, d.strides, d.stream) == (PTR, (2, 3), (4, 8), 2)


def test_describe_reads_a_fake_cuda_array_once() -> None:
    x = FakeCudaArray(np.arange(6, dtype="<i4").reshape(2, 3))
    d = describe(x)
    assert x.cai_reads == 1
    assert (d.ptr, d.shape, d.typestr, d.strides, d.stream, d.version) == (
        x.ptr,
        (2, 3),
        "<i4",
        None,
        None,
        3,
    )
    assert np.array_equal(host_view(d), np.arange(6).reshape(2, 3))


def test_describe_refusal_also_reads_once() -> None:
    obj = CountingExporter(cai(stream=0))
    with pytest.raises(CAIError):
        describe(obj)
    assert obj.reads == 1


@pytest.mark.parametrize("obj", [3, None, "x", np.zeros(3), object()])
def test_describe_of_a_non_exporter_is_a_type_error(obj: Any) -> None:
    with pytest.raises(
        TypeError, match=f"^{type(obj).__name__} object does not export __cuda_array_interface__$"
    ):
        describe(obj)


def test_describe_of_a_v0_fake_array_without_strides_or_mask() -> None:
    x = FakeCudaArray(np.ones((3, 2), ">f8"), version=0)
    cai_dict = x.__cuda_array_interface__
    assert "strides" not in cai_dict
    assert "mask" not in cai_dict
    d = describe(x)
    assert (d.version, d.typestr, d.strides, d.stream) == (0, ">f8", None, None)


# ---------------------------------------------------------------------------------------------
# derived properties


def test_dtype_itemsize_size_nbytes() -> None:
    d = accept(cai(shape=(4, 5, 6), typestr="<c16"))
    assert d.dtype == np.dtype("<c16")
    assert (d.itemsize, d.size, d.nbytes, d.ndim) == (16, 120, 1920, 3)
    assert d.byte_strides == (480, 96, 16)


def test_c_and_f_contiguity() -> None:
    c = accept(cai(shape=(2, 3)))
    assert (c.is_c_contiguous, c.is_f_contiguous) == (True, False)
    f = accept(cai(shape=(2, 3), strides=(4, 8)))
    assert (f.is_c_contiguous, f.is_f_contiguous) == (False, True)
    both = accept(cai(shape=(1, 3)))
    assert (both.is_c_contiguous, both.is_f_contiguous) == (True, True)
    column = accept(cai(shape=(3, 1), strides=(4, 77)))
    assert (column.strides, column.is_c_contiguous, column.is_f_contiguous) == (None, True, True)
    neither = accept(cai(shape=(2, 3), strides=(24, 4)))
    assert (neither.is_c_contiguous, neither.is_f_contiguous, neither.is_contiguous) == (False, False, False)
    empty = accept(cai(shape=(0, 3), strides=(4, 8)))
    assert (empty.is_c_contiguous, empty.is_f_contiguous) == (True, True)


@pytest.mark.parametrize(
    ("shape", "strides", "itemsize", "extent"),
    [
        ((3, 4), (-32, 8), 8, (-64, 32)),
        ((3, 4), (32, -8), 8, (-24, 72)),
        ((3, 4), (-32, -8), 8, (-88, 8)),
        ((5,), (-4,), 4, (-16, 4)),
        ((2, 3), None, 4, (0, 24)),
        ((2, 3), (4, 8), 4, (0, 24)),
        ((4, 3), (0, 4), 4, (0, 12)),
        ((0, 4), (-32, 8), 8, (0, 0)),
        ((), None, 8, (0, 8)),
    ],
)
def test_byte_extent(
    shape: tuple[int, ...], strides: tuple[int, ...] | None, itemsize: int, extent: tuple[int, int]
) -> None:
    d = CAIDescriptor(ptr=PTR, shape=shape, typestr=f"<u{itemsize}", strides=strides)
    assert d.byte_extent == extent


def test_transposed_f_order_becomes_c_order() -> None:
    f = accept(cai(shape=(2, 3), strides=(4, 8), stream=9))
    t = f.transposed()
    assert (t.shape, t.strides, t.ptr, t.typestr, t.stream) == ((3, 2), None, PTR, "<f4", 9)
    back = t.transposed()
    assert (back.shape, back.strides) == ((2, 3), (4, 8))


def test_transposed_of_a_strided_view() -> None:
    d = accept(cai(shape=(2, 3, 4), strides=(-96, 32, 4)))
    t = d.transposed()
    assert (t.shape, t.strides) == ((4, 3, 2), (4, 32, -96))


def test_to_dict_is_a_valid_v3_dict() -> None:
    d = accept(cai(shape=(2, 3), strides=(-12, 4), stream=0xABC0, data=(PTR, True)))
    out = d.to_dict()
    assert out == {
        "shape": (2, 3),
        "typestr": "<f4",
        "data": (PTR, True),
        "version": 3,
        "strides": (-12, 4),
        "stream": 0xABC0,
    }
    assert accept(out) == d


def test_to_dict_of_c_order_has_strides_none() -> None:
    d = CAIDescriptor(ptr=PTR, shape=(2, 3), typestr="<f4", strides=(12, 4))
    out = d.to_dict()
    assert out["strides"] is None
    assert accept(out) == d.replace(strides=None)


def test_to_dict_accepted_from_older_versions() -> None:
    d = accept(cai(version=1))
    assert d.version == 1
    out = d.to_dict()
    assert out["version"] == 3
    assert accept(out) == d.replace(version=3)


def test_for_new_buffer_c_and_fortran() -> None:
    c = CAIDescriptor.for_new_buffer(PTR, (2, 3), np.dtype("<f8"))
    assert (c.strides, c.typestr, c.descr, c.readonly, c.version, c.stream) == (
        None,
        "<f8",
        None,
        False,
        3,
        None,
    )
    f = CAIDescriptor.for_new_buffer(PTR, (2, 3, 4), np.dtype("<f8"), fortran=True, readonly=True)
    assert f.strides == (8, 16, 48)
    assert f.readonly is True
    assert (f.is_f_contiguous, f.is_c_contiguous) == (True, False)
    assert f.byte_extent == (0, 192)
    # F order of a shape that is also C-contiguous is normalised to None
    for shape in [(5,), (1, 5), (5, 1, 1), (0, 3), ()]:
        assert CAIDescriptor.for_new_buffer(PTR, shape, np.dtype("f4"), fortran=True).strides is None, shape


def test_for_new_buffer_structured() -> None:
    dtype = STRUCTURED[2]
    d = CAIDescriptor.for_new_buffer(PTR, [np.int64(3)], dtype)
    assert d.shape == (3,)
    assert d.dtype == dtype
    assert d.typestr == dtype.str
    assert accept(d.to_dict()) == d


def test_may_self_overlap_function() -> None:
    assert may_self_overlap((3,), (0,), 8) is True
    assert may_self_overlap((2, 2), (8, 8), 8) is True
    assert may_self_overlap((4,), (4,), 8) is True
    assert may_self_overlap((2, 2), (16, 8), 8) is False
    assert may_self_overlap((2, 2), (8, 16), 8) is False
    assert may_self_overlap((2, 2), (-16, 8), 8) is False
    # interleaved rows do not overlap, but the test is only sufficient: True ("may") is allowed
    assert may_self_overlap((3, 2), (16, 24), 8) is True
    assert may_self_overlap((3, 2), (16, 40), 8) is False
    assert may_self_overlap((1, 1), (0, 0), 8) is False
    assert may_self_overlap((0, 5), (0, 0), 8) is False
    assert may_self_overlap((5, 1), (8, 0), 8) is False


def test_may_self_overlap_property() -> None:
    assert accept(cai()).may_self_overlap is False
    assert accept(cai(strides=(0, 4))).may_self_overlap is True
    assert accept(cai(strides=(4, 8))).may_self_overlap is False


# ---------------------------------------------------------------------------------------------
# property-based: numpy views


VIEW_DTYPES = [
    np.dtype("u1"),
    np.dtype("<i2"),
    np.dtype(">i4"),
    np.dtype("<f8"),
    np.dtype(">c16"),
    np.dtype("|V3"),
    np.dtype([("a", "<f4"), ("b", "|u1")]),
    np.dtype([("n", [("x", ">i2"), ("y", "<f8", (2,))]), ("z", "|S3")]),
]


@st.composite
def numpy_views(draw: st.DrawFn) -> tuple[np.ndarray[Any, Any], np.ndarray[Any, Any]]:
    """(base, view): a random C-ordered base (random bytes) and a slice/transposed view of it."""
    dtype = draw(st.sampled_from(VIEW_DTYPES))
    shape = tuple(draw(st.lists(st.integers(0, 5), min_size=0, max_size=4)))
    nbytes = int(np.prod(shape)) * dtype.itemsize
    raw = draw(st.binary(min_size=nbytes, max_size=nbytes))
    base = np.frombuffer(bytearray(raw), np.uint8).view(dtype).reshape(shape)
    index = []
    for n in shape:
        start = draw(st.integers(-n - 1, n + 1))
        stop = draw(st.integers(-n - 1, n + 1) | st.none())
        step = draw(st.sampled_from([1, 1, 2, 3, -1, -2, -3]))
        index.append(slice(start, stop, step))
    view = base[(*index, Ellipsis)]  # the Ellipsis keeps a 0-d result a view, not a scalar
    if view.ndim > 1 and draw(st.booleans()):
        view = view.transpose(draw(st.permutations(range(view.ndim))))
    return base, view


def cai_from_numpy(arr: np.ndarray[Any, Any], version: int = 3) -> dict[str, Any]:
    ai = arr.__array_interface__
    d = {
        "shape": ai["shape"],
        "typestr": ai["typestr"],
        "data": (arr.ctypes.data, ai["data"][1]),
        "strides": ai["strides"],
        "version": version,
    }
    if "descr" in ai:
        d["descr"] = ai["descr"]
    return d


@settings(max_examples=250, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(numpy_views())
def test_numpy_views_match_numpy(bv: tuple[np.ndarray[Any, Any], np.ndarray[Any, Any]]) -> None:
    _, view = bv
    d = accept(cai_from_numpy(view))
    assert d.dtype == view.dtype
    assert d.shape == view.shape
    if view.size:  # dimensions of length 1 may carry any stride
        assert [s for n, s in zip(d.shape, d.byte_strides, strict=True) if n > 1] == [
            s for n, s in zip(view.shape, view.strides, strict=True) if n > 1
        ]
    assert d.is_c_contiguous == view.flags.c_contiguous
    assert d.is_f_contiguous == view.flags.f_contiguous
    assert (d.strides is None) == view.flags.c_contiguous
    if view.size:
        low, high = np.lib.array_utils.byte_bounds(view)
        assert (d.ptr + d.byte_extent[0], d.ptr + d.byte_extent[1]) == (low, high)
    else:
        assert d.byte_extent == (0, 0)
    assert d.may_self_overlap is False
    assert may_self_overlap(view.shape, view.strides, view.itemsize) is False
    hv = host_view(d)
    assert hv.dtype == view.dtype
    assert hv.shape == view.shape
    assert hv.tobytes() == view.tobytes()
    if view.size:
        assert hv.ctypes.data == view.ctypes.data
        assert hv.strides == d.byte_strides
    # to_dict round trip keeps everything
    assert accept(d.to_dict()) == d


@settings(max_examples=100, deadline=None)
@given(numpy_views(), st.integers(2, 4), st.booleans())
def test_broadcast_views_may_overlap(
    bv: tuple[np.ndarray[Any, Any], np.ndarray[Any, Any]], k: int, inner: bool
) -> None:
    _, view = bv
    if view.size == 0:
        view = np.zeros(3, view.dtype)
    target = (*view.shape, k) if inner else (k, *view.shape)
    src = view[..., None] if inner else view
    b = np.broadcast_to(src, target)
    d = accept(cai_from_numpy(b))
    assert d.readonly is True
    assert d.may_self_overlap is True
    assert may_self_overlap(b.shape, b.strides, b.itemsize) is True
    hv = host_view(d)
    assert hv.flags.writeable is False
    assert hv.tobytes() == b.tobytes()
