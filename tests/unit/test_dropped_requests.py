"""A request dropped before it completes must not hand freed memory to MPI: it keeps itself and its memory until
MPI is done. A dropped receive stays posted, as an MPI receive freed with MPI_Request_free does: it takes the next
matching message, and the message after goes to the next receive, intact. Self-messages in one process; the
receives have a timeout so a swallowed message fails instead of hanging."""

from __future__ import annotations

import gc

import numpy as np
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
