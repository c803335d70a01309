"""Closing waits on a peer too, so it honours ``timeout=`` and ``CAI_MPI_TIMEOUT``: a channel's ``close()`` with a
message nobody takes raises cai_mpi.TimeoutError naming the close, the peer, the tag and the seconds; a send stays
posted with its memory kept (the peer that comes later gets it intact), a receive that matched nothing is withdrawn.
Leaving a channel's ``with`` block on an exception does not wait at all, and a ``Pipeline`` stage that never leaves
makes the others' leaving time out.

A peer that never matches must not hang the job when the code under test regresses: the peer here does not wait in
a barrier for the timed-out rank, but in ``_meet``, which gives up after ``GIVE_UP`` seconds and then matches anyway,
so a close that still waits without limit fails the test (no TimeoutError) instead of hanging it."""

from __future__ import annotations

import builtins
import gc
import re
import time
import weakref

import numpy as np
import pytest
from mpi4py import MPI
from ordering import assert_nothing_waiting

import cai_mpi
from cai_mpi._src.config import reload_config
from cai_mpi._src.progress.driving import pending_count

pytestmark = [pytest.mark.mpi(min_size=2)]

WORLD = MPI.COMM_WORLD
SHORT = 0.3  # seconds: long enough to be clearly past, short enough for the suite
GIVE_UP = 30.0  # seconds a peer waits in _meet before matching anyway
BIG = 1 << 20  # float64: 8 MiB, beyond any eager limit, so a send waits for its receiver


def _payload(n: int, seed: int) -> np.ndarray:
    return np.random.default_rng(seed).standard_normal(n)


def _meet(comm: MPI.Comm = WORLD) -> None:
    """A barrier every rank of ``comm`` joins, which gives up waiting after GIVE_UP seconds (then completes later)."""
    req = comm.Ibarrier()
    until = time.monotonic() + GIVE_UP
    while not req.Test() and time.monotonic() < until:
        time.sleep(1e-3)
    _late.append(req)


_late: list[MPI.Request] = []


def _settle_meetings() -> None:
    MPI.Request.Waitall(_late)
    _late.clear()


def _expect_timeout(call, *fragments: str) -> cai_mpi.TimeoutError:
    start = time.monotonic()
    with pytest.raises(cai_mpi.TimeoutError) as info:
        call()
    waited = time.monotonic() - start
    err = info.value
    assert isinstance(err, cai_mpi.CaiMpiError) and isinstance(err, builtins.TimeoutError)
    assert SHORT * 0.9 <= waited < SHORT + 10, waited
    for fragment in fragments:
        assert fragment in str(err), (fragment, str(err))
    return err


def _drain_background() -> None:
    """Later cai_mpi waits finish what a timeout left in the background."""
    until = time.monotonic() + GIVE_UP
    while pending_count() and time.monotonic() < until:
        cai_mpi.irecv_array(MPI.PROC_NULL).wait()
    assert not pending_count()


@pytest.mark.parametrize("opened", [False, True])
def test_send_channel_close_times_out_and_the_message_is_delivered_later(opened: bool) -> None:
    """The issue's case: send(timeout) times out, then close(timeout) must too, not wait for ever."""
    rank = WORLD.Get_rank()  # ranks 0 and 1 exchange; any others only meet
    x = np.zeros(BIG)
    if rank == 0:
        ch = cai_mpi.send_channel(x, 1, tag=21)
        if opened:
            x[:] = _payload(BIG, 1)
            ch.send(timeout=60)
        x[:] = _payload(BIG, 2)
        _expect_timeout(lambda: ch.send(timeout=SHORT), "SendChannel.send", "to rank 1", "tag 21")
        err = _expect_timeout(lambda: ch.close(timeout=SHORT), "SendChannel.close", "to rank 1", "tag 21",
                              "MPI_COMM_WORLD", f"within {SHORT:g} s", "stays posted")
        assert not err.cancelled and err.seconds == SHORT
        assert "closed" in repr(ch)
        with pytest.raises(ValueError, match="closed channel"):
            ch.send()
        ch.close(timeout=SHORT)  # closing again does nothing
        # Nothing MPI still reads from is freed: not the buffer, though every reference to it and to the channel
        # is dropped, and not the channel's MPI request (freed, it would read as complete to the send's wait).
        gone = weakref.ref(x)
        del ch, x, err  # (the error's traceback holds the channel)
        gc.collect()
        cai_mpi.irecv_array(MPI.PROC_NULL).wait()  # (any cai_mpi wait drives what a timeout left behind)
        assert gone() is not None and pending_count(), "the send in flight was let go"
    elif rank == 1:
        rx = cai_mpi.recv_channel(0, 21)
        if opened:
            assert np.asarray(rx.recv(timeout=60)).tobytes() == _payload(BIG, 1).tobytes()
    _meet()  # only now does rank 1 receive the second message
    if rank == 1:
        assert np.asarray(rx.recv(timeout=60)).tobytes() == _payload(BIG, 2).tobytes()
        rx.close(timeout=60)
    _settle_meetings()
    WORLD.Barrier()
    if rank == 0:
        _drain_background()
        gc.collect()
        assert gone() is None, "the buffer outlived its send"
    assert_nothing_waiting()


