"""Pipeline between real MPI ranks: every rank is a stage; passes at any world size >= 2."""

from __future__ import annotations

import time
import traceback
from typing import Any

import numpy as np
import pytest
from mpi4py import MPI

import cai_mpi
from cai_mpi.testing import FakeCudaArray, SimulatedRuntime, use_runtime

pytestmark = pytest.mark.mpi(min_size=2)

comm = MPI.COMM_WORLD
rank, size = comm.Get_rank(), comm.Get_size()
# s: the tests where a stage fails bound every wait, so that a failure notice that never comes fails them in seconds
# (the stage left waiting raises TimeoutError, the others see it as that stage's failure and their assertions name
# the wrong stage) instead of at the 50 s hang watchdog
LIMIT = 10.0


def item(i: int) -> np.ndarray[Any, Any]:
    return np.arange(i, i + 6 * (i % 4), dtype="<f8").reshape(-1, 2) if i % 4 else np.zeros((0, 2))


def forward_all(pipe: cai_mpi.Pipeline, transform: Any = None) -> list[cai_mpi.Array]:
    """A middle stage forwards every item (keeping its meta); the last one keeps them."""
    kept = []
    for a in pipe:
        if pipe.last:
            kept.append(a)
        else:
            pipe.send(a if transform is None else transform(a), meta=None if transform is None else a.meta)
    return kept


def reuse_of_the_communicator() -> None:
    """Afterwards nothing of the pipeline is left unmatched: plain point-to-point works on the same comm."""
    nxt, prv = (rank + 1) % size, (rank - 1) % size
    req = cai_mpi.isend_array(np.full(2, rank), nxt, tag=31)
    got = cai_mpi.recv_array(prv, tag=31, timeout=LIMIT)
    req.wait(timeout=LIMIT)
    assert np.asarray(got).tolist() == [prv, prv]
    comm.Barrier()


@pytest.mark.parametrize("depth", [1, 2, 5])
def test_items_arrive_in_order_with_their_meta(depth: int) -> None:
    n = 12
    with cai_mpi.Pipeline(depth=depth) as pipe:
        assert (pipe.stage, pipe.first, pipe.last, pipe.depth) == (rank, rank == 0, rank == size - 1, depth)
        if pipe.first:
            for i in range(n):
                pipe.send(item(i), meta={"i": i})
        kept = [] if pipe.first else forward_all(pipe)
    if rank == size - 1:
        assert [a.meta for a in kept] == [{"i": i} for i in range(n)]
        for i, a in enumerate(kept):
            assert a.shape == item(i).shape and np.array_equal(np.asarray(a), item(i))
    reuse_of_the_communicator()


def test_stages_transform_and_the_end_of_the_stream_is_sticky() -> None:
    with cai_mpi.Pipeline() as pipe:
        if pipe.first:
            for i in range(5):
                pipe.send(np.full(4, i, "<i8"), meta={"i": i})
            pipe.close()
            pipe.close()  # idempotent
            with pytest.raises(ValueError, match="already closed"):
                pipe.send(np.zeros(1))
            with pytest.raises(ValueError, match="first stage"):
                pipe.recv()
        else:
            kept = forward_all(pipe, transform=lambda a: np.asarray(a) * 2)
            assert pipe.recv() is None and pipe.recv() is None
            if pipe.last:
                factor = 2 ** (size - 2)
                assert [np.asarray(a).tolist() for a in kept] == [[i * factor] * 4 for i in range(5)]
                assert [a.meta for a in kept] == [{"i": i} for i in range(5)]
                with pytest.raises(ValueError, match="last stage"):
                    pipe.send(np.zeros(1))
                pipe.close()  # does nothing on the last stage
    reuse_of_the_communicator()


