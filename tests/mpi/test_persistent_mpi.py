"""Persistent collectives (allreduce_init, bcast_init, allgather_init, reduce_init) and the bucketed allreduce
(allreduce_arrays, allreduce_init of a list or dict), against numpy, exactly; passes at any world size >= 2.

Values are small integers (also in floating dtypes), so every sum is exact whatever order MPI adds in; the mean
is compared with MPI's own sum divided in the input dtype, as the library computes it.
"""

from __future__ import annotations

import gc
import weakref
from typing import Any, ClassVar

import numpy as np
import pytest
from mpi4py import MPI

import cai_mpi

pytestmark = pytest.mark.mpi(min_size=2)

world = MPI.COMM_WORLD
rank, size = world.Get_rank(), world.Get_size()
DTYPES = ["i1", "i4", "u8", "f4", "f8", "c8", "c16", ">i4"]
# s: after a refused creation the calls that show the ranks still in step bound their wait, so that a creation that
# left them out of step fails the test by TimeoutError, not at the 50 s hang watchdog (creation itself takes no
# timeout=)
LIMIT = 20.0


def values(dtype: Any, r: int, shape: tuple[int, ...] = (3, 4), step: int = 0) -> np.ndarray[Any, Any]:
    n = int(np.prod(shape))
    base = (np.arange(n) % 7 + r + 1 + step).reshape(shape)
    if np.dtype(dtype).kind == "b":
        return ((base % 2) == 0).astype(bool)
    if np.dtype(dtype).kind == "c":
        return np.asarray(base + 1j * (base % 3)).astype(dtype)
    return base.astype(dtype)


def total(dtype: Any, shape: tuple[int, ...] = (3, 4), step: int = 0) -> np.ndarray[Any, Any]:
    parts = [values(dtype, r, shape, step) for r in range(size)]
    return np.sum(parts, axis=0, dtype=np.dtype(dtype).newbyteorder("=")) if parts[0].size else parts[0]


def same(got: Any, want: np.ndarray[Any, Any], *, native: bool = True) -> None:
    """``got`` holds ``want`` exactly; reductions compute in native byte order (``native``), data movers keep it."""
    arr = np.asarray(got) if not isinstance(got, cai_mpi.Array) or got.is_host else got.numpy()
    dtype = want.dtype.newbyteorder("=") if native else want.dtype
    assert arr.shape == want.shape and arr.dtype == dtype, (arr.shape, arr.dtype, dtype)
    assert np.array_equal(arr, want), f"{arr} != {want}"


def strided(dtype: Any, r: int) -> np.ndarray[Any, Any]:
    return np.asarray(values(dtype, r, (6, 8))[::2, ::2])


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("shape", [(3, 4), (), (0,), (5,)])
def test_allreduce_init_sum_against_numpy(dtype: str, shape: tuple[int, ...]) -> None:
    x = values(dtype, rank, shape)
    with cai_mpi.allreduce_init(x) as red:
        same(red(), total(dtype, shape))
        red.start()
        same(red.wait(), total(dtype, shape))


@pytest.mark.parametrize("layout", ["strided", "F"])
def test_allreduce_init_of_strided_and_f_ordered_inputs(layout: str) -> None:
    x = strided("f8", rank) if layout == "strided" else np.asfortranarray(values("f8", rank))
    want = (np.sum([strided("f8", r) for r in range(size)], axis=0) if layout == "strided" else total("f8"))
    with cai_mpi.allreduce_init(x) as red:
        for _ in range(3):
            same(red(), want)


def test_reused_100_times_with_the_contents_changed_between_uses() -> None:
    x = values("i8", rank)
    red = cai_mpi.allreduce_init(x, op="max")
    first = red()
    for step in range(100):
        x[...] = values("i8", rank, step=step)
        got = red()
        assert got is first  # the same Array over the same memory at every use
        same(got, values("i8", size - 1, step=step))
    red.close()


