"""Waits with a timeout raise cai_mpi.TimeoutError saying what was awaited, and leave the communicator in step:
the message that comes after a timed-out receive is delivered intact to the next receive."""

from __future__ import annotations

import builtins
import time

import numpy as np
import pytest
from mpi4py import MPI
from ordering import assert_nothing_waiting

import cai_mpi
from cai_mpi._src.config import reload_config
from cai_mpi._src.core.header import encode_header
from cai_mpi._src.progress.driving import pending_count
from cai_mpi._src.transport.privcomm import private_comms

pytestmark = [pytest.mark.mpi(min_size=2)]

WORLD = MPI.COMM_WORLD
SHORT = 0.3  # seconds: long enough to be clearly past, short enough for the suite


def _payload(n: int, seed: int) -> np.ndarray:
    return np.random.default_rng(seed).standard_normal(n)


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


@pytest.mark.parametrize("source, tag, said", [(1, 7, ["from rank 1", "tag 7"]),
                                               (cai_mpi.ANY_SOURCE, cai_mpi.ANY_TAG, ["any rank", "any tag"])])
def test_recv_times_out_then_the_late_message_is_delivered_intact(source, tag, said) -> None:
    rank = WORLD.Get_rank()  # ranks 0 and 1 exchange; any others only join the barriers
    x = _payload(1000, 1)
    if rank == 0:
        err = _expect_timeout(lambda: cai_mpi.recv_array(source, tag, timeout=SHORT),
                              "recv_array", *said, "MPI_COMM_WORLD", f"{SHORT:g} s", "cancelled")
        assert err.cancelled and err.seconds == SHORT
    WORLD.Barrier()  # only now does rank 1 send: the timed-out receive must not have swallowed it
    if rank == 1:
        cai_mpi.send_array(x, 0, tag=7)
    elif rank == 0:
        y = cai_mpi.recv_array(1, 7)
        assert np.array_equal(np.asarray(y), x) and y.source == 1 and y.tag == 7
    WORLD.Barrier()


def test_request_wait_times_out_and_the_request_is_done() -> None:
    rank = WORLD.Get_rank()  # ranks 0 and 1 exchange; any others only join the barriers
    x = _payload(300, 2)
    if rank == 0:
        req = cai_mpi.irecv_array(1, 3)
        err = _expect_timeout(lambda: req.wait(timeout=SHORT), "irecv_array", "from rank 1", "tag 3")
        assert req.done
        with pytest.raises(cai_mpi.TimeoutError) as tested:
            req.test()  # done: (True, result), or its error, as wait() raises it
        assert tested.value is err
        with pytest.raises(cai_mpi.TimeoutError) as again:
            req.wait()
        assert again.value is err
    WORLD.Barrier()
    if rank == 1:
        cai_mpi.send_array(x, 0, tag=3)
    elif rank == 0:
        assert np.array_equal(np.asarray(cai_mpi.irecv_array(1, 3).wait(timeout=60)), x)
    WORLD.Barrier()


def test_a_timeout_that_is_not_reached_changes_nothing() -> None:
    rank = WORLD.Get_rank()  # ranks 0 and 1 exchange; any others only join the barriers
    x = _payload(5000, 3)
    if rank == 1:
        cai_mpi.send_array(x, 0, tag=4, timeout=60)
    elif rank == 0:
        y = cai_mpi.recv_array(1, 4, timeout=60)
        assert np.array_equal(np.asarray(y), x)
    WORLD.Barrier()


def test_the_environment_sets_a_default_timeout(monkeypatch: pytest.MonkeyPatch) -> None:
    rank = WORLD.Get_rank()  # ranks 0 and 1 exchange; any others only join the barriers
    monkeypatch.setenv("CAI_MPI_TIMEOUT", str(SHORT))
    reload_config()
    if rank == 0:
        _expect_timeout(lambda: cai_mpi.recv_array(1, 9), "recv_array", "tag 9")
    WORLD.Barrier()
    if rank == 1:
        cai_mpi.send_array(np.arange(5), 0, tag=9)
    elif rank == 0:  # (a timeout= of the call wins over the environment's: rank 1 may be late)
        assert np.asarray(cai_mpi.recv_array(1, 9, timeout=60)).tolist() == list(range(5))
    WORLD.Barrier()


def test_a_send_that_is_not_received_times_out_and_is_delivered_later() -> None:
    rank = WORLD.Get_rank()  # ranks 0 and 1 exchange; any others only join the barriers
    big = _payload(1 << 20, 4)  # 8 MiB: beyond any eager limit, so the send waits for the receiver
    if rank == 0:
        err = _expect_timeout(lambda: cai_mpi.send_array(big, 1, tag=5, timeout=SHORT),
                              "send_array", "to rank 1", "tag 5", "stays posted")
        assert not err.cancelled
    WORLD.Barrier()
    if rank == 1:
        assert np.array_equal(np.asarray(cai_mpi.recv_array(0, 5)), big)
    WORLD.Barrier()
    if rank == 0:
        cai_mpi.send_array(np.arange(3), 1, tag=6)  # any later wait finishes the abandoned send
        assert pending_count() == 0
    elif rank == 1:
        assert np.asarray(cai_mpi.recv_array(0, 6)).tolist() == [0, 1, 2]
    WORLD.Barrier()


