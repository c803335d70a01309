"""``close()`` of a channel (and leaving its ``with`` block): quiet on a channel that never carried a message, and
it waits for the message in flight, so the request is done when ``close()`` returns. A rank talking to itself
(survivors of the mutation run: neither was tested, docs/testing.md)."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
from mpi4py import MPI

import cai_mpi

me = MPI.COMM_WORLD.Get_rank()
DATA = np.arange(1000, dtype="<i4")


def test_closing_channels_that_never_carried_a_message_is_quiet() -> None:
    tx = cai_mpi.send_channel(DATA.copy(), me, 71)
    rx = cai_mpi.recv_channel(me, 71)
    tx.close()
    rx.close()
    tx.close()  # idempotent
    rx.close()
    with cai_mpi.send_channel(DATA.copy(), me, 72), cai_mpi.recv_channel(me, 72):
        pass


@pytest.mark.parametrize("earlier", [0, 1], ids=["first-message", "later-message"])
def test_close_waits_for_the_message_in_flight(earlier: int) -> None:
    """The first message (it carries the description) and later ones take different paths."""
    with cai_mpi.send_channel(DATA, me, 73) as tx, cai_mpi.recv_channel(me, 73) as rx:
        for _ in range(earlier):
            rx_req, tx_req = rx.irecv(), tx.isend()
            assert np.asarray(rx_req.wait()).tolist() == DATA.tolist()
            tx_req.wait()
        received, sent = rx.irecv(), tx.isend()
        tx.close()
        assert sent.done, "SendChannel.close() returned with its message still in flight"
        rx.close()
        assert received.done, "RecvChannel.close() returned with its message still in flight"
        assert np.asarray(received.wait()).tolist() == DATA.tolist()


def test_freeing_a_request_already_freed_or_completed_does_nothing() -> None:
    """A freed (or completed nonblocking) request's handle is null without being the ``MPI.REQUEST_NULL`` object:
    the channels' free step compares handles, so a second free on teardown's path cannot raise."""
    from cai_mpi._src.transport.bound import free_request

    buf = np.zeros(4, np.int32)
    req = MPI.COMM_SELF.Recv_init(buf, 0, 73)
    free_request(req)
    assert req == MPI.REQUEST_NULL and req is not MPI.REQUEST_NULL
    free_request(req)  # a second free: nothing (MPI would raise on freeing a null request)
    done = MPI.COMM_SELF.Isend(np.ones(4, np.int32), 0, 74)
    MPI.COMM_SELF.Recv(buf, 0, 74)
    done.Wait()
    free_request(done)
    free_request(None)
    assert buf.tolist() == [1, 1, 1, 1]


def test_a_receive_queued_behind_an_abandoned_one_waits_until_that_one_settles() -> None:
    """A channel receive that a timeout abandoned after its message matched is done but still in flight (MPI owns
    its memory): the next message must not start the channel's one persistent request before it has settled."""
    from cai_mpi._src.progress.requests import Request, settled
    from cai_mpi._src.progress.waits import MPIWait

    x = np.arange(4.0)
    with cai_mpi.send_channel(x, me, 91) as tx, cai_mpi.recv_channel(me, 91, out=np.empty(4)) as rx:
        first = tx.isend()
        rx.recv()
        first.wait()
        # The abandoned predecessor: a request whose MPI receive nothing has matched yet, given up on by a timeout.
        late = np.zeros(1)
        held = MPI.COMM_SELF.Irecv(late, 0, 92)

        def payload_wait() -> Any:
            yield MPIWait([held], final=True)

        previous: Request[None] = Request(payload_wait())
        previous.abandon(RuntimeError("timed out in the payload"))
        assert previous.done and not settled(previous)
        rx._inflight = previous
        received = rx.irecv()
        x[...] = 7.0
        sent = tx.isend()
        assert not received.test()[0], "the next message started while the abandoned one was still in flight"
        MPI.COMM_SELF.Send(np.ones(1), 0, 92)  # the abandoned receive completes
        assert np.asarray(received.wait()).tolist() == [7.0] * 4
        sent.wait()
        assert late.tolist() == [1.0]