@pytest.mark.parametrize("dtype", ["f4", "f8", "c8", "c16"])
def test_allreduce_init_mean(dtype: str) -> None:
    x = values(dtype, rank) / 3
    want = np.empty_like(x)
    world.Allreduce(x, want, MPI.SUM)
    want = np.true_divide(want, want.dtype.type(size), dtype=want.dtype)
    with cai_mpi.allreduce_init(x, op="mean") as red:
        same(red(), want)
        same(red(), want)


def test_mean_of_integers_refused_on_every_rank() -> None:
    with pytest.raises(TypeError, match="applies to floating"):
        cai_mpi.allreduce_init(values("i4", rank), op="avg")


def test_bool_logical_ops() -> None:
    x = values(bool, rank)
    parts = [values(bool, r) for r in range(size)]
    with cai_mpi.allreduce_init(x, op=MPI.LOR) as red:
        same(red(), np.logical_or.reduce(parts))
    with cai_mpi.allreduce_init(x, op="min") as red:
        same(red(), np.logical_and.reduce(parts))


def test_allreduce_init_into_out_and_in_place() -> None:
    x = values("f8", rank)
    out = np.zeros((4, 3)).T  # F-ordered
    with cai_mpi.allreduce_init(x, out=out) as red:
        y = red()
        assert np.shares_memory(np.asarray(y), out)
        same(out, total("f8"))
    x2 = values("i4", rank)
    with cai_mpi.allreduce_init(x2, out=x2) as red:
        red()
        same(x2, total("i4"))


def test_out_that_does_not_fit_is_an_error_on_every_rank() -> None:
    out = np.zeros(5) if rank == 0 else np.zeros((3, 4))
    with pytest.raises((ValueError, cai_mpi.CollectiveMismatchError)) as info:
        cai_mpi.allreduce_init(values("f8", rank), out=out)
    assert isinstance(info.value, ValueError if rank == 0 else cai_mpi.CollectiveMismatchError)


@pytest.mark.parametrize("root", [0, -1])
@pytest.mark.parametrize("dtype", ["u1", "i4", "f8", "c16", ">f4", bool])
def test_bcast_init(root: int, dtype: Any) -> None:
    root %= size
    buf = values(dtype, rank)
    with cai_mpi.bcast_init(buf, root=root) as bc:
        for step in range(3):
            if rank == root:
                buf[...] = values(dtype, rank, step=step)
            got = bc()
            assert np.shares_memory(np.asarray(got), buf)
            same(got, values(dtype, root, step=step), native=False)


def test_bcast_init_into_strided_zero_size_and_0d_buffers() -> None:
    big = values("f8", rank, (6, 8))
    view = big[::2, ::2]
    with cai_mpi.bcast_init(view) as bc:
        bc()
    want = values("f8", 0, (6, 8))
    same(view, want[::2, ::2])
    if rank:
        rest = values("f8", rank, (6, 8))
        rest[::2, ::2] = want[::2, ::2]
        same(big, rest)  # nothing outside the view was written
    for shape in [(), (0,)]:
        b = values("i4", rank, shape)
        with cai_mpi.bcast_init(b) as bc:
            same(bc(), values("i4", 0, shape))


def test_bcast_init_shape_checked_against_the_roots() -> None:
    buf = np.zeros(3 if rank == 0 else 4)
    with pytest.raises(cai_mpi.CollectiveMismatchError, match="rank 0: bcast shape=\\(3,\\)"):
        cai_mpi.bcast_init(buf)


@pytest.mark.parametrize("dtype", ["i2", "f8", "c8", ">i8"])
@pytest.mark.parametrize("shape", [(3, 4), (), (0,)])
def test_allgather_init(dtype: str, shape: tuple[int, ...]) -> None:
    x = values(dtype, rank, shape)
    with cai_mpi.allgather_init(x) as ag:
        for step in range(3):
            x[...] = values(dtype, rank, shape, step)
            got = ag()
            assert len(got) == size
            for r, a in enumerate(got):
                assert a.source == r
                same(a, values(dtype, r, shape, step), native=False)


def test_allgather_init_of_strided_input() -> None:
    with cai_mpi.allgather_init(strided("i4", rank)) as ag:
        for r, a in enumerate(ag()):
            same(a, strided("i4", r))


