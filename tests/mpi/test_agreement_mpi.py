"""The one-shot collectives agree on everything that decides the MPI calls each rank makes (issue 38): a rank
that names another root or op, or reduces another shape, dtype or order, is an error on every rank, at every
size, with and without ``timeout=``, and the communicator works afterwards. Calls whose signature changes from
one to the next (the steady state posts the payload of the last agreed signature with the vote, then makes it
again when the vote says the signature changed) give exactly what numpy gives. Passes at any world size >= 2.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np
import pytest
from mpi4py import MPI

import cai_mpi

pytestmark = pytest.mark.mpi(min_size=2)

world = MPI.COMM_WORLD
rank, size = world.Get_rank(), world.Get_size()
LAST = size - 1
SIZES = {"8 B": 1, "64 KiB": 8192, "1 MiB": 131072}  # float64 elements: speculated, at the limit, voted first
TIMEOUTS = [None, 30.0]
# s: a call that an agreement mistake leaves waiting raises TimeoutError, well before the 50 s hang watchdog (the
# tests parametrized by TIMEOUTS keep a case without one: the blocking form)
LIMIT = 20.0


def values(n: int, r: int, step: int = 0) -> np.ndarray[Any, Any]:
    return (np.arange(n) % 11 + r + step).astype(np.float64)


def everyone_raises(call: Callable[[], Any], match: str) -> None:
    with pytest.raises(cai_mpi.CollectiveMismatchError, match=match):
        call()


def still_in_step(comm: MPI.Intracomm | None = None) -> None:
    """The communicator works after the error: a reduction and a broadcast give exact results."""
    got = cai_mpi.allreduce_array(values(5, rank), comm=comm, timeout=LIMIT)
    assert np.array_equal(np.asarray(got), sum(values(5, r) for r in range(size)))
    got = cai_mpi.bcast_array(values(3, 7) if rank == 0 else None, root=0, comm=comm, timeout=LIMIT)
    assert np.array_equal(np.asarray(got), values(3, 7))


@pytest.mark.parametrize("timeout", TIMEOUTS)
@pytest.mark.parametrize("n", SIZES.values(), ids=SIZES.keys())
@pytest.mark.parametrize("warm", [False, True], ids=["first call", "after a call alike"])
def test_a_different_op_on_one_rank(n: int, timeout: float | None, warm: bool) -> None:
    x = values(n, rank)
    if warm:  # the same signature agreed before: the steady state's speculative path
        cai_mpi.allreduce_array(x, "sum", timeout=timeout)
        cai_mpi.reduce_array(x, "sum", root=0, timeout=timeout)
    op = "max" if rank == LAST else "sum"
    everyone_raises(lambda: cai_mpi.allreduce_array(x, op, timeout=timeout), r"op=.*rank \d+: .*op='max'")
    everyone_raises(lambda: cai_mpi.reduce_array(x, op, root=0, timeout=timeout), "one op and root")
    everyone_raises(lambda: cai_mpi.allreduce_arrays([x, x[:1]], op, timeout=timeout), "same keys, shapes")
    still_in_step()


@pytest.mark.parametrize("timeout", TIMEOUTS)
@pytest.mark.parametrize("n", SIZES.values(), ids=SIZES.keys())
@pytest.mark.parametrize("warm", [False, True], ids=["first call", "after a call alike"])
def test_a_different_root_on_one_rank(n: int, timeout: float | None, warm: bool) -> None:
    x = values(n, rank)
    if warm:
        cai_mpi.bcast_array(x if rank == 0 else None, root=0, timeout=timeout)
        cai_mpi.reduce_array(x, root=0, timeout=timeout)
        cai_mpi.gather_array(x, root=0, timeout=timeout)
        cai_mpi.scatter_array([x] * size if rank == 0 else None, root=0, timeout=timeout)
    root = 1 if rank == LAST else 0
    mine = x if rank == root else None
    everyone_raises(lambda: cai_mpi.bcast_array(mine, root=root, timeout=timeout), "the same root")
    everyone_raises(lambda: cai_mpi.reduce_array(x, root=root, timeout=timeout), "one op and root")
    everyone_raises(lambda: cai_mpi.gather_array(x, root=root, timeout=timeout), "the same root")
    everyone_raises(lambda: cai_mpi.scatter_array([x] * size if rank == root else None, root=root, timeout=timeout),
                    "the same root")
    still_in_step()


@pytest.mark.parametrize("change", ["shape", "float32", "int64"])
@pytest.mark.parametrize("warm", [False, True], ids=["first call", "after a call alike"])
def test_a_different_shape_or_dtype_of_a_reduction(change: str, warm: bool) -> None:
    """(Memory order is no difference: reductions combine elements by index, whatever the layout.)"""
    x = values(12, rank).reshape(3, 4)
    if warm:
        cai_mpi.allreduce_array(x, timeout=LIMIT)
    if rank == LAST:
        x = {"shape": x.reshape(4, 3), "float32": x.astype(np.float32), "int64": x.astype(np.int64)}[change]
    everyone_raises(lambda: cai_mpi.allreduce_array(x, timeout=LIMIT), f"rank {LAST}: shape=")
    still_in_step()


def test_signatures_that_change_from_call_to_call() -> None:
    """Alternating shapes, dtypes, ops and roots, with a mismatch in the middle: every result exact."""
    plan: list[tuple[int, str, Any, int]] = [(3, "<f8", "sum", 0), (3, "<f8", "sum", 0), (5, "<f8", "sum", LAST),
                                             (5, "<i4", "max", LAST), (3, "<f8", "sum", 0), (5, "<i4", "max", 0)]
    for step, (n, dtype, op, root) in enumerate(plan * 2):
        if step == len(plan):  # a mismatch in the middle, then the same sequence again
            everyone_raises(lambda: cai_mpi.allreduce_array(values(4 + (rank == LAST), rank), timeout=LIMIT),
                            "one shape")
        x = values(n, rank, step).astype(dtype)
        parts = [values(n, r, step).astype(dtype) for r in range(size)]
        want = np.sum(parts, axis=0) if op == "sum" else np.max(parts, axis=0)
        got = cai_mpi.allreduce_array(x, op, timeout=LIMIT)
        assert np.asarray(got).dtype == np.dtype(dtype) and np.array_equal(np.asarray(got), want)
        got_at = cai_mpi.reduce_array(x, op, root=root, timeout=LIMIT)
        assert (got_at is None) == (rank != root)
        if got_at is not None:
            assert np.array_equal(np.asarray(got_at), want)
        b = cai_mpi.bcast_array(x if rank == root else None, root=root, meta={"step": step} if rank == root else None,
                                timeout=LIMIT)
        assert np.array_equal(np.asarray(b), parts[root]) and b.meta == {"step": step} and b.source == root
        g = cai_mpi.gather_array(x, root=root, timeout=LIMIT)
        if rank == root:
            assert g is not None and all(np.array_equal(np.asarray(a), p) for a, p in zip(g, parts, strict=True))
        a = cai_mpi.allgather_array(x, timeout=LIMIT)
        assert [np.asarray(v).tolist() for v in a] == [p.tolist() for p in parts]


def test_the_steady_state_gives_each_result_memory_and_meta_of_its_own() -> None:
    """Repeated calls alike: every Array keeps its values and its own meta dict through later calls."""
    kept, metas = [], []
    for step in range(4):
        x = values(6, rank, step)
        kept.append((cai_mpi.allreduce_array(x, timeout=LIMIT),
                     cai_mpi.bcast_array(x if rank == 0 else None, meta={"s": 1} if rank == 0 else None, timeout=LIMIT),
                     cai_mpi.allgather_array(x, timeout=LIMIT)))
        metas.append(kept[-1][1].meta)
        kept[-1][1].meta["s"] = step  # the caller's to change
    for step, (total, b, a) in enumerate(kept):
        assert np.array_equal(np.asarray(total), sum(values(6, r, step) for r in range(size)))
        assert np.array_equal(np.asarray(b), values(6, 0, step)) and b.meta == {"s": step}
        assert [np.asarray(v).tolist() for v in a] == [values(6, r, step).tolist() for r in range(size)]


def test_gathers_of_shapes_that_differ_then_alike() -> None:
    """Descriptions that differ travel; alike, they do not: both give every rank's data."""
    for shapes in ([r + 1 for r in range(size)], [3] * size, [r + 1 for r in range(size)], [3] * size):
        x = values(shapes[rank], rank)
        got = cai_mpi.allgather_array(x, timeout=LIMIT)
        assert [np.asarray(v).tolist() for v in got] == [values(shapes[r], r).tolist() for r in range(size)]
        at = cai_mpi.gather_array(x, root=LAST, timeout=LIMIT)
        if rank == LAST:
            assert at is not None and [np.asarray(v).tolist() for v in at] == [values(shapes[r], r).tolist()
                                                                                for r in range(size)]


