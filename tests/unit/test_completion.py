"""waitall / waitany / testall and Request.test() on one rank, messages to itself: arguments, None entries, the
order errors come in, and which requests waitany skips. (Around a ring of ranks: tests/mpi/test_requests_mpi.py.)"""

from __future__ import annotations

import numpy as np
import pytest
from mpi4py import MPI

import cai_mpi

me = MPI.COMM_WORLD.Get_rank()


def test_they_are_public() -> None:
    for name in ("waitall", "waitany", "testall"):
        assert name in cai_mpi.__all__ and callable(getattr(cai_mpi, name))


@pytest.mark.parametrize("fn", [cai_mpi.waitall, cai_mpi.waitany, cai_mpi.testall], ids=lambda f: f.__name__)
def test_what_is_not_a_cai_mpi_request_is_refused(fn: object) -> None:
    name = fn.__name__  # type: ignore[attr-defined]
    with pytest.raises(TypeError, match=f"^{name}: requests must be a list of cai_mpi Requests, got int"):
        fn(5)  # type: ignore[operator]
    with pytest.raises(TypeError, match=rf"^{name}: requests\[1\] is a Request, not a cai_mpi Request: complete "
                                        rf"mpi4py's requests with MPI.Request.waitall, cai_mpi's with cai_mpi.{name}"):
        fn([None, MPI.REQUEST_NULL])  # type: ignore[operator]
    with pytest.raises(TypeError, match=rf"^{name}: requests\[0\] is a str, not a cai_mpi Request$"):
        fn(["x"])  # type: ignore[operator]


def test_a_bad_timeout_is_refused() -> None:
    with pytest.raises(ValueError, match=r"^waitall: timeout must be at least 0 seconds"):
        cai_mpi.waitall([], timeout=-1)
    with pytest.raises(TypeError, match=r"^waitany: timeout must be a number of seconds"):
        cai_mpi.waitany([], timeout="1")  # type: ignore[arg-type]


def test_empty_lists_and_none_entries() -> None:
    assert cai_mpi.waitall([]) == [] and cai_mpi.testall([]) == (True, [])
    assert cai_mpi.waitany([]) == (MPI.UNDEFINED, None) and cai_mpi.waitany([None]) == (MPI.UNDEFINED, None)
    assert cai_mpi.waitall([None, None]) == [None, None] and cai_mpi.testall((None,)) == (True, [None])


def test_request_test_returns_flag_and_value() -> None:
    assert cai_mpi.isend_array(np.arange(3), MPI.PROC_NULL).test() == (True, None)
    flag, got = cai_mpi.irecv_array(MPI.PROC_NULL).test()
    assert flag and got.source == MPI.PROC_NULL and got.size == 0
    recv = cai_mpi.irecv_array(me, 3)
    assert recv.test() == (False, None)
    send = cai_mpi.isend_array(np.arange(4.0), me, 3)
    assert cai_mpi.waitall([send]) == [None]
    flag, got = recv.test()
    while not flag:
        flag, got = recv.test()
    assert np.asarray(got).tolist() == [0.0, 1.0, 2.0, 3.0] and recv.wait() is got


def test_waitall_completes_every_request_then_raises_the_first_error() -> None:
    bad = cai_mpi.irecv_array(me, 5, out=np.zeros(4))
    good = cai_mpi.irecv_array(me, 6)
    sends = [cai_mpi.isend_array(np.arange(3.0), me, 5), cai_mpi.isend_array(np.arange(2), me, 6)]
    with pytest.raises(cai_mpi.RecvMismatchError, match=r"^irecv_array: the message from rank"):
        cai_mpi.waitall([*sends, bad, good])
    assert good.done and np.asarray(good.wait()).tolist() == [0, 1] and all(s.done for s in sends)
    # testall raises it too, once everything has completed; waitany hands it over (then skips it)
    assert cai_mpi.waitany([bad]) == (MPI.UNDEFINED, None)  # already returned (as its error) by waitall
    again = cai_mpi.irecv_array(me, 7, out=np.zeros(4))
    cai_mpi.send_array(np.arange(3.0), me, 7)
    with pytest.raises(cai_mpi.RecvMismatchError):
        while not cai_mpi.testall([again])[0]:
            pass