@pytest.mark.parametrize("root", [0, -1])
def test_reduce_init(root: int) -> None:
    root %= size
    x = values("i8", rank)
    out = np.zeros((3, 4), "i8") if rank == root else None
    with cai_mpi.reduce_init(x, op="sum", root=root, out=out) as rd:
        for step in range(3):
            x[...] = values("i8", rank, step=step)
            got = rd()
            if rank == root:
                same(got, total("i8", step=step))
                assert out is not None and np.shares_memory(np.asarray(got), out)
            else:
                assert got is None
    with cai_mpi.reduce_init(values("c16", rank) / 4, op="mean", root=root) as rd:
        got = rd()
        want = np.empty((3, 4), "c16")
        world.Reduce(values("c16", rank) / 4, want if rank == root else None, MPI.SUM, root=root)
        if rank == root:
            same(got, np.true_divide(want, np.complex128(size)))
        else:
            assert got is None


def test_start_wait_rules() -> None:
    x = values("f8", rank)
    red = cai_mpi.allreduce_init(x)
    with pytest.raises(ValueError, match="without start"):
        red.wait()
    red.start()
    with pytest.raises(ValueError, match="in flight"):
        red.start()
    same(red.wait(), total("f8"))
    red.close()
    red.close()  # idempotent
    for use in (red.start, red):
        with pytest.raises(ValueError, match="closed"):
            use()


def test_shape_change_after_creation_refused() -> None:
    x = values("f8", rank, (12,))
    red = cai_mpi.allreduce_init(x)
    same(red(), total("f8", (12,)))
    x.shape = (3, 4)
    with pytest.raises(ValueError, match="reshaped"):
        red()
    with pytest.raises(ValueError, match="reshaped"):
        red.start()
    x.shape = (12,)
    same(red(timeout=LIMIT), total("f8", (12,)))  # refused without starting: the ranks are still in step
    red.close()


def test_mismatched_creation_on_one_rank_is_an_error_on_every_rank() -> None:
    shape = (3,) if rank == 1 else (4,)
    with pytest.raises(cai_mpi.CollectiveMismatchError, match="rank 1: allreduce shape=\\(3,\\)"):
        cai_mpi.allreduce_init(np.zeros(shape), timeout=LIMIT)
    op = "max" if rank == 0 else "sum"
    with pytest.raises(cai_mpi.CollectiveMismatchError, match="op="):
        cai_mpi.reduce_init(np.zeros(4), op=op, timeout=LIMIT)
    # different collectives on different ranks
    with pytest.raises(cai_mpi.CollectiveMismatchError):
        if rank == 0:
            cai_mpi.bcast_init(np.zeros(4), timeout=LIMIT)
        else:
            cai_mpi.allgather_init(np.zeros(4), timeout=LIMIT)
    # a rank that cannot take part raises its own error, the others name it
    bad: Any = np.zeros(2, "i4,f8") if rank == size - 1 else np.zeros(2)
    with pytest.raises((TypeError, cai_mpi.CollectiveMismatchError)) as info:
        cai_mpi.allreduce_init(bad, timeout=LIMIT)
    assert isinstance(info.value, TypeError if rank == size - 1 else cai_mpi.CollectiveMismatchError)
    same(cai_mpi.allreduce_array(np.ones(2), timeout=LIMIT), np.full(2, float(size)))  # still in step



@pytest.mark.parametrize("make", ["bcast_init", "allgather_init"])
def test_an_object_array_is_refused_at_creation_on_every_rank(make: str) -> None:
    """Issue 46: bcast_init of an object array was created and broadcast the root's pointers (a segfault where a
    receiver read them); now every rank refuses it, naming the host array and its dtype, and the ranks stay in step.
    Only the root holding one is refused there and named by the others."""
    objects = np.array([1, "x", None], dtype=object)
    create = getattr(cai_mpi, make)
    with pytest.raises(TypeError, match=f"^{make}: a host array of dtype object cannot be sent"):
        create(objects)
    bad: Any = objects if rank == 0 else np.zeros(3)
    with pytest.raises((TypeError, cai_mpi.CollectiveMismatchError)) as info:
        create(bad)
    assert isinstance(info.value, TypeError if rank == 0 else cai_mpi.CollectiveMismatchError)
    assert "host array of dtype object" in str(info.value)
    same(cai_mpi.allreduce_array(np.ones(2), timeout=LIMIT), np.full(2, float(size)))  # still in step

