"""cai_mpi's exit hooks leave what MPI still owns to MPI: a channel message in flight at exit stays posted, so a
wait after the hooks (another library's exit hook, registered before cai_mpi's) sees it really complete. Self-
messages in one process, calling the channel exit hook directly."""

from __future__ import annotations

import numpy as np
from mpi4py import MPI

import cai_mpi
from cai_mpi._src.api import channel_ends

ME = MPI.COMM_WORLD.Get_rank()


def test_a_channel_message_in_flight_at_exit_stays_posted() -> None:
    x = np.random.default_rng(5).standard_normal(1 << 20)  # 8 MiB: in flight until a receive matches it
    tx = cai_mpi.send_channel(x, ME, 61)
    sending = tx.isend()
    channel_ends.free_open_channels()  # what atexit runs
    assert not sending.test()[0], "the send reads as complete, yet nothing has received it"
    with cai_mpi.recv_channel(ME, 61) as rx:
        got = rx.recv(timeout=10)
    sending.wait(timeout=10)
    assert np.asarray(got).tobytes() == x.tobytes()
