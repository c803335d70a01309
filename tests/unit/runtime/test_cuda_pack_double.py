"""Packing and unpacking strided device arrays without CuPy (cai_mpi._src.runtime.cuda on the CUDA driver double):
every layout a CAI exporter may describe (reversed, broadcast, transposed, overlapping, 0-d, pitches over CUDA's
limit, every item size) gives exactly numpy's bytes, through copies the real CUDA driver accepts."""

from __future__ import annotations

import gc
from collections.abc import Callable
from typing import Any

import numpy as np
import pytest

from cai_mpi._src.config import reload_config
from cai_mpi._src.core.descriptor import CAIDescriptor
from cai_mpi._src.errors import CudaError
from cai_mpi._src.runtime.cuda import CudaRuntime
from cai_mpi.testing import CudaDriverDouble

FILL = 0xAB  # what device memory outside the array holds: an unpack must leave it as it is

Layout = Any  # a function from a C-ordered base array to a view of it


def base_array(itemsize: int, shape: tuple[int, ...] = (6, 7, 5)) -> np.ndarray[Any, Any]:
    """Distinct bytes in every element, as a ``(*shape, itemsize)`` array of bytes viewed as ``V{itemsize}``."""
    n = int(np.prod(shape)) * itemsize
    raw = (np.arange(n, dtype=np.uint64) * 7 + 3).astype(np.uint8)
    return raw.view(f"V{itemsize}").reshape(shape)


LAYOUTS: dict[str, Layout] = {
    "reversed": lambda b: b[0, 0, ::-1],
    "reversed-columns": lambda b: b[0, :, ::-1],
    "reversed-rows": lambda b: b[1, ::-1],
    "every-other-reversed": lambda b: b[2, ::-2, ::3],
    "both-reversed": lambda b: b[3, ::-1, ::-1],
    "all-axes-reversed-and-stepped": lambda b: b[::-2, 1::2, ::-3],
    "transposed": lambda b: b[0].T,
    "transposed-3d": lambda b: b.transpose(2, 0, 1),
    "transposed-reversed": lambda b: b[::-1, :, 1].T,
    "column": lambda b: b[:, 3, 2],
    "0-d": lambda b: b[1, 2, 3, ...],
    "one-element": lambda b: b[4:5, 2:3, ::-1][:, :, :1],
    "3d-slice": lambda b: b[1:5:2, ::3, 1:4],
    "inner-contiguous-rows-reversed": lambda b: b[::-1, 2],
}

BROADCASTS: dict[str, Layout] = {
    "broadcast-rows": lambda b: np.broadcast_to(b[0, 0], (4, 5)),
    "broadcast-columns": lambda b: np.broadcast_to(b[0, :5, 1:2], (5, 6)),
    "broadcast-scalar": lambda b: np.broadcast_to(b[2, 3, 4, ...], (3, 4)),
    "broadcast-reversed": lambda b: np.broadcast_to(b[1, ::-2, 3][:, None], (4, 3))[:, ::-1],
    "sliding-windows": lambda b: np.lib.stride_tricks.sliding_window_view(b[0, 0], 3),
    "middle-axis-broadcast": lambda b: np.broadcast_to(b[1, :3, None, ::-2], (3, 4, 3)),
}


@pytest.fixture
def d(make_double: Callable[..., CudaDriverDouble]) -> CudaDriverDouble:
    return make_double(1, install=False)


class OnDevice:
    """``base``'s bytes in device memory of the double, and descriptors of views of it."""

    def __init__(self, rt: CudaRuntime, d: CudaDriverDouble, base: np.ndarray[Any, Any]) -> None:
        self.rt, self.d, self.base = rt, d, base
        self.buf = rt.alloc_device(base.nbytes, 0)
        d.write_device(self.buf.ptr, base.tobytes())

    def descriptor(self, view: np.ndarray[Any, Any]) -> CAIDescriptor:
        offset = view.__array_interface__["data"][0] - self.base.__array_interface__["data"][0]
        assert 0 <= offset < self.base.nbytes
        return CAIDescriptor(ptr=self.buf.ptr + offset, shape=view.shape, typestr=f"|V{view.itemsize}",
                             strides=view.strides)

    def read(self) -> bytes:
        return self.d.read_device(self.buf.ptr, self.base.nbytes)


def pack_bytes(rt: CudaRuntime, d: CudaDriverDouble, desc: CAIDescriptor) -> bytes:
    s = rt.create_stream(0)
    packed = rt.pack(desc, 0, s)
    s.synchronize()
    return d.read_device(packed.ptr, desc.nbytes)


def unpack_into(rt: CudaRuntime, d: CudaDriverDouble, data: bytes, desc: CAIDescriptor) -> None:
    s = rt.create_stream(0)
    src = rt.alloc_device(len(data), 0)
    d.write_device(src.ptr, data)
    rt.unpack(src.ptr, desc, 0, s)
    s.synchronize()


