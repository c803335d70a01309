"""Messages on cai_mpi's private communicators that no cai_mpi sender makes, refused with ProtocolError before
anything is allocated or posted, and the communicator still in step; and send_array's sync= checked for every
kind of array."""

from __future__ import annotations

import numpy as np
import pytest
from hostile_headers import craft
from mpi4py import MPI
from ordering import assert_nothing_waiting

import cai_mpi
from cai_mpi._src.core.header import HEADER_BUFFER_BYTES
from cai_mpi._src.transport.privcomm import private_comms

pytestmark = pytest.mark.mpi(min_size=2)

comm = MPI.COMM_WORLD
rank = comm.Get_rank()
SENDER, RECEIVER = 0, 1
TAG = 41
WAIT = 20.0


RECEIVES = {  # every way a header is received
    "recv_array": lambda: cai_mpi.recv_array(SENDER, TAG),
    "recv_array(timeout)": lambda: cai_mpi.recv_array(SENDER, TAG, timeout=WAIT),
    "irecv_array": lambda: cai_mpi.irecv_array(SENDER, TAG).wait(WAIT),
    "recv_channel": lambda: cai_mpi.recv_channel(SENDER, TAG).recv(timeout=WAIT),
}


def corrupt_then_good(message: bytes, says: str, receive: str = "recv_array(timeout)") -> None:
    pc = private_comms(None)
    good = np.arange(1000, dtype=np.int64)
    if rank == SENDER:
        pc.header.Send([message, MPI.BYTE], RECEIVER, TAG)
        cai_mpi.send_array(good, RECEIVER, TAG, timeout=WAIT)
    elif rank == RECEIVER:
        with pytest.raises(cai_mpi.ProtocolError, match=says):
            RECEIVES[receive]()
        assert np.asarray(cai_mpi.recv_array(SENDER, TAG, timeout=WAIT)).tobytes() == good.tobytes()
    assert_nothing_waiting()


@pytest.mark.parametrize("receive", RECEIVES)
def test_a_header_message_longer_than_any_header(receive: str) -> None:
    """MPI truncates it (MPI_ERR_TRUNCATE): it was an MPI.Exception."""
    corrupt_then_good(bytes(HEADER_BUFFER_BYTES + 1), "longer than any cai_mpi header", receive)


def test_a_payload_tag_over_tag_ub() -> None:
    """It was MPI.Exception ("Invalid tag") from the payload Irecv on MPICH, whose MPI.TAG_UB is 2**29-1; Open MPI's
    is 2**31-1, the most the header's i32 can hold, so there it cannot happen."""
    tag_ub = private_comms(None).tag_ub
    if tag_ub >= 2**31 - 1:
        pytest.skip(f"MPI.TAG_UB is {tag_ub}: every payload tag the header can hold is valid")
    corrupt_then_good(craft(b"<f8", (4,), payload_tag=tag_ub + 1), "payload tag")


def test_one_payload_message_over_2_gib() -> None:
    """A cai_mpi sender never sends more than 2**31-1 bytes in one message. It was: Open MPI allocated 3 GiB and
    then failed with MPI.Exception (MPI_ERR_ARG); MPICH's large-count receive waited for a payload that never came."""
    corrupt_then_good(craft(b"|u1", (3 << 30,)), "one message")


def test_sync_is_checked_for_a_numpy_array_too() -> None:
    """send_array's sync= was validated only for CAI objects: numpy arrays passed straight through."""
    if rank == SENDER:
        with pytest.raises(TypeError, match="sync must be None, True or False"):
            cai_mpi.send_array(np.arange(3.0), RECEIVER, TAG, sync="yes")
    assert_nothing_waiting()