@pytest.mark.parametrize("n", SIZES.values(), ids=SIZES.keys())
def test_a_bad_out_is_that_ranks_own_error(n: int) -> None:
    """A bad ``out=`` on one rank raises there, after the call; the others complete (every collective alike)."""
    x = values(n, rank)
    want = sum(values(n, r) for r in range(size))
    for _ in range(2):  # first call, then the steady state
        out = np.zeros(n + 1) if rank == LAST else np.zeros(n)
        if rank == LAST:
            with pytest.raises(ValueError, match="out="):
                cai_mpi.allreduce_array(x, out=out, timeout=LIMIT)
        else:
            assert np.array_equal(np.asarray(cai_mpi.allreduce_array(x, out=out, timeout=LIMIT)), want)
            assert np.array_equal(out, want)
        if rank == 0:
            assert np.array_equal(np.asarray(cai_mpi.reduce_array(x, root=0, out=np.zeros(n), timeout=LIMIT)), want)
        else:
            assert cai_mpi.reduce_array(x, root=0, out=np.zeros(n + 1), timeout=LIMIT) is None
    still_in_step()


def test_a_failure_on_one_rank_in_the_steady_state() -> None:
    """A rank that cannot take part after calls alike raises its own error; the others name it."""
    x = values(4, rank)
    for _ in range(2):
        cai_mpi.allreduce_array(x, timeout=LIMIT)
        cai_mpi.allgather_array(x, timeout=LIMIT)
        cai_mpi.bcast_array(x if rank == 0 else None, timeout=LIMIT)
    bad: Any = object() if rank == LAST else x
    for call in (lambda: cai_mpi.allreduce_array(bad, timeout=LIMIT),
                 lambda: cai_mpi.allgather_array(bad, timeout=LIMIT),
                 lambda: cai_mpi.gather_array(bad, root=0, timeout=LIMIT)):
        if rank == LAST:
            with pytest.raises(TypeError):
                call()
        else:
            everyone_raises(call, f"rank {LAST}: could not take part")
    if rank == 0:
        with pytest.raises(TypeError):
            cai_mpi.bcast_array(object(), timeout=LIMIT)
    else:
        everyone_raises(lambda: cai_mpi.bcast_array(None, timeout=LIMIT), "root, rank 0, could not send")
    still_in_step()


