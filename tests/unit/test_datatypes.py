"""Byte-based derived datatypes that let MPI read or write strided host arrays in place."""

from __future__ import annotations

from typing import Any

import numpy as np
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st
from mpi4py import MPI

from cai_mpi._src.arrays.operands import host_view
from cai_mpi._src.core.descriptor import descriptor_from_numpy
from cai_mpi._src.transport.datatypes import describable, strided_type

# =============================================================================================
# strided_type through MPI.COMM_SELF


@st.composite
def strided_views(draw: st.DrawFn) -> tuple[np.ndarray[Any, Any], np.ndarray[Any, Any]]:
    itemsize = draw(st.sampled_from([1, 2, 3, 4, 8, 16]))
    dtype = np.dtype(f"V{itemsize}")
    shape = tuple(draw(st.lists(st.integers(1, 5), min_size=0, max_size=4)))
    nbytes = int(np.prod(shape)) * itemsize
    base = np.frombuffer(bytearray(draw(st.binary(min_size=nbytes, max_size=nbytes))), dtype).reshape(shape)
    index = tuple(
        slice(draw(st.integers(0, n)), None, draw(st.sampled_from([1, 2, 3, -1, -2]))) for n in shape
    )
    view = base[(*index, Ellipsis)]
    if view.ndim > 1 and draw(st.booleans()):
        view = view.transpose(draw(st.permutations(range(view.ndim))))
    return base, view


def mpi_strided_buffer(view: np.ndarray[Any, Any]) -> list[Any]:
    assume(describable(view.shape, view.strides))  # stride -1 layouts are copied, not described
    desc = descriptor_from_numpy(view)
    dt, low = strided_type(view.shape, desc.byte_strides, view.itemsize)
    if view.size:
        assert low == desc.byte_extent[0]
        extent = desc.byte_extent[1] - desc.byte_extent[0]
        assert dt.Get_true_extent() == (0, extent)
        ptr = view.ctypes.data
    else:
        extent, ptr = 0, view.ctypes.data
    assert dt.Get_size() == view.nbytes
    return [MPI.buffer.fromaddress(ptr + low, extent), 1, dt]


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(strided_views())
def test_strided_type_sends_a_view(bv: tuple[np.ndarray[Any, Any], np.ndarray[Any, Any]]) -> None:
    base, view = bv
    before = base.tobytes()
    recv = bytearray(view.nbytes + 8)
    MPI.COMM_SELF.Sendrecv(mpi_strided_buffer(view), 0, 5, [recv, view.nbytes, MPI.BYTE], 0, 5)
    assert bytes(recv[: view.nbytes]) == np.ascontiguousarray(view).tobytes()
    assert bytes(recv[view.nbytes :]) == bytes(8)
    assert base.tobytes() == before


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(strided_views(), st.data())
def test_strided_type_receives_into_a_view(
    bv: tuple[np.ndarray[Any, Any], np.ndarray[Any, Any]], data: st.DataObject
) -> None:
    base, view = bv
    payload = data.draw(st.binary(min_size=view.nbytes, max_size=view.nbytes))
    expected = base.copy()
    expected_view = (
        np.ndarray(
            view.shape,
            view.dtype,
            buffer=expected,
            offset=view.ctypes.data - base.ctypes.data,
            strides=view.strides,
        )
        if view.size
        else expected[:0]
    )
    if view.size:
        expected_view[...] = np.frombuffer(payload, view.dtype).reshape(view.shape)
    MPI.COMM_SELF.Sendrecv([bytearray(payload), len(payload), MPI.BYTE], 0, 6, mpi_strided_buffer(view), 0, 6)
    assert np.ascontiguousarray(view).tobytes() == payload
    assert base.tobytes() == expected.tobytes()


def test_strided_type_is_cached_and_low_is_the_lowest_byte() -> None:
    a, low_a = strided_type((3, 4), (-32, 8), 8)
    b, low_b = strided_type((3, 4), (-32, 8), 8)
    assert a is b
    assert low_a == low_b == -64
    assert a.Get_size() == 96
    assert a.Get_true_extent() == (0, 96)
    _, low = strided_type((2, 3), (24, -8), 8)
    assert low == -16


def test_strided_type_of_a_zero_size_view() -> None:
    dt, _ = strided_type((0, 4), (32, 8), 8)
    assert dt.Get_size() == 0
    recv = bytearray(4)
    MPI.COMM_SELF.Sendrecv([MPI.buffer.fromaddress(0, 0), 1, dt], 0, 7, [recv, 0, MPI.BYTE], 0, 7)
    assert bytes(recv) == bytes(4)


def test_host_view_round_trips_a_strided_descriptor() -> None:
    base = np.arange(24, dtype="<i4").reshape(4, 6)
    view = base[::-2, 1::2].T
    d = descriptor_from_numpy(view)
    hv = host_view(d)
    assert hv.tobytes() == view.tobytes()
    assert hv.strides == view.strides
    assert hv.flags.writeable
    assert host_view(d, readonly=True).flags.writeable is False
    hv[0, 0] = -1
    assert base[3, 1] == -1


def test_describable_refuses_byte_stride_minus_one() -> None:
    """Open MPI 5.0 mishandles hvector stride -1; such layouts must take the copy path."""
    assert not describable((4, 3), (-1, 4))
    assert describable((1, 3), (-1, 4))  # a length-1 dimension's stride is never used
    assert describable((4,), (-2,))

