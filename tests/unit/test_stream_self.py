"""The described stream (``transport.stream``) on its own: a rank streaming to itself through real MPI, both ends
on one communicator (no launcher needed)."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

import numpy as np
import pytest
from mpi4py import MPI

from cai_mpi import Array
from cai_mpi._src.core.meta import encode_meta
from cai_mpi._src.transport.privcomm import private_comms
from cai_mpi._src.transport.stream import StreamIn, StreamOut, exchange_bare_ok


def _encoded(meta: dict[str, Any] | None) -> bytes:
    """``meta`` as a header carries it (what the stream's owner hands it)."""
    return b"" if meta is None else encode_meta(meta)


@pytest.fixture
def ends() -> Iterator[tuple[StreamOut, StreamIn]]:
    data, control = MPI.COMM_SELF.Dup(), MPI.COMM_SELF.Dup()
    private_comms(data)  # (a stream's owner makes them, collectively)
    out = StreamOut(data, control, 0, bare=True, window=4, fn="test.send")
    into = StreamIn(data, control, 0, fn="test.recv")
    yield out, into
    out.close()
    into.drain(out.sent - into.received, _no_wait)  # (what is still in flight: the end, at least)
    into.credit()
    out.settle(into.credits_sent, _no_wait)
    into.settle(_no_wait)
    data.Free()
    control.Free()


def _no_wait(done: Callable[[], bool]) -> None:
    """Everything a rank sends itself here has been posted before it is received: a wait only polls."""
    while not done():
        pass


def test_a_run_of_one_description_goes_bare_and_arrives_exactly_in_order(ends: tuple[StreamOut, StreamIn]) -> None:
    out, into = ends
    sent = [np.arange(6, dtype=np.int32).reshape(2, 3) * i for i in range(5)]
    sent += [np.arange(4, dtype=np.float64) + i for i in range(3)]  # another description: described again
    got = []
    for x in sent:
        out.send(x, _encoded({"n": 1}))
        item = into.recv(_no_wait)
        assert item is not None
        got.append(np.array(item.numpy()))
        assert item.meta == {"n": 1}
        del item
    for x, y in zip(sent, got, strict=True):
        assert x.dtype == y.dtype and np.array_equal(x, y)
    assert out.bare_sent == into.bare_received == 4 + 2  # each description once, then bare
    assert out.sent == into.received == len(sent)


def test_an_item_still_held_is_never_overwritten_by_a_later_one(ends: tuple[StreamOut, StreamIn]) -> None:
    """The ring reuses a buffer only once the item over it (and every view of it) is finalized."""
    out, into = ends
    held: list[Array] = []
    views = []
    for i in range(12):
        out.send(np.full(8, i, np.int64), b"")
        item = into.recv(_no_wait)
        assert item is not None
        if i % 3 == 0:
            held.append(item)
        elif i % 3 == 1:
            views.append(np.asarray(item)[2:])
        del item
    assert into.bare_received == 11
    assert [a.numpy().tolist() for a in held] == [[i] * 8 for i in range(0, 12, 3)]
    assert [v.tolist() for v in views] == [[i] * 6 for i in range(1, 12, 3)]


def test_a_changed_meta_or_a_non_bare_item_is_described_again(ends: tuple[StreamOut, StreamIn]) -> None:
    out, into = ends
    plan = [({"k": 0}, np.ones(3)), ({"k": 0}, np.ones(3) * 2), ({"k": 1}, np.ones(3) * 3),
            (None, np.ones(3)[::2]), (None, np.ones(2) * 5), (None, np.ones(2) * 6)]
    for meta, x in plan:
        out.send(x, _encoded(meta))
        item = into.recv(_no_wait)
        assert item is not None
        assert np.array_equal(item.numpy(), x) and item.meta == meta
        del item
    assert out.bare_sent == into.bare_received == 2  # the second item, and the last one


def test_the_end_of_the_stream_arrives_after_every_item(ends: tuple[StreamOut, StreamIn]) -> None:
    out, into = ends
    for i in range(3):
        out.send(np.full(4, i, np.uint8), b"")
    out.close()
    got = []
    while (item := into.recv(_no_wait)) is not None:
        got.append(item.numpy().tolist())
    assert got == [[i] * 4 for i in range(3)]


def test_credits_tell_the_sender_how_many_items_arrived(ends: tuple[StreamOut, StreamIn]) -> None:
    out, into = ends
    for i in range(5):
        out.send(np.full(2, i, np.int16), b"")
        assert into.recv(_no_wait) is not None
        if i in (1, 3):
            into.credit()
    out.read_credits()
    assert (out.acked, out.credits_read, into.credits_sent) == (4, 2, 2)


def test_bare_payloads_go_only_to_a_receiver_that_takes_them() -> None:
    control = MPI.COMM_SELF.Dup()
    try:
        assert exchange_bare_ok(control, 0, 0, True) is True
        assert exchange_bare_ok(control, 0, 0, False) is False
        assert exchange_bare_ok(control, MPI.PROC_NULL, MPI.PROC_NULL, True) is False
    finally:
        control.Free()

