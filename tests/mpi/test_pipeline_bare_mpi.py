"""Pipeline items that travel as bare payloads (a run of items with the shape, dtype and meta of the one before,
host memory of numbers in C order) and the self-describing messages they fall back to: every item arrives intact,
in order, with its own shape, dtype and meta, whichever way it came. Every rank is a stage; passes at any world
size >= 2. Which items go bare is what MPI is asked to receive: tests/test_pipeline_traffic.py counts it."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
from mpi4py import MPI

import cai_mpi

pytestmark = pytest.mark.mpi(min_size=2)

comm = MPI.COMM_WORLD
rank, size = comm.Get_rank(), comm.Get_size()


def stream() -> list[tuple[Any, dict[str, Any] | None]]:
    """Runs of same-described items, each run ended by a change of shape, dtype, meta, layout or kind."""
    items: list[tuple[Any, dict[str, Any] | None]] = []
    items += [(np.arange(4.0) + i, None) for i in range(5)]  # one described, four bare
    items += [(np.arange(6.0).reshape(2, 3) * i, None) for i in range(3)]  # a new shape
    items += [(np.arange(6, dtype="<i4").reshape(2, 3) - i, None) for i in range(3)]  # a new dtype
    items += [(np.arange(6, dtype=">i4").reshape(2, 3) + i, None) for i in range(2)]  # the byte order
    items += [(np.zeros((0, 3)), None) for _ in range(3)]  # zero-size
    items += [(np.array(float(i)), None) for i in range(3)]  # 0-d
    items += [(np.full(3, i, np.int16), {"run": 1}) for i in range(3)]  # a meta, kept
    items += [(np.full(3, i, np.int16), {"run": 2, "i": i}) for i in range(2)]  # meta that changes every item
    items += [(np.full(3, i, np.int16), None) for i in range(2)]  # meta dropped
    items += [(np.asfortranarray(np.arange(6.0).reshape(2, 3) + i), None) for i in range(2)]  # F order
    items += [(np.arange(12.0)[::2] + i, None) for i in range(2)]  # strided
    items += [(np.array([i, i + 1], "datetime64[s]"), None) for i in range(2)]  # not numbers
    items += [(np.array([True, False]) ^ bool(i % 2), None) for i in range(3)]  # bool
    items += [(np.arange(3) * (1 + 1j) * i, None) for i in range(3)]  # complex
    items += [(np.arange(4.0) + i, None) for i in range(3)]  # the first shape again
    return items


def same(a: cai_mpi.Array, x: Any) -> bool:
    h = np.asarray(a)
    return h.shape == x.shape and h.dtype == x.dtype and np.array_equal(h, x)


@pytest.mark.parametrize("depth", [1, 2, 4])
def test_bare_runs_and_their_fallbacks_arrive_intact_in_order(depth: int) -> None:
    items = stream()
    kept: list[cai_mpi.Array] = []
    with cai_mpi.Pipeline(depth=depth) as pipe:
        if pipe.first:
            for x, meta in items:
                pipe.send(x, meta=meta)
        else:
            for a in pipe:
                if pipe.last:
                    kept.append(a)
                else:
                    pipe.send(a)
    if rank == size - 1:
        assert len(kept) == len(items)
        for i, (a, (x, meta)) in enumerate(zip(kept, items, strict=True)):  # (checked once all have arrived:
            assert same(a, x), (i, np.asarray(a), x)  # no item's memory is reused for a later one)
            assert a.meta == meta and a.source == rank - 1 and a.tag == 0, (i, a.meta, a.tag)


def test_a_meta_of_a_bare_run_is_each_items_own() -> None:
    with cai_mpi.Pipeline(depth=2) as pipe:
        if pipe.first:
            for i in range(4):
                pipe.send(np.full(2, i), meta={"tags": ["a"]})
        else:
            got = list(pipe)
            for a in got:
                a.meta["tags"].append("touched")  # the receiver's own dict: later items keep theirs
            assert [a.meta for a in got] == [{"tags": ["a", "touched"]}] * 4
            assert [np.asarray(a).tolist() for a in got] == [[i, i] for i in range(4)]
            if not pipe.last:
                for a in got:
                    pipe.send(a, meta={"tags": ["a"]})


def test_an_item_changed_in_place_after_its_run_was_described_is_sent_as_it_is_now() -> None:
    x = np.zeros(5)
    meta = {"k": 1}
    with cai_mpi.Pipeline(depth=1) as pipe:
        if pipe.first:
            for i in range(4):
                meta["k"] = i // 2  # the same dict object, changed: a new description
                pipe.send(np.full(5, float(i)), meta=meta)
            pipe.send(x)
        else:
            got = list(pipe)
            if not pipe.last:
                for a in got:
                    pipe.send(a)
            else:
                assert [a.meta for a in got] == [{"k": 0}, {"k": 0}, {"k": 1}, {"k": 1}, None]
                assert [np.asarray(a).tolist() for a in got] == [[float(i)] * 5 for i in range(4)] + [[0.0] * 5]


@pytest.mark.parametrize("where", ["first", "last"])
def test_a_failure_in_a_bare_run_reaches_every_stage_and_leaves_nothing_unmatched(where: str) -> None:
    failing = 0 if where == "first" else size - 1
    outcome: Any = None
    try:
        with cai_mpi.Pipeline(depth=4) as pipe:
            if pipe.first:
                for i in range(60):
                    if rank == failing and i == 20:
                        raise KeyError("stage 0 broke")
                    pipe.send(np.full(8, i))
            else:
                for a in pipe:
                    if rank == failing and int(np.asarray(a)[0]) == 5:
                        raise KeyError(f"stage {rank} broke")
                    if not pipe.last:
                        pipe.send(a)
    except (cai_mpi.PipelineError, KeyError) as exc:
        outcome = exc
    if rank == failing:
        assert type(outcome) is KeyError
    else:
        assert isinstance(outcome, cai_mpi.PipelineError) and outcome.rank == failing, outcome
    # plain point-to-point on the same communicator: nothing of the pipeline is left to match it
    nxt, prv = (rank + 1) % size, (rank - 1) % size
    req = cai_mpi.isend_array(np.full(2, rank), nxt, tag=32)
    assert np.asarray(cai_mpi.recv_array(prv, tag=32)).tolist() == [prv, prv]
    req.wait()
    comm.Barrier()


def test_a_stage_that_leaves_early_in_a_bare_run_is_reported_and_the_rest_is_drained() -> None:
    outcome: Any = None
    try:
        with cai_mpi.Pipeline(depth=3) as pipe:
            if pipe.first:
                for i in range(40):
                    pipe.send(np.full(3, i))
            elif pipe.last:
                for a in pipe:
                    if int(np.asarray(a)[0]) == 4:
                        break  # leaves with bare items still on their way
            else:
                for a in pipe:
                    pipe.send(a)
    except cai_mpi.PipelineError as exc:
        outcome = exc
    assert isinstance(outcome, cai_mpi.PipelineError) and outcome.rank == size - 1, outcome
    comm.Barrier()


def test_large_items_go_bare_and_arrive_intact() -> None:
    n = 1 << 18  # 2 MiB of float64
    with cai_mpi.Pipeline(depth=2) as pipe:
        if pipe.first:
            for i in range(6):
                pipe.send(np.arange(n, dtype=np.float64) * i)
        else:
            for i, a in enumerate(pipe):
                assert np.array_equal(np.asarray(a), np.arange(n, dtype=np.float64) * i)
                if not pipe.last:
                    pipe.send(a)


def test_host_items_to_a_stage_with_a_gpu_land_on_its_gpu_self_described() -> None:
    from cai_mpi.testing import SimulatedRuntime, use_runtime

    with use_runtime(SimulatedRuntime()), cai_mpi.Pipeline() as pipe:
        if pipe.first:
            for i in range(4):
                pipe.send(np.full(5, float(i)))
        else:
            got = list(pipe)
            assert [a.device for a in got] == [0] * 4  # where a receive without out= lands on this rank
            assert [a.numpy().tolist() for a in got] == [[float(i)] * 5 for i in range(4)]
            if not pipe.last:
                for a in got:
                    pipe.send(a)


@pytest.mark.parametrize("depth", [1, 2, 5])
def test_memory_of_a_bare_item_someone_still_holds_is_never_reused(depth: int) -> None:
    n = 40
    held: dict[int, Any] = {}
    with cai_mpi.Pipeline(depth=depth) as pipe:
        if pipe.first:
            for i in range(n):
                pipe.send(np.full((2, 3), i, np.int32))
        else:
            for i, a in enumerate(pipe):
                if not pipe.last:
                    pipe.send(a)
                # keep some items in every way one can hold their memory, drop the rest
                if i % 6 == 0:
                    held[i] = a
                elif i % 6 == 1:
                    held[i] = a.numpy()
                elif i % 6 == 2:
                    held[i] = np.asarray(a)
                elif i % 6 == 3:
                    held[i] = np.asarray(a)[1:]  # a view of the memory
                del a
    if not pipe.first:
        assert sorted(held) == [i for i in range(n) if i % 6 < 4]
        for i, h in held.items():
            want = np.full((2, 3), i, np.int32)[1:] if i % 6 == 3 else np.full((2, 3), i, np.int32)
            assert np.array_equal(np.asarray(h), want), (i, np.asarray(h))


def test_items_held_from_an_earlier_pipeline_are_never_overwritten_by_a_later_one() -> None:
    """Buffers of a ring that ended with no item in them held are kept for the next ring of that shape and dtype,
    and only those: what the user still holds from the first pipeline stays as it arrived."""
    held: list[tuple[int, Any]] = []
    for run in range(3):
        with cai_mpi.Pipeline(depth=2) as pipe:
            if pipe.first:
                for i in range(10):
                    pipe.send(np.full(1000, 100 * run + i, np.int64))
            else:
                for i, a in enumerate(pipe):
                    if not pipe.last:
                        pipe.send(a)
                    if i % 3 == 0:
                        held.append((100 * run + i, a if i % 2 else a.numpy()))
    if rank == 0:
        assert held == []
    else:
        assert [v for v, _ in held] == [100 * run + i for run in range(3) for i in (0, 3, 6, 9)]
        for v, h in held:
            assert np.array_equal(np.asarray(h), np.full(1000, v, np.int64)), (v, np.asarray(h)[:3])


def test_what_a_stage_does_to_a_dropped_item_never_reaches_later_items_or_pipelines() -> None:
    """Bare items are views of the ring's buffers: a new shape, a read-only flag or an annotation given to an item
    stays with it, and a read-only item does not break the next Pipeline that reuses its buffer."""
    for run in range(2):
        with cai_mpi.Pipeline(depth=2) as pipe:
            if pipe.first:
                for i in range(12):
                    pipe.send(np.full(8, 10 * run + i, np.float64))
            else:
                seen = []
                for i, item in enumerate(pipe):
                    if not pipe.last:
                        pipe.send(item)
                    x = item.numpy()
                    seen.append((x.shape, x.dtype, x.flags.writeable, item.meta, x.tolist()))
                    if i % 4 == 0:
                        x.shape = (2, 4)
                    elif i % 4 == 1:
                        x.flags.writeable = False
                    elif i % 4 == 2:
                        item.meta = {"mine": True}
                    del x, item
                assert seen == [((8,), np.dtype(np.float64), True, None, [10.0 * run + i] * 8) for i in range(12)]
    assert pipe.first or seen


class CreditStillInFlight:
    """A stage's persistent credit request as an MPI that has not sent the last credit yet shows it: never
    complete, so every credit takes the other way, a message of its own."""

    def __init__(self, req: Any) -> None:
        self._req = req

    def Test(self, *args: Any) -> bool:
        return False

    def __getattr__(self, name: str) -> Any:
        return getattr(self._req, name)


def test_credits_sent_while_the_last_one_is_still_in_flight_reach_the_previous_stage() -> None:
    """Credits carry the count received so far; when the persistent credit request is still busy, the credit goes
    as a message of its own, to the previous stage: without them the first stage would wait for ever (here: time
    out) after ``depth`` items."""
    n = 12
    got = []
    with cai_mpi.Pipeline(depth=2, timeout=20) as pipe:
        if not pipe.first:
            pipe._up._credit_send = CreditStillInFlight(pipe._up._credit_send)
        if pipe.first:
            for i in range(n):
                pipe.send(np.full(4, i, np.int32))
        else:
            for a in pipe:
                got.append(a.numpy().tolist())
                if not pipe.last:
                    pipe.send(a)
            pipe._up._credit_send = pipe._up._credit_send._req  # leaving tests it until the last credit has gone
    if not pipe.first:
        assert got == [[i] * 4 for i in range(n)]


def test_a_finished_rings_buffers_go_back_to_the_receive_pool() -> None:
    """The buffers of a ring come from the host receive pool and go back to it once the ring has ended and no item
    refers to them, for the next Pipeline (or receive) of their size, instead of fresh pages for every Pipeline."""
    from cai_mpi._src.transport.pool import host_receive_pool

    shape, dtype = (128, 64), np.dtype(np.float64)  # 64 KiB: the smallest item the pool lends
    size_class = 128 * 64 * 8
    pool = host_receive_pool()
    pool.clear()
    with cai_mpi.Pipeline(depth=2) as pipe:
        if pipe.first:
            for i in range(10):
                pipe.send(np.full(shape, i, dtype))
        else:
            for i, a in enumerate(pipe):
                assert np.array_equal(a.numpy(), np.full(shape, i, dtype))
                if not pipe.last:
                    pipe.send(a)
                del a
    idle = pool.blocks.idle_blocks().get(size_class, 0)
    if pipe.first:
        assert idle == 0, "the first stage receives nothing"
    else:  # the first item's own block (it came described), and 1 to 4 ring buffers
        assert 2 <= idle <= 5, idle