def test_close_and_drop_without_leaks() -> None:
    """Objects dropped without close() are collected and free their MPI requests (seen from MPI's side)."""
    x = values("f4", rank)
    comm = _Counting(world.Dup())
    _Counting.made.clear()
    red: Any = cai_mpi.allreduce_init(x, comm=comm)
    red()
    gone = weakref.ref(red)
    del red
    gc.collect()
    assert gone() is None
    bucket = cai_mpi.allreduce_init([values("f4", rank), values("i4", rank)], comm=comm)
    bucket()
    gone = weakref.ref(bucket)
    del bucket
    gc.collect()
    assert gone() is None
    assert len(_Counting.made) == 3 and all(req == MPI.REQUEST_NULL for req in _Counting.made)
    _Counting.made.clear()
    comm.Free()
    # dropped while in flight: MPI finishes it in the background; the next collective is in step
    red = cai_mpi.allgather_init(x)
    red.start()
    del red
    gc.collect()
    same(cai_mpi.allreduce_array(np.ones(3)), np.full(3, float(size)))


def test_timeout_of_a_wait() -> None:
    comm = world.Dup()
    red = cai_mpi.allreduce_init(np.ones(2), comm=comm)
    if rank == 0:
        red.start()
        with pytest.raises(cai_mpi.TimeoutError, match="joined"):
            red.wait(timeout=0.2)
        with pytest.raises(ValueError, match="timed out"):
            red.start()
        world.Barrier()
    else:
        world.Barrier()
        same(red(), np.full(2, float(size)))
    red.close()
    world.Barrier()
    gc.collect()
    comm.Free()


@pytest.mark.parametrize("container", ["list", "dict"])
def test_allreduce_arrays_mixed_dtypes(container: str) -> None:
    arrays = [values("f8", rank), values("i4", rank, (5,)), strided("f4", rank), values("f8", rank, ()),
              np.asfortranarray(values("i4", rank)), values("f4", rank, (0,)), values(">i4", rank, (2,))]
    wants = [total("f8"), total("i4", (5,)), np.sum([strided("f4", r) for r in range(size)], axis=0),
             total("f8", ()), total("i4"), total("f4", (0,)), total(">i4", (2,))]
    objs: Any = arrays if container == "list" else {f"w{i}": a for i, a in enumerate(arrays)}
    got = cai_mpi.allreduce_arrays(objs)
    assert type(got) is type(objs) and len(got) == len(arrays)
    items = got if container == "list" else [got[f"w{i}"] for i in range(len(arrays))]
    for a, want in zip(items, wants, strict=True):
        same(a, want)


def test_allreduce_arrays_mean_and_mismatch() -> None:
    objs = {"a": values("f8", rank) / 4, "b": values("c8", rank, (2,)) / 4}  # (quarters: every sum exact)
    got = cai_mpi.allreduce_arrays(objs, op="mean")
    for key, x in objs.items():
        want = np.empty_like(x)
        world.Allreduce(x, want, MPI.SUM)
        same(got[key], np.true_divide(want, want.dtype.type(size), dtype=want.dtype))
    keys = {"a": np.zeros(2), ("b" if rank else "c"): np.zeros(2)}
    with pytest.raises(cai_mpi.CollectiveMismatchError, match="rank 0"):
        cai_mpi.allreduce_arrays(keys, timeout=LIMIT)


@pytest.mark.parametrize("container", ["list", "dict"])
def test_bucketed_allreduce_init_reused_100_times(container: str) -> None:
    arrays = [values("f8", rank), values("i4", rank, (5,)), strided("f4", rank), values("i4", rank, ())]
    objs: Any = arrays if container == "list" else dict(zip("abcd", arrays, strict=True))
    with cai_mpi.allreduce_init(objs) as red:
        for step in range(100):
            arrays[0][...] = values("f8", rank, step=step)
            arrays[1][...] = values("i4", rank, (5,), step)
            got = red()
            items = got if container == "list" else [got[k] for k in "abcd"]
            same(items[0], total("f8", step=step))
            same(items[1], total("i4", (5,), step))
            same(items[2], np.sum([strided("f4", r) for r in range(size)], axis=0))
            same(items[3], total("i4", ()))
        red.start()
        red.wait()
    with pytest.raises(ValueError, match="closed"):
        red()


