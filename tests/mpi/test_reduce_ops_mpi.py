"""Reduction ops beyond sum/prod/min/max: op="mean" of floating and complex arrays, and bool arrays with logical
ops and min/max, against numpy, exactly; passes at any world size >= 2.

The expected mean is computed the way the library computes it: MPI's sum (mpi4py, same datatype), then divided by
the communicator size in the input dtype. The values are dyadic fractions whose sums are exact in every dtype, so
the order of the additions (MPI's, or the rank order of the small path that reduces in numpy) cannot change a bit.
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
FLOATING = ["f4", "f8", "c8", "c16"]
# s: where one rank errs, the calls bound their wait, so that an agreement mistake fails the test by TimeoutError
# naming the call, well before the 50 s hang watchdog
LIMIT = 20.0


def values(dtype: str, r: int) -> np.ndarray[Any, Any]:
    base = np.array([[0.125, -2.75, 3.375], [1 / 1024, 7.25, -0.625]]) * (r + 1) + r / 4
    if np.dtype(dtype).kind == "c":
        base = base + 1j * (base[::-1] - r / 8)
    return base.astype(dtype)


def mpi_mean(x: np.ndarray[Any, Any], root: int | None = None) -> np.ndarray[Any, Any]:
    """MPI's sum (Allreduce, or Reduce onto ``root``: MPI may add in another order there) over the size."""
    total = np.empty_like(x)
    if root is None:
        comm.Allreduce(x, total, MPI.SUM)
    else:
        comm.Reduce(x, total, MPI.SUM, root=root)
    return np.true_divide(total, x.dtype.type(size), dtype=x.dtype)  # type: ignore[no-any-return]


@pytest.mark.parametrize("alias", ["mean", "avg", "MEAN"])
@pytest.mark.parametrize("dtype", FLOATING)
def test_allreduce_mean(dtype: str, alias: str) -> None:
    x = values(dtype, rank)
    got = np.asarray(cai_mpi.allreduce_array(x, op=alias))
    want = mpi_mean(x)
    assert got.dtype == np.dtype(dtype) and got.shape == x.shape
    assert got.tobytes() == want.tobytes(), f"{got} != {want}"


@pytest.mark.parametrize("dtype", FLOATING)
def test_allreduce_mean_into_out(dtype: str) -> None:
    x = values(dtype, rank)
    out = np.full((3, 2), 99, dtype).T  # a strided (F-ordered) target
    y = cai_mpi.allreduce_array(x, op="mean", out=out)
    assert np.shares_memory(np.asarray(y), out)
    assert out.tobytes(order="C") == mpi_mean(x).tobytes()


@pytest.mark.parametrize("dtype", ["f4", "c16"])
def test_reduce_mean_at_every_root(dtype: str) -> None:
    x = values(dtype, rank)
    for root in range(size):
        want = mpi_mean(x, root)
        got = cai_mpi.reduce_array(x, op="mean", root=root)
        if rank == root:
            assert got is not None and np.asarray(got).tobytes() == want.tobytes()
        else:
            assert got is None
        out = np.zeros_like(x)
        got = cai_mpi.reduce_array(x, op="avg", root=root, out=out)
        if rank == root:
            assert out.tobytes() == want.tobytes()
        else:
            assert got is None and not out.any()


@pytest.fixture
def simulated_gpu() -> Iterator[None]:
    with use_runtime(SimulatedRuntime()):
        yield


@pytest.fixture(params=["staged", "cuda-aware"])
def device_comm(request: pytest.FixtureRequest, simulated_gpu: None, routed_dup: Any) -> Iterator[MPI.Intracomm]:
    """A communicator on which device data is staged through the host, or handed to a (simulated) CUDA-aware
    MPI directly."""
    dup = routed_dup(request.param == "cuda-aware")
    yield dup
    dup.Free()


@pytest.mark.parametrize("dtype", ["f8", "c8"])
def test_mean_of_device_arrays(device_comm: MPI.Intracomm, dtype: str) -> None:
    x = values(dtype, rank)
    want = mpi_mean(x)
    got = cai_mpi.allreduce_array(FakeCudaArray(x, device=True), op="mean", comm=device_comm)
    assert got.device == 0 and got.numpy().tobytes() == want.tobytes()
    out = FakeCudaArray(np.zeros_like(x), device=True)
    got = cai_mpi.allreduce_array(FakeCudaArray(x, device=True), op="mean", comm=device_comm, out=out)
    assert got.numpy().tobytes() == want.tobytes()
    for root in range(size):
        want_at_root = mpi_mean(x, root)  # (collective: every rank calls it)
        host_result = cai_mpi.reduce_array(FakeCudaArray(x, device=True), op="avg", root=root, comm=device_comm,
                                           out=np.zeros_like(x) if rank == root else None)
        assert (host_result is None) == (rank != root)
        if host_result is not None:
            assert host_result.numpy().tobytes() == want_at_root.tobytes()


