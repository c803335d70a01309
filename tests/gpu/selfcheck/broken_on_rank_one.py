"""Deliberately broken (run only by tests/gpu/test_gpu_harness.py, under tests/gpu/conftest.py's rules): rank 1
fails while rank 0 waits for a message from it that never comes."""

from mpi4py import MPI


def test_every_rank_passes_first() -> None:
    assert MPI.COMM_WORLD.Get_size() == 2


def test_rank_one_fails_while_rank_zero_waits() -> None:
    MPI.COMM_WORLD.Barrier()  # every rank has finished (and reported) the first test
    if MPI.COMM_WORLD.Get_rank() == 1:
        assert 6 * 7 == 43, "deliberate failure on rank 1"
    MPI.COMM_WORLD.recv(source=1, tag=5)  # never sent: without the abort, rank 0 would wait here forever