def test_allreduce_arrays_calls_are_independent() -> None:
    """A second call on the same arrays (its plan reused) leaves the first call's results as they were."""
    arrays = [values("f8", rank), values("i4", rank, (5,))]
    first = cai_mpi.allreduce_arrays(arrays)
    arrays[0][...] = values("f8", rank, step=5)
    second = cai_mpi.allreduce_arrays(arrays)
    same(first[0], total("f8"))
    same(second[0], total("f8", step=5))
    same(first[1], total("i4", (5,)))
    arrays.append(values("f4", rank, (2, 2)))  # another layout: planned afresh
    third = cai_mpi.allreduce_arrays(arrays)
    same(third[2], total("f4", (2, 2)))
    same(third[0], total("f8", step=5))


class _NoPersistent(MPI.Intracomm):
    """A communicator whose MPI lacks MPI-4's persistent collectives: every ``*_init`` raises NotImplementedError,
    as mpi4py does on such an MPI, so the persistent collectives take their nonblocking form per start. Its
    duplicates (cai_mpi's private communicators) are of this class too."""

    def _lacks(self, *args: Any, **kwargs: Any) -> Any:
        raise NotImplementedError("MPI-4 persistent collectives")

    Allreduce_init = Bcast_init = Allgather_init = Reduce_init = _lacks


class _Counting(MPI.Intracomm):
    """A communicator that keeps every persistent collective request MPI makes on it (and its duplicates): what
    ``close()`` must free, seen from MPI's side."""

    made: ClassVar[list[MPI.Request]] = []

    def _keep(self, name: str, *args: Any, **kwargs: Any) -> MPI.Request:
        req: MPI.Request = getattr(super(), name)(*args, **kwargs)
        _Counting.made.append(req)
        return req

    def Allreduce_init(self, *args: Any, **kwargs: Any) -> MPI.Request:  # type: ignore[override]
        return self._keep("Allreduce_init", *args, **kwargs)

    def Bcast_init(self, *args: Any, **kwargs: Any) -> MPI.Request:  # type: ignore[override]
        return self._keep("Bcast_init", *args, **kwargs)

    def Allgather_init(self, *args: Any, **kwargs: Any) -> MPI.Request:  # type: ignore[override]
        return self._keep("Allgather_init", *args, **kwargs)

    def Reduce_init(self, *args: Any, **kwargs: Any) -> MPI.Request:  # type: ignore[override]
        return self._keep("Reduce_init", *args, **kwargs)


@pytest.mark.parametrize("persistent", [True, False], ids=["persistent", "nonblocking"])
def test_bcast_init_and_reduce_init_from_every_root(persistent: bool) -> None:
    """Every rank as the root, on MPI's persistent collectives and on the nonblocking form an MPI without them
    takes: the root's data reaches every rank (a root lost on the way delivers rank 0's, or zeros)."""
    comm: Any = world.Dup() if persistent else _NoPersistent(world.Dup())
    try:
        for root in range(size):
            buf = values("i4", root) * (root + 2) if rank == root else np.zeros((3, 4), "i4")
            with cai_mpi.bcast_init(buf, root=root, comm=comm) as bc:
                for step in range(2):
                    if rank == root:
                        buf[...] = values("i4", root, step=step) * (root + 2)
                    same(bc(), values("i4", root, step=step) * (root + 2))
            x = values("f8", rank)
            with cai_mpi.reduce_init(x, op="max", root=root, comm=comm) as rd:
                got = rd()
                if rank == root:
                    same(got, values("f8", size - 1))
                else:
                    assert got is None
    finally:
        comm.Free()


