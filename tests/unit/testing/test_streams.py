"""Simulated streams and events (cai_mpi.testing): in order, with delays, errors surfaced at sync."""

from __future__ import annotations

import gc
import threading
import time
import weakref
from typing import Any

import pytest

from cai_mpi._src.errors import CaiMpiError, StreamError
from cai_mpi.testing import SimulatedEvent, SimulatedStream
from cai_mpi.testing._streams import resolve_stream

# =============================================================================================
# SimulatedStream


def test_stream_runs_work_in_order_after_the_delay(stream: SimulatedStream) -> None:
    # The gate holds the stream, so "nothing has run yet" does not depend on this thread being quick; the times
    # at which the items ran show that each waited for its delay (a lower bound only: robust to a loaded machine).
    gate = threading.Event()
    stream.enqueue(lambda: gate.wait(10))
    log: list[tuple[int, float]] = []

    def note(item: int) -> None:
        log.append((item, time.monotonic()))

    stream.enqueue(note, 1, delay=0.05)
    stream.enqueue(note, 2)
    stream.enqueue(note, 3, delay=0.01)
    assert log == []  # the stream is held at the gate
    opened = time.monotonic()
    gate.set()
    stream.synchronize()
    assert [item for item, _ in log] == [1, 2, 3]
    (_, first), (_, second), (_, third) = log
    assert first - opened >= 0.05  # the first item slept its delay before it ran
    assert third - second >= 0.01


def test_stream_delay_is_honoured(stream: SimulatedStream) -> None:
    t0 = time.monotonic()
    stream.enqueue(lambda: None, delay=0.1)
    stream.synchronize()
    assert time.monotonic() - t0 >= 0.1


def test_stream_query(stream: SimulatedStream) -> None:
    assert stream.query() is True
    gate = threading.Event()
    stream.enqueue(gate.wait)
    assert stream.query() is False
    gate.set()
    stream.synchronize()
    assert stream.query() is True


def test_stream_runs_on_its_own_thread(stream: SimulatedStream) -> None:
    seen: list[str] = []
    stream.enqueue(lambda: seen.append(threading.current_thread().name))
    stream.synchronize()
    assert seen == ["test-stream"]


def test_events_record_and_wait(stream: SimulatedStream) -> None:
    gate = threading.Event()
    stream.enqueue(gate.wait)
    ev = stream.record_event()
    assert isinstance(ev, SimulatedEvent)
    assert ev.query() is False
    gate.set()
    ev.synchronize()
    assert ev.query() is True


def test_wait_event_orders_two_streams(stream: SimulatedStream) -> None:
    log: list[str] = []
    with SimulatedStream("producer") as producer:
        producer.enqueue(log.append, "producer work", delay=0.1)
        ev = producer.record_event()
        stream.wait_event(ev)
        stream.enqueue(log.append, "consumer work")
        stream.synchronize()
        assert log == ["producer work", "consumer work"]
        assert ev.query() is True


def test_an_exception_in_work_is_reraised_at_synchronize(stream: SimulatedStream) -> None:
    log: list[int] = []

    def boom() -> None:
        raise ValueError("kernel failed")

    stream.enqueue(boom)
    stream.enqueue(log.append, 1)  # later work still runs
    with pytest.raises(
        StreamError, match=r"work on test-stream failed: ValueError\('kernel failed'\)"
    ) as info:
        stream.synchronize()
    assert isinstance(info.value.__cause__, ValueError)
    assert isinstance(info.value, CaiMpiError)
    assert log == [1]
    stream.synchronize()  # reported once only


def test_the_first_of_several_errors_is_reraised(stream: SimulatedStream) -> None:
    def fail(exc: BaseException) -> None:
        raise exc

    stream.enqueue(fail, ValueError("first"))
    stream.enqueue(fail, KeyError("second"))
    with pytest.raises(StreamError) as info:
        stream.synchronize()
    assert isinstance(info.value.__cause__, ValueError)


def test_close_waits_and_refuses_more_work() -> None:
    s = SimulatedStream()
    handle = s.handle
    assert resolve_stream(handle) is s
    log: list[int] = []
    s.enqueue(log.append, 1, delay=0.05)
    s.close()
    assert log == [1]
    assert resolve_stream(handle) is None
    with pytest.raises(StreamError, match="is closed"):
        s.enqueue(log.append, 2)
    with pytest.raises(StreamError, match="is closed"):
        s.record_event()
    s.close()  # idempotent


def test_context_manager_closes() -> None:
    with SimulatedStream() as s:
        handle = s.handle
        assert resolve_stream(handle) is s
    assert resolve_stream(handle) is None


def test_handles_are_distinct_and_never_special() -> None:
    streams = [SimulatedStream() for _ in range(5)]
    try:
        handles = [s.handle for s in streams]
        assert len(set(handles)) == 5
        assert all(h > 2 for h in handles)
        assert all(resolve_stream(h) is s for h, s in zip(handles, streams, strict=True))
        assert (
            repr(streams[0]) == f"<SimulatedStream simulated-stream-{handles[0]:#x} handle={handles[0]:#x}>"
        )
    finally:
        for s in streams:
            s.close()


def test_default_streams_have_handles_1_and_2() -> None:
    legacy = SimulatedStream.legacy()
    assert legacy.handle == 1
    assert SimulatedStream.legacy() is legacy
    assert resolve_stream(1) is legacy
    per_thread = SimulatedStream.per_thread()
    assert per_thread.handle == 2
    assert SimulatedStream.per_thread() is per_thread
    assert resolve_stream(2) is per_thread
    assert per_thread is not legacy
    # another thread gets its own per-thread stream, and the same legacy stream
    other: list[Any] = []

    def in_thread() -> None:
        other.extend([SimulatedStream.per_thread(), resolve_stream(2), SimulatedStream.legacy()])

    t = threading.Thread(target=in_thread)
    t.start()
    t.join()
    assert other[0] is other[1]
    assert other[0] is not per_thread
    assert other[0].handle == 2
    assert other[2] is legacy
    other[0].close()


def test_resolve_unknown_handle_is_none() -> None:
    assert resolve_stream(0xDEAD_BEEF_0000) is None
    assert resolve_stream(3) is None


def test_a_dropped_stream_is_collected() -> None:
    s = SimulatedStream()
    handle = s.handle
    ref = weakref.ref(s)
    del s
    gc.collect()
    assert ref() is None
    assert resolve_stream(handle) is None


