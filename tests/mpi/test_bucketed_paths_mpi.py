"""The paths of the one-shot ``allreduce_arrays``, each on both sides of its boundary, against numpy, exactly:
the buckets (small arrays copied together, one Allreduce per dtype) and the large host arrays reduced on their
own (``DIRECT_BYTES``); results held are never changed by later calls. Passes at any world size >= 2.

Values are small integers (also in floating dtypes), so every sum is exact in whatever order MPI or numpy adds.
"""

from __future__ import annotations

import gc
import weakref
from typing import Any

import numpy as np
import pytest
from mpi4py import MPI

import cai_mpi
from cai_mpi._src.api import bucketed

pytestmark = pytest.mark.mpi(min_size=2)

world = MPI.COMM_WORLD
rank, size = world.Get_rank(), world.Get_size()
FITS = 126  # elements of one float64 array that filled the former fused path's slot exactly (a small bucket)
DIRECT = bucketed.DIRECT_BYTES
# s: where one rank errs, the calls bound their wait, so that an agreement mistake fails the test by TimeoutError
# naming the call, well before the 50 s hang watchdog
LIMIT = 20.0


def values(dtype: Any, r: int, shape: Any = (3, 4), step: int = 0) -> np.ndarray[Any, Any]:
    shape = (shape,) if isinstance(shape, int) else shape
    n = int(np.prod(shape))
    base = (np.arange(n) % 7 + r + 1 + step).reshape(shape)
    if np.dtype(dtype).kind == "b":
        return ((base + r) % 3 == 0).reshape(shape)
    if np.dtype(dtype).kind == "c":
        return np.asarray(base + 1j * (base % 3)).astype(dtype)
    return base.astype(dtype)


def every(dtype: Any, shape: Any, step: int = 0) -> list[np.ndarray[Any, Any]]:
    return [values(dtype, r, shape, step) for r in range(size)]


def same(got: Any, want: np.ndarray[Any, Any]) -> None:
    arr = np.asarray(got)
    native = want.dtype.newbyteorder("=")
    assert arr.shape == want.shape and arr.dtype == native, (arr.shape, arr.dtype, want.shape, native)
    assert np.array_equal(arr, want), f"{arr} != {want}"


def total(dtype: Any, shape: Any, step: int = 0) -> np.ndarray[Any, Any]:
    return np.sum(every(dtype, shape, step), axis=0, dtype=np.dtype(dtype).newbyteorder("="))


def split() -> tuple[MPI.Intracomm, list[int]]:
    """COMM_WORLD split in two (even and odd ranks): the communicator and the world ranks in it."""
    return world.Split(rank % 2, rank), list(range(rank % 2, size, 2))


def among(members: list[int], dtype: Any, shape: Any, op: str = "sum") -> np.ndarray[Any, Any]:
    """The sum (or mean, in the dtype) of the members' values."""
    native = np.dtype(dtype).newbyteorder("=")
    want = np.sum([values(dtype, r, shape) for r in members], axis=0, dtype=native)
    return want if op == "sum" else np.true_divide(want, native.type(len(members)), dtype=native)


@pytest.mark.parametrize("n", [FITS, FITS + 1], ids=["fills the slot", "one more"])
def test_the_slot_boundary(n: int) -> None:
    """An array of 8-byte elements filling the slot exactly travels in the exchange; one element more takes the
    buckets: exact either way, in every dtype and byte order of that size, and on a split communicator (mean)."""
    for dtype in ("f8", ">f8", "i8", "<u8", "c8"):
        objs = [values(dtype, rank, n)]
        same(cai_mpi.allreduce_arrays(objs)[0], total(dtype, n))
    comm, members = split()
    for dtype in ("f8", ">f8"):
        got = cai_mpi.allreduce_arrays({"x": values(dtype, rank, n)}, op="mean", comm=comm)
        same(got["x"], among(members, dtype, n, "mean"))
    comm.Free()