def test_sub_communicators_remember_their_own_signatures() -> None:
    """The last agreed signature is per communicator: calls alternating between two give exact results."""
    half = world.Split(rank % 2, rank)
    try:
        for step in range(3):
            for comm, n in ((world, 3), (half, 5)):
                x = values(n, rank, step)
                members = [r for r in range(size) if comm is world or r % 2 == rank % 2]
                got = cai_mpi.allreduce_array(x, "mean", comm=comm, timeout=LIMIT)
                assert np.allclose(np.asarray(got), sum(values(n, r, step) for r in members) / len(members))
    finally:
        half.Free()


def test_allreduce_arrays_in_the_steady_state() -> None:
    """Calls alike (posted with the vote), a different op, a failure, then calls alike again: exact or raised."""
    arrays = {"a": values(3, rank), "b": values(4, rank).astype(np.float32), "c": np.array(rank + 1)}
    for step in range(3):
        for x in arrays.values():
            x[...] = x + step
        got = cai_mpi.allreduce_arrays(arrays, timeout=LIMIT)
        for key, x in arrays.items():
            want = world.allreduce(np.asarray(x).copy())
            assert np.array_equal(np.asarray(got[key]), want), (step, key)
    op = "max" if rank == LAST else "sum"
    everyone_raises(lambda: cai_mpi.allreduce_arrays(arrays, op, timeout=LIMIT), "same keys, shapes, dtypes and op")
    if rank == LAST:
        with pytest.raises(TypeError):
            cai_mpi.allreduce_arrays({**arrays, "b": object()}, timeout=LIMIT)
    else:
        everyone_raises(lambda: cai_mpi.allreduce_arrays(arrays, timeout=LIMIT), f"rank {LAST}: could not take part")
    got = cai_mpi.allreduce_arrays(arrays, "max", timeout=LIMIT)
    assert np.array_equal(np.asarray(got["c"]), np.array(world.allreduce(int(arrays["c"]), MPI.MAX)))


def test_allreduce_arrays_when_one_rank_turns_to_device_memory() -> None:
    """The same shapes, now on a (simulated) GPU on one rank: every rank takes the staged path, results exact."""
    from cai_mpi.testing import FakeCudaArray, SimulatedRuntime, use_runtime

    host = [values(3, rank), values(5, rank)]
    want = [sum(values(3, r) for r in range(size)), sum(values(5, r) for r in range(size))]
    for _ in range(2):
        got = cai_mpi.allreduce_arrays(host, timeout=LIMIT)
        assert all(np.array_equal(np.asarray(g), w) for g, w in zip(got, want, strict=True))
    with use_runtime(SimulatedRuntime()):
        mine = [FakeCudaArray(host[0], device=True), host[1]] if rank == LAST else host
        got = cai_mpi.allreduce_arrays(mine, timeout=LIMIT)
        assert np.array_equal(np.asarray(got[1]), want[1])
        first = got[0]
        assert np.array_equal(np.asarray(first.to_host() if not first.is_host else first), want[0])


@pytest.mark.parametrize("warm", [False, True], ids=["first call", "after a call alike"])
def test_a_root_out_of_range_on_one_rank(warm: bool) -> None:
    """That rank raises its own ValueError; every other rank CollectiveMismatchError naming it: nobody hangs."""
    x = values(4, rank)
    calls: dict[str, Callable[[int], Any]] = {
        "bcast_array": lambda root: cai_mpi.bcast_array(x if rank == root else None, root=root, timeout=LIMIT),
        "reduce_array": lambda root: cai_mpi.reduce_array(x, root=root, timeout=LIMIT),
        "gather_array": lambda root: cai_mpi.gather_array(x, root=root, timeout=LIMIT),
        "scatter_array": lambda root: cai_mpi.scatter_array([x] * size if rank == root else None, root=root,
                                                            timeout=LIMIT),
    }
    for name, call in calls.items():
        if warm:
            call(0)
        if rank == LAST:
            with pytest.raises(ValueError, match=f"{name}: root"):
                call(size)
        else:
            everyone_raises(lambda c=call: c(0), f"rank {LAST}: could not take part")
    still_in_step()
