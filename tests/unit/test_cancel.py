"""``Request.cancel()`` withdraws a receive that no message has matched (issue 34), with MPI's semantics: a
cancelled receive takes no message, so the next message is the next receive's; the cancelled request completes
with no result (``wait()`` returns None, ``test()`` ``(True, None)``). A receive that already matched, a completed
request and a send are not withdrawn (False), and complete as usual. One rank sending to itself."""

from __future__ import annotations

import numpy as np
import pytest
from mpi4py import MPI

import cai_mpi
from cai_mpi._src.progress.driving import is_pending

me = MPI.COMM_WORLD.Get_rank()


def exchange(data: np.ndarray, tag: int) -> cai_mpi.Array:
    """Send ``data`` to this rank and receive it with a new receive."""
    sent = cai_mpi.isend_array(data, me, tag)
    got = cai_mpi.recv_array(me, tag)
    sent.wait()
    return got


@pytest.mark.parametrize("out", [False, True], ids=["new-array", "into-out"])
def test_a_cancelled_receive_takes_no_message(out: bool) -> None:
    buf = np.full(4, -1, "<i4")
    req = cai_mpi.irecv_array(me, 21, out=buf if out else None)
    assert req.cancel() is True
    assert req.done and not is_pending(req)
    assert req.test() == (True, None) and req.wait() is None
    got = exchange(np.arange(4, dtype="<i4"), 21)  # the later message goes to the later receive
    assert np.asarray(got).tolist() == [0, 1, 2, 3] and got.tag == 21
    assert buf.tolist() == [-1, -1, -1, -1]  # the cancelled receive's out= was never written


def test_an_any_source_any_tag_receive_cancelled_leaves_every_message() -> None:
    req = cai_mpi.irecv_array()
    assert req.cancel()
    assert np.asarray(exchange(np.arange(3.0), 22)).tolist() == [0.0, 1.0, 2.0]


def test_a_completed_receive_is_not_cancelled() -> None:
    sent = cai_mpi.isend_array(np.arange(5, dtype="<i8"), me, 23, meta={"k": 1})
    req = cai_mpi.irecv_array(me, 23)
    got = req.wait()
    sent.wait()
    assert req.cancel() is False
    assert req.wait() is got and np.asarray(got).tolist() == [0, 1, 2, 3, 4] and got.meta == {"k": 1}


def test_cancel_twice_and_a_proc_null_receive() -> None:
    req = cai_mpi.irecv_array(me, 24)
    assert req.cancel() is True and req.cancel() is False
    null = cai_mpi.irecv_array(MPI.PROC_NULL, 24)
    assert null.cancel() is False  # it completed at once, as MPI's does
    assert null.wait().source == MPI.PROC_NULL


def test_a_send_is_not_withdrawn() -> None:
    """MPI deprecated cancelling sends; cai_mpi never withdraws one: the message is still received."""
    sent = cai_mpi.isend_array(np.arange(6, dtype="<u2"), me, 25)
    assert sent.cancel() is False
    got = cai_mpi.recv_array(me, 25)
    assert sent.wait() is None and np.asarray(got).tolist() == [0, 1, 2, 3, 4, 5]


@pytest.mark.parametrize("earlier", [0, 1], ids=["first-message", "later-message"])
def test_a_cancelled_channel_receive_leaves_the_message_to_the_next(earlier: int) -> None:
    """The first message (with the description) and later ones take different paths."""
    data = np.arange(8, dtype="<f8")
    with cai_mpi.send_channel(data, me, 26) as tx, cai_mpi.recv_channel(me, 26) as rx:
        for _ in range(earlier):
            received, sent = rx.irecv(), tx.isend()
            assert np.asarray(received.wait()).tolist() == data.tolist()
            sent.wait()
        req = rx.irecv()
        assert req.cancel() is True and req.wait() is None
        data *= 3
        received, sent = rx.irecv(), tx.isend()
        assert np.asarray(received.wait()).tolist() == (np.arange(8.0) * 3).tolist()
        sent.wait()