@pytest.mark.parametrize("opened", [False, True])
def test_a_channel_recv_times_out_and_gets_the_late_message_next(opened: bool) -> None:
    rank = WORLD.Get_rank()  # ranks 0 and 1 exchange; any others only join the barriers
    x = np.zeros(64)
    if rank == 1:
        with cai_mpi.send_channel(x, 0, tag=11) as ch:
            if opened:
                x[:] = 1
                ch.send()
            WORLD.Barrier()
            x[:] = 2
            ch.send(timeout=60)
    elif rank == 0:
        with cai_mpi.recv_channel(1, 11) as ch:
            if opened:
                assert np.all(np.asarray(ch.recv()) == 1)
            _expect_timeout(lambda: ch.recv(timeout=SHORT), "RecvChannel.recv", "from rank 1", "tag 11")
            WORLD.Barrier()
            assert np.all(np.asarray(ch.recv(timeout=60)) == 2)
    else:
        WORLD.Barrier()
    WORLD.Barrier()


@pytest.mark.parametrize("bad, error", [("1", TypeError), (True, TypeError), (-1, ValueError),
                                        (float("nan"), ValueError)])
def test_a_bad_timeout_is_refused_before_anything_happens(bad, error) -> None:
    with pytest.raises(error, match="timeout"):
        cai_mpi.recv_array(0, timeout=bad)
    with pytest.raises(error, match="timeout"):
        cai_mpi.send_array(np.arange(2), 0, timeout=bad)
    with pytest.raises(error, match="timeout"):
        cai_mpi.isend_array(np.arange(2), WORLD.Get_rank(), tag=99).wait(timeout=bad)
    assert np.asarray(cai_mpi.recv_array(WORLD.Get_rank(), 99)).tolist() == [0, 1]


def test_a_pipeline_stage_that_waits_too_long_fails_and_every_stage_hears_of_it() -> None:
    comm = WORLD.Split(0 if WORLD.Get_rank() < 2 else 1, WORLD.Get_rank())
    told = comm.Dup()  # (stage 1 tells stage 0 it has timed out: stage 0 must not end the stream before)
    if WORLD.Get_rank() < 2:
        with pytest.raises((cai_mpi.TimeoutError, cai_mpi.PipelineError)) as info, \
                cai_mpi.Pipeline(comm, timeout=SHORT) as pipe:
            if pipe.first:  # sends nothing in time: ends the stream only once stage 1 timed out (or 30 s passed)
                give_up = time.monotonic() + 30
                while not told.Iprobe(source=1) and time.monotonic() < give_up:
                    time.sleep(1e-3)
            else:
                try:
                    for _item in pipe:
                        pass
                finally:
                    told.send(None, dest=0)
        if comm.Get_rank() == 1:
            assert isinstance(info.value, cai_mpi.TimeoutError)
            assert f"stage 1 waited {SHORT:g} s for an item from the previous stage" in str(info.value)
        else:
            assert isinstance(info.value, cai_mpi.PipelineError) and info.value.rank == 1
            told.recv(source=1)
        x = np.arange(4.0)
        if comm.Get_rank() == 0:
            cai_mpi.send_array(x, 1, comm=comm)
        else:
            assert np.array_equal(np.asarray(cai_mpi.recv_array(0, comm=comm)), x)
    told.Free()
    comm.Free()
    WORLD.Barrier()


@pytest.mark.parametrize("into", ["new", "out="])
def test_a_payload_that_does_not_come_times_out_and_is_received_in_the_background(into: str) -> None:
    """A header arrives but its payload is held back (a sender built by hand on the private communicators: cai_mpi's
    own senders post both at once). The receive gets a second timeout for the payload, then raises; the payload,
    sent afterwards, is received in the background and dropped; the next message arrives intact."""
    rank = WORLD.Get_rank()  # ranks 0 and 1 exchange; any others only join the barriers
    pc = private_comms(None)
    x, after = _payload(1 << 16, 7), _payload(500, 8)
    out = np.zeros(1 << 16) if into == "out=" else None
    if rank == 1:
        ptag = pc.next_payload_tag()
        pc.header.Send([encode_header(x.dtype, x.shape, fortran=False, payload_tag=ptag), MPI.BYTE], 0, 17)
    elif rank == 0:
        assert pending_count() == 0  # (so that what is pending afterwards is this receive)
        pc.header.Probe(1, 17)  # (the header is there: the timeout below is the payload's, however late rank 1 is)
        start = time.monotonic()
        with pytest.raises(cai_mpi.TimeoutError) as info:
            cai_mpi.recv_array(1, 17, timeout=SHORT, out=out)
        waited = time.monotonic() - start
        assert SHORT * 0.9 <= waited < 2 * SHORT + 10, waited  # until the header came, then the payload's SHORT
        assert not info.value.cancelled
        assert "arrived, but its payload did not complete within" in str(info.value), str(info.value)
        assert pending_count(), "the receive should go on in the background"
    WORLD.Barrier()  # only now does the payload come, then the next message
    if rank == 1:
        pc.payload.Send([x, MPI.BYTE], 0, ptag)
        cai_mpi.send_array(after, 0, tag=17)
    elif rank == 0:
        got = cai_mpi.recv_array(1, 17, timeout=30)
        assert np.array_equal(np.asarray(got), after) and got.tag == 17
        deadline = time.monotonic() + 30
        while pending_count() and time.monotonic() < deadline:  # the background receive completes in later waits
            cai_mpi.irecv_array(MPI.PROC_NULL).wait()
        assert pending_count() == 0
        if out is not None:
            assert out.tobytes() == x.tobytes()  # (the documented hazard: out= may still be written)
    assert_nothing_waiting()
