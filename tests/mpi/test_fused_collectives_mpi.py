"""The one-shot collectives against numpy, on every dtype and layout, small and large: every rank's result is
compared exactly. Sizes around the description slot of ``bcast_array`` (slot-1, slot and slot+1 bytes used, and
ranks on either side of it in one call) and calls whose signature changes from one to the next (the steady
state's speculation on the last agreed signature, then a new one) are covered; the reductions' answer is MPI's
own at every size. Passes at any size >= 2.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any, ClassVar

import numpy as np
import pytest
from mpi4py import MPI

import cai_mpi
from cai_mpi._src.transport.agreement import SPECULATE_BYTES, describe_source
from cai_mpi._src.transport.slots import BROADCAST, PIECE, Slots
from cai_mpi.testing import FakeCudaArray, SimulatedRuntime, use_runtime

pytestmark = pytest.mark.mpi(min_size=2)

comm = MPI.COMM_WORLD
rank, size = comm.Get_rank(), comm.Get_size()
DTYPES = ["?", "u1", "<i1", "<i2", "<u4", "<i8", "<f4", "<f8", "<c8", "<c16", ">i4", ">f8"]
LAYOUTS = ["C", "F", "strided", "0d", "empty"]
# s: where one rank errs, the calls bound their wait, so that an agreement mistake fails the test by TimeoutError
# naming the call, well before the 50 s hang watchdog
LIMIT = 20.0
SMALL, LARGE = (3, 4), (30, 20)  # 12 and 600 elements: in a slot, and over it, for every dtype above but "?"/u1


def values(dtype: Any, shape: tuple[int, ...], seed: int, *, integral: bool = False) -> np.ndarray[Any, Any]:
    """Contents every rank can rebuild from the seed; ``integral``: small integers (exact sums in any order)."""
    dt = np.dtype(dtype)
    rng = np.random.default_rng(seed)
    count = int(np.prod(shape))
    if integral or dt.kind == "b":
        got = rng.integers(-4 if dt.kind in "ifc" else 0, 5, size=count)
        if dt.kind == "c":
            return (got + 1j * rng.integers(-4, 5, size=count)).astype(dt).reshape(shape)
        return got.astype(dt).reshape(shape)
    raw = rng.integers(0, 256, size=count * dt.itemsize, dtype=np.uint8)
    return raw.view(dt).reshape(shape)


def laid_out(arr: np.ndarray[Any, Any], kind: str) -> np.ndarray[Any, Any]:
    """The same values in another layout ("0d" and "empty" make other arrays of the dtype)."""
    if kind == "F":
        return np.asfortranarray(arr)
    if kind == "strided":
        big = np.zeros((arr.shape[0], 2 * arr.shape[1]), arr.dtype)
        big[:, ::2] = arr
        return big[:, ::2]
    if kind == "0d":
        return arr.reshape(-1)[:1].reshape(())
    if kind == "empty":
        return arr[:0]
    return arr


def same(got: Any, expected: np.ndarray[Any, Any], *, signed_zeros: bool = True) -> None:
    """Equal exactly: the same bytes (or, without ``signed_zeros``, the same values: MPI may multiply complex
    numbers in another order, which can turn a zero's sign)."""
    g = np.asarray(got)
    assert g.shape == expected.shape and g.dtype == expected.dtype, (g.shape, g.dtype, expected.shape, expected.dtype)
    if signed_zeros:
        assert np.ascontiguousarray(g).tobytes() == np.ascontiguousarray(expected).tobytes(), (g, expected)
    else:
        assert np.array_equal(g, expected), (g, expected)


def fits(arr: np.ndarray[Any, Any], slot: Slots = BROADCAST) -> bool:
    """Does ``arr`` travel in its ``slot`` (as the data collectives describe it)?"""
    return arr.nbytes <= slot.payload_room(len(describe_source(arr)))


# -- bcast, gather, allgather: every dtype and layout, both paths -------------------------------------------------


@pytest.mark.parametrize("kind", LAYOUTS)
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("shape", [SMALL, LARGE], ids=["small", "large"])
def test_data_collectives_against_numpy(shape: tuple[int, ...], dtype: str,
                                        kind: str) -> None:
    mine = laid_out(values(dtype, shape, rank), kind)
    every = [laid_out(values(dtype, shape, r), kind) for r in range(size)]
    for root in range(size):
        got = cai_mpi.bcast_array(mine if rank == root else None, root=root)
        same(got, every[root])
        assert got.source == root
        out = np.full(every[root].shape, 1, dtype)
        got = cai_mpi.bcast_array(mine if rank == root else None, root=root, out=None if rank == root else out)
        same(got, every[root])
        if rank != root:
            same(out, every[root])
            assert np.shares_memory(np.asarray(got), out) or out.size == 0
        gathered = cai_mpi.gather_array(mine, root=root)
        if rank == root:
            assert gathered is not None and [a.source for a in gathered] == list(range(size))
            for a, e in zip(gathered, every, strict=True):
                same(a, e)
        else:
            assert gathered is None
    gathered = cai_mpi.allgather_array(mine)
    assert [a.source for a in gathered] == list(range(size))
    for a, e in zip(gathered, every, strict=True):
        same(a, e)


def padded_bytes(used: int, seed: int, slot: Slots = BROADCAST) -> np.ndarray[Any, Any]:
    """A uint8 vector that fills ``used`` bytes of ``slot`` (prefix, header, alignment, payload)."""
    header = len(describe_source(np.zeros(1, np.uint8)))  # (the same for every length: shape fields are fixed)
    n = used - (slot.size - slot.payload_room(header))
    return values("u1", (n,), seed)


@pytest.mark.parametrize("used", [BROADCAST.size - 1, BROADCAST.size, BROADCAST.size + 1],
                         ids=["slot-1", "slot", "slot+1"])
def test_at_the_slot_boundary(used: int) -> None:
    every = [padded_bytes(used, r) for r in range(size)]
    assert all(fits(a) for a in every) == (used <= BROADCAST.size)
    for root in range(size):
        same(cai_mpi.bcast_array(every[rank] if rank == root else None, root=root), every[root])
        gathered = cai_mpi.gather_array(every[rank], root=root)
        if rank == root:
            assert gathered is not None
            for a, e in zip(gathered, every, strict=True):
                same(a, e)
    for a, e in zip(cai_mpi.allgather_array(every[rank]), every, strict=True):
        same(a, e)


@pytest.mark.parametrize("big", range(4), ids=lambda r: f"rank{r}-over")
def test_one_rank_over_the_slot_takes_every_rank_to_the_large_path(big: int) -> None:
    every = [padded_bytes(BROADCAST.size + (r == big), r) for r in range(size)]
    for root in range(size):
        gathered = cai_mpi.gather_array(every[rank], root=root)
        if rank == root:
            assert gathered is not None
            for a, e in zip(gathered, every, strict=True):
                same(a, e)
    for a, e in zip(cai_mpi.allgather_array(every[rank]), every, strict=True):
        same(a, e)


def test_a_header_longer_than_a_slot_beside_small_ones() -> None:
    wide = np.dtype([(f"f{i}", "<i2") for i in range(150)])  # a header of ~2 KiB, and a payload of 300 bytes
    mine = values(wide, (1,), rank) if rank == 1 else values("<f8", (2,), rank)
    every = [values(wide, (1,), r) if r == 1 else values("<f8", (2,), r) for r in range(size)]
    for a, e in zip(cai_mpi.allgather_array(mine), every, strict=True):
        same(a, e)


# -- scatter, alltoall: every dtype and layout, pieces in their slots and over them, in one call -----------------


def check_scatter(every: list[np.ndarray[Any, Any]], root: int, *, out: bool = False,
                  timeout: float | None = None) -> None:
    """``scatter_array`` of ``every`` (one piece per rank) from ``root``: each rank gets its own, exactly."""
    mine = every[rank]
    into = np.full(mine.shape, 1, mine.dtype, order="F" if mine.flags.f_contiguous else "C") if out else None
    got = cai_mpi.scatter_array(every if rank == root else None, root=root, out=into, timeout=timeout)
    same(got, mine)
    assert got.source == root
    if into is not None:
        same(into, mine)
        assert np.shares_memory(np.asarray(got), into) or into.size == 0


def check_alltoall(piece: Callable[[int, int], np.ndarray[Any, Any]], timeout: float | None = None) -> None:
    """``alltoall_array`` of ``piece(rank, dst)`` to every ``dst``: each rank gets ``piece(src, rank)``, exactly."""
    got = cai_mpi.alltoall_array([piece(rank, d) for d in range(size)], timeout=timeout)
    assert [a.source for a in got] == list(range(size))
    for src, a in enumerate(got):
        same(a, piece(src, rank))


@pytest.mark.parametrize("kind", LAYOUTS)
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("shape", [SMALL, LARGE], ids=["small", "large"])
def test_scatter_and_alltoall_against_numpy(shape: tuple[int, ...], dtype: str, kind: str) -> None:
    every = [laid_out(values(dtype, shape, r), kind) for r in range(size)]
    for root in range(size):
        check_scatter(every, root)
        check_scatter(every, root, out=True)
    check_alltoall(lambda src, dst: laid_out(values(dtype, shape, 100 * src + dst), kind))


@pytest.mark.parametrize("used", [PIECE.size - 1, PIECE.size, PIECE.size + 1], ids=["slot-1", "slot", "slot+1"])
def test_scatter_and_alltoall_at_the_slot_boundary(used: int) -> None:
    every = [padded_bytes(used, r, PIECE) for r in range(size)]
    assert all(fits(a, PIECE) for a in every) == (used <= PIECE.size)
    for root in range(size):
        check_scatter(every, root)
    check_alltoall(lambda src, dst: padded_bytes(used, 100 * src + dst, PIECE))


@pytest.mark.parametrize("big", range(4), ids=lambda r: f"rank{r}-over")
def test_pieces_in_and_over_their_slots_in_one_scatter_or_alltoall(big: int) -> None:
    """One destination's piece (or one sender's pieces, or one pair's) over its slot, the rest in theirs: every rank
    joins the payload collective, and each piece arrives from where it travelled."""
    # (timeout= first: ranks that disagree on whether a payload collective follows fail it, rather than hang)
    every = [padded_bytes(PIECE.size + (r == big), r, PIECE) for r in range(size)]
    for root in range(size):
        check_scatter(every, root, out=True, timeout=30.0)
        check_scatter(every, root)
    check_alltoall(lambda src, dst: padded_bytes(PIECE.size + (src == big and dst == (big + 1) % size),
                                                 100 * src + dst, PIECE), timeout=30.0)
    check_alltoall(lambda src, dst: padded_bytes(PIECE.size + (dst == big), 100 * src + dst, PIECE), timeout=30.0)
    check_alltoall(lambda src, dst: padded_bytes(PIECE.size + (src == big), 100 * src + dst, PIECE))


def mixed(src: int, dst: int) -> np.ndarray[Any, Any]:
    """A piece whose dtype, shape, layout and size (empty, in its slot, over it) change with the pair."""
    dtype = DTYPES[(3 * src + dst) % len(DTYPES)]
    shape = [(0,), SMALL, LARGE, (2, 0, 3)][(src + 2 * dst) % 4]
    return laid_out(values(dtype, shape, 100 * src + dst), ["C", "F", "strided"][(src + dst) % 3 if
                                                                                   len(shape) == 2 else 0])


def test_scatter_and_alltoall_of_mixed_pieces() -> None:
    for root in range(size):
        every = [mixed(root, r) for r in range(size)]
        check_scatter(every, root)
        check_scatter(every, root, out=True)
    check_alltoall(mixed)
    check_alltoall(mixed, timeout=30.0)
    check_alltoall(lambda src, dst: values("<f8", (0,), src))  # (every piece empty)


def test_a_header_longer_than_a_slot_in_scatter_and_alltoall() -> None:
    wide = np.dtype([(f"f{i}", "<i2") for i in range(150)])  # a header of ~2 KiB, and a payload of 300 bytes

    def piece(src: int, dst: int) -> np.ndarray[Any, Any]:
        return values(wide, (1,), 10 * src + dst) if dst == 1 else values("<f8", (2,), 10 * src + dst)

    for root in range(size):
        check_scatter([piece(root, r) for r in range(size)], root)
    check_alltoall(piece)
    check_alltoall(lambda src, dst: piece(dst, src))  # (from rank 1 only)


class LongFailure:
    """An object whose refusal explains itself at length (a text over a slot: its rest follows the slots)."""

    __cuda_array_interface__: ClassVar[dict[str, Any]] = {"shape": (1,), "typestr": "<" + "f" * 2000,
                                                          "data": (0, False), "version": 3}


@pytest.mark.parametrize("timeout", [None, 30.0])
@pytest.mark.parametrize("failure", ["short", "long", "count"])
@pytest.mark.parametrize("shape", [SMALL, LARGE], ids=["small", "large"])
def test_a_rank_that_cannot_take_part_in_scatter_or_alltoall(shape: tuple[int, ...], failure: str,
                                                            timeout: float | None) -> None:
    """Its own error on that rank, CollectiveMismatchError naming it everywhere else, within ``timeout=``; every
    ``out=`` keeps what it held, and the next call is exact."""
    bad = size - 1
    junk: Any = LongFailure() if failure == "long" else object()
    error = cai_mpi.CAIError if failure == "long" else TypeError
    good = [values("<f8", shape, r) for r in range(size)]

    def pieces(failing: bool) -> list[Any]:
        """What a rank hands to scatter or alltoall: a piece per rank, one of them junk, or one piece too many."""
        if not failing:
            return good
        return [*good, good[0]] if failure == "count" else [junk if r == bad else good[r] for r in range(size)]

    for root in (0, bad):
        out = np.full(shape, 5.0)
        parts = pieces(True)
        if rank == root:
            with pytest.raises(error):
                cai_mpi.scatter_array(parts, root=root, out=out, timeout=timeout)
        else:
            with pytest.raises(cai_mpi.CollectiveMismatchError, match=f"root, rank {root}, could not send"):
                cai_mpi.scatter_array(None, root=root, out=out, timeout=timeout)
        same(out, np.full(shape, 5.0))
    mine = pieces(rank == bad)
    if rank == bad:
        with pytest.raises(error):
            cai_mpi.alltoall_array(mine, timeout=timeout)
    else:
        with pytest.raises(cai_mpi.CollectiveMismatchError, match=f"1 rank\\(s\\) could not take part \\(rank {bad}: "
                                                                  f"{error.__name__}"):
            cai_mpi.alltoall_array(mine, timeout=timeout)
    check_scatter(good, 0, timeout=timeout)  # (and still in step)
    check_alltoall(lambda src, dst: values("<f8", shape, 10 * src + dst), timeout=timeout)


def test_every_failing_rank_of_an_alltoall_is_named() -> None:
    failing = {0, size - 1}
    mine: list[Any] = [object()] * size if rank in failing else [values("<f8", SMALL, d) for d in range(size)]
    if rank in failing:
        with pytest.raises(TypeError):
            cai_mpi.alltoall_array(mine, timeout=30.0)
    else:
        with pytest.raises(cai_mpi.CollectiveMismatchError, match=f"2 rank\\(s\\) could not take part \\(rank 0: "
                                                                  f"TypeError.*; rank {size - 1}: TypeError"):
            cai_mpi.alltoall_array(mine, timeout=30.0)
    check_alltoall(lambda src, dst: values("<i4", SMALL, 10 * src + dst))


# -- reductions --------------------------------------------------------------------------------------------------


def expected_reduction(op: Any, parts: list[np.ndarray[Any, Any]]) -> np.ndarray[Any, Any]:
    """What MPI computes, in numpy: elementwise over the ranks, in the input dtype (integers wrap)."""
    dtype = parts[0].dtype.newbyteorder("=")
    parts = [p.astype(dtype) for p in parts]
    if op in ("mean", "avg"):
        return np.true_divide(sum(parts[1:], parts[0]), dtype.type(size)).astype(dtype)
    if op in ("min", MPI.MIN) and dtype.kind == "b":
        op = MPI.LAND
    if op in ("max", MPI.MAX) and dtype.kind == "b":
        op = MPI.LOR
    ufunc = {"sum": np.add, "prod": np.multiply, "min": np.minimum, "max": np.maximum}.get(op) if isinstance(
        op, str) else next(f for o, f in [(MPI.SUM, np.add), (MPI.PROD, np.multiply), (MPI.MIN, np.minimum),
                                          (MPI.MAX, np.maximum), (MPI.LAND, np.logical_and),
                                          (MPI.LOR, np.logical_or), (MPI.LXOR, np.logical_xor),
                                          (MPI.BAND, np.bitwise_and), (MPI.BOR, np.bitwise_or),
                                          (MPI.BXOR, np.bitwise_xor)] if o == op)
    assert ufunc is not None
    acc = parts[0].copy()
    for p in parts[1:]:
        acc = ufunc(acc, p).astype(dtype)
    return acc


ARITHMETIC = ["<i1", "<u2", "<i4", "<i8", "<f4", "<f8", "<c8", "<c16", ">i4", ">f8"]


@pytest.mark.parametrize("kind", LAYOUTS)
@pytest.mark.parametrize("dtype", ARITHMETIC)
@pytest.mark.parametrize("shape", [SMALL, LARGE], ids=["small", "large"])
def test_reductions_against_numpy(shape: tuple[int, ...], dtype: str,
                                  kind: str) -> None:
    mine = laid_out(values(dtype, shape, rank, integral=True), kind)
    every = [laid_out(values(dtype, shape, r, integral=True), kind) for r in range(size)]
    ops: list[Any] = ["sum", "prod", MPI.SUM]
    if np.dtype(dtype).kind != "c":
        ops += ["min", "max", MPI.MAX]
    if np.dtype(dtype).kind in "iu":
        ops += [MPI.BAND, MPI.BXOR, MPI.LAND, MPI.LXOR]
    else:
        ops += ["mean"]
    for op in ops:
        want = expected_reduction(op, every)
        zeros = op != "prod" or np.dtype(dtype).kind != "c"
        same(cai_mpi.allreduce_array(mine, op), want, signed_zeros=zeros)
        out = np.full(want.shape, 7, want.dtype, order="F")
        got = cai_mpi.allreduce_array(mine, op, out=out)
        same(got, want, signed_zeros=zeros)
        same(out, want, signed_zeros=zeros)
        assert np.shares_memory(np.asarray(got), out) or out.size == 0
        for root in range(size):
            got_at_root = cai_mpi.reduce_array(mine, op, root=root)
            if rank == root:
                same(got_at_root, want, signed_zeros=zeros)
            else:
                assert got_at_root is None


@pytest.mark.parametrize("op", ["min", "max", MPI.LAND, MPI.LOR, MPI.LXOR, MPI.MIN, MPI.MAX], ids=str)
@pytest.mark.parametrize("shape", [SMALL, LARGE], ids=["small", "large"])
def test_bool_reductions_on_both_paths(shape: tuple[int, ...], op: Any) -> None:
    every = [values("?", shape, r) for r in range(size)]
    same(cai_mpi.allreduce_array(every[rank], op), expected_reduction(op, every))


def test_integers_wrap_as_in_mpi() -> None:
    mine = np.array([100, -100, 127], np.int8) * np.int8(1) + np.int8(rank)
    every = [np.array([100, -100, 127], np.int8) + np.int8(r) for r in range(size)]
    want = (np.sum([e.astype(np.int64) for e in every], axis=0) % 256).astype(np.uint8).view(np.int8)
    same(cai_mpi.allreduce_array(mine, "sum"), want)
    zero_d = np.array(2**62, np.int64)
    same(cai_mpi.allreduce_array(zero_d, "sum"), np.array(2**62 * size, np.int64) if size < 2 else
         np.array((2**62 * size + 2**63) % 2**64 - 2**63, np.int64))


@pytest.mark.parametrize("n", [4, 100_000], ids=["small", "large"])
def test_the_answer_is_mpis_own_at_every_size(n: int) -> None:
    """A NaN under min/max: whatever the MPI library computes, cai_mpi gives the same, small or large."""
    mine = np.linspace(-1.0, 1.0, n) + rank
    mine[1] = np.nan if rank == size - 1 else 2.0
    for op, mpi_op in (("min", MPI.MIN), ("max", MPI.MAX), ("sum", MPI.SUM)):
        want = np.empty_like(mine)
        comm.Allreduce(mine, want, mpi_op)
        got = np.asarray(cai_mpi.allreduce_array(mine, op))
        assert np.array_equal(got, want, equal_nan=True), (op, got[:4], want[:4])


def test_an_op_numpy_cannot_stand_in_for_is_left_to_mpi() -> None:
    def twice_sum(inbuf: Any, inoutbuf: Any, datatype: Any) -> None:
        a = np.frombuffer(inbuf, np.float64)
        b = np.frombuffer(inoutbuf, np.float64)
        b += a

    op = MPI.Op.Create(twice_sum, commute=True)
    try:
        got = cai_mpi.allreduce_array(np.arange(3.0) + rank, op)
    finally:
        op.Free()
    same(got, sum(np.arange(3.0) + r for r in range(size)))


@pytest.mark.parametrize("n", [SPECULATE_BYTES - 1, SPECULATE_BYTES, SPECULATE_BYTES + 1],
                         ids=["speculated-1", "speculated", "speculated+1"])
def test_reductions_where_speculation_ends(n: int) -> None:
    """Payloads up to ``SPECULATE_BYTES`` are posted with the vote in the steady state, larger ones after it: the
    second call of each runs the steady state."""
    # Sums that do not overflow: Open MPI 5.0's vectorized uint8 SUM saturates at 255 instead of wrapping (64
    # elements and more), so the large path would differ from MPI's standard there; the small path wraps (below).
    every = [values("u1", (n,), r) // np.uint8(size) for r in range(size)]
    want = expected_reduction("sum", every)
    for _ in range(2):
        same(cai_mpi.allreduce_array(every[rank], "sum"), want)
    for _ in range(2):
        got = cai_mpi.reduce_array(every[rank], MPI.BXOR, root=size - 1)
        if rank == size - 1:
            same(got, expected_reduction(MPI.BXOR, every))


@pytest.mark.parametrize("order", ["C", "F"])
@pytest.mark.parametrize("dtype", ["<f8", "<c16", "<i2", ">f4"])
def test_a_repeated_small_allgather_keeps_each_pieces_layout(order: str, dtype: str) -> None:
    """The steady state of a small allgather (one Allgather of a record per rank) returns each piece as it was sent:
    values, shape, dtype and order, call after call."""
    every = [laid_out(values(dtype, (3, 5), r), order) for r in range(size)]
    for _ in range(3):
        got = cai_mpi.allgather_array(every[rank], timeout=LIMIT)
        assert len(got) == size
        for r, (piece, want) in enumerate(zip(got, every, strict=True)):
            same(piece, want)
            assert np.asarray(piece).flags.f_contiguous == want.flags.f_contiguous, (r, dtype, order)
            assert piece.source == r


@pytest.mark.parametrize("fn", ["allgather", "gather"])
def test_large_gathers_take_each_new_description_of_the_same_bytes(fn: str) -> None:
    """Past ``SPECULATE_BYTES`` the vote goes first, and a call like the last one keeps its agreed description:
    calls whose payloads keep their size but change dtype, shape or order (on every rank at once) arrive as sent,
    each of them twice (the second time like the last)."""
    n = (SPECULATE_BYTES + 64) // 8
    kinds = [("<f8", (n,), "C"), ("<i8", (n,), "C"), ("<f8", (2, n // 2), "C"), ("<f8", (2, n // 2), "F"),
             ("<u4", (n, 2), "C"), ("<f8", (n,), "C")]
    root = size - 1
    for dtype, shape, order in kinds:
        every = [laid_out(values(dtype, shape, r + 10 * len(shape)), order) for r in range(size)]
        for _ in range(2):
            if fn == "allgather":
                got = cai_mpi.allgather_array(every[rank], timeout=LIMIT)
            else:
                got = cai_mpi.gather_array(every[rank], root=root, timeout=LIMIT)
                if rank != root:
                    assert got is None
                    continue
            assert len(got) == size
            for r, (piece, want) in enumerate(zip(got, every, strict=True)):
                same(piece, want)
                assert np.asarray(piece).flags.f_contiguous == want.flags.f_contiguous, (r, dtype, shape, order)


# -- errors on one rank: an error on every rank, on both paths ----------------------------------------------------


@pytest.mark.parametrize("shape", [SMALL, LARGE], ids=["small", "large"])
def test_a_bad_argument_on_one_rank_is_an_error_on_every_rank(shape: tuple[int, ...]) -> None:
    bad = size - 1
    calls: list[Callable[[Any], Any]] = [
        lambda x: cai_mpi.allgather_array(x, timeout=LIMIT), lambda x: cai_mpi.gather_array(x, root=0, timeout=LIMIT),
        lambda x: cai_mpi.allreduce_array(x, timeout=LIMIT), lambda x: cai_mpi.reduce_array(x, root=0, timeout=LIMIT),
    ]
    for call in calls:
        mine = object() if rank == bad else values("<f8", shape, rank)
        if rank == bad:
            with pytest.raises(TypeError):
                call(mine)
        else:
            with pytest.raises(cai_mpi.CollectiveMismatchError, match=f"rank {bad}"):
                call(mine)
    x = values("<i4", shape, rank)
    if rank == bad:
        with pytest.raises(TypeError, match="mean"):
            cai_mpi.allreduce_array(x, "mean", timeout=LIMIT)
    else:
        with pytest.raises(cai_mpi.CollectiveMismatchError, match=f"rank {bad}"):
            cai_mpi.allreduce_array(x, "sum", timeout=LIMIT)
    same(cai_mpi.allreduce_array(np.ones(2) * rank, timeout=LIMIT), np.ones(2) * sum(range(size)))  # and still in step


@pytest.mark.parametrize("other", [(3, 5), LARGE], ids=["small", "large"])
def test_shapes_that_differ_are_an_error_on_every_rank(other: tuple[int, ...]) -> None:
    shape = other if rank == size - 1 else SMALL
    with pytest.raises(cai_mpi.CollectiveMismatchError, match=r"rank 0: shape=\(3, 4\).*shape=\("):
        cai_mpi.allreduce_array(np.zeros(shape), timeout=LIMIT)
    with pytest.raises(cai_mpi.CollectiveMismatchError, match="one shape and dtype"):
        cai_mpi.reduce_array(np.zeros(shape), root=size - 1, timeout=LIMIT)


# -- device data keeps its path -----------------------------------------------------------------------------------


@pytest.fixture
def simulated_gpu() -> Iterator[SimulatedRuntime]:
    with use_runtime(SimulatedRuntime()) as rt:
        assert isinstance(rt, SimulatedRuntime)
        yield rt


@pytest.mark.usefixtures("simulated_gpu")
def test_small_device_data_takes_the_large_path_and_small_host_data_lands_on_the_gpu() -> None:
    got = cai_mpi.allgather_array(FakeCudaArray(np.arange(3.0) + rank, device=True))
    for r, a in enumerate(got):
        assert a.device == 0
        same(a.numpy(), np.arange(3.0) + r)
    for r, a in enumerate(got):
        assert a.device == 0
        same(a.numpy(), np.arange(3.0) + r)
    total = cai_mpi.allreduce_array(np.arange(3.0) + rank, out=FakeCudaArray(np.zeros(3), device=True))
    same(np.asarray(total.numpy()), sum(np.arange(3.0) + r for r in range(size)))


@pytest.mark.usefixtures("simulated_gpu")
def test_the_same_header_from_device_and_host_data_takes_every_rank_to_the_large_path() -> None:
    # Every rank describes the same (3,) float64 array, so the slots' headers are equal; rank 0's is device data,
    # whose slot cannot carry it: the slots' prefixes differ, and no rank may take the small path.
    mine = np.arange(3.0) + rank
    got = cai_mpi.allgather_array(FakeCudaArray(mine, device=True) if rank == 0 else mine)
    for r, a in enumerate(got):
        same(np.asarray(a.numpy()), np.arange(3.0) + r)
    total = cai_mpi.allreduce_array(FakeCudaArray(mine, device=True) if rank == 0 else mine)
    same(np.asarray(total.numpy()), sum(np.arange(3.0) + r for r in range(size)))
