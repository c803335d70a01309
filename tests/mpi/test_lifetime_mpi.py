"""Lifetime under faults: memory cai_mpi is sending from outlives every reference the user drops, and is freed
once MPI is done with it; a channel dropped without close() is collected."""

from __future__ import annotations

import gc
import weakref

import numpy as np
import pytest
from mpi4py import MPI

import cai_mpi
from cai_mpi._src.progress.driving import pending_count

pytestmark = pytest.mark.mpi(min_size=2)

comm = MPI.COMM_WORLD
rank = comm.Get_rank()
WAIT = 30.0
N = 1 << 20  # 8 MiB of float64: sent by rendezvous, so the send is in flight until the receiver comes


def payload(seed: int) -> np.ndarray:
    return np.random.default_rng(seed).standard_normal(N)


def test_an_array_freed_while_its_send_is_in_flight() -> None:
    """Rank 0 forwards an Array cai_mpi handed it, then drops every reference before rank 1 receives it."""
    if rank == 1:
        cai_mpi.send_array(payload(1), 0, 30, timeout=WAIT)
    if rank == 0:
        received = cai_mpi.recv_array(1, 30, timeout=WAIT)
        gone = weakref.ref(received)
        req = cai_mpi.isend_array(received, 1, 31)
        del received
        gc.collect()
        assert gone() is not None, "the Array died while MPI was still sending from it"
        comm.Barrier()  # rank 1 receives only now
        req.wait(WAIT)
        del req
        gc.collect()
        assert gone() is None, "the Array outlived its send"
    elif rank == 1:
        comm.Barrier()
        got = cai_mpi.recv_array(0, 31, timeout=WAIT)
        assert np.asarray(got).tobytes() == payload(1).tobytes()
    else:
        comm.Barrier()
    comm.Barrier()
    assert not pending_count()


def test_a_strided_view_freed_while_its_send_is_in_flight() -> None:
    """The packed copy of a strided view, and the view's base, live until the send is done."""
    if rank == 0:
        base = payload(2)
        view = base[::-2]
        expected = view.copy()
        gone = weakref.ref(base)
        req = cai_mpi.isend_array(view, 1, 32)
        del base, view
        gc.collect()
        comm.Barrier()
        req.wait(WAIT)
        del req
        gc.collect()
        assert gone() is None
        comm.bcast(expected, root=0)
    elif rank == 1:
        comm.Barrier()
        got = cai_mpi.recv_array(0, 32, timeout=WAIT)
        expected = comm.bcast(None, root=0)
        assert np.asarray(got).tobytes() == expected.tobytes()
    else:
        comm.Barrier()
        comm.bcast(None, root=0)
    comm.Barrier()


def test_a_channel_dropped_without_close_is_collected() -> None:
    if rank in (0, 1):
        peer = 1 - rank
        x = np.arange(1000.0) + rank
        tx = cai_mpi.send_channel(x, peer, 33)
        rx = cai_mpi.recv_channel(peer, 33, device="host")
        for step in range(3):
            x[:] = np.arange(1000.0) + rank + step
            sent = tx.isend()
            got = rx.recv(WAIT)
            assert np.asarray(got).tobytes() == (np.arange(1000.0) + peer + step).tobytes()
            sent.wait(WAIT)
        refs = [weakref.ref(tx), weakref.ref(rx)]
        del tx, rx, got, sent
        gc.collect()
        assert [r() for r in refs] == [None, None], "a dropped channel stayed alive"
    comm.Barrier()
    assert not pending_count()