def test_mean_of_empty_array() -> None:
    got = cai_mpi.allreduce_array(np.zeros((0, 3), "f8"), op="mean")
    assert np.asarray(got).shape == (0, 3)


@pytest.mark.parametrize("dtype", ["i4", "u1", "i8", "?"])
@pytest.mark.parametrize("fn", ["allreduce_array", "reduce_array"])
def test_mean_of_integers_and_bool_refused_on_every_rank(dtype: str, fn: str) -> None:
    with pytest.raises(TypeError, match=rf"{fn}: op='mean' .* floating or complex"):
        getattr(cai_mpi, fn)(np.ones(4, dtype), op="mean")
    # the collectives of comm are still in step
    assert np.asarray(cai_mpi.allreduce_array(np.ones(2), op="sum")).tolist() == [size, size]


def test_mean_refused_on_one_rank_is_an_error_on_every_rank() -> None:
    x = np.ones(4, "i4" if rank == size - 1 else "f4")
    if rank == size - 1:
        with pytest.raises(TypeError, match="allreduce_array: op='mean'"):
            cai_mpi.allreduce_array(x, op="mean", timeout=LIMIT)
    else:
        with pytest.raises(cai_mpi.CollectiveMismatchError, match=f"rank {size - 1}"):
            cai_mpi.allreduce_array(x, op="mean", timeout=LIMIT)


def bools(r: int) -> np.ndarray[Any, Any]:
    rng = np.random.default_rng(17 + r)
    x = rng.random((3, 5)) < 0.5
    x[0] = True  # a row true everywhere, a row false everywhere, a row true on one rank only
    x[1] = False
    x[2, :] = r == 1
    return x


BOOL_OPS: list[tuple[Any, Any]] = [
    (MPI.LAND, np.logical_and), (MPI.LOR, np.logical_or), (MPI.LXOR, np.logical_xor),
    ("min", np.logical_and), ("max", np.logical_or), (MPI.MIN, np.logical_and), (MPI.MAX, np.logical_or),
]


@pytest.mark.parametrize(("op", "ufunc"), BOOL_OPS, ids=lambda v: getattr(v, "__name__", str(v)))
def test_bool_reductions(op: Any, ufunc: Any) -> None:
    want = ufunc.reduce(np.stack([bools(r) for r in range(size)]), axis=0)
    got = np.asarray(cai_mpi.allreduce_array(bools(rank), op=op))
    assert got.dtype == np.bool_ and np.array_equal(got, want)
    out = np.zeros((5, 3), bool).T
    cai_mpi.allreduce_array(bools(rank), op=op, out=out)
    assert np.array_equal(out, want)
    for root in range(size):
        got_root = cai_mpi.reduce_array(bools(rank), op=op, root=root)
        assert (got_root is None) == (rank != root)
        if got_root is not None:
            assert np.array_equal(np.asarray(got_root), want)


@pytest.mark.parametrize(("op", "name"), [("sum", "'sum'"), ("prod", "'prod'"), (MPI.SUM, "MPI.SUM"),
                                          (MPI.BOR, "MPI.BOR")])
def test_bool_with_arithmetic_op_refused_by_name(op: Any, name: str) -> None:
    with pytest.raises(TypeError) as info:
        cai_mpi.allreduce_array(np.ones(3, bool), op=op)
    text = str(info.value)
    assert text.startswith("allreduce_array:") and name in text and "object at" not in text
    assert "MPI.LOR" in text and "'max'" in text


def test_complex_min_names_the_op() -> None:
    with pytest.raises(TypeError) as info:
        cai_mpi.allreduce_array(np.ones(3, "c16"), op=MPI.MAX)
    assert "MPI.MAX" in str(info.value) and "object at" not in str(info.value)


@pytest.mark.parametrize("op", ["median", 3, None])
def test_unknown_op_lists_the_ops(op: Any) -> None:
    with pytest.raises(ValueError) as info:
        cai_mpi.reduce_array(np.ones(3), op=op)
    text = str(info.value)
    assert text.startswith("reduce_array: op must be") and repr(op) in text
    for name in ("'sum'", "'prod'", "'min'", "'max'", "'mean'", "'avg'", "MPI.Op"):
        assert name in text