def test_send_blocks_beyond_depth_items_not_yet_received() -> None:
    """Stage 0 sends ``depth`` items while stage 1 receives nothing, and the next send cannot complete (it times out,
    sending nothing, however long the machine takes): only then does stage 1 start receiving, and the rest goes
    through. Order, not clocks: stage 1 waits for stage 0's word before it receives anything."""
    depth, extra = 2, 3
    probe = 0.3  # s: only how long stage 0's blocked send waits before it says so
    side = comm.Dup()
    try:
        with cai_mpi.Pipeline(depth=depth, timeout=probe if rank == 0 else None) as pipe:
            if rank == 0:
                for i in range(depth):
                    retried(pipe.send, np.full(1000, i), meta={"i": i})  # (a wait for stage 1 would never end)
                with pytest.raises(cai_mpi.TimeoutError):
                    pipe.send(np.full(1000, depth), meta={"i": depth})  # stage 1 has received nothing
                side.send("blocked", dest=1)
                for i in range(depth, depth + extra):
                    retried(pipe.send, np.full(1000, i), meta={"i": i})
                pipe.close()
            else:
                if rank == 1:
                    assert side.recv(source=0) == "blocked"
                kept = forward_all(pipe)
                pipe.close()  # (the end of the stream goes on before the barrier; nothing on the last stage)
            side.Barrier()  # every stream has ended: stage 0 leaves within its short timeout
    finally:
        side.Free()
    if rank == size - 1:
        assert [a.meta for a in kept] == [{"i": i} for i in range(depth + extra)]
        assert [np.asarray(a)[0] for a in kept] == list(range(depth + extra))
    reuse_of_the_communicator()


def retried(call: Any, *args: Any, **kwargs: Any) -> Any:
    """A send of a stage with a short timeout, retried until it does not time out (a send that times out sends
    nothing); 30 s of timeouts in a row is a hang, which fails the test."""
    give_up = time.monotonic() + 30
    while True:
        try:
            return call(*args, **kwargs)
        except cai_mpi.TimeoutError:
            if time.monotonic() > give_up:
                raise