def test_the_slot_holds_every_bucket_aligned() -> None:
    """Mixed dtypes in one slot: each dtype's bucket starts 16-aligned; a layout one element over does not fit."""
    shapes = [(3,), (2, 5), (), (0,), (4, 1)]
    dtypes = ["f8", "f4", "i2", "f8", ">i4", "c16", "u1"]
    for extra in (0, 200):  # (the slot holds the layout; one over, it does not)
        objs = {f"k{i}": values(dt, rank, shapes[i % len(shapes)]) for i, dt in enumerate(dtypes)}
        objs["big"] = values("f8", rank, 100 + extra)
        got = cai_mpi.allreduce_arrays(objs)
        assert type(got) is dict and list(got) == list(objs)
        for i, dt in enumerate(dtypes):
            same(got[f"k{i}"], total(dt, shapes[i % len(shapes)]))
        same(got["big"], total("f8", 100 + extra))
        comm, members = split()
        got = cai_mpi.allreduce_arrays(objs, comm=comm)
        for i, dt in enumerate(dtypes):
            same(got[f"k{i}"], among(members, dt, shapes[i % len(shapes)]))
        same(got["big"], among(members, "f8", 100 + extra))
        comm.Free()


@pytest.mark.parametrize("op", ["sum", "prod", "min", "max", "mean"])
@pytest.mark.parametrize("n", [4, FITS + 1, DIRECT // 8])
def test_ops_on_every_path(op: str, n: int) -> None:
    """The same ops give the same results fused (4), bucketed (FITS + 1) and direct (DIRECT // 8 float64)."""
    arrays = [values("f8", rank, n) % 3 + 1, values("f4", rank, (2, 3)) % 3 + 1]
    got = cai_mpi.allreduce_arrays(arrays, op=op)
    for a, x in zip(got, arrays, strict=True):
        parts = [(values(x.dtype, r, x.shape) % 3 + 1).astype(x.dtype) for r in range(size)]
        if op in ("sum", "mean"):
            want = np.sum(parts, axis=0, dtype=x.dtype)
            if op == "mean":
                want = np.true_divide(want, x.dtype.type(size), dtype=x.dtype)
        else:
            want = {"prod": np.prod, "min": np.min, "max": np.max}[op](parts, axis=0).astype(x.dtype)
        same(a, want)


@pytest.mark.parametrize("op, ufunc", [("min", np.logical_and), ("max", np.logical_or), (MPI.LXOR, np.logical_xor),
                                       (MPI.LAND, np.logical_and)])
@pytest.mark.parametrize("n", [5, 1024, DIRECT])
def test_bool_ops_on_every_path(op: Any, ufunc: Any, n: int) -> None:
    got = cai_mpi.allreduce_arrays({"flags": values(bool, rank, n), "x": values("i4", rank, 3)}, op=op)
    want = every(bool, n)[0]
    for part in every(bool, n)[1:]:
        want = ufunc(want, part)
    same(got["flags"], want)
    if isinstance(op, str):
        same(got["x"], {"min": np.min, "max": np.max}[op](every("i4", 3), axis=0))
    else:  # MPI's logical ops on integers: 1 or 0, as MPI's own Allreduce gives
        logical = every("i4", 3)[0] != 0
        for part in every("i4", 3)[1:]:
            logical = ufunc(logical, part != 0)
        same(got["x"], logical.astype("i4"))
        mpi = np.empty(3, "i4")
        world.Allreduce(values("i4", rank, 3), mpi, op)
        same(got["x"], mpi)
    with cai_mpi.allreduce_init({"flags": values(bool, rank, n), "x": values("i4", rank, 3)}, op=op) as red:
        again = red()  # the persistent form, the same values
        same(again["flags"], want)
        same(again["x"], np.asarray(got["x"]))


@pytest.mark.parametrize("nbytes", [DIRECT - 8, DIRECT])
def test_the_direct_boundary(nbytes: int) -> None:
    """A float64 array of DIRECT_BYTES is reduced on its own, one element less goes in its bucket; strided,
    F-ordered and byte-swapped large arrays too, and zero-size and 0-d small ones beside them."""
    n = nbytes // 8
    arrays = [values("f8", rank, n), np.asfortranarray(values("f4", rank, (2, n))),
              values("f8", rank, 2 * n)[::2], values(">i8", rank, n), values("f8", rank, ()),
              values("f4", rank, (0, 3)), values("f8", rank, 7)]
    got = cai_mpi.allreduce_arrays(arrays)
    same(got[0], total("f8", n))
    same(got[1], total("f4", (2, n)))
    same(got[2], np.sum([values("f8", r, 2 * n)[::2] for r in range(size)], axis=0))
    same(got[3], total(">i8", n))
    same(got[4], total("f8", ()))
    same(got[5], values("f4", rank, (0, 3)))
    same(got[6], total("f8", 7))
    comm, members = split()  # the same arrays on a split communicator, with the mean of the floating ones
    got = cai_mpi.allreduce_arrays(arrays[:3] + arrays[4:], op="mean", comm=comm)
    same(got[0], among(members, "f8", n, "mean"))
    same(got[1], among(members, "f4", (2, n), "mean"))
    parts = [values("f8", r, 2 * n)[::2] for r in members]
    same(got[2], np.true_divide(np.sum(parts, axis=0), float(len(members))))
    same(got[3], among(members, "f8", (), "mean"))
    same(got[5], among(members, "f8", 7, "mean"))
    comm.Free()


def test_results_are_kept_while_referred_to() -> None:
    """A call never overwrites an earlier call's results that are still held (as Arrays or as numpy views)."""
    n = DIRECT // 8
    arrays = [values("f8", rank, n), values("f4", rank, 9)]
    first = cai_mpi.allreduce_arrays(arrays)
    view = np.asarray(first[1])[2:]
    del first[1]
    for step in range(1, 4):
        arrays[0][...] = values("f8", rank, n, step)
        arrays[1][...] = values("f4", rank, 9, step)
        got = cai_mpi.allreduce_arrays(arrays)
        same(got[0], total("f8", n, step))
        same(got[1], total("f4", 9, step))
        same(first[0], total("f8", n))
        same(view, total("f4", 9)[2:])


@pytest.mark.parametrize("hold", ["array", "asarray", "view of a view", "__array__", "dlpack"])
def test_small_results_held_in_any_form_are_never_overwritten(hold: str) -> None:
    """An Array held, or any numpy view of one, keeps its values through later calls; a dropped one is freed (no
    call hands an Array it made before back: a weak reference to it dies, never to see another call's values)."""
    arrays = [values("f8", rank, 3), values("f4", rank, (2, 2)), values("f8", rank, ())]
    first = cai_mpi.allreduce_arrays(arrays)
    held = {"array": lambda a: a, "asarray": np.asarray, "view of a view": lambda a: np.asarray(a)[1:],
            "__array__": lambda a: a.__array__(), "dlpack": np.from_dlpack}[hold](first[1])
    want = np.asarray(held).copy()
    del first
    for step in range(1, 4):
        for x in arrays:
            x[...] = values(x.dtype, rank, x.shape, step)
        got = cai_mpi.allreduce_arrays(arrays)
        same(got[0], total("f8", 3, step))
        same(got[1], total("f4", (2, 2), step))
        same(got[2], total("f8", (), step))
        assert np.array_equal(np.asarray(held), want)
        last = weakref.ref(got[0])
        del got
    del held
    gc.collect()
    assert last() is None, "a dropped result is kept alive (and could come back with new values)"
    arrays[0][...] = values("f8", rank, 3, 9)
    again = cai_mpi.allreduce_arrays(arrays)
    same(again[0], total("f8", 3, 9))
    same(again[1], total("f4", (2, 2), 3))


@pytest.mark.parametrize("n", [4, FITS + 1, DIRECT // 8], ids=["fused", "bucketed", "alone"])
def test_what_a_caller_does_to_dropped_results_never_reaches_later_ones(n: int) -> None:
    """A later call may reuse the memory of dropped results, but each call hands out views of its own: a new shape,
    a read-only flag or an annotation given to a dropped result stays with it (and a read-only one cannot make a
    later call fail on one rank only, which would leave the others waiting in the collective)."""
    arrays = [values("f8", rank, n), values("f8", rank, n)]
    for change in ("shape", "read-only", "dtype", "annotations"):
        got = cai_mpi.allreduce_arrays(arrays)
        x = got[0].numpy()
        if change == "shape":
            x.shape = (1, n)
        elif change == "read-only":
            x.flags.writeable = False
        elif change == "dtype":
            x.dtype = np.int64
        else:
            got[0].meta, got[0].tag = {"mine": True}, 99
        del x, got
        again = cai_mpi.allreduce_arrays(arrays)
        same(again[0], total("f8", n))
        same(again[1], total("f8", n))
        assert again[0].numpy().flags.writeable and again[0].meta is None and again[0].tag == MPI.ANY_TAG, change


def test_a_cached_plan_keeps_no_input_alive() -> None:
    """The plan of a layout is cached for the next call; the arrays of the call that made it are not."""
    small, large = values("f8", rank, 3), values("f8", rank, DIRECT // 8)
    inputs = [weakref.ref(small), weakref.ref(large)]
    same(cai_mpi.allreduce_arrays([small, large])[0], total("f8", 3))
    del small, large
    gc.collect()
    assert [ref() is None for ref in inputs] == [True, True], "the plan cache keeps a call's inputs alive"


@pytest.mark.parametrize("n", [3, FITS + 1, DIRECT])
def test_a_mismatch_on_one_rank_is_an_error_on_every_rank(n: int) -> None:
    objs = [values("f8", rank, n), values("f4", rank, (n if rank else n + 1,))]
    with pytest.raises(cai_mpi.CollectiveMismatchError, match=r"rank 0.*rank 1"):
        cai_mpi.allreduce_arrays(objs, timeout=LIMIT)
    # (and the comm still works)
    same(cai_mpi.allreduce_arrays([values("f8", rank, n)], timeout=LIMIT)[0], total("f8", n))


@pytest.mark.parametrize("n", [3, DIRECT])
def test_a_failure_on_one_rank_is_an_error_on_every_rank(n: int) -> None:
    """Rank 0 asks for the mean of integers: it raises its own TypeError, the others name it."""
    arrays = [values("f8", rank, n), values("i4" if rank == 0 else "f4", rank, 2)]
    if rank == 0:
        with pytest.raises(TypeError, match="mean"):
            cai_mpi.allreduce_arrays(arrays, op="mean", timeout=LIMIT)
    else:
        with pytest.raises(cai_mpi.CollectiveMismatchError, match="rank 0: could not take part"):
            cai_mpi.allreduce_arrays(arrays, op="mean", timeout=LIMIT)


@pytest.mark.parametrize("n", [3, DIRECT])
def test_timeout_when_every_rank_joins_and_other_communicators(n: int) -> None:
    comm = world.Split(rank % 2, rank)
    arrays = [values("f8", rank, n), values("f4", rank, 4)]
    got = cai_mpi.allreduce_arrays(arrays, comm=comm, timeout=60)
    members = range(rank % 2, size, 2)
    same(got[0], np.sum([values("f8", r, n) for r in members], axis=0))
    same(got[1], np.sum([values("f4", r, 4) for r in members], axis=0))
    comm.Free()


def test_a_list_subclass_and_a_tuple_take_the_uncached_paths() -> None:
    """Containers other than a plain list or dict are planned afresh each call, on every path alike."""
    n = DIRECT // 8
    got = cai_mpi.allreduce_arrays((values("f8", rank, n), values("i2", rank, 3)))
    assert type(got) is list
    same(got[0], total("f8", n))
    same(got[1], total("i2", 3))
    small = cai_mpi.allreduce_arrays((values("u8", rank, 2), values("c8", rank, 2)), op="sum")
    same(small[0], total("u8", 2))
    same(small[1], total("c8", 2))


@pytest.mark.parametrize("op", ["sum", "mean"])
@pytest.mark.parametrize("container", ["list", "dict"])
def test_bucketed_allreduce_init_with_large_arrays(op: str, container: str) -> None:
    """The persistent form gives each host array of DIRECT_BYTES its own persistent Allreduce (bound to the
    array, or to a staging copy of a strided or byte-swapped one), the smaller ones their buckets: reused 20
    times with the contents changed, the same Arrays every use; a reshaped array is refused afterwards."""
    n = DIRECT // 8
    arrays = [values("f8", rank, n), values("f8", rank, 2 * n)[::2], values(">f4", rank, 2 * n),
              values("f4", rank, n - 1), values("f8", rank, (2, 3))]
    objs: Any = arrays if container == "list" else {f"a{i}": x for i, x in enumerate(arrays)}
    with cai_mpi.allreduce_init(objs, op=op) as red:
        first = None
        for step in range(20):
            for x in arrays:
                x[...] = values(x.dtype, rank, x.shape, step)
            got = red()
            items = got if container == "list" else [got[f"a{i}"] for i in range(len(arrays))]
            for a, x in zip(items, arrays, strict=True):
                want = total(x.dtype, x.shape, step)
                same(a, want if op == "sum" else np.true_divide(want, want.dtype.type(size), dtype=want.dtype))
            first = first or items
            assert all(a is b for a, b in zip(items, first, strict=True))
        arrays[0].shape = (n // 2, 2)
        with pytest.raises(ValueError, match="reshaped"):
            red()
