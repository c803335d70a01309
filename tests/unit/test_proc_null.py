"""A receive from PROC_NULL completes at once and leaves ``out=`` untouched (MPI's rule), whatever kind of buffer
``out=`` is: host (numpy in any layout, a numpy subclass, a buffer-protocol object, a host CAI exporter, a host
cai_mpi.Array) or device (a simulated device exporter, the real CUDA runtime on the driver double, a device
cai_mpi.Array). Each returns an Array over ``out=``, its data unchanged. One rank, no launcher needed."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

import numpy as np
import pytest
from mpi4py import MPI

import cai_mpi
from cai_mpi.testing import DoubleDeviceArray, FakeCudaArray, SimulatedRuntime, double_runtime, use_runtime

me = MPI.COMM_WORLD.Get_rank()
DATA = np.arange(24, dtype="<f8").reshape(4, 6) + 0.5


class Subclassed(np.ndarray):  # type: ignore[type-arg]
    """A user's ndarray subclass: its data is the buffer."""


# Each kind makes (out, read): ``read()`` returns out's elements now, as a numpy array.
Kind = Callable[[], tuple[Any, Callable[[], np.ndarray[Any, Any]]]]


def numpy_c() -> tuple[Any, Callable[[], np.ndarray[Any, Any]]]:
    out = DATA.copy()
    return out, lambda: out.copy()


def numpy_fortran_face() -> tuple[Any, Callable[[], np.ndarray[Any, Any]]]:
    field = np.asfortranarray(DATA)
    out = field[1, :]  # a row of a Fortran-ordered array: strided
    assert not out.flags.c_contiguous
    return out, lambda: out.copy()


def numpy_subclass() -> tuple[Any, Callable[[], np.ndarray[Any, Any]]]:
    out = DATA.copy().view(Subclassed)
    return out, lambda: np.asarray(out).copy()


def buffer_protocol() -> tuple[Any, Callable[[], np.ndarray[Any, Any]]]:
    out = bytearray(DATA.tobytes())
    return out, lambda: np.frombuffer(bytes(out), "u1").copy()


def host_cai() -> tuple[Any, Callable[[], np.ndarray[Any, Any]]]:
    out = FakeCudaArray(DATA)
    return out, lambda: out.copy_to_host()


def host_array() -> tuple[Any, Callable[[], np.ndarray[Any, Any]]]:
    out = cai_mpi.Array.from_host(DATA.copy())
    return out, lambda: np.asarray(out).copy()


HOST_KINDS: list[Kind] = [numpy_c, numpy_fortran_face, numpy_subclass, buffer_protocol, host_cai, host_array]


@pytest.fixture
def simulated() -> Iterator[Any]:
    with use_runtime(SimulatedRuntime()) as rt:
        yield rt


@pytest.fixture
def double() -> Iterator[Any]:
    rt = double_runtime()
    try:
        with use_runtime(rt):
            yield rt
    finally:
        rt.driver_double.close()  # type: ignore[attr-defined]


def device_kinds(name: str, rt: Any) -> tuple[Any, Callable[[], np.ndarray[Any, Any]]]:
    if name == "simulated-cai":
        fake = FakeCudaArray(DATA, device=True, stream=None)
        return fake, fake.copy_to_host
    if name == "double-cai":
        dev = DoubleDeviceArray(rt, DATA, stream=1)
        return dev, lambda: dev.read().reshape(DATA.shape)
    assert name == "double-array"
    dev = DoubleDeviceArray(rt, DATA)
    arr = cai_mpi.Array(cai_mpi.describe(dev), device=0, owner=dev)
    return arr, lambda: arr.numpy()


def receive(how: str, out: Any) -> cai_mpi.Array:
    null = MPI.PROC_NULL
    if how == "recv_array":
        return cai_mpi.recv_array(null, 5, out=out)
    if how == "recv_array-timeout":
        return cai_mpi.recv_array(null, 5, out=out, timeout=5)
    if how == "irecv_array":
        return cai_mpi.irecv_array(null, 5, out=out).wait()
    if how == "irecv_array-test":
        flag, got = cai_mpi.irecv_array(null, 5, out=out).test()
        assert flag
        return got  # type: ignore[no-any-return]
    assert how == "sendrecv_array"
    return cai_mpi.sendrecv_array(np.ones(3), null, source=null, recvtag=5, out=out)


HOW = ["recv_array", "recv_array-timeout", "irecv_array", "irecv_array-test", "sendrecv_array"]


def host_memory(out: Any) -> np.ndarray[Any, Any]:
    if isinstance(out, FakeCudaArray):
        return out.host
    return np.asarray(memoryview(out)) if isinstance(out, bytearray) else np.asarray(out)


def untouched(got: cai_mpi.Array, out: Any, before: np.ndarray[Any, Any], read: Callable[[], np.ndarray[Any, Any]]
              ) -> None:
    assert isinstance(got, cai_mpi.Array)
    assert (got.source, got.tag, got.meta) == (MPI.PROC_NULL, MPI.ANY_TAG, None)  # MPI's status: no source, any tag
    assert np.array_equal(read(), before)
    if got.is_host:
        assert np.shares_memory(np.asarray(got), host_memory(out))
    else:
        assert got.descriptor.ptr == cai_mpi.describe(out).ptr and got.device == 0
    assert got.nbytes == before.nbytes


def nothing_was_consumed() -> None:
    """Nothing reached cai_mpi's communicators: a message sent now is the next one received."""
    req = cai_mpi.isend_array(np.arange(4), me, 9)
    assert np.asarray(cai_mpi.recv_array(me, 9, device="host")).tolist() == [0, 1, 2, 3]
    req.wait()


@pytest.mark.parametrize("how", HOW)
@pytest.mark.parametrize("kind", HOST_KINDS, ids=lambda k: k.__name__)
def test_host_out_from_proc_null_is_returned_unchanged(kind: Kind, how: str) -> None:
    out, read = kind()
    before = read()
    got = receive(how, out)
    untouched(got, out, before, read)
    if isinstance(out, np.ndarray):
        assert got.shape == out.shape and got.dtype == out.dtype
    nothing_was_consumed()


@pytest.mark.parametrize("how", HOW)
@pytest.mark.parametrize("name", ["simulated-cai", "double-cai", "double-array"])
def test_device_out_from_proc_null_is_returned_unchanged(name: str, how: str, request: pytest.FixtureRequest) -> None:
    rt = request.getfixturevalue("simulated" if name.startswith("simulated") else "double")
    out, read = device_kinds(name, rt)
    before = read()
    got = receive(how, out)
    assert not got.is_host and got.shape == DATA.shape and got.dtype == DATA.dtype
    untouched(got, out, before, read)
    assert np.array_equal(got.numpy(), DATA)
    nothing_was_consumed()


@pytest.mark.parametrize("how", HOW)
def test_without_out_proc_null_gives_an_empty_array(how: str) -> None:
    got = receive(how, None)
    assert got.source == MPI.PROC_NULL and got.is_host and got.shape == (0,) and got.dtype == np.uint8
    assert got.tag == MPI.ANY_TAG  # not the tag asked for (5): MPI's status of a receive from PROC_NULL
    assert "source=PROC_NULL, tag=ANY_TAG" in repr(got)  # names, not numbers that differ between MPI libraries
    nothing_was_consumed()


def test_an_unusable_out_is_refused_even_from_proc_null() -> None:
    with pytest.raises(TypeError, match="recv_array: out= must be a writable CAI object or host array"):
        cai_mpi.recv_array(MPI.PROC_NULL, out=object())