@pytest.mark.parametrize("where", ["first", "middle", "last"])
def test_a_failing_stage_reaches_every_other_stage(where: str) -> None:
    failing = {"first": 0, "middle": size // 2, "last": size - 1}[where]
    if where == "middle" and size < 3:
        failing = 1
    outcome: Any = None
    try:
        with cai_mpi.Pipeline(depth=2, timeout=LIMIT) as pipe:
            if pipe.first:
                for i in range(50):
                    if rank == failing and i == 3:
                        raise KeyError(f"stage {rank} broke")
                    pipe.send(np.full(10, i), meta={"i": i})
            else:
                for a in pipe:
                    if rank == failing and a.meta == {"i": 2}:
                        raise KeyError(f"stage {rank} broke")
                    if not pipe.last:
                        pipe.send(a)
    except cai_mpi.PipelineError as exc:
        outcome = exc
    except KeyError as exc:
        outcome = exc
    if rank == failing:
        assert isinstance(outcome, KeyError) and not isinstance(outcome, cai_mpi.PipelineError)
    else:
        assert isinstance(outcome, cai_mpi.PipelineError), outcome
        assert outcome.rank == failing and f"stage {failing} failed" in str(outcome)
        assert outcome.meta == (None if failing == 0 else {"i": 2})
    reuse_of_the_communicator()


def middle_stage_transform(a: cai_mpi.Array) -> np.ndarray[Any, Any]:
    if a.meta == {"i": 2}:
        raise ValueError(f"item {a.meta['i']} is bad on stage {rank}")
    return np.asarray(a) * 2


def test_a_middle_stage_failure_reaches_the_others_once_with_its_type_message_and_traceback() -> None:
    failing = max(1, size // 2)  # (at 2 ranks, the last stage)
    outcome: Any = None
    try:
        with cai_mpi.Pipeline(depth=1, timeout=LIMIT) as pipe:
            if pipe.first:
                for i in range(20):
                    pipe.send(np.full(4, i), meta={"i": i})
            else:
                for a in pipe:
                    out = middle_stage_transform(a) if rank == failing else a
                    if not pipe.last:
                        pipe.send(out, meta=a.meta)
    except (cai_mpi.PipelineError, ValueError) as exc:
        outcome = exc
    if rank == failing:
        assert type(outcome) is ValueError and "item 2 is bad" in str(outcome)
    else:
        assert isinstance(outcome, cai_mpi.PipelineError), outcome
        assert (outcome.rank, outcome.meta) == (failing, {"i": 2})
        assert outcome.error_type == "ValueError"
        assert outcome.error_message == f"item 2 is bad on stage {failing}"
        assert "in middle_stage_transform" in outcome.error_traceback
        assert outcome.error_traceback.rstrip().endswith(f"ValueError: item 2 is bad on stage {failing}")
        printed = "".join(traceback.format_exception(type(outcome), outcome, outcome.__traceback__))
        assert printed.count(f"stage {failing} failed") == 1, printed  # not chained to a copy of itself
        assert "cai_mpi.PipelineError: Pipeline: stage" in printed
    reuse_of_the_communicator()


def test_a_stage_that_finished_still_hears_of_a_failure_downstream() -> None:
    outcome: Any = None
    try:
        with cai_mpi.Pipeline(timeout=LIMIT) as pipe:
            if pipe.first:
                pipe.send(np.ones(3), meta={"i": 0})  # then leaves, its part done
            else:
                for _a in pipe:
                    if pipe.last:
                        raise RuntimeError("the last stage broke")
                    pipe.send(_a)
    except cai_mpi.PipelineError as exc:
        outcome = exc
    except RuntimeError as exc:
        outcome = exc
    if rank == size - 1:
        assert isinstance(outcome, RuntimeError)
    else:
        assert isinstance(outcome, cai_mpi.PipelineError) and outcome.rank == size - 1
    reuse_of_the_communicator()


def test_device_items_stay_on_the_device() -> None:
    with use_runtime(SimulatedRuntime()), cai_mpi.Pipeline() as pipe:
        if pipe.first:
            for i in range(3):
                pipe.send(FakeCudaArray(np.full(5, float(i)), device=True), meta={"i": i})
        else:
            for a in pipe:
                assert a.device == 0
                if pipe.last:
                    assert np.array_equal(a.numpy(), np.full(5, float(a.meta["i"])))
                else:
                    pipe.send(a)
    reuse_of_the_communicator()


def test_bad_arguments() -> None:
    with pytest.raises(ValueError, match="depth"):
        cai_mpi.Pipeline(depth=0)
    with pytest.raises(TypeError, match="intracommunicator"):
        cai_mpi.Pipeline(comm="world")  # type: ignore[arg-type]


def test_a_bad_item_or_meta_is_refused_in_the_pipelines_name_and_the_stream_goes_on() -> None:
    """Whatever way an item would travel (bare-capable or described: an F-ordered array always is), a bad item or
    meta raises naming ``Pipeline.send``, sends nothing, and the next good item arrives as the first."""
    fortran = np.asfortranarray(np.arange(6.0).reshape(2, 3))
    with cai_mpi.Pipeline() as pipe:
        if pipe.first:
            for bad_item, bad_meta, error in [
                (object(), None, TypeError),
                ("text", None, TypeError),
                (np.arange(3.0), {"x": object()}, TypeError),
                (fortran, {"x": object()}, TypeError),
                (fortran, {1: "a non-text key"}, TypeError),
            ]:
                with pytest.raises(error, match=r"^Pipeline\.send: "):
                    pipe.send(bad_item, meta=bad_meta)
            pipe.send(fortran, meta={"good": True})
        kept = [] if pipe.first else forward_all(pipe)
    if rank == size - 1:
        assert len(kept) == 1
        assert np.array_equal(np.asarray(kept[0]), fortran) and kept[0].meta == {"good": True}
    reuse_of_the_communicator()
