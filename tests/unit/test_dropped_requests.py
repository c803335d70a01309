"""A request dropped before it completes must not hand freed memory to MPI: it keeps itself and its memory until
MPI is done. A dropped receive stays posted, as an MPI receive freed with MPI_Request_free does: it takes the next
matching message, and the message after goes to the next receive, intact. Self-messages in one process; the
receives have a timeout so a swallowed message fails instead of hanging."""

from __future__ import annotations

import gc

import numpy as np
import pytest
from mpi4py import MPI

import cai_mpi
from cai_mpi._src.progress.driving import pending_count

ME = MPI.COMM_WORLD.Get_rank()


def test_a_dropped_receive_still_receives_its_message_as_in_mpi() -> None:
    req = cai_mpi.irecv_array(ME, tag=41)
    del req
    gc.collect()
    first, second = np.arange(100.0), np.arange(7)
    sends = [cai_mpi.isend_array(first, ME, tag=41), cai_mpi.isend_array(second, ME, tag=41)]
    got = cai_mpi.recv_array(ME, 41, timeout=5)  # the first message went to the dropped receive
    assert np.array_equal(np.asarray(got), second)
    for s in sends:
        s.wait(timeout=5)
    assert pending_count() == 0


def test_a_receive_dropped_while_its_payload_lands_keeps_its_memory() -> None:
    x = np.random.default_rng(3).standard_normal(1 << 20)  # 8 MiB: the payload lands after the header
    sent = cai_mpi.isend_array(x, ME, tag=44)
    req = cai_mpi.irecv_array(ME, tag=44)
    req.test()  # header matched, payload receive posted: nothing left for cai_mpi but to let MPI finish
    del req
    gc.collect()
    filler = [np.ones(1 << 17) for _ in range(64)]  # reuse freed memory, if any was freed
    sent.wait(timeout=5)
    probe = cai_mpi.isend_array(np.arange(3), ME, tag=45)
    assert np.asarray(cai_mpi.recv_array(ME, 45, timeout=5)).tolist() == [0, 1, 2]
    probe.wait()
    assert all(np.all(f == 1) for f in filler) and pending_count() == 0


def test_a_dropped_send_keeps_its_buffer_until_it_is_received() -> None:
    x = np.random.default_rng(0).standard_normal(1 << 20)  # 8 MiB: received after the drop, not at posting
    expected = x.copy()
    req = cai_mpi.isend_array(x, ME, tag=42)
    del x, req
    gc.collect()
    np.random.default_rng(1).standard_normal(1 << 20)  # memory a freed buffer would be reused for
    got = cai_mpi.recv_array(ME, 42, timeout=5)
    assert np.array_equal(np.asarray(got), expected)


def test_a_dropped_strided_send_keeps_its_packed_copy() -> None:
    x = np.random.default_rng(2).standard_normal((1024, 1024))[:, ::2]  # packed into a temporary to send
    expected = x.copy()
    req = cai_mpi.isend_array(x, ME, tag=43)
    del x, req
    gc.collect()
    got = cai_mpi.recv_array(ME, 43, timeout=5)
    assert np.array_equal(np.asarray(got), expected)


def test_a_receive_whose_header_receive_cannot_be_posted_raises_and_leaves_nothing_behind(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """MPI refusing the header receive is the caller's error; the half-made request it leaves is settled (its
    __del__ found no state: 'Exception ignored ... no attribute _gen')."""
    import sys

    from cai_mpi._src.transport.privcomm import private_comms

    post = sys.modules["cai_mpi._src.transport.post"]

    class Refusing:
        def Irecv(self, *args: object) -> None:
            raise RuntimeError("Irecv refused")

    class Comms:
        header = Refusing()

    unraisable: list[object] = []
    monkeypatch.setattr(sys, "unraisablehook", unraisable.append)
    with pytest.raises(RuntimeError, match="Irecv refused"):
        post.ireceive("irecv_array", Comms(), ME, 0, None, None, None, None)
    gc.collect()
    assert unraisable == []
    assert pending_count() == 0
    private_comms(None)  # (the real communicator is untouched)


def test_a_cancelled_receive_lets_go_of_its_out_buffer() -> None:
    """A withdrawn receive holds nothing: its out= buffer can be freed while the finished request lives on."""
    import weakref

    out = np.empty(4)
    alive = weakref.ref(out)
    req = cai_mpi.irecv_array(ME, tag=43, out=out)
    assert req.cancel()
    del out
    gc.collect()
    assert alive() is None
    assert req.wait() is None
