"""Strided host arrays above and below the size where cai_mpi stops handing them to MPI as derived datatypes and
packs them with numpy instead (CAI_MPI_HOST_DATATYPE_BYTES; by default 4 KiB on MPICH, whose derived datatypes are
slow past its eager size). The two sides choose alone, so every mix must carry the same bytes: a packed send into
an in-place strided receive, and the other way round. Any size >= 2 (ring neighbours)."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import numpy as np
import pytest
from mpi4py import MPI

import cai_mpi
from cai_mpi._src.config import reload_config

pytestmark = pytest.mark.mpi(min_size=2)

comm = MPI.COMM_WORLD
rank, size = comm.Get_rank(), comm.Get_size()
nxt, prv = (rank + 1) % size, (rank - 1) % size
IN_PLACE, PACKED = str(1 << 40), "0"


@pytest.fixture
def limit(request: pytest.FixtureRequest) -> Iterator[None]:
    """This rank's CAI_MPI_HOST_DATATYPE_BYTES: ``request.param`` is (even ranks', odd ranks')."""
    reload_config({"CAI_MPI_HOST_DATATYPE_BYTES": request.param[rank % 2]})
    try:
        yield
    finally:
        reload_config()


def rows(ncells: int, seed: int) -> np.ndarray[Any, Any]:
    """A Fortran-ordered (5, ncells) field: its rows are strided (stride 5 elements), as a halo exchange's faces."""
    return np.asfortranarray(np.random.default_rng(seed).standard_normal((5, ncells)))


MIXES = [(IN_PLACE, IN_PLACE), (PACKED, PACKED), (PACKED, IN_PLACE), (IN_PLACE, PACKED)]
CELLS = [2048, 16384, 131072]  # 16 KiB, 128 KiB and 1 MiB rows of float64


@pytest.mark.parametrize("limit", MIXES, indirect=True, ids=["in-place", "packed", "packed-even", "packed-odd"])
@pytest.mark.parametrize("ncells", CELLS)
@pytest.mark.parametrize("form", ["blocking", "nonblocking"])
@pytest.mark.usefixtures("limit")
def test_a_strided_row_lands_exactly_in_a_strided_out_whichever_side_packs(ncells: int, form: str) -> None:
    mine, theirs = rows(ncells, rank), rows(ncells, prv)
    field = np.full((5, ncells), -1.0, order="F")
    if form == "blocking":
        sent = cai_mpi.isend_array(mine[2], nxt, 7)
        got = cai_mpi.recv_array(prv, 7, out=field[3])
        sent.wait()
    else:
        got, _ = cai_mpi.waitall([cai_mpi.irecv_array(prv, 7, out=field[3]), cai_mpi.isend_array(mine[2], nxt, 7)])
    assert np.array_equal(field[3], theirs[2])
    assert np.array_equal(np.asarray(got), theirs[2])
    untouched = np.delete(field, 3, axis=0)
    assert (untouched == -1.0).all()  # nothing written around the row


@pytest.mark.parametrize("limit", MIXES[2:], indirect=True, ids=["packed-even", "packed-odd"])
@pytest.mark.usefixtures("limit")
def test_a_strided_row_without_out_arrives_whole(limit: None) -> None:
    mine, theirs = rows(131072, rank), rows(131072, prv)
    sent = cai_mpi.isend_array(mine[1], nxt, 8)
    got = cai_mpi.recv_array(prv, 8, device="host")
    sent.wait()
    assert np.array_equal(np.asarray(got), theirs[1])
