"""Corrupt headers (tests/hostile_headers.py) sent as raw bytes on cai_mpi's private header communicator, with the
tag the receiver expects: the receiver raises ProtocolError saying what is wrong, and stays in step (the next
message arrives intact, nothing is left unmatched). Ranks 0 and 1 take part; any others only wait at the barrier."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np
import pytest
from hostile_headers import CORRUPT, Corrupt
from mpi4py import MPI
from ordering import assert_nothing_waiting

import cai_mpi
from cai_mpi._src.config import reload_config
from cai_mpi._src.transport.privcomm import private_comms

pytestmark = pytest.mark.mpi(min_size=2)

comm = MPI.COMM_WORLD
rank = comm.Get_rank()
SENDER, RECEIVER = 0, 1
TAG = 31
WAIT = 60.0

RECEIVES: dict[str, Callable[[], cai_mpi.Array]] = {
    "recv_array": lambda: cai_mpi.recv_array(SENDER, TAG, timeout=WAIT),
    "irecv_array": lambda: cai_mpi.irecv_array(SENDER, TAG).wait(timeout=WAIT),
    "wildcards": lambda: cai_mpi.recv_array(MPI.ANY_SOURCE, MPI.ANY_TAG, timeout=WAIT),
    "out=": lambda: cai_mpi.recv_array(SENDER, TAG, out=np.zeros(4), timeout=WAIT),
}


def assert_intact(got: cai_mpi.Array, sent: np.ndarray[Any, Any], meta: Any) -> None:
    data = np.asarray(got)
    assert (data.dtype, data.shape, got.source, got.tag, got.meta) == (sent.dtype, sent.shape, SENDER, TAG, meta)
    assert data.tobytes() == sent.tobytes()


def corrupt_then_good(corrupt: Corrupt, receive: Callable[[], cai_mpi.Array], good: np.ndarray[Any, Any]) -> None:
    pc = private_comms(None)
    meta = {"after": corrupt.name}
    if rank == SENDER:
        pc.header.Send([corrupt.message, MPI.BYTE], RECEIVER, TAG)
        cai_mpi.send_array(good, RECEIVER, TAG, meta=meta, timeout=WAIT)
    elif rank == RECEIVER:
        with pytest.raises(cai_mpi.ProtocolError) as info:
            receive()
        assert corrupt.says in str(info.value), str(info.value)
        assert_intact(cai_mpi.recv_array(SENDER, TAG, timeout=WAIT), good, meta)
    assert_nothing_waiting()


@pytest.mark.parametrize("how", sorted(RECEIVES))
@pytest.mark.parametrize("corrupt", CORRUPT, ids=[c.name for c in CORRUPT])
def test_a_corrupt_header_is_refused_and_the_next_message_arrives_intact(corrupt: Corrupt, how: str) -> None:
    corrupt_then_good(corrupt, RECEIVES[how], np.arange(1000, dtype=np.int64))


@pytest.mark.parametrize("corrupt", CORRUPT, ids=[c.name for c in CORRUPT])
def test_a_corrupt_header_right_after_a_good_one_of_the_same_shape(corrupt: Corrupt) -> None:
    """The receiver remembers the last header to recognise a stream of same-shaped arrays with one comparison:
    a corrupt header after a good (4,) float64 one (the shape most corrupt headers here have) is still refused."""
    reload_config({"CAI_MPI_INLINE_BYTES": "0"})  # header and payload apart, as in the corrupt headers
    x = np.arange(4.0)
    if rank == SENDER:
        cai_mpi.send_array(x, RECEIVER, TAG, timeout=WAIT)
    elif rank == RECEIVER:
        got = cai_mpi.recv_array(SENDER, TAG, timeout=WAIT)
        assert np.asarray(got).tobytes() == x.tobytes()
    corrupt_then_good(corrupt, RECEIVES["recv_array"], x)