@pytest.mark.parametrize("fn", ["bcast_init", "reduce_init"])
def test_ranks_naming_different_roots_is_an_error_on_every_rank(fn: str) -> None:
    """Different roots are refused at creation on every rank, naming each rank's (never a first use that hangs)."""
    make = getattr(cai_mpi, fn)
    root = 0 if rank == 0 else 1
    kind = fn.removesuffix("_init")
    with pytest.raises(cai_mpi.CollectiveMismatchError, match=rf"rank 0: {kind} .*root=0; rank 1: {kind} .*root=1"):
        make(values("f8", rank), root=root)
    with cai_mpi.allreduce_init(np.ones(2)) as red:  # still in step
        same(red(timeout=LIMIT), np.full(2, float(size)))


@pytest.mark.parametrize("how", ["bucketed", "one array", "one large array"])
def test_mean_on_a_split_communicator_divides_by_its_size(how: str) -> None:
    """``mean`` on a communicator smaller than the world divides by that communicator's size."""
    comm = world.Split(rank % 2, rank)
    members = list(range(rank % 2, size, 2))

    def mean(dtype: str, shape: tuple[int, ...], step: int = 0) -> np.ndarray[Any, Any]:
        parts = [values(dtype, r, shape, step) for r in members]
        return np.true_divide(np.sum(parts, axis=0, dtype=dtype), np.dtype(dtype).type(len(members)), dtype=dtype)

    try:
        if how == "bucketed":
            from cai_mpi._src.api.bucketed import DIRECT_BYTES

            shapes = [((3, 4), "f8"), ((5,), "f4"), ((DIRECT_BYTES // 8,), "f8")]  # (the last one reduced alone)
            arrays = [values(dt, rank, shape) for shape, dt in shapes]
            with cai_mpi.allreduce_init(arrays, op="mean", comm=comm) as red:
                for step in range(2):
                    for (shape, dt), x in zip(shapes, arrays, strict=True):
                        x[...] = values(dt, rank, shape, step)
                    for a, (shape, dt) in zip(red(), shapes, strict=True):
                        same(a, mean(dt, shape, step))
        else:
            shape = (3, 4) if how == "one array" else (40_000,)
            x = values("c16", rank, shape)
            with cai_mpi.allreduce_init(x, op="mean", comm=comm) as red:
                same(red(), mean("c16", shape))
            with cai_mpi.reduce_init(x, op="mean", root=0, comm=comm) as rd:
                got = rd()
                if comm.Get_rank() == 0:
                    same(got, mean("c16", shape))
    finally:
        comm.Free()


def test_close_frees_every_mpi_request() -> None:
    """``close()``, the end of a ``with`` block and leaving one on an error free every persistent request MPI made
    for the object (seen on the communicator's side: each is MPI.REQUEST_NULL), without waiting for the collector."""
    comm = _Counting(world.Dup())
    made = _Counting.made
    made.clear()
    kept = []
    try:
        objs: list[Any] = [
            cai_mpi.allreduce_init(values("f8", rank), comm=comm),
            cai_mpi.bcast_init(values("i4", 0) if rank == 0 else np.zeros((3, 4), "i4"), comm=comm),
            cai_mpi.allgather_init(values("u1", rank), comm=comm),
            cai_mpi.reduce_init(values("f4", rank), comm=comm),
            cai_mpi.allreduce_init([values("f8", rank), values("i4", rank), values("f8", rank, (70_000,))],
                                   comm=comm),
        ]
        assert len(made) == 7 and not any(req == MPI.REQUEST_NULL for req in made)
        for obj in objs:
            obj()
            obj.close()
            kept.append(obj)  # (alive: only close() can have freed its requests)
        assert [req == MPI.REQUEST_NULL for req in made] == [True] * 7
        made.clear()
        with cai_mpi.allreduce_init(values("f8", rank), comm=comm) as red:
            red()
        kept.append(red)
        with pytest.raises(KeyError), cai_mpi.allreduce_init([values("f8", rank)], comm=comm) as bucket:
            raise KeyError("leaving on an error")
        kept.append(bucket)
        assert [req == MPI.REQUEST_NULL for req in made] == [True] * 2
    finally:
        made.clear()
        comm.Free()
