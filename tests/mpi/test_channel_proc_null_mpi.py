"""Channels to and from ``PROC_NULL``, as MPI's persistent requests take it: a channel per face of a non-periodic
grid works at the walls. A send completes at once and sends nothing; a receive completes at once with what the
one-shot ``recv_array(PROC_NULL)`` returns (``out=`` untouched, or an empty uint8 host Array; source PROC_NULL,
tag ANY_TAG, no meta), through every form: ``recv``/``send``, ``irecv``/``isend`` with ``wait``, ``test``,
``waitall`` and ``testall``, timeouts, and ``close``."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
from mpi4py import MPI
from ordering import assert_nothing_waiting

import cai_mpi
from cai_mpi.testing import DoubleDeviceArray

pytestmark = [pytest.mark.mpi(min_size=2), pytest.mark.timeout(30)]

world = MPI.COMM_WORLD
rank, size = world.Get_rank(), world.Get_size()
right = rank + 1 if rank + 1 < size else MPI.PROC_NULL  # a line of ranks, as a non-periodic Cart.Shift gives
left = rank - 1 if rank else MPI.PROC_NULL
WALL = -7.0


def face(r: int, step: int) -> np.ndarray[Any, Any]:
    return np.arange(6, dtype="<f8") + 100 * r + 10_000 * step


def like_one_shot(got: cai_mpi.Array, want: cai_mpi.Array) -> None:
    """A channel's receive from PROC_NULL says what the one-shot receive from PROC_NULL says."""
    assert (got.source, got.tag, got.meta) == (want.source, want.tag, want.meta) == (MPI.PROC_NULL, MPI.ANY_TAG, None)
    assert (got.shape, got.dtype, got.device) == (want.shape, want.dtype, want.device)


def opened(end: Any, *args: Any, **kwargs: Any) -> Any:
    """``end(*args, **kwargs)``, a channel end that must open at a wall (it used to be refused)."""
    try:
        return end(*args, **kwargs)
    except ValueError as exc:
        pytest.fail(f"a channel end at PROC_NULL was refused: {exc}")


@pytest.mark.parametrize("form", ["blocking", "wait", "waitall", "test", "testall", "timeout"])
def test_a_line_of_channels_with_walls(comm: MPI.Intracomm, form: str) -> None:
    x = face(rank, 0)
    ghost = np.full(6, WALL)
    with opened(cai_mpi.send_channel, x, right, 3, comm) as tx, \
            opened(cai_mpi.recv_channel, left, 3, comm, out=ghost) as rx:
        for step in range(3):
            x[...] = face(rank, step)
            if form == "blocking":
                sent = tx.isend()  # (a blocking send to a real rank would wait for the receive)
                got = rx.recv()
                sent.wait()
            elif form == "timeout":
                sent = tx.isend()
                got = rx.recv(timeout=20)
                sent.wait(timeout=20)
            else:
                reqs = [rx.irecv(), tx.isend()]
                if form == "wait":
                    got = reqs[0].wait()
                    assert reqs[1].wait() is None
                elif form == "waitall":
                    got, nothing = cai_mpi.waitall(reqs)
                    assert nothing is None
                else:
                    while not (done := (cai_mpi.testall(reqs) if form == "testall" else reqs[0].test()))[0]:
                        pass
                    got = done[1][0] if form == "testall" else done[1]
                    reqs[1].wait()
            assert got is rx.array
            if left == MPI.PROC_NULL:
                like_one_shot(got, cai_mpi.recv_array(MPI.PROC_NULL, 3, comm, out=np.full(6, WALL)))
                assert np.array_equal(ghost, np.full(6, WALL)) and np.shares_memory(np.asarray(got), ghost)
            else:
                assert got.source == left and got.tag == 3
                assert np.array_equal(ghost, face(left, step))
            comm.Barrier()  # (x is rewritten next step: its neighbour has it)
    assert_nothing_waiting(comm)  # nothing was sent to a wall


def test_proc_null_ends_complete_at_once(comm: MPI.Intracomm) -> None:
    """Both ends at PROC_NULL on every rank: every form completes at once, however often; without out= the Array is
    the one-shot receive's empty uint8 host Array."""
    x = np.arange(4.0)
    with opened(cai_mpi.send_channel, x, MPI.PROC_NULL, 5, comm) as tx, \
            opened(cai_mpi.recv_channel, MPI.PROC_NULL, 5, comm) as rx:
        want = cai_mpi.recv_array(MPI.PROC_NULL, 5, comm)
        for _ in range(3):
            tx.send()
            tx.send(timeout=0.01)
            got = rx.recv()
            like_one_shot(got, want)
            assert got.size == 0 and got.is_host
            assert rx.recv(timeout=0.01) is got
            recv, send = rx.irecv(), tx.isend()
            assert recv.test() == (True, got) and send.test() == (True, None)
            assert cai_mpi.waitall([rx.irecv(), tx.isend(), rx.irecv()]) == [got, None, got]
        assert (rx.source, rx.tag, rx.meta) == (MPI.PROC_NULL, MPI.ANY_TAG, None)
        unwaited = [rx.irecv(), tx.isend()]
        tx.close(timeout=0.01)
        rx.close(timeout=0.01)
        assert all(r.test()[0] for r in unwaited)
    for use in (tx.send, rx.recv):
        with pytest.raises(ValueError, match="closed"):
            use()
    assert_nothing_waiting(comm)


def test_device_channels_at_the_walls(on_double: Any) -> None:
    """Device memory on a CUDA-aware MPI (the channels' device route): out= a device array at a wall is left as it
    was, as the one-shot receive leaves it."""
    with on_double(True) as (rt, comm):
        x = DoubleDeviceArray(rt, face(rank, 0))
        ghost = DoubleDeviceArray(rt, np.full(6, WALL))
        with opened(cai_mpi.send_channel, x, right, 4, comm) as tx, \
                opened(cai_mpi.recv_channel, left, 4, comm, out=ghost) as rx:
            for _ in range(2):
                sent = tx.isend()
                got = rx.recv()
                sent.wait()
                if left == MPI.PROC_NULL:
                    like_one_shot(got, cai_mpi.recv_array(MPI.PROC_NULL, 4, comm, out=ghost))
                    assert np.array_equal(ghost.read(), np.full(6, WALL))
                else:
                    assert got.source == left
                    assert np.array_equal(ghost.read(), face(left, 0))
                comm.Barrier()
