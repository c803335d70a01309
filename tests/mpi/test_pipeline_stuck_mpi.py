"""A ``Pipeline`` with a stage that is stuck (alive, but away longer than the pipeline's ``timeout``): once a stage
has failed or timed out, every other stage hears of it within about one ``timeout``, with ``PipelineError`` (a stage
whose own wait timed out raises its ``TimeoutError``), and the stuck stage gets ``PipelineError`` as soon as it
comes back and waits or leaves. The communicator stays usable: for a message, a collective and a new Pipeline.
Passes at any world size >= 2 (the middle stage's case needs 3)."""

from __future__ import annotations

import time

import numpy as np
import pytest
from mpi4py import MPI

import cai_mpi

pytestmark = [pytest.mark.mpi(min_size=2), pytest.mark.timeout(40)]

WORLD = MPI.COMM_WORLD
rank, size = WORLD.Get_rank(), WORLD.Get_size()
T = 1.0  # the pipeline's timeout
AWAY = 6 * T  # how long the stuck stage is away: well past the time the others need to give up
HEARD = 4 * T  # the latest the others may raise: one timeout to fail, one to leave, and slack for a loaded machine


def _run(stuck: int, work, timeout: float = T, away: float = AWAY) -> tuple[BaseException | None, float, float]:
    """Run ``work(pipe)`` in a Pipeline with ``timeout``; the stage ``stuck`` first sleeps ``away``. Returns the error
    each stage raised, when (seconds from entering), and on the stuck stage how long after waking."""
    error: BaseException | None = None
    with cai_mpi.Pipeline(timeout=30) as pipe:  # (a first, healthy one: set-up costs are not counted below)
        if not pipe.first:
            assert list(pipe) == []
    WORLD.Barrier()
    start = time.monotonic()
    woke = start
    try:
        with cai_mpi.Pipeline(timeout=timeout) as pipe:
            if rank == stuck:
                time.sleep(away)
                woke = time.monotonic()
            work(pipe)
    except (cai_mpi.PipelineError, cai_mpi.TimeoutError, ValueError) as exc:
        error = exc
    end = time.monotonic()
    return error, end - start, end - woke


