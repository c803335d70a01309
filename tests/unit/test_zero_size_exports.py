"""Zero-size arrays export a NULL pointer (CAI allows it): on a rank without a GPU they are sent and received like
any other, with their shape and dtype (a survivor of the mutation run: where a NULL pointer lives was never
exercised end to end, docs/testing.md)."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
from mpi4py import MPI

import cai_mpi

me = MPI.COMM_WORLD.Get_rank()


class NullExporter:
    """What CuPy, PyTorch and Numba export for an empty array: data (0, False)."""

    def __init__(self, shape: tuple[int, ...], typestr: str, version: int) -> None:
        self.__cuda_array_interface__: dict[str, Any] = {
            "shape": shape, "typestr": typestr, "data": (0, False), "version": version, "strides": None,
        }


@pytest.mark.parametrize("version", [2, 3])
@pytest.mark.parametrize(("shape", "typestr"), [((0,), "<f8"), ((0, 3), "<i4"), ((4, 0, 2), "|u1")])
def test_a_zero_size_export_round_trips_on_a_rank_without_a_gpu(
    shape: tuple[int, ...], typestr: str, version: int
) -> None:
    req = cai_mpi.isend_array(NullExporter(shape, typestr, version), me, tag=5)
    got = cai_mpi.recv_array(me, 5)
    req.wait()
    received = np.asarray(got)
    assert received.shape == shape and received.dtype == np.dtype(typestr) and received.size == 0
