"""Several cai_mpi requests completed together: waitall, waitany and testall around a ring of ranks, sends and
receives mixed, host and (simulated) device data, and their timeouts. Request.test() returns (flag, value)."""

from __future__ import annotations

import time
from collections.abc import Iterator
from typing import Any

import numpy as np
import pytest
from mpi4py import MPI
from ordering import assert_nothing_waiting

import cai_mpi
from cai_mpi._src.config import reload_config
from cai_mpi._src.progress.driving import PENDING
from cai_mpi.testing import FakeCudaArray, SimulatedRuntime, use_runtime

pytestmark = pytest.mark.mpi(min_size=2)

world = MPI.COMM_WORLD
rank, size = world.Get_rank(), world.Get_size()
right, left = (rank + 1) % size, (rank - 1) % size
HANG = 60  # seconds: only tells a hang from a slow machine


def data(r: int, n: int, salt: int = 0) -> np.ndarray[Any, Any]:
    return np.arange(n, dtype="<f8") * (r + 1) + r + 1000 * salt


_earlier: set[Any] = set()  # requests other tests left in progress (if any): not this file's to account for


@pytest.fixture
def comm() -> Iterator[MPI.Comm]:
    _earlier.clear()
    _earlier.update(PENDING)
    c = world.Dup()
    try:
        yield c
    finally:
        assert_nothing_waiting(c)
        c.Free()
        reload_config()


def quiet(comm: MPI.Comm) -> None:
    """Nothing is left on cai_mpi's communicators: a message sent now is the next one received."""
    send = cai_mpi.isend_array(np.arange(3), right, 77, comm)
    assert np.asarray(cai_mpi.recv_array(left, 77, comm)).tolist() == [0, 1, 2]
    send.wait()
    assert not PENDING - _earlier, "requests of this test are still in progress"


@pytest.mark.parametrize("how", ["small", "large-strided", "simulated-device"])
def test_waitall_completes_a_ring_of_sends_and_receives(comm: MPI.Comm, how: str) -> None:
    n = 5 if how == "small" else 60_000
    reload_config({"CAI_MPI_CHUNK_BYTES": "65536"})  # staged device data takes several chunks, each a step
    with use_runtime(SimulatedRuntime() if how == "simulated-device" else "host"):
        if how == "simulated-device":
            mine: Any = FakeCudaArray(data(rank, n), device=True)
            out: Any = FakeCudaArray(np.zeros(n), device=True)
        elif how == "large-strided":
            mine = np.repeat(data(rank, n), 2)[::2]  # packed before it is sent
            out = np.zeros(2 * n)[::2]  # filled in place through a datatype
        else:
            mine, out = data(rank, n), None
        reqs = [cai_mpi.irecv_array(left, 1, comm, out=out), cai_mpi.isend_array(mine, right, 1, comm),
                None, cai_mpi.irecv_array(left, 2, comm), cai_mpi.isend_array(data(rank, 7, 1), right, 2, comm)]
        got, sent, nothing, second, sent2 = cai_mpi.waitall(reqs)
        assert sent is None and sent2 is None and nothing is None
        assert got.source == left and got.tag == 1
        assert np.array_equal(got.numpy(), data(left, n))
        if out is not None:
            assert np.array_equal(np.asarray(out) if how != "simulated-device" else out.copy_to_host(), data(left, n))
        assert np.array_equal(second.numpy(), data(left, 7, 1))
        assert all(req.done for req in reqs if req is not None)
        assert cai_mpi.waitall(reqs)[0] is got  # completed requests give their results again
    quiet(comm)


def test_waitany_returns_the_first_to_complete_then_the_next(comm: MPI.Comm) -> None:
    reqs = [cai_mpi.irecv_array(left, 11, comm), cai_mpi.irecv_array(left, 12, comm)]
    early = cai_mpi.isend_array(data(rank, 10, 2), right, 12, comm)  # only the second of the pair, for now
    index, got = cai_mpi.waitany(reqs, timeout=HANG)
    assert index == 1 and got.tag == 12 and np.array_equal(np.asarray(got), data(left, 10, 2))
    assert not reqs[0].done  # its message has not been sent by anyone
    comm.Barrier()  # every rank has seen its second message arrive first
    late = cai_mpi.isend_array(data(rank, 4, 3), right, 11, comm)
    index, got = cai_mpi.waitany(reqs, timeout=HANG)  # the one already returned is skipped, as MPI skips it
    assert index == 0 and got.tag == 11 and np.array_equal(np.asarray(got), data(left, 4, 3))
    assert cai_mpi.waitany(reqs) == (MPI.UNDEFINED, None)
    assert cai_mpi.waitany([]) == (MPI.UNDEFINED, None)
    assert cai_mpi.waitall([early, late]) == [None, None]
    quiet(comm)


def test_testall_before_and_after_completion(comm: MPI.Comm) -> None:
    reqs = [cai_mpi.irecv_array(left, 21, comm), None]
    assert cai_mpi.testall(reqs) == (False, None)  # nobody has sent yet
    flag, value = reqs[0].test()  # type: ignore[union-attr]
    assert (flag, value) == (False, None)
    comm.Barrier()
    reqs.append(cai_mpi.isend_array(data(rank, 50_000), right, 21, comm))
    give_up = time.monotonic() + HANG
    flag, results = cai_mpi.testall(reqs)
    while not flag:
        assert time.monotonic() < give_up, "testall never saw the ring complete"
        flag, results = cai_mpi.testall(reqs)
    assert results is not None
    got, nothing, sent = results
    assert nothing is None and sent is None and np.array_equal(np.asarray(got), data(left, 50_000))
    flag, again = reqs[0].test()  # type: ignore[union-attr]
    assert flag and again is got  # mpi4py's lowercase convention: (flag, value)
    quiet(comm)


