"""A persistent bucketed allreduce (``allreduce_init`` of a list or dict) reads, at every use, the arrays it was
created with, and refuses one that moved: tried here on one rank (``COMM_SELF``), where every use completes at once."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
from mpi4py import MPI

import cai_mpi
from cai_mpi._src.api.bucket_plan import DIRECT_BYTES
from cai_mpi.testing import FakeCudaArray, SimulatedRuntime, use_runtime


def test_a_list_of_hundreds_of_arrays_is_used_again_and_again() -> None:
    """Lengths above the small integers CPython shares compare by value: the list has not changed."""
    grads = [np.full(2, float(i)) for i in range(300)]
    red = cai_mpi.allreduce_init(grads, comm=MPI.COMM_SELF)
    try:
        for _ in range(2):
            try:
                got = red()
            except ValueError as exc:
                pytest.fail(f"an unchanged list of 300 arrays was refused: {exc}")
            assert all(np.array_equal(np.asarray(g), np.full(2, float(i))) for i, g in enumerate(got))
    finally:
        red.close()


class Movable:
    """A host array (``__array_interface__``) whose data its owner can move: here, to a lower address."""

    def __init__(self, buffer: np.ndarray[Any, Any], at: int, n: int) -> None:
        self.buffer, self.at, self.n = buffer, at, n

    @property
    def __array_interface__(self) -> dict[str, Any]:
        return {"shape": (self.n,), "typestr": "<f8", "version": 3,
                "data": (self.buffer.ctypes.data + 8 * self.at, False)}


@pytest.mark.parametrize("shift", [-1, 1], ids=["lower", "higher"])
def test_a_large_array_that_moved_is_refused_wherever_it_went(shift: int) -> None:
    n = DIRECT_BYTES // 8  # (an array this large has an Allreduce of its own, bound to its address)
    buffer = np.arange(n + 2, dtype=np.float64)
    big = Movable(buffer, 1, n)
    red = cai_mpi.allreduce_init([np.ones(2), big], comm=MPI.COMM_SELF)
    try:
        assert np.array_equal(np.asarray(red()[1]), buffer[1 : n + 1])
        big.at = 1 + shift
        with pytest.raises(ValueError, match="reallocated"):
            red()
    finally:
        red.close()


@pytest.mark.parametrize("shift", [-8, 8], ids=["lower", "higher"])
def test_a_device_array_that_moved_is_refused_wherever_it_went(shift: int) -> None:
    """A device array shares its dtype's bucket, copied in at every use from where it was at creation."""
    with use_runtime(SimulatedRuntime()):
        grad = FakeCudaArray(np.arange(4.0), device=True, shape=(2,), offset=8)  # elements 1 and 2 of its memory
        red = cai_mpi.allreduce_init([np.ones(2), grad], comm=MPI.COMM_SELF)
        try:
            assert red()[1].numpy().tolist() == [1.0, 2.0]
            grad.ptr += shift  # the same object, its data now one element lower or higher
            with pytest.raises(ValueError, match="reallocated"):
                red()
        finally:
            red.close()
