"""Every bad input of tests/bad_input_cases.py between two ranks: exactly the documented error, and the
communicator in step afterwards (the next message arrives intact, nothing is left unmatched, and a sender whose
payload the receiver dropped still completes). Ranks 0 and 1 take part; any others only wait at the barrier."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
from bad_input_cases import CASES, SENT, BadInput, good_message
from mpi4py import MPI
from ordering import assert_nothing_waiting

import cai_mpi

pytestmark = pytest.mark.mpi(min_size=2)

comm = MPI.COMM_WORLD
rank = comm.Get_rank()
SENDER, RECEIVER = 0, 1
TAG = 21
WAIT = 60.0  # seconds: a wait that would hang fails instead


def assert_intact(got: cai_mpi.Array, sent: np.ndarray[Any, Any], meta: Any = None) -> None:
    data = np.asarray(got)
    assert (data.dtype, data.shape, got.source, got.tag, got.meta) == (sent.dtype, sent.shape, SENDER, TAG, meta)
    assert data.tobytes() == sent.tobytes()


def provoke(case: BadInput, peer: int, tag: int) -> None:
    with pytest.raises(Exception) as info:
        case.call(peer, tag)
    err = info.value
    assert type(err) is case.error, f"{case.what}: expected {case.error.__name__}, got {type(err).__name__}: {err}"
    assert str(err)


def exchange(index: int, case: BadInput, peer_in_call: int, tag_in_call: int) -> None:
    """Case ``index`` between SENDER and RECEIVER, then the good message that must follow intact."""
    good, meta = good_message(index), {"after": index}
    if rank == SENDER:
        sends = []
        if case.side == "send":
            provoke(case, RECEIVER, TAG)
        else:
            sends.append(cai_mpi.isend_array(SENT, RECEIVER, TAG))
        sends.append(cai_mpi.isend_array(good, RECEIVER, TAG, meta=meta))
        for request in sends:  # a payload the receiver failed to drain would keep this wait from completing
            request.wait(timeout=WAIT)
    elif rank == RECEIVER:
        if case.side == "recv":
            provoke(case, peer_in_call, tag_in_call)
            if not case.consumed:  # refused before matching: the message is still there, whole
                assert_intact(cai_mpi.recv_array(SENDER, TAG, timeout=WAIT), SENT)
        assert_intact(cai_mpi.recv_array(SENDER, TAG, timeout=WAIT), good, meta)
    assert_nothing_waiting()


@pytest.mark.parametrize(("index", "case"), list(enumerate(CASES)), ids=[c.what for c in CASES])
def test_a_bad_input_leaves_the_communicator_in_step(index: int, case: BadInput) -> None:
    exchange(index, case, SENDER, TAG)


DRAINED = [(i, c) for i, c in enumerate(CASES) if c.consumed]


@pytest.mark.parametrize(("index", "case"), DRAINED, ids=[c.what for _, c in DRAINED])
def test_an_out_that_does_not_fit_a_wildcard_receive_drains_the_right_payload(index: int, case: BadInput) -> None:
    """The payload of a message matched with ANY_SOURCE and ANY_TAG is drained from the rank and tag it came with."""
    exchange(index, case, MPI.ANY_SOURCE, MPI.ANY_TAG)
