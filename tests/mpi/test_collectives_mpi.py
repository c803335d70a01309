"""Shape-free collectives between real MPI ranks, against numpy references; every test passes at any size >= 2."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from mpi4py import MPI

import cai_mpi
from cai_mpi._src.api import gathers
from cai_mpi._src.config import reload_config
from cai_mpi.testing import FakeCudaArray, SimulatedRuntime, use_runtime

pytestmark = pytest.mark.mpi(min_size=2)

comm = MPI.COMM_WORLD
rank, size = comm.Get_rank(), comm.Get_size()
STRUCT = np.dtype([("id", "<i4"), ("pos", "<f8", (3,)), ("flag", "?"), ("name", "S5")])
DTYPES = ["?", "u1", "<i2", "<i4", "<i8", "<f2", "<f4", "<f8", "<c16", ">i4", ">f8", STRUCT]
SHAPES = [(), (0,), (3, 0), (1,), (7,), (5, 3), (2, 3, 4), (300, 301)]
# s: the tests where ranks take different paths (an error on one rank, a mismatch) bound their calls, so that an
# agreement mistake fails them by TimeoutError naming the call well before the 50 s hang watchdog; the tests of
# results keep MPI's blocking form (no timeout=), which they cover
LIMIT = 20.0


def make(dtype: Any, shape: tuple[int, ...], seed: int) -> np.ndarray[Any, Any]:
    """Contents every rank can rebuild: the receiver knows what each sender sent."""
    dt = np.dtype(dtype)
    raw = np.random.default_rng(seed).integers(0, 256, size=int(np.prod(shape)) * dt.itemsize, dtype=np.uint8)
    return raw.view(dt).reshape(shape)


def same(got: Any, expected: np.ndarray[Any, Any]) -> None:
    g = np.asarray(got)
    assert g.shape == expected.shape and g.dtype == expected.dtype
    assert np.ascontiguousarray(g).tobytes() == np.ascontiguousarray(expected).tobytes()


def layout(arr: np.ndarray[Any, Any], kind: str) -> np.ndarray[Any, Any]:
    """The same values in another memory layout."""
    if kind == "F":
        return np.asfortranarray(arr)
    if kind == "strided" and arr.ndim:
        big = np.zeros(tuple(2 * n for n in arr.shape), arr.dtype)
        view = big[tuple(slice(None, None, 2) for _ in arr.shape)]
        view[...] = arr
        return view[::-1][::-1] if arr.ndim == 1 else view
    return arr


# -- bcast ----------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("shape", SHAPES, ids=str)
def test_bcast_every_dtype_and_shape(dtype: Any, shape: tuple[int, ...]) -> None:
    root = size - 1
    sent = make(dtype, shape, 7)
    got = cai_mpi.bcast_array(sent if rank == root else None, root=root, meta={"from": root} if rank == root else None)
    assert isinstance(got, cai_mpi.Array) and got.source == root and got.meta == {"from": root}
    same(got, sent)
    if rank == root:
        assert np.asarray(got).__array_interface__["data"][0] == sent.__array_interface__["data"][0] or not sent.size


@pytest.mark.parametrize("kind", ["C", "F", "strided"])
@pytest.mark.parametrize("nbytes", ["inline", "large"])
def test_bcast_layouts_and_out(kind: str, nbytes: str) -> None:
    shape = (6, 4) if nbytes == "inline" else (400, 300)
    expected = make("<f8", shape, 11)
    out = np.full(shape, -1.0, order="F" if kind == "F" else "C")
    out_view = layout(out, kind) if kind == "strided" else out
    if kind == "strided":
        out_view = np.zeros((2 * shape[0], shape[1]))[::2]
    got = cai_mpi.bcast_array(layout(expected, kind) if rank == 0 else None, out=None if rank == 0 else out_view)
    same(got, expected)
    if rank:
        same(out_view, expected)
        assert np.shares_memory(np.asarray(got), out_view)
        if kind == "F":
            assert np.asarray(got).flags.f_contiguous


def test_bcast_out_mismatch_raises_after_the_broadcast_and_the_communicator_stays_in_step() -> None:
    bad = np.zeros(5, "<f4")
    if rank == 1:
        with pytest.raises(cai_mpi.RecvMismatchError, match=r"bcast_array.*shapes differ"):
            cai_mpi.bcast_array(None, out=bad, timeout=LIMIT)
    else:
        got = cai_mpi.bcast_array(np.arange(4, dtype="<f4") if rank == 0 else None, timeout=LIMIT)
        same(got, np.arange(4, dtype="<f4"))
    same(cai_mpi.bcast_array(np.arange(3) if rank == 0 else None, timeout=LIMIT), np.arange(3))


def test_a_bad_root_argument_is_an_error_on_every_rank() -> None:
    if rank == 0:
        with pytest.raises(TypeError, match="cannot send or receive"):
            cai_mpi.bcast_array(object(), timeout=LIMIT)
    else:
        with pytest.raises(cai_mpi.CollectiveMismatchError, match="root, rank 0, could not send"):
            cai_mpi.bcast_array(timeout=LIMIT)
    same(cai_mpi.bcast_array(np.ones(2) if rank == 0 else None, timeout=LIMIT), np.ones(2))


@pytest.mark.parametrize("version", [0, 1, 2, 3])
def test_bcast_takes_any_cai_version(version: int) -> None:
    expected = make("<i8", (10, 3), 3)
    src = FakeCudaArray(expected, version=version) if rank == 0 else None
    same(cai_mpi.bcast_array(src), expected)


def test_bcast_long_meta_and_structured_header_take_a_second_step() -> None:
    meta = {"text": "x" * 3000}
    dtype = np.dtype([(f"field{i}", "<f4") for i in range(40)])
    got = cai_mpi.bcast_array(make(dtype, (3,), 1) if rank == 0 else None, meta=meta if rank == 0 else None)
    same(got, make(dtype, (3,), 1))
    assert got.meta == meta


# -- gather / allgather ---------------------------------------------------------------------------------------


def mine(r: int) -> np.ndarray[Any, Any]:
    """Each rank contributes its own shape, dtype and layout."""
    dtype = DTYPES[r % len(DTYPES)]
    return layout(make(dtype, (r + 1, 3), 100 + r), ["C", "F", "strided"][r % 3])


@pytest.mark.parametrize("root", [0, "last"])
def test_gather_per_rank_shapes_and_dtypes(root: Any) -> None:
    root = size - 1 if root == "last" else root
    got = cai_mpi.gather_array(mine(rank), root=root)
    if rank != root:
        assert got is None
        return
    assert got is not None and len(got) == size
    for r, a in enumerate(got):
        assert a.source == r
        same(a, mine(r))


def test_allgather_per_rank_shapes_and_dtypes_and_empty_pieces() -> None:
    def piece(r: int) -> np.ndarray[Any, Any]:
        return np.zeros((0, r), "<i2") if r % 2 else mine(r)

    got = cai_mpi.allgather_array(piece(rank))
    assert [a.source for a in got] == list(range(size))
    for r, a in enumerate(got):
        same(a, piece(r))


def test_allgather_and_alltoall_with_headers_longer_than_an_agreement_slot() -> None:
    # Odd ranks describe a 40-field structured dtype (a header of ~1 KiB): its rest follows the fixed slots.
    def piece(r: int) -> np.ndarray[Any, Any]:
        dtype = np.dtype([(f"field{i}", "<f4") for i in range(40)]) if r % 2 else np.dtype("<i8")
        return make(dtype, (r + 1,), 7 + r)

    for r, a in enumerate(cai_mpi.allgather_array(piece(rank))):
        same(a, piece(r))
    for r, a in enumerate(cai_mpi.alltoall_array([piece(rank)] * size)):
        same(a, piece(r))


@pytest.mark.parametrize("version", [0, 1, 2, 3])
def test_allgather_takes_any_cai_version(version: int) -> None:
    got = cai_mpi.allgather_array(FakeCudaArray(make("<f4", (2, 5), rank), version=version))
    for r, a in enumerate(got):
        same(a, make("<f4", (2, 5), r))


def test_a_rank_that_cannot_contribute_is_named_on_every_rank() -> None:
    bad = size - 1
    if rank == bad:
        with pytest.raises(TypeError):
            cai_mpi.allgather_array([1, 2, 3], timeout=LIMIT)
    else:
        with pytest.raises(cai_mpi.CollectiveMismatchError, match=f"rank {bad}"):
            cai_mpi.allgather_array(np.zeros(2), timeout=LIMIT)
    same(cai_mpi.allgather_array(np.full(1, rank), timeout=LIMIT)[0], np.full(1, 0))


@pytest.fixture
def large_path(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """The path for pieces whose counts pass a C int, on small pieces: Alltoallw over absolute addresses."""
    monkeypatch.setattr(gathers, "_small", lambda sizes, infos: False)
    yield


@pytest.mark.usefixtures("large_path")
def test_gather_and_allgather_through_the_large_count_path() -> None:
    got = cai_mpi.allgather_array(mine(rank))
    for r, a in enumerate(got):
        same(a, mine(r))
    gathered = cai_mpi.gather_array(mine(rank), root=1)
    if rank == 1:
        assert gathered is not None
        for r, a in enumerate(gathered):
            same(a, mine(r))


# -- scatter / alltoall ---------------------------------------------------------------------------------------


def test_scatter_per_rank_shapes_and_out() -> None:
    root = 1
    pieces = [mine(r) for r in range(size)] if rank == root else None
    expected = mine(rank)
    out = np.empty(expected.shape, expected.dtype) if rank % 2 == 0 else None
    got = cai_mpi.scatter_array(pieces, root=root, out=out)
    assert got.source == root
    same(got, expected)
    if out is not None:
        same(out, expected)


def test_scatter_refuses_a_wrong_number_of_arrays_on_every_rank() -> None:
    if rank == 0:
        with pytest.raises(TypeError, match=f"expected a sequence of {size} arrays"):
            cai_mpi.scatter_array([np.zeros(1)] * (size + 1), timeout=LIMIT)
    else:
        with pytest.raises(cai_mpi.CollectiveMismatchError, match="root, rank 0"):
            cai_mpi.scatter_array(timeout=LIMIT)
    same(cai_mpi.scatter_array([np.full(1, r) for r in range(size)] if rank == 0 else None, timeout=LIMIT),
         np.full(1, rank))


def test_alltoall_one_array_per_pair() -> None:
    def piece(src: int, dst: int) -> np.ndarray[Any, Any]:
        return layout(make(DTYPES[(src + dst) % len(DTYPES)], (src + 1, dst), 1000 * src + dst),
                      ["C", "F"][(src + dst) % 2])

    got = cai_mpi.alltoall_array([piece(rank, d) for d in range(size)])
    assert len(got) == size
    for src, a in enumerate(got):
        assert a.source == src
        same(a, piece(src, rank))


# -- reductions -----------------------------------------------------------------------------------------------

NUMERIC = ["u1", "<i2", "<i4", "<i8", "<f4", "<f8", "<c8", "<c16"]


@pytest.mark.parametrize("dtype", NUMERIC)
@pytest.mark.parametrize("op", ["sum", "prod", "min", "max"])
def test_allreduce_against_numpy(dtype: str, op: str) -> None:
    if np.dtype(dtype).kind == "c" and op in ("min", "max"):
        with pytest.raises(TypeError, match="complex values have no order"):  # on every rank: each one's own
            cai_mpi.allreduce_array(np.ones(3, dtype), op=op)
        return
    arrays = [(np.arange(12) % 5 + r).astype(dtype).reshape(3, 4) for r in range(size)]
    expected = {"sum": np.sum, "prod": np.prod, "min": np.min, "max": np.max}[op](np.stack(arrays), axis=0)
    if np.dtype(dtype).kind in "fc":  # (MPI's order of combining ranks rounds its own way: the answer is MPI's)
        expected = np.empty_like(arrays[rank])
        comm.Allreduce(arrays[rank], expected, {"sum": MPI.SUM, "prod": MPI.PROD, "min": MPI.MIN, "max": MPI.MAX}[op])
    got = cai_mpi.allreduce_array(arrays[rank], op=op)
    assert got.dtype == np.dtype(dtype)  # the input dtype, as MPI keeps it
    same(got, expected.astype(dtype))


@pytest.mark.parametrize("kind", ["C", "F", "strided"])
def test_reduce_any_layout_and_out(kind: str) -> None:
    arrays = [np.arange(20.0).reshape(4, 5) * (r + 1) for r in range(size)]
    root = size - 1
    out = np.empty((4, 5)) if rank == root else None
    got = cai_mpi.reduce_array(layout(arrays[rank], kind), root=root, out=out)
    if rank != root:
        assert got is None
        return
    assert got is not None
    same(got, sum(arrays))
    assert np.shares_memory(np.asarray(got), out)


def test_reduce_with_an_mpi_op_and_a_0d_array() -> None:
    got = cai_mpi.allreduce_array(np.array(rank + 1, "<i4"), op=MPI.BXOR)
    expected = 0
    for r in range(size):
        expected ^= r + 1
    same(got, np.array(expected, "<i4"))


def test_mismatched_shapes_raise_on_every_rank_naming_each_one() -> None:
    shape = (2, 3) if rank else (3, 2)  # the same element count: shapes are compared, not sizes
    with pytest.raises(cai_mpi.CollectiveMismatchError) as info:
        cai_mpi.allreduce_array(np.zeros(shape), timeout=LIMIT)
    assert "rank 0: shape=(3, 2)" in str(info.value) and "rank 1: shape=(2, 3)" in str(info.value)
    same(cai_mpi.allreduce_array(np.ones(2), timeout=LIMIT), np.full(2, float(size)))  # still usable


def test_mismatched_dtypes_raise_on_every_rank() -> None:
    dtype = "<f8" if rank else "<f4"
    with pytest.raises(cai_mpi.CollectiveMismatchError, match="dtype=<f4"):
        cai_mpi.reduce_array(np.zeros(3, dtype), timeout=LIMIT)


@pytest.mark.parametrize(("dtype", "why"), [(STRUCT, "cannot reduce a structured dtype"),
                                            ("?", "'sum' does not apply to a bool array: use MPI.LAND")],
                         ids=["structured", "bool-sum"])
def test_reducing_structured_or_summing_bool_is_a_clear_error(dtype: Any, why: str) -> None:
    if rank == 0:  # (bool arrays reduce with the logical ops and min/max: tests/mpi/test_reduce_ops_mpi.py)
        with pytest.raises(TypeError, match=why):
            cai_mpi.allreduce_array(np.zeros(2, dtype), timeout=LIMIT)
    else:
        with pytest.raises(cai_mpi.CollectiveMismatchError, match="rank 0"):
            cai_mpi.allreduce_array(np.zeros(2), timeout=LIMIT)


def test_reductions_split_at_the_message_limit() -> None:
    reload_config({"CAI_MPI_MAX_MESSAGE_BYTES": "64"})  # 8 float64 per MPI call
    x = np.arange(1000.0) * (rank + 1)
    same(cai_mpi.allreduce_array(x), np.arange(1000.0) * sum(range(1, size + 1)))
    same(cai_mpi.bcast_array(np.arange(1000.0) if rank == 0 else None), np.arange(1000.0))
    # To a root below other ranks: those send their own pieces (only the root may reduce in place)
    got = cai_mpi.reduce_array(x, root=0)
    if rank == 0:
        same(got, np.arange(1000.0) * sum(range(1, size + 1)))
    else:
        assert got is None


# -- communicators ----------------------------------------------------------------------------------------------


def test_on_a_sub_communicator_without_touching_user_traffic() -> None:
    sub = comm.Split(rank % 2, rank)
    try:
        # The user's own message on the same communicator, sent before and received after the collectives.
        token = np.array([rank], "i8")
        req = sub.Isend(token, (sub.Get_rank() + 1) % sub.Get_size(), tag=0)
        got = cai_mpi.allgather_array(np.full(2, rank), comm=sub)
        assert [int(np.asarray(a)[0]) for a in got] == [r for r in range(size) if r % 2 == rank % 2]
        total = cai_mpi.allreduce_array(np.ones(1), comm=sub)
        assert float(np.asarray(total)[0]) == sub.Get_size()
        back = np.zeros(1, "i8")
        sub.Recv(back, MPI.ANY_SOURCE, MPI.ANY_TAG)
        req.Wait()
        assert int(back[0]) % 2 == rank % 2
    finally:
        sub.Free()


# -- device memory (simulated GPU) -----------------------------------------------------------------------------


@pytest.fixture
def simulated_gpu() -> Iterator[SimulatedRuntime]:
    with use_runtime(SimulatedRuntime()) as rt:
        assert isinstance(rt, SimulatedRuntime)
        yield rt


@pytest.mark.usefixtures("simulated_gpu")
def test_device_arrays_are_staged_through_host_memory_and_land_on_the_device() -> None:
    assert not cai_mpi.cuda_aware()
    x = FakeCudaArray(make("<f8", (5, 7), rank), device=True)
    got = cai_mpi.allgather_array(x)
    for r, a in enumerate(got):
        assert a.device == 0
        same(a.numpy(), make("<f8", (5, 7), r))
    total = cai_mpi.allreduce_array(FakeCudaArray(np.arange(6.0) + rank, device=True))
    assert total.device == 0
    same(total.numpy(), sum(np.arange(6.0) + r for r in range(size)))
    b = cai_mpi.bcast_array(FakeCudaArray(np.arange(4.0), device=True) if rank == 0 else None)
    same(b.numpy(), np.arange(4.0))


# -- sendrecv -----------------------------------------------------------------------------------------------------


def test_sendrecv_around_a_ring_and_at_the_edges() -> None:
    nxt, prv = (rank + 1) % size, (rank - 1) % size
    got = cai_mpi.sendrecv_array(np.full(3, rank), nxt, 4, prv, 4, meta={"r": rank})
    same(got, np.full(3, prv))
    assert got.meta == {"r": prv} and got.source == prv
    # A non-periodic line: the ends send to or receive from PROC_NULL.
    right = rank + 1 if rank + 1 < size else MPI.PROC_NULL
    left = rank - 1 if rank else MPI.PROC_NULL
    got = cai_mpi.sendrecv_array(np.full(2, rank), right, sendtag=5, source=left, recvtag=5)
    if left == MPI.PROC_NULL:
        assert got.source == MPI.PROC_NULL and got.size == 0
    else:
        same(got, np.full(2, left))


# -- hypothesis ---------------------------------------------------------------------------------------------------


@settings(max_examples=25, deadline=None, derandomize=True, suppress_health_check=list(HealthCheck))
@given(shape=st.lists(st.integers(0, 5), max_size=4).map(tuple), dtype=st.sampled_from(DTYPES))
def test_hypothesis_shapes_through_every_data_collective(shape: tuple[int, ...], dtype: Any) -> None:
    mine_ = make(dtype, shape, rank)
    for r, a in enumerate(cai_mpi.allgather_array(mine_)):
        same(a, make(dtype, shape, r))
    same(cai_mpi.bcast_array(mine_ if rank == 0 else None), make(dtype, shape, 0))
    same(cai_mpi.scatter_array([make(dtype, shape, 50 + r) for r in range(size)] if rank == 0 else None),
         make(dtype, shape, 50 + rank))
    if np.dtype(dtype).names is None and np.dtype(dtype).kind not in "b":
        total = cai_mpi.allreduce_array(np.ones(shape, dtype))  # (either byte order: the result is native)
        same(total, (np.ones(shape, dtype) * size).astype(np.dtype(dtype).newbyteorder("=")))
