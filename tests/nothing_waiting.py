"""One rule for the MPI tests that check a test left no message behind on cai_mpi's private communicators."""

from __future__ import annotations

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