@pytest.mark.parametrize("opened", [False, True])
def test_recv_channel_close_times_out_and_withdraws_the_receive(opened: bool) -> None:
    rank = WORLD.Get_rank()  # ranks 0 and 1 exchange; any others only join the barriers
    x = _payload(64, 3)
    if rank == 1 and opened:
        with cai_mpi.send_channel(x, 0, tag=22) as tx:
            tx.send(timeout=60)
    elif rank == 0:
        rx = cai_mpi.recv_channel(1, 22, device="host")
        if opened:
            assert np.asarray(rx.recv(timeout=60)).tobytes() == x.tobytes()
        pending = rx.irecv()  # nothing will come
        err = _expect_timeout(lambda: rx.close(timeout=SHORT), "RecvChannel.close", "from rank 1", "tag 22",
                              f"within {SHORT:g} s", "cancelled")
        assert err.cancelled and pending.done and not pending_count()
        with pytest.raises(ValueError, match="closed channel"):
            rx.recv()
    WORLD.Barrier()
    if rank == 1:  # the communicator is in step: the next message is the next receive's, intact
        cai_mpi.send_array(x, 0, tag=22)
    elif rank == 0:
        got = cai_mpi.recv_array(1, 22, timeout=60)
        assert np.asarray(got).tobytes() == x.tobytes() and got.tag == 22
    assert_nothing_waiting()


def test_close_honours_the_environment_timeout(monkeypatch: pytest.MonkeyPatch) -> None:
    rank = WORLD.Get_rank()  # ranks 0 and 1 exchange; any others only meet
    monkeypatch.setenv("CAI_MPI_TIMEOUT", str(SHORT))
    reload_config()
    x = _payload(BIG, 4)
    if rank == 0:
        ch = cai_mpi.send_channel(x, 1, tag=23)
        _expect_timeout(ch.send, "SendChannel.send", "tag 23")
        _expect_timeout(ch.close, "SendChannel.close", "to rank 1", "tag 23", f"within {SHORT:g} s")
    elif rank == 1:
        rx = cai_mpi.recv_channel(0, 26)
        rx.irecv()  # nobody sends with tag 26
        _expect_timeout(rx.close, "RecvChannel.close", "from rank 0", "tag 26", f"within {SHORT:g} s", "cancelled")
    monkeypatch.delenv("CAI_MPI_TIMEOUT")
    reload_config()
    _meet()
    if rank == 1:
        with cai_mpi.recv_channel(0, 23) as late:
            assert np.asarray(late.recv(timeout=60)).tobytes() == x.tobytes()
    _settle_meetings()
    WORLD.Barrier()
    if rank == 0:
        _drain_background()
    assert_nothing_waiting()


def test_leaving_a_channel_on_an_exception_does_not_wait() -> None:
    """No timeout set: the ``with`` block of a channel whose send timed out ends at once with that error; the send
    stays posted and the peer that comes later receives it."""
    rank = WORLD.Get_rank()
    x = _payload(BIG, 5)
    if rank == 0:
        start = time.monotonic()
        with pytest.raises(cai_mpi.TimeoutError, match=r"SendChannel\.send"), cai_mpi.send_channel(x, 1, tag=24) as tx:
            tx.send(timeout=SHORT)
        assert time.monotonic() - start < SHORT + 10
    elif rank == 1:
        with pytest.raises(RuntimeError, match="planted"), cai_mpi.recv_channel(0, 27) as rx:
            pending = rx.irecv()  # nobody sends with tag 27
            raise RuntimeError("planted")
        assert pending.done and not pending_count()  # withdrawn
        with pytest.raises(cai_mpi.TimeoutError, match="cancelled"):
            pending.wait()
    _meet()
    if rank == 1:
        with cai_mpi.recv_channel(0, 24) as late:
            assert np.asarray(late.recv(timeout=60)).tobytes() == x.tobytes()
    _settle_meetings()
    WORLD.Barrier()
    if rank == 0:
        _drain_background()
    assert_nothing_waiting()


