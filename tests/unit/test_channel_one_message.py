"""A channel hands its array to MPI as one message: an array that would travel as several (over
``CAI_MPI_MAX_MESSAGE_BYTES``) is refused when the channel is made, with the limit named, and one at the limit is
carried intact. A rank talking to itself (a survivor of the mutation run: only the one-message rule's other
conditions were tested, docs/testing.md)."""

from __future__ import annotations

from collections.abc import Iterator

import numpy as np
import pytest
from mpi4py import MPI

import cai_mpi
from cai_mpi._src.config import reload_config

me = MPI.COMM_WORLD.Get_rank()
LIMIT = 4096


@pytest.fixture(autouse=True)
def small_messages() -> Iterator[None]:
    reload_config({"CAI_MPI_MAX_MESSAGE_BYTES": str(LIMIT), "CAI_MPI_INLINE_BYTES": "0"})
    yield
    reload_config()


def test_an_array_over_the_message_limit_is_refused() -> None:
    with pytest.raises(ValueError, match=f"send_channel: .*CAI_MPI_MAX_MESSAGE_BYTES={LIMIT}"):
        cai_mpi.send_channel(np.zeros(LIMIT + 8, np.uint8), me, 81)


def test_an_array_at_the_message_limit_is_carried() -> None:
    x = np.arange(LIMIT, dtype=np.uint8)
    with cai_mpi.send_channel(x, me, 82) as tx, cai_mpi.recv_channel(me, 82) as rx:
        received, sent = rx.irecv(), tx.isend()
        sent.wait()
        assert np.asarray(received.wait()).tobytes() == x.tobytes()
