"""How a wait with a timeout polls (``complete_by``, through ``progress.backoff``): it spins, yielding, for its
first millisecond, then sleeps with pauses that double from 10 microseconds up to a millisecond, and never past the
deadline; it returns True as soon as the operation completes and False at the deadline. A ``Pipeline`` wait backs
off the same way, to a tenth of a millisecond. On a clock of its own (no real time passes, nothing is timed):
survivors of the mutation run found the back-off untested, docs/testing.md."""

from __future__ import annotations

import types
from typing import Any

import pytest

from cai_mpi._src.api.pipeline_leave import wait_pauses
from cai_mpi._src.progress import backoff, driving
from cai_mpi._src.progress.deadlines import Deadline


class Clock:
    """``time.monotonic`` that creeps a microsecond per reading, and ``time.sleep`` that records and advances it."""

    def __init__(self) -> None:
        self.now = 1000.0
        self.pauses: list[float] = []

    def monotonic(self) -> float:
        self.now += 1e-6
        return self.now

    def sleep(self, seconds: float) -> None:
        self.pauses.append(seconds)
        self.now += seconds


class CompletesAfter:
    def __init__(self, tests: int | None) -> None:
        self.left, self.tests = tests, 0

    def test(self) -> bool:
        self.tests += 1
        return self.left is not None and self.tests > self.left


@pytest.fixture
def clock(monkeypatch: pytest.MonkeyPatch) -> Clock:
    fake = Clock()
    monkeypatch.setattr(backoff, "time", types.SimpleNamespace(monotonic=fake.monotonic, sleep=fake.sleep))
    return fake


def due_in(clock: Clock, seconds: float) -> Any:
    due = Deadline(seconds)
    due.at = clock.now + seconds
    return due


def test_it_spins_for_a_millisecond_before_it_sleeps(clock: Clock) -> None:
    assert driving.complete_by(CompletesAfter(200), due_in(clock, 10.0)) is True  # done while spinning
    assert clock.pauses == []


def test_the_pauses_double_up_to_a_millisecond_and_stop_at_the_deadline(clock: Clock) -> None:
    waitable = CompletesAfter(None)  # never completes
    start = clock.now
    assert driving.complete_by(waitable, due_in(clock, 0.02)) is False
    assert clock.now >= start + 0.02
    pauses = clock.pauses
    expected = [1e-5]
    while expected[-1] < 1e-3:
        expected.append(min(expected[-1] * 2 + 1e-5, 1e-3))
    assert pauses[:len(expected)] == pytest.approx(expected)
    assert all(p == pytest.approx(1e-3) for p in pauses[len(expected):-1])
    assert 0 < pauses[-1] <= 1e-3 + 1e-12  # the last pause ends at the deadline, not past it


def test_it_returns_as_soon_as_the_operation_completes(clock: Clock) -> None:
    waitable = CompletesAfter(3000)  # past the spinning phase
    assert driving.complete_by(waitable, due_in(clock, 10.0)) is True
    assert waitable.tests == 3001 and clock.pauses


def test_a_pipeline_wait_backs_off_to_a_tenth_of_a_millisecond_and_gives_up_at_its_deadline(clock: Clock) -> None:
    backoff = wait_pauses(due_in(clock, 0.01))
    start = clock.now
    while backoff.pause():
        pass
    assert clock.now >= start + 0.01
    expected = [1e-6]
    while expected[-1] < 1e-4:
        expected.append(min(expected[-1] * 2 + 1e-6, 1e-4))
    assert clock.pauses[:len(expected)] == pytest.approx(expected)
    assert all(p == pytest.approx(1e-4) for p in clock.pauses[len(expected):-1])
    assert 0 < clock.pauses[-1] <= 1e-4 + 1e-12


def test_without_a_deadline_a_pipeline_wait_never_gives_up(clock: Clock) -> None:
    backoff = wait_pauses(None)
    assert all(backoff.pause() for _ in range(5000))  # well past the spinning phase: sleeping, never done
    assert clock.pauses and max(clock.pauses) == pytest.approx(1e-4)