def test_waitany_skips_what_wait_already_returned() -> None:
    first, second = cai_mpi.irecv_array(me, 8), cai_mpi.irecv_array(me, 9)
    cai_mpi.send_array(np.arange(2), me, 8)
    cai_mpi.send_array(np.arange(5), me, 9)
    assert np.asarray(first.wait()).tolist() == [0, 1]
    index, got = cai_mpi.waitany([first, second])
    assert index == 1 and np.asarray(got).tolist() == [0, 1, 2, 3, 4]
    assert cai_mpi.waitany([first, second]) == (MPI.UNDEFINED, None)
    assert [np.asarray(a).tolist() for a in cai_mpi.waitall([first, second])] == [[0, 1], [0, 1, 2, 3, 4]]


def test_waitall_raises_the_first_failure_in_list_order_not_the_first_to_fail() -> None:
    """Three failing receives among good ones, their messages sent in the reverse of list order: the error of the
    first in the list is raised, once every request has completed."""
    reqs = [cai_mpi.irecv_array(me, 20), cai_mpi.irecv_array(me, 21, out=np.zeros(4)),
            cai_mpi.irecv_array(me, 22), cai_mpi.irecv_array(me, 23, out=np.zeros(5, "i4")),
            cai_mpi.irecv_array(me, 24, out=np.zeros(1, "u1"))]
    for tag in (24, 23, 22, 21, 20):  # the last failing one completes first
        cai_mpi.send_array(np.arange(3.0) + tag, me, tag)
    with pytest.raises(cai_mpi.RecvMismatchError, match=r"tag 21\b"):
        cai_mpi.waitall(reqs)
    assert all(req.done for req in reqs)
    assert np.asarray(reqs[0].wait()).tolist() == [20.0, 21.0, 22.0]
    for req, tag in ((reqs[3], 23), (reqs[4], 24)):
        with pytest.raises(cai_mpi.RecvMismatchError, match=rf"tag {tag}\b"):
            req.wait()
    # testall, once everything completed, raises the first in list order too
    again = [cai_mpi.irecv_array(me, 26, out=np.zeros(2)), cai_mpi.irecv_array(me, 25, out=np.zeros(2))]
    for tag in (25, 26):
        cai_mpi.send_array(np.arange(3.0), me, tag)
    with pytest.raises(cai_mpi.RecvMismatchError, match=r"tag 26\b"):
        while not cai_mpi.testall(again)[0]:
            pass


def test_waitall_times_out_naming_how_many_of_several_did_not_complete_and_the_first() -> None:
    """Two of four receives never get a message: the timeout names 2 of 4 and the first of them in list order;
    the completed ones keep their results, the two are withdrawn (a message sent later is not swallowed)."""
    reqs = [cai_mpi.irecv_array(me, 30), cai_mpi.irecv_array(me, 31), cai_mpi.irecv_array(me, 32), None,
            cai_mpi.irecv_array(me, 33)]
    for tag in (32, 30):
        cai_mpi.send_array(np.arange(2.0) + tag, me, tag)
    with pytest.raises(cai_mpi.TimeoutError, match=r"^waitall: 2 of 4 requests did not complete within 0.2 s; the "
                                                   r"first, requests\[1\]: .*tag 31") as info:
        cai_mpi.waitall(reqs, timeout=0.2)
    assert info.value.cancelled
    assert [np.asarray(reqs[i].wait()).tolist() for i in (0, 2)] == [[30.0, 31.0], [32.0, 33.0]]  # type: ignore[union-attr]
    for tag in (31, 33):  # (the receive first: MPICH completes a send to its own rank only once matched)
        late = cai_mpi.irecv_array(me, tag)
        cai_mpi.send_array(np.arange(3.0), me, tag)
        assert np.asarray(late.wait()).tolist() == [0.0, 1.0, 2.0]