@pytest.mark.parametrize("bad, error", [("1", TypeError), (-1, ValueError)])
def test_a_bad_close_timeout_is_refused_and_the_channel_stays_open(bad, error) -> None:
    me = WORLD.Get_rank()
    x = np.arange(6.0)
    with cai_mpi.send_channel(x, me, tag=25) as tx, cai_mpi.recv_channel(me, 25) as rx:
        for ch, name in ((tx, "SendChannel.close"), (rx, "RecvChannel.close")):
            with pytest.raises(error, match=re.escape(f"{name}: timeout")):
                ch.close(timeout=bad)
        tx.isend()
        assert np.asarray(rx.recv(timeout=60)).tolist() == x.tolist()


def test_leaving_a_pipeline_times_out_when_a_stage_never_leaves() -> None:
    """Leaving is collective: stage 0 waits for stage 1 to leave too, at most the pipeline's timeout once per stage
    and item that may be in flight."""
    comm = WORLD.Split(0 if WORLD.Get_rank() < 2 else 1, WORLD.Get_rank())
    x = _payload(1000, 6)
    if WORLD.Get_rank() < 2:
        if comm.Get_rank() == 0:
            with pytest.raises(cai_mpi.TimeoutError) as info:
                start = time.monotonic()
                with cai_mpi.Pipeline(comm, timeout=SHORT) as pipe:
                    pipe.send(x, meta={"n": 1})
            bound = SHORT * 2 * 3  # once per stage and item that may be in flight, at the default depth 2
            assert bound * 0.9 <= time.monotonic() - start < bound + 10
            said = str(info.value)
            assert f"Pipeline: stage 0 waited {bound:g} s for every stage to leave the pipeline" in said, said
            assert not info.value.cancelled and info.value.seconds == pytest.approx(bound)
            assert pending_count(), "the pending agreement should be kept alive"
            _meet(comm)
        else:
            with cai_mpi.Pipeline(comm) as pipe:
                _meet(comm)  # stage 1 leaves only once stage 0 has given up
                items = list(pipe)
            assert len(items) == 1 and np.asarray(items[0]).tobytes() == x.tobytes() and items[0].meta == {"n": 1}
        _settle_meetings()
        if comm.Get_rank() == 0:
            _drain_background()  # the agreement completed once stage 1 left
        y = _payload(10, 7)  # the communicator itself is usable
        if comm.Get_rank() == 0:
            cai_mpi.send_array(y, 1, comm=comm, timeout=60)
        else:
            assert np.asarray(cai_mpi.recv_array(0, comm=comm, timeout=60)).tobytes() == y.tobytes()
    comm.Free()
    WORLD.Barrier()



def test_sendrecv_times_out_and_both_messages_arrive_later() -> None:
    """Each half of sendrecv_array waits at most the timeout (the errors name the halves that timed out)."""
    rank = WORLD.Get_rank()  # ranks 0 and 1 exchange; any others only meet
    x, y = _payload(BIG, 8), _payload(100, 9)
    if rank == 0:
        start = time.monotonic()
        with pytest.raises(cai_mpi.TimeoutError) as info:
            cai_mpi.sendrecv_array(x, 1, 28, 1, 29, timeout=SHORT)
        assert SHORT * 0.9 <= time.monotonic() - start < 2 * SHORT + 10
        # The send half timed out last (MPI cannot withdraw it): its error, with the withdrawn receive's as context.
        assert "to rank 1 with tag 28" in str(info.value) and not info.value.cancelled, str(info.value)
        received = info.value.__context__
        assert isinstance(received, cai_mpi.TimeoutError) and received.cancelled, received
        assert "from rank 1 with tag 29" in str(received), received
    _meet()
    if rank == 1:
        assert np.asarray(cai_mpi.recv_array(0, 28, timeout=60)).tobytes() == x.tobytes()
        cai_mpi.send_array(y, 0, tag=29, timeout=60)
    elif rank == 0:
        assert np.asarray(cai_mpi.recv_array(1, 29, timeout=60)).tobytes() == y.tobytes()
    _settle_meetings()
    WORLD.Barrier()
    if rank == 0:
        _drain_background()
    assert_nothing_waiting()
