"""Property tests of whole transfers, a rank sending to itself through real MPI (no launcher needed)."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp
from mpi4py import MPI

import cai_mpi
from cai_mpi._src.config import reload_config
from cai_mpi._src.transport.privcomm import private_comms
from cai_mpi.testing import FakeCudaArray, SimulatedRuntime, use_runtime

me = MPI.COMM_WORLD.Get_rank()
SETTINGS = settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])

dtypes = st.sampled_from(["u1", "<i2", "<f4", "<f8", "<c16", ">i8", "?", "<f2"]).map(np.dtype)


@st.composite
def strided_views(draw: Any) -> np.ndarray[Any, Any]:
    """A view of a random array with random steps (negative too), offsets and axis order."""
    dtype = draw(dtypes)
    shape = draw(hnp.array_shapes(min_dims=0, max_dims=4, min_side=0, max_side=7))
    base = np.arange(int(np.prod(shape)) * dtype.itemsize, dtype=np.uint8).view(dtype).reshape(shape)
    index = tuple(
        slice(draw(st.integers(0, max(n - 1, 0))), None, draw(st.sampled_from([1, 2, 3, -1, -2])))
        for n in shape
    )
    view = base[(*index, Ellipsis)]  # Ellipsis keeps 0-d results arrays, not scalars
    if view.ndim > 1:
        view = view.transpose(draw(st.permutations(range(view.ndim))))
    return view


def self_round_trip(obj: Any, **kw: Any) -> cai_mpi.Array:
    req = cai_mpi.isend_array(obj, me, tag=3)
    got = cai_mpi.recv_array(me, 3, **kw)
    req.wait()
    return got


@SETTINGS
@given(view=strided_views(), inline=st.sampled_from(["0", "4096"]))
def test_any_host_layout_round_trips(view: np.ndarray[Any, Any], inline: str) -> None:
    reload_config({"CAI_MPI_INLINE_BYTES": inline})
    got = np.asarray(self_round_trip(view))
    assert got.shape == view.shape and got.dtype == view.dtype
    assert got.tobytes() == view.tobytes()


@SETTINGS
@given(src=strided_views(), data=st.data())
def test_any_layout_into_any_strided_out(src: np.ndarray[Any, Any], data: Any) -> None:
    reload_config({"CAI_MPI_INLINE_BYTES": "0"})
    # An out= with its own random layout: a view into a bigger zeroed buffer.
    steps = [data.draw(st.sampled_from([1, 2, -1, -3])) for _ in src.shape]
    big = np.zeros(tuple(n * abs(s) + 1 for n, s in zip(src.shape, steps)), src.dtype)
    walk = [slice(None, n * abs(s), s) if s > 0 else slice(n * abs(s) - 1, None, s) for n, s in zip(src.shape, steps)]
    out = big[(*walk, Ellipsis)][(*(slice(0, n) for n in src.shape), Ellipsis)]
    assert out.shape == src.shape
    self_round_trip(src, out=out)
    assert out.tobytes() == src.tobytes()


@SETTINGS
@given(view=strided_views(), version=st.integers(0, 3), device=st.booleans())
def test_cai_exporters_round_trip(view: np.ndarray[Any, Any], version: int, device: bool) -> None:
    """Host-backed and simulated-device CAI exporters with the same random layouts."""
    reload_config({"CAI_MPI_CHUNK_BYTES": "64"})
    with use_runtime(SimulatedRuntime()):
        base = view.base if view.base is not None else view
        while base.base is not None:
            base = base.base
        flat = np.ascontiguousarray(base).reshape(-1)
        fake = FakeCudaArray(flat, version=version, device=device)
        # Re-create the view over the fake's memory: same byte offset and strides.
        offset = view.__array_interface__["data"][0] - base.__array_interface__["data"][0] if view.size else 0
        fake.shape, fake.strides, fake.dtype = view.shape, view.strides if view.ndim else None, view.dtype
        fake.ptr = (fake.ptr + offset) if view.size else 0
        got = self_round_trip(fake, device="host")
        assert np.asarray(got).tobytes() == view.tobytes()


def test_proc_null_is_a_no_op() -> None:
    assert cai_mpi.send_array(np.arange(3), MPI.PROC_NULL) is None
    req = cai_mpi.isend_array(np.arange(3), MPI.PROC_NULL)
    assert req.test() == (True, None) and req.wait() is None
    # Nothing reached cai_mpi's private communicators: a message sent now is the next one received.
    assert np.asarray(self_round_trip(np.arange(4))).tolist() == [0, 1, 2, 3]


def test_array_exports() -> None:
    got = self_round_trip(np.arange(12, dtype="<i4").reshape(3, 4))
    assert isinstance(got, cai_mpi.Array)
    assert not hasattr(got, "__cuda_array_interface__")
    assert np.from_dlpack(got).tobytes() == np.arange(12, dtype="<i4").tobytes()
    view = np.asarray(got)
    view[0, 0] = 99  # a zero-copy view: the Array's own memory changes
    assert np.asarray(got)[0, 0] == 99
    assert repr(got).startswith("cai_mpi.Array(shape=(3, 4)")


def test_device_array_exports_cai_v3_without_stream() -> None:
    with use_runtime(SimulatedRuntime()):
        got = self_round_trip(np.arange(6.0))
        cai = got.__cuda_array_interface__
        assert cai["version"] == 3 and cai["stream"] is None and cai["shape"] == (6,)
        assert cai_mpi.describe(got).ptr == got.descriptor.ptr
        with pytest.raises(AttributeError):
            got.__array_interface__  # noqa: B018
        assert got.__dlpack_device__() == (2, 0)  # kDLCUDA (the capsule: tests/unit/test_array_dlpack.py)
        # Forwarding a device Array: its descriptor travels on.
        again = self_round_trip(got, device="host")
        assert np.array_equal(np.asarray(again), np.arange(6.0))


@pytest.mark.parametrize("out", [False, True])
def test_a_lowered_payload_limit_refuses_a_header_the_receiver_has_seen_before(out: bool) -> None:
    reload_config({"CAI_MPI_INLINE_BYTES": "0"})  # header + payload even for this small array
    x = np.arange(6, dtype=np.float64)
    dst = np.zeros_like(x) if out else None
    np.testing.assert_array_equal(np.asarray(self_round_trip(x, out=dst)), x)  # the fast path knows it now
    if dst is not None:
        dst[...] = 0
    reload_config({"CAI_MPI_INLINE_BYTES": "0", "CAI_MPI_MAX_PAYLOAD_BYTES": str(x.nbytes - 1)})
    req = cai_mpi.isend_array(x, me, tag=3)
    with pytest.raises(cai_mpi.ProtocolError, match="payload"):
        cai_mpi.recv_array(me, 3, out=dst)
    # The refused payload stays unmatched (receiving it would allocate what the limit forbids).
    leftover = np.zeros_like(x)
    private_comms(None).payload.Recv(leftover, me, MPI.ANY_TAG)
    req.wait()
    np.testing.assert_array_equal(leftover, x)
    if dst is not None:
        assert not dst.any()  # out= untouched


class _Tagged(np.ndarray):  # type: ignore[type-arg]
    """A user's ndarray subclass (as astropy, pandas internals and many codes have)."""


