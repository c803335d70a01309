"""A host message over 2 GiB: split into MPI messages under 2**31 bytes and reassembled exactly."""

from __future__ import annotations

import numpy as np
import pytest
from mpi4py import MPI

import cai_mpi

pytestmark = [pytest.mark.mpi(min_size=2), pytest.mark.slow, pytest.mark.timeout(120)]  # (beyond the 50 s hang limit)

comm = MPI.COMM_WORLD
NWORDS = (2**31 + 4096) // 8  # over the int32 count limit of MPI libraries without large-count calls


def test_over_2gib_round_trip() -> None:
    # Every 8-byte word holds its own index, so a lost, duplicated or reordered chunk shows.
    rank = comm.Get_rank()
    if rank == 0:
        x = np.arange(NWORDS, dtype=np.uint64)
        assert x.nbytes > 2**31
        cai_mpi.send_array(x, 1, tag=77, meta={"n": NWORDS})
    elif rank == 1:
        got = np.asarray(cai_mpi.recv_array(0, 77))
        assert got.shape == (NWORDS,) and got.dtype == np.uint64
        assert np.array_equal(got, np.arange(NWORDS, dtype=np.uint64))
    comm.Barrier()