def _still_usable() -> None:
    """A message, a collective, then a new Pipeline, on the same communicator, received exactly."""
    x = np.arange(5.0) + 0.5
    if rank == 0:
        cai_mpi.send_array(x, 1, tag=3, timeout=30)
    elif rank == 1:
        assert np.asarray(cai_mpi.recv_array(0, 3, timeout=30)).tobytes() == x.tobytes()
    total = cai_mpi.allreduce_array(np.full(3, rank + 1, np.int64), timeout=30)
    assert np.asarray(total).tolist() == [size * (size + 1) // 2] * 3
    with cai_mpi.Pipeline(timeout=30) as pipe:
        if pipe.first:
            for i in range(4):
                pipe.send(np.full(3, i, np.int32), meta={"i": i})
        else:
            got = []
            for item in pipe:
                got.append((np.asarray(item).tolist(), item.meta))
                if not pipe.last:
                    pipe.send(item)
            assert got == [([i] * 3, {"i": i}) for i in range(4)]
    WORLD.Barrier()


def _forward(pipe: cai_mpi.Pipeline) -> None:
    if pipe.first:
        for i in range(3):
            pipe.send(np.full(4, i), meta={"i": i})
    else:
        for item in pipe:
            if not pipe.last:
                pipe.send(item)


def _timed_out_or_heard(error: BaseException | None, elapsed: float) -> None:
    """A stage that was not stuck: its own wait timed out, or it heard of a stage that timed out; within HEARD."""
    assert isinstance(error, (cai_mpi.PipelineError, cai_mpi.TimeoutError)), error
    if isinstance(error, cai_mpi.PipelineError):
        assert error.rank != rank and error.error_type == "cai_mpi.TimeoutError", (error, error.error_type)
    else:
        assert f"Pipeline: stage {rank} waited {T:g} s for" in str(error), error
    assert elapsed <= HEARD, f"stage {rank} raised {type(error).__name__} after {elapsed:.1f} s: {error}"


@pytest.mark.parametrize("stuck", ["first", "middle"])
def test_a_stuck_stage_is_reported_to_every_stage_within_about_one_timeout(stuck: str) -> None:
    if stuck == "middle" and size < 3:
        pytest.skip("a middle stage needs 3 ranks")
    where = 0 if stuck == "first" else 1
    error, elapsed, since_woke = _run(where, _forward)
    if rank == where:
        # Back after the others gave up: its next wait or leaving raises PipelineError, at once.
        assert isinstance(error, cai_mpi.PipelineError), error
        assert error.rank != rank and error.error_type == "cai_mpi.TimeoutError", (error, error.error_type)
        assert since_woke <= T + 1, f"stage {rank} raised {since_woke:.1f} s after it came back"
    else:
        _timed_out_or_heard(error, elapsed)
    _still_usable()


def test_a_stage_that_raises_while_the_first_is_stuck_is_reported_within_about_one_timeout() -> None:
    failing = size - 1

    def work(pipe: cai_mpi.Pipeline) -> None:
        if rank == failing:
            raise ValueError(f"stage {rank} broke")
        _forward(pipe)

    error, elapsed, since_woke = _run(0, work)
    if rank == failing:
        assert isinstance(error, ValueError) and str(error) == f"stage {rank} broke", error
        assert elapsed <= HEARD, f"stage {rank} raised its own error after {elapsed:.1f} s"
    else:
        assert isinstance(error, cai_mpi.PipelineError), error
        assert error.rank == failing and error.error_type == "ValueError", error
        if rank == 0:
            assert since_woke <= T + 1, f"stage 0 raised {since_woke:.1f} s after it came back"
        else:
            assert elapsed <= HEARD, f"stage {rank} raised {type(error).__name__} after {elapsed:.1f} s: {error}"
    _still_usable()


def test_a_stage_that_has_left_hears_of_a_failure_while_it_waits_for_the_others() -> None:
    """Stage 0 sends one item and leaves, with no failure known; stage 1 is stuck, so a later stage times out, and
    stage 0 hears of it while it waits for the others to leave: within about one timeout of that, PipelineError."""
    if size < 3:
        pytest.skip("a stuck middle stage needs 3 ranks")

    def work(pipe: cai_mpi.Pipeline) -> None:
        if pipe.first:
            pipe.send(np.arange(4.0), meta={"i": 0})
        else:
            _forward(pipe)

    error, elapsed, since_woke = _run(1, work)
    if rank == 1:
        assert isinstance(error, cai_mpi.PipelineError), error
        assert error.rank > 1 and error.error_type == "cai_mpi.TimeoutError", (error, error.error_type)
        assert since_woke <= T + 1, f"stage 1 raised {since_woke:.1f} s after it came back"
    elif rank == 0:
        assert isinstance(error, cai_mpi.PipelineError), error
        assert error.rank > 1 and error.error_type == "cai_mpi.TimeoutError", (error, error.error_type)
        assert elapsed <= HEARD, f"stage 0 raised PipelineError after {elapsed:.1f} s: {error}"
    else:
        _timed_out_or_heard(error, elapsed)
    _still_usable()


def test_the_stuck_stage_back_raises_at_once_while_the_others_are_away_from_mpi() -> None:
    """The stages that gave up on the stuck one make no MPI call for a while (they handle the error): the stuck
    stage, back, does not wait for them to drive the agreement they left, nor a timeout: PipelineError at once."""
    timeout, away = 2.0, 6.0
    error, elapsed, since_woke = _run(0, _forward, timeout, away)
    if rank == 0:
        assert isinstance(error, cai_mpi.PipelineError), error
        assert error.rank != rank and error.error_type == "cai_mpi.TimeoutError", (error, error.error_type)
        assert since_woke <= timeout / 2, f"stage 0 raised {since_woke:.1f} s after it came back"
    else:
        assert isinstance(error, (cai_mpi.PipelineError, cai_mpi.TimeoutError)), error
        assert elapsed < away, f"stage {rank} raised after {elapsed:.1f} s, when stage 0 was back"
        time.sleep(away + 1.5 * timeout - elapsed)  # away from MPI until well after stage 0 came back
    _still_usable()