def test_request_test_polls_to_completion_with_flag_and_value(comm: MPI.Comm) -> None:
    recv = cai_mpi.irecv_array(left, 31, comm)
    comm.Barrier()
    send = cai_mpi.isend_array(data(rank, 20_000), right, 31, comm)
    give_up = time.monotonic() + HANG
    (done, got), (sent, nothing) = recv.test(), send.test()
    while not (done and sent):
        assert time.monotonic() < give_up
        if not done:
            done, got = recv.test()
        if not sent:
            sent, nothing = send.test()
    assert nothing is None and np.array_equal(np.asarray(got), data(left, 20_000))
    quiet(comm)


@pytest.mark.parametrize("how", ["timeout", "CAI_MPI_TIMEOUT"])
def test_waitall_and_waitany_time_out_and_withdraw_what_did_not_match(comm: MPI.Comm, how: str) -> None:
    short = 0.2
    kw: dict[str, Any] = {"timeout": short} if how == "timeout" else {}
    # Completed requests, and between them a receive whose message nobody sends yet.
    arrives = cai_mpi.irecv_array(left, 41, comm)
    missing = cai_mpi.irecv_array(left, 42, comm)
    sent = cai_mpi.isend_array(data(rank, 6), right, 41, comm)
    assert cai_mpi.waitany([sent]) == (0, None) and cai_mpi.waitany([arrives])[0] == 0
    if how == "CAI_MPI_TIMEOUT":  # (only now: the waits above wait for a neighbour, which may be late)
        reload_config({"CAI_MPI_TIMEOUT": str(short)})
    with pytest.raises(cai_mpi.TimeoutError) as info:
        cai_mpi.waitall([arrives, missing, sent], **kw)
    err = info.value
    assert str(err).startswith(f"waitall: 1 of 3 requests did not complete within {short:g} s; the first, "
                               "requests[1]: irecv_array: the message from rank"), str(err)
    assert err.cancelled and err.seconds == short
    assert missing.done and np.array_equal(np.asarray(arrives.wait()), data(left, 6))
    with pytest.raises(cai_mpi.TimeoutError):
        missing.wait()
    pending = [cai_mpi.irecv_array(left, 43, comm), cai_mpi.irecv_array(left, 44, comm)]
    with pytest.raises(cai_mpi.TimeoutError, match=f"^waitany: none of 2 requests completed within {short:g} s"):
        cai_mpi.waitany(pending, **kw)
    assert all(req.done for req in pending)
    reload_config()
    comm.Barrier()  # only now are the messages sent: the withdrawn receives must not have swallowed them
    late = [cai_mpi.isend_array(data(rank, 3, tag), right, tag, comm) for tag in (42, 43, 44)]
    for tag in (42, 43, 44):
        got = cai_mpi.recv_array(left, tag, comm, timeout=HANG)
        assert np.array_equal(np.asarray(got), data(left, 3, tag))
    assert cai_mpi.waitall([*late, sent], timeout=HANG) == [None] * 4
    quiet(comm)


def test_testall_returns_at_once_while_some_of_several_requests_are_pending(comm: MPI.Comm) -> None:
    """Of five requests, two receives' messages arrive while testall is polling and a third waits for a message rank
    1 sends only once rank 0 is done testing: every testall says (False, None) without blocking, including the one
    that sees the first two complete; then, once the last arrives, every result in order. (If testall blocked, rank 1
    would send after ``give_up`` seconds and testall would return True: the test fails instead of hanging.)"""
    give_up = 20.0  # s: far beyond the microseconds testall takes, only ends a broken run
    cai_mpi.isend_array(np.empty(0), MPI.PROC_NULL, 0, comm).wait()  # cai_mpi's own communicators, made on every rank
    if rank == 0:
        reqs = [cai_mpi.irecv_array(1, 51, comm), cai_mpi.irecv_array(1, 52, comm), None,
                cai_mpi.isend_array(data(0, 5), 1, 50, comm), cai_mpi.irecv_array(1, 53, comm)]
        comm.Barrier()  # (rank 1 has sent 51 and 52)
        deadline = time.monotonic() + HANG
        while not (reqs[0].done and reqs[1].done and reqs[3].done):  # type: ignore[union-attr]
            assert time.monotonic() < deadline, "the messages sent before the barrier never arrived"
            assert cai_mpi.testall(reqs) == (False, None)  # (the one that completes them too)
        assert not reqs[4].done  # type: ignore[union-attr]
        comm.send("tested", dest=1, tag=99)
        flag, results = cai_mpi.testall(reqs)
        while not flag:
            assert time.monotonic() < deadline, "testall never saw the last message arrive"
            flag, results = cai_mpi.testall(reqs)
        assert results is not None and results[2] is None and results[3] is None
        for got, tag in zip((results[0], results[1], results[4]), (51, 52, 53), strict=True):
            assert got.tag == tag and np.array_equal(np.asarray(got), data(1, 4, tag))
    elif rank == 1:
        assert np.array_equal(np.asarray(cai_mpi.recv_array(0, 50, comm)), data(0, 5))
        for tag in (51, 52):
            cai_mpi.send_array(data(1, 4, tag), 0, tag, comm)
        comm.Barrier()
        notice = comm.irecv(source=0, tag=99)
        until = time.monotonic() + give_up
        while not notice.test()[0] and time.monotonic() < until:
            time.sleep(1e-3)
        cai_mpi.send_array(data(1, 4, 53), 0, 53, comm)
        notice.wait()  # (had it given up, rank 0 would fail its assertion and end the run)
    else:
        comm.Barrier()
    quiet(comm)
