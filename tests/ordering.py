"""What the MPI tests may conclude only once every rank, or a stream, has reached a point: that no message was left
behind, and that data was sent before a write."""

from __future__ import annotations

import threading
from typing import Any

import numpy as np
from mpi4py import MPI

from cai_mpi._src.transport.privcomm import private_comms


def assert_nothing_waiting(comm: MPI.Comm | None = None) -> None:
    """Asserts that no message waits, on this rank, on ``comm``'s private communicators (COMM_WORLD's by default).

    It looks between two barriers of ``comm``: after the first, every rank has made this test's sends; the second
    holds every rank until all have looked, so a message of the next test, sent by a rank that went on first, is
    not taken for one this test left behind."""
    world = MPI.COMM_WORLD if comm is None else comm
    pc = private_comms(comm)
    world.Barrier()
    header = pc.header.Iprobe(MPI.ANY_SOURCE, MPI.ANY_TAG)
    payload = pc.payload.Iprobe(MPI.ANY_SOURCE, MPI.ANY_TAG)
    world.Barrier()
    assert not header, "a header message was left unreceived"
    assert not payload, "a payload message was left unreceived"


def write_after(sent: threading.Event, target: np.ndarray[Any, Any], value: float) -> None:
    """A slow "kernel" for a simulated stream: fills ``target`` with ``value`` once ``sent`` is set (30 s at most).

    A test that expects the stale data (``sync=False``) sets ``sent`` after its send completed, so what was sent
    is the old data however late the receiver is; one that expects the written data sets it at once."""
    sent.wait(30.0)
    target.fill(value)