def scattered(base: np.ndarray[Any, Any], view_of: Layout, values: np.ndarray[Any, Any]) -> bytes:
    """The bytes of ``base``'s memory, FILL everywhere, after numpy writes ``values`` into ``view_of`` it."""
    expected = np.full(base.nbytes, FILL, np.uint8).view(base.dtype).reshape(base.shape)
    view_of(expected)[...] = values
    return expected.tobytes()


@pytest.mark.parametrize("name", list(LAYOUTS) + list(BROADCASTS))
def test_pack_gives_numpys_bytes(rt: CudaRuntime, d: CudaDriverDouble, name: str) -> None:
    base = base_array(4)
    view = {**LAYOUTS, **BROADCASTS}[name](base)
    mem = OnDevice(rt, d, base)
    assert pack_bytes(rt, d, mem.descriptor(view)) == np.ascontiguousarray(view).tobytes()


@pytest.mark.parametrize("name", list(LAYOUTS))
def test_unpack_writes_exactly_the_elements(rt: CudaRuntime, d: CudaDriverDouble, name: str) -> None:
    """Unpack writes the array's elements and not one byte between or around them."""
    base = base_array(4)
    layout = LAYOUTS[name]
    mem = OnDevice(rt, d, np.full(base.nbytes, FILL, np.uint8).view(base.dtype).reshape(base.shape))
    values = np.ascontiguousarray(layout(base))
    unpack_into(rt, d, values.tobytes(), mem.descriptor(layout(mem.base)))
    assert mem.read() == scattered(base, layout, values)


@pytest.mark.parametrize("itemsize", range(1, 17))
@pytest.mark.parametrize("name", ["all-axes-reversed-and-stepped", "transposed-reversed", "broadcast-reversed"])
def test_every_item_size(rt: CudaRuntime, d: CudaDriverDouble, itemsize: int, name: str) -> None:
    base = base_array(itemsize)
    layout = {**LAYOUTS, **BROADCASTS}[name]
    mem = OnDevice(rt, d, base)
    view = layout(base)
    assert pack_bytes(rt, d, mem.descriptor(view)) == np.ascontiguousarray(view).tobytes()
    if name in LAYOUTS:
        d.write_device(mem.buf.ptr, bytes([FILL]) * base.nbytes)
        values = np.ascontiguousarray(view)
        unpack_into(rt, d, values.tobytes(), mem.descriptor(layout(mem.base)))
        assert mem.read() == scattered(base, layout, values)


@pytest.mark.parametrize("max_pitch", [16, 64, 1 << 20])
@pytest.mark.parametrize("name", ["reversed-columns", "every-other-reversed", "transposed-3d", "column", "3d-slice",
                                  "broadcast-columns"])
def test_pitches_over_the_devices_maximum(rt: CudaRuntime, d: CudaDriverDouble, max_pitch: int, name: str) -> None:
    """A GPU reports the largest pitch its 2-D copies take (CU_DEVICE_ATTRIBUTE_MAX_PITCH); wider strides still
    pack and unpack."""
    d.max_pitch = max_pitch
    base = base_array(8, (12, 9, 7))
    layout = {**LAYOUTS, **BROADCASTS}[name]
    mem = OnDevice(rt, d, base)
    view = layout(base)
    assert pack_bytes(rt, d, mem.descriptor(view)) == np.ascontiguousarray(view).tobytes()
    if name in LAYOUTS:
        d.write_device(mem.buf.ptr, bytes([FILL]) * base.nbytes)
        values = np.ascontiguousarray(view)
        unpack_into(rt, d, values.tobytes(), mem.descriptor(layout(mem.base)))
        assert mem.read() == scattered(base, layout, values)


def test_a_stride_over_two_gib(rt: CudaRuntime, d: CudaDriverDouble) -> None:
    """Rows 2**31 bytes apart: more than any GPU's maximum pitch (the double's device memory is sparse)."""
    gib2 = 1 << 31
    buf = rt.alloc_device(2 * gib2 + 64, 0)
    rows = [bytes(range(r * 16, r * 16 + 16)) for r in range(3)]
    for r, row in enumerate(rows):
        d.write_device(buf.ptr + r * gib2, row)
    desc = CAIDescriptor(ptr=buf.ptr + 2 * gib2 + 12, shape=(3, 4), typestr="<u4", strides=(-gib2, -4))
    expected = b"".join(np.frombuffer(row, "<u4")[::-1].tobytes() for row in reversed(rows))
    assert pack_bytes(rt, d, desc) == expected
    unpack_into(rt, d, bytes(range(100, 148)), desc)
    got = b"".join(d.read_device(buf.ptr + r * gib2, 16) for r in range(3))
    assert got == np.frombuffer(bytes(range(100, 148)), "<u4").reshape(3, 4)[::-1, ::-1].tobytes()
    assert d.read_device(buf.ptr + 16, 16) == bytes(16)  # nothing written past a row


