"""A repeated small ``bcast_array`` travels in its vote (issue 42): one ``Allreduce(MAX)`` of the ballot's words and
a slot where the root writes its bytes and every other rank the lowest int64. What arrives must be the root's bytes
exactly, whatever they are (negative words, the lowest int64 itself, sizes that are no multiple of 8, F order, the
largest slot and one byte over it), into ``out=`` or not, from any root. Each case failed, by an assertion, on a
planted mistake (the others writing zeros, the root writing C order for an F-ordered array). Passes at any world
size >= 2."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
from mpi4py import MPI

import cai_mpi
from cai_mpi._src.transport.engine import SLOT_PAYLOAD_BYTES

pytestmark = pytest.mark.mpi(min_size=2)

rank, size = MPI.COMM_WORLD.Get_rank(), MPI.COMM_WORLD.Get_size()
WAIT = 30.0  # every call's timeout=: a planted mistake that would hang fails within it
LOWEST = np.iinfo(np.int64).min


def payloads() -> dict[str, np.ndarray[Any, Any]]:
    words = np.array([-5, LOWEST, -1, 7, LOWEST + 1, 0], np.int64)
    return {
        "negative int64 words": words,
        "one byte": np.array([0x80], np.uint8),
        "3 bytes": np.array([-1, -128, 5], np.int8),
        "127 bytes": (np.arange(127) * 37 % 256).astype(np.uint8),
        "one byte under the slot": (np.arange(SLOT_PAYLOAD_BYTES - 1) * 37 % 256).astype(np.uint8),
        "the whole slot": -np.arange(1, SLOT_PAYLOAD_BYTES // 8 + 1, dtype=np.int64),
        "one byte over the slot": (255 - np.arange(SLOT_PAYLOAD_BYTES + 1) % 256).astype(np.uint8),
        "F order": np.asfortranarray(-np.arange(12, dtype=np.float64).reshape(3, 4)),
        "negative floats": np.array([-0.0, -np.inf, -1.5, np.nan], np.float64),
        "empty": np.empty((0, 3), np.int64),
    }


@pytest.mark.parametrize("case", list(payloads()))
@pytest.mark.parametrize("root", [0, -1], ids=["root 0", "last rank root"])
@pytest.mark.parametrize("into", [False, True], ids=["new array", "out="])
def test_a_repeated_small_bcast_delivers_the_roots_bytes_exactly(comm: MPI.Intracomm, case: str, root: int,
                                                                 into: bool) -> None:
    root = root % size
    x = payloads()[case]
    for step in range(4):  # the first call agrees; the later ones are the steady state
        mine = x.copy(order="K") if rank == root else None  # (a new array every call: the same description)
        out = np.full(x.shape, 99, x.dtype) if into and rank != root else None
        got = cai_mpi.bcast_array(mine, root=root, comm=comm, out=out, timeout=WAIT).numpy()
        assert got.dtype == x.dtype and got.shape == x.shape, (step, got.dtype, got.shape)
        assert got.tobytes("C") == x.tobytes("C"), (step, got, x)
        if out is not None:
            assert out.tobytes("C") == x.tobytes("C"), (step, out, x)


def test_a_small_bcast_that_changes_between_calls_delivers_each_one(comm: MPI.Intracomm) -> None:
    """Each call differs from the one agreed before it (its payload in the slot is discarded, the call made again)."""
    for step, x in enumerate([np.arange(3, dtype=np.int64) - 9, np.arange(4, dtype=np.int64) - 9,
                              np.arange(4, dtype=np.int32) - 9, np.arange(4, dtype=np.int64) - 9]):
        got = cai_mpi.bcast_array(x if rank == 0 else None, root=0, comm=comm, timeout=WAIT).numpy()
        assert got.dtype == x.dtype and got.tobytes() == x.tobytes(), (step, got, x)


def test_a_repeated_small_bcast_of_a_strided_array_delivers_its_elements(comm: MPI.Intracomm) -> None:
    big = -np.arange(40, dtype=np.int64).reshape(4, 10)
    x = big[1:, ::3]  # (neither C- nor F-contiguous: travels in C order)
    for step in range(4):
        got = cai_mpi.bcast_array(x if rank == 0 else None, root=0, comm=comm, timeout=WAIT).numpy()
        assert got.shape == x.shape and got.tobytes("C") == x.tobytes("C"), (step, got, x)
