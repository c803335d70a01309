"""Deliberately broken (run only by tests/test_under_mpiexec.py): rank 1 fails while rank 0 waits in Barrier."""

from mpi4py import MPI


def test_rank_one_fails_while_the_others_wait() -> None:
    if MPI.COMM_WORLD.Get_rank() == 1:
        assert 6 * 7 == 43, "deliberate failure on rank 1"
    MPI.COMM_WORLD.Barrier()  # without the abort, the other ranks would wait here forever
