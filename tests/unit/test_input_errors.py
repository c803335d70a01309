"""Inputs that used to escape as Python's own exceptions: a `meta` nested past the recursion limit, and a
``__cuda_array_interface__`` property that raises. Both are cai_mpi errors naming the function, on every
entry point that takes them (the bad-input table, tests/bad_input_cases.py, shows the messages)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np
import pytest
from bad_input_cases import FailingExporter, nested
from mpi4py import MPI

import cai_mpi

me = MPI.COMM_WORLD.Get_rank()
SELF = MPI.COMM_SELF
X = np.arange(6.0)

# function name -> a call that sends X with the given meta on COMM_SELF (rank 0 to itself)
WITH_META: dict[str, Callable[[Any], object]] = {
    "send_array": lambda meta: cai_mpi.send_array(X, 0, 1, SELF, meta=meta),
    "isend_array": lambda meta: cai_mpi.isend_array(X, 0, 1, SELF, meta=meta),
    "bcast_array": lambda meta: cai_mpi.bcast_array(X, 0, SELF, meta=meta),
    "send_channel": lambda meta: cai_mpi.send_channel(X, 0, 1, SELF, meta=meta),
}


@pytest.mark.parametrize("fn", WITH_META)
def test_meta_nested_past_the_recursion_limit_is_a_type_error_naming_the_function(fn: str) -> None:
    with pytest.raises(TypeError, match=rf"^{fn}: meta is nested too deeply for JSON .*: flatten it$") as info:
        WITH_META[fn](nested(5000))
    assert len(str(info.value)) < 200  # (the meta itself is not in the message)
    # nothing sent
    assert not cai_mpi._src.transport.privcomm.private_comms(SELF).header.Iprobe(MPI.ANY_SOURCE, MPI.ANY_TAG)


def test_meta_nested_moderately_still_travels() -> None:
    meta = nested(200)
    req = cai_mpi.isend_array(X, me, 3, meta=meta)
    got = cai_mpi.recv_array(me, 3)
    req.wait()
    assert got.meta == meta and np.asarray(got).tobytes() == X.tobytes()


# function name -> a call that reads the CAI of ``obj`` (a send source, or a receive buffer out=)
READING_CAI: dict[str, Callable[[Any], object]] = {
    "send_array": lambda obj: cai_mpi.send_array(obj, 0, 1, SELF),
    "isend_array": lambda obj: cai_mpi.isend_array(obj, 0, 1, SELF),
    "recv_array": lambda obj: cai_mpi.recv_array(0, 1, SELF, out=obj),
    "irecv_array": lambda obj: cai_mpi.irecv_array(0, 1, SELF, out=obj),
    "allgather_array": lambda obj: cai_mpi.allgather_array(obj, SELF),
    "allreduce_array": lambda obj: cai_mpi.allreduce_array(obj, comm=SELF),
    "describe": cai_mpi.describe,
}


@pytest.mark.parametrize("fn", READING_CAI)
def test_a_raising_cai_property_is_a_cai_error_naming_the_function_chained_to_the_original(fn: str) -> None:
    with pytest.raises(cai_mpi.CAIError, match=rf"^__cuda_array_interface__: {fn}: reading it from a "
                                               "FailingExporter object raised RuntimeError: the buffer was freed"
                       ) as info:
        READING_CAI[fn](FailingExporter())
    cause = info.value.__cause__
    assert isinstance(cause, RuntimeError) and str(cause) == "the buffer was freed"
    assert not cai_mpi._src.transport.privcomm.private_comms(SELF).header.Iprobe(MPI.ANY_SOURCE, MPI.ANY_TAG)


class NoInterfaceHere:
    """As PyTorch's CPU tensors: the property raises AttributeError, meaning "no CUDA memory here"."""

    @property
    def __cuda_array_interface__(self) -> Any:
        raise AttributeError("not on a GPU")

    @property
    def __array_interface__(self) -> Any:
        return X.__array_interface__


def test_a_property_raising_attribute_error_means_no_interface_and_the_host_path_takes_the_object() -> None:
    obj = NoInterfaceHere()
    req = cai_mpi.isend_array(obj, me, 4)
    got = cai_mpi.recv_array(me, 4)
    req.wait()
    assert np.asarray(got).tobytes() == X.tobytes()
    with pytest.raises(TypeError, match="does not export __cuda_array_interface__"):
        cai_mpi.describe(obj)


# function name -> a call that sends an object array on COMM_SELF (rank 0 to itself)
OBJECTS = np.array([1, "x", None], dtype=object)
WITH_OBJECTS: dict[str, Callable[[np.ndarray[Any, Any]], object]] = {
    "send_array": lambda a: cai_mpi.send_array(a, 0, 1, SELF),
    "isend_array": lambda a: cai_mpi.isend_array(a, 0, 1, SELF),
    "bcast_array": lambda a: cai_mpi.bcast_array(a, 0, SELF),
    "allgather_array": lambda a: cai_mpi.allgather_array(a, SELF),
    "send_channel": lambda a: cai_mpi.send_channel(a, 0, 1, SELF),
    "bcast_init": lambda a: cai_mpi.bcast_init(a, 0, SELF),
    "allgather_init": lambda a: cai_mpi.allgather_init(a, SELF),
}


@pytest.mark.parametrize("fn", WITH_OBJECTS)
@pytest.mark.parametrize("objects", [OBJECTS, np.empty(100_000, dtype=object), np.empty(64, dtype=object)[::2]],
                         ids=["small", "large", "strided"])
def test_an_object_array_is_a_type_error_naming_the_host_array_and_its_dtype(
        fn: str, objects: np.ndarray[Any, Any]) -> None:
    """Issue 46: it was a CAIError about __cuda_array_interface__ (the array is a host array), and a persistent
    collective took it, to broadcast its pointers."""
    with pytest.raises(TypeError, match=r"a host array of dtype object cannot be sent: its elements are references "
                                        r"to Python objects.*comm\.send") as info:
        WITH_OBJECTS[fn](objects)
    assert "__cuda_array_interface__" not in str(info.value)
    assert not cai_mpi._src.transport.privcomm.private_comms(SELF).header.Iprobe(MPI.ANY_SOURCE, MPI.ANY_TAG)
