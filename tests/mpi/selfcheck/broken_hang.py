"""Deliberately broken (run only by tests/test_under_mpiexec.py): every rank blocks in MPI for good."""

from mpi4py import MPI


def test_every_rank_blocks_in_a_receive_nobody_sends() -> None:
    MPI.COMM_WORLD.Recv(bytearray(8), source=MPI.ANY_SOURCE, tag=12345)
