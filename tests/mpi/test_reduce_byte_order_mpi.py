"""Reductions of arrays in either byte order, against numpy, exactly; passes at any world size >= 2.

MPI computes on native values: handed big-endian int32 bytes as MPI_INT, a little-endian machine adds
byte-swapped numbers (``[200, 70000, -5]`` on two ranks came back as ``[144, 140000, -16777225]`` once the
check was dropped). cai_mpi converts host input to native order first; the result is in native order.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import numpy as np
import pytest
from mpi4py import MPI

import cai_mpi
from cai_mpi.testing import FakeCudaArray, SimulatedRuntime, use_runtime

pytestmark = pytest.mark.mpi(min_size=2)

comm = MPI.COMM_WORLD
rank, size = comm.Get_rank(), comm.Get_size()
SWAPPED = ">" if np.little_endian else "<"
NATIVE = "<" if np.little_endian else ">"
KINDS = ["i4", "i8", "u2", "f4", "f8", "c16"]
DTYPES = [order + kind for kind in KINDS for order in (SWAPPED, NATIVE)]
UFUNCS = {"sum": np.add, "prod": np.multiply, "min": np.minimum, "max": np.maximum}


def contribution(dtype: str, r: int) -> np.ndarray[Any, Any]:
    """Rank ``r``'s values: several bytes wide and negative where the dtype allows (swapped bytes cannot pass
    for the right numbers); floats of few significant bits, so that sums and products are exact in any order."""
    dt = np.dtype(dtype)
    sign = 1 if r % 2 else -1
    if dt.kind in "fc":
        values: Any = np.array([-2.5, 3.0, 0.5, 4.0, -1.5, 1.25]) * sign + 0.5 * r
        if dt.kind == "c":
            values = values + 1j * (0.5 * r - 1)
    else:
        values = np.array([200, 70000, -5, 3, -40000, 7], np.int64) * sign + 3 * r
        if dt.kind == "u":
            values = np.abs(values) % 60000 + 256
    return np.asarray(values).astype(dt).reshape(2, 3)


def expected(dtype: str, op: str) -> np.ndarray[Any, Any]:
    """numpy's reduction of every rank's values, computed in the native dtype (integers wrap as MPI's do)."""
    native = np.dtype(dtype).newbyteorder("=")
    stack = np.stack([contribution(dtype, r).astype(native) for r in range(size)])
    return UFUNCS[op].reduce(stack, axis=0, dtype=native)  # type: ignore[no-any-return]


def assert_reduced(got: Any, dtype: str, op: str) -> None:
    data = np.asarray(got)
    want = expected(dtype, op)
    assert data.dtype.isnative and data.dtype == np.dtype(dtype).newbyteorder("=")
    assert data.shape == want.shape and data.tobytes() == want.tobytes(), f"{op} of {dtype}: {data} != {want}"


def applies(dtype: str, op: str) -> bool:
    return not (np.dtype(dtype).kind == "c" and op in ("min", "max"))  # (complex numbers have no order)


@pytest.mark.parametrize("op", UFUNCS)
@pytest.mark.parametrize("dtype", DTYPES)
def test_allreduce_either_byte_order(dtype: str, op: str) -> None:
    if not applies(dtype, op):
        with pytest.raises(TypeError, match="complex values have no order"):  # on every rank: each its own
            cai_mpi.allreduce_array(contribution(dtype, rank), op=op)
    else:
        assert_reduced(cai_mpi.allreduce_array(contribution(dtype, rank), op=op), dtype, op)


@pytest.mark.parametrize("op", UFUNCS)
@pytest.mark.parametrize("dtype", DTYPES)
def test_reduce_either_byte_order_at_every_root(dtype: str, op: str) -> None:
    for root in range(size):
        if not applies(dtype, op):
            with pytest.raises(TypeError, match="complex values have no order"):
                cai_mpi.reduce_array(contribution(dtype, rank), op=op, root=root)
            continue
        got = cai_mpi.reduce_array(contribution(dtype, rank), op=op, root=root)
        if rank == root:
            assert_reduced(got, dtype, op)
        else:
            assert got is None


@pytest.mark.parametrize("kind", KINDS)
def test_ranks_may_mix_byte_orders_and_out_takes_the_native_result(kind: str) -> None:
    mine = (SWAPPED if rank % 2 else NATIVE) + kind  # the values agree; only their storage differs
    swapped_in_f_order = np.asfortranarray(contribution(mine, rank))
    out = np.full((2, 3), 0, NATIVE + kind)
    got = cai_mpi.allreduce_array(swapped_in_f_order, out=out)
    assert_reduced(got, SWAPPED + kind, "sum")
    assert np.shares_memory(np.asarray(got), out) and out.tobytes() == expected(SWAPPED + kind, "sum").tobytes()


@pytest.fixture
def simulated_gpu() -> Iterator[None]:
    with use_runtime(SimulatedRuntime()):
        yield


@pytest.mark.usefixtures("simulated_gpu")
def test_device_arrays_of_the_other_byte_order_are_refused_on_every_rank() -> None:
    x = FakeCudaArray(contribution(SWAPPED + "i4", rank), device=True)
    with pytest.raises(TypeError, match=rf"allreduce_array: a device array of dtype \{SWAPPED}i4 is not in native"):
        cai_mpi.allreduce_array(x)
    total = cai_mpi.allreduce_array(FakeCudaArray(contribution(NATIVE + "i4", rank), device=True))
    assert_reduced(total.numpy(), NATIVE + "i4", "sum")  # and the communicator is still in step