@pytest.mark.parametrize("kind", ["subclass", "recarray", "memmap"])
def test_ndarray_subclasses_are_sent_as_their_data(kind: str, tmp_path: Any) -> None:
    base = np.arange(24, dtype="<f8").reshape(4, 6)
    obj: Any
    if kind == "subclass":
        obj = base.view(_Tagged)
    elif kind == "recarray":
        obj = np.rec.fromarrays([np.arange(5), np.arange(5) * 0.5], names="a,b")
    else:
        obj = np.memmap(tmp_path / "m.bin", dtype="<f8", mode="w+", shape=(4, 6))
        obj[:] = base
    plain = np.asarray(obj).view(np.ndarray)
    for inline in ("0", "4096"):
        reload_config({"CAI_MPI_INLINE_BYTES": inline})
        got = np.asarray(self_round_trip(obj))
        assert got.shape == plain.shape and got.dtype == plain.dtype and got.tobytes() == plain.tobytes()
        got = np.asarray(self_round_trip(obj[::2]))  # strided
        assert got.tobytes() == plain[::2].tobytes()
    with cai_mpi.send_channel(obj, me, tag=5) as tx, cai_mpi.recv_channel(me, 5) as rx:
        req = tx.isend()
        assert np.asarray(rx.recv()).tobytes() == plain.tobytes()
        req.wait()


def test_a_masked_array_is_refused_rather_than_sent_without_its_mask() -> None:
    masked = np.ma.masked_array(np.arange(4.0), mask=[0, 1, 0, 0])
    with pytest.raises(TypeError, match="masked"):
        cai_mpi.send_array(masked, me, tag=6)
    with pytest.raises(TypeError, match="masked"):
        cai_mpi.recv_array(me, 6, out=masked)
    # Nothing was sent: the next message is the next one received.
    assert np.asarray(self_round_trip(np.arange(3))).tolist() == [0, 1, 2]


@pytest.mark.parametrize("tag_type", [int, np.int64, np.int32, np.uint8], ids=lambda t: t.__name__)
@pytest.mark.parametrize("tag", [0, 1, 7])
def test_a_tag_of_any_integer_type_is_taken_from_zero_up(tag_type: Any, tag: int) -> None:
    """Tags are 0..TAG_UB whatever integer type carries them (a numpy integer from an array of tags, say): the
    default tag 0 too, on both ends."""
    x = np.arange(4.0)
    try:
        req = cai_mpi.isend_array(x, me, tag=tag_type(tag))
    except ValueError as exc:
        pytest.fail(f"isend_array refused tag {tag_type.__name__}({tag}): {exc}")
    try:
        got = cai_mpi.recv_array(me, tag_type(tag))
    except ValueError as exc:
        pytest.fail(f"recv_array refused tag {tag_type.__name__}({tag}): {exc}")
    req.wait()
    assert np.array_equal(np.asarray(got), x) and got.tag == tag