def test_unpack_refuses_a_destination_whose_elements_share_memory(rt: CudaRuntime, d: CudaDriverDouble) -> None:
    buf = rt.alloc_device(64, 0)
    desc = CAIDescriptor(ptr=buf.ptr, shape=(4, 4), typestr="<u4", strides=(0, 4))
    with pytest.raises(ValueError, match=r"unpack.*share memory"):
        unpack_into(rt, d, bytes(64), desc)


def test_a_failed_copy_leaves_no_copy_running_into_freed_pinned_memory(
    rt: CudaRuntime, d: CudaDriverDouble, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Copies queued before one fails still write into the pinned memory in between: the error waits for them,
    so that memory is not freed under them."""
    d.max_pitch = 16  # one 1-D copy per element
    base = base_array(8, (12, 9, 7))
    mem = OnDevice(rt, d, base)
    desc = mem.descriptor(base[:, 3, 2])
    real_copy, issued = d.cuMemcpyAsync, []

    def third_fails(*args: Any) -> Any:
        issued.append(args)
        if len(issued) == 3:
            return (d.CUresult.CUDA_ERROR_INVALID_VALUE,)
        return real_copy(*args)

    s = rt.create_stream(0)
    real_free, busy_at_free = d.cuMemFreeHost, []

    def free(p: Any) -> Any:
        busy_at_free.append(d.cuStreamQuery(s.handle) != (d.CUresult.CUDA_SUCCESS,))
        return real_free(p)

    monkeypatch.setattr(d, "cuMemcpyAsync", third_fails)
    monkeypatch.setattr(d, "cuMemFreeHost", free)
    d.set_copy_delay(0.2)
    reload_config({"CAI_MPI_PINNED_POOL_BYTES": "0"})  # the pinned pool frees every block given back to it
    try:
        with pytest.raises(CudaError, match="cuMemcpyAsync failed with CUDA_ERROR_INVALID_VALUE"):
            rt.pack(desc, 0, s)
        gc.collect()
    finally:
        reload_config()
    assert busy_at_free == [False]  # the two copies queued before the failure were done before the free


@pytest.mark.parametrize(("name", "copies_2d", "copies_1d"), [
    ("every-other-reversed", 4, 1),  # elements 12 bytes apart: a 2-D copy per row; the packed bytes in one
    ("3d-slice", 2, 1),  # one 2-D copy per outer index
    ("broadcast-rows", 0, 2),  # the row read once
    ("sliding-windows", 0, 4),  # overlapping rows: one copy each (3 windows), then the packed bytes
])
def test_2d_copies_where_they_are_valid(rt: CudaRuntime, d: CudaDriverDouble, name: str, copies_2d: int,
                                        copies_1d: int) -> None:
    base = base_array(4)
    view = {**LAYOUTS, **BROADCASTS}[name](base)
    mem = OnDevice(rt, d, base)
    desc = mem.descriptor(view)
    s = rt.create_stream(0)
    d.calls.clear()
    rt.pack(desc, 0, s)
    made = [name for name, _ in d.calls]
    assert (made.count("cuMemcpy2DAsync"), made.count("cuMemcpyAsync")) == (copies_2d, copies_1d)


# -- issue 33, defect 8: the pinned memory of a pack comes from the pinned pool --------------------------------------


def host_allocations(d: CudaDriverDouble) -> int:
    return sum(1 for name, _ctx in d.calls if name == "cuMemHostAlloc")


@pytest.mark.parametrize("direction", ["pack", "unpack"])
def test_strided_copies_take_pinned_memory_from_the_pool(rt: CudaRuntime, d: CudaDriverDouble, direction: str) -> None:
    reload_config({"CAI_MPI_PINNED_POOL_BYTES": str(1 << 20)})
    try:
        base = base_array(8, (64, 64, 8))  # 256 KiB, reversed: two pinned blocks per copy
        mem = OnDevice(rt, d, base)
        desc = mem.descriptor(base[::-1])
        expected = np.ascontiguousarray(base[::-1]).tobytes()
        first = 0
        for i in range(3):
            if direction == "pack":
                assert pack_bytes(rt, d, desc) == expected
            else:
                d.write_device(mem.buf.ptr, bytes(base.nbytes))
                unpack_into(rt, d, expected, desc)
                assert mem.read() == base.tobytes()
            if i == 0:
                first = host_allocations(d)
        assert host_allocations(d) == first  # the second and third reuse the first's pinned blocks
        assert d.pinned_bytes_outstanding <= 1 << 20  # what stays page-locked is within CAI_MPI_PINNED_POOL_BYTES
        reload_config({"CAI_MPI_PINNED_POOL_BYTES": "0"})
        pack_bytes(rt, d, desc)  # a pool with no budget keeps nothing
        gc.collect()
        assert d.pinned_bytes_outstanding == 0
    finally:
        reload_config()
