"""bcast_array from every root, for every length of the header the root broadcasts first.

The root broadcasts one fixed slot (``slots.BROADCAST``: a prefix, the header's start, and a small payload
when the whole fits); a header longer than the slot's room sends its rest in a second broadcast, which must come
from the root too. A bug there passed the whole suite once, because only root 0 had a long header. Here every
rank is the root in turn, with headers of each class: small payloads (inside the slot when they fit), one slot
(exactly full included), and spilled (one byte over, a 3 KB meta, a structured dtype, a root's long error).
scatter_array and gather_array from every root with headers longer than an agreement slot close the file.
Passes at any size >= 2.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np
import pytest
from mpi4py import MPI

import cai_mpi
from cai_mpi._src.core.header import encode_meta
from cai_mpi._src.transport.agreement import describe_source
from cai_mpi._src.transport.slots import BROADCAST

pytestmark = pytest.mark.mpi(min_size=2)

comm = MPI.COMM_WORLD
rank, size = comm.Get_rank(), comm.Get_size()
ROOM = BROADCAST.room  # header bytes the first broadcast carries
SMALL = (5,)  # 40 bytes: travels in the slot
LARGE = (100, 7)  # 5600 bytes: over the inline limit of a broadcast, a payload of its own
FIELDS = np.dtype([(f"field{i}", "<f4") for i in range(80)])  # a structured dtype: a header of ~1.7 KiB
# s: where one rank errs, the calls bound their wait, so that an agreement mistake fails the test by TimeoutError
# naming the call, well before the 50 s hang watchdog
LIMIT = 20.0


def make(dtype: Any, shape: tuple[int, ...], seed: int) -> np.ndarray[Any, Any]:
    """Contents every rank can rebuild from the seed."""
    dt = np.dtype(dtype)
    raw = np.random.default_rng(seed).integers(0, 256, size=int(np.prod(shape)) * dt.itemsize, dtype=np.uint8)
    return raw.view(dt).reshape(shape)


def header_length(arr: np.ndarray[Any, Any], meta: dict[str, Any] | None) -> int:
    """How long the header the root broadcasts for ``arr`` and ``meta`` is (as bcast_array makes it)."""
    return len(describe_source(arr, encode_meta(meta)))


def padded(arr: np.ndarray[Any, Any], length: int) -> dict[str, Any]:
    """A meta that makes the root's header exactly ``length`` bytes long."""
    pad = length - header_length(arr, {"pad": ""})
    assert pad >= 0
    meta = {"pad": "m" * pad}
    assert header_length(arr, meta) == length
    return meta


# name -> (dtype, shape, meta for the data seeded by the root's rank, how long the header is: "fits" or "spills")
CASES: dict[str, tuple[Any, tuple[int, ...], Callable[[np.ndarray[Any, Any]], dict[str, Any] | None], str]] = {
    "inline": ("<f8", SMALL, lambda a: None, "fits"),
    "inline-meta": ("<f8", SMALL, lambda a: {"step": 3, "name": "small"}, "fits"),
    "inline-block-full": ("<f8", SMALL, lambda a: padded(a, ROOM), "fits"),
    "inline-spilled-by-one": ("<f8", SMALL, lambda a: padded(a, ROOM + 1), "spills"),
    "inline-3KB-meta": ("<i4", SMALL, lambda a: {"text": "i" * 3000}, "spills"),
    "block": ("<f8", LARGE, lambda a: None, "fits"),
    "block-full": ("<f8", LARGE, lambda a: padded(a, ROOM), "fits"),
    "spilled-by-one": ("<f8", LARGE, lambda a: padded(a, ROOM + 1), "spills"),
    "spilled-3KB-meta": (">i4", LARGE, lambda a: {"text": "s" * 3000, "nested": {"list": list(range(50))}}, "spills"),
    "spilled-structured": (FIELDS, (3,), lambda a: None, "spills"),
    "spilled-structured-and-meta": (FIELDS, (40,), lambda a: {"text": "f" * 3000}, "spills"),
}


@pytest.mark.parametrize("case", CASES)
def test_bcast_from_every_root_with_every_header_length(case: str) -> None:
    dtype, shape, meta_of, length = CASES[case]
    for root in range(size):
        sent = make(dtype, shape, 100 * root + len(case))
        meta = meta_of(sent)
        assert (header_length(sent, meta) > ROOM) == (length == "spills")  # the case is the class it names
        got = cai_mpi.bcast_array(sent if rank == root else None, root=root, meta=meta if rank == root else None)
        assert isinstance(got, cai_mpi.Array) and got.source == root
        assert got.meta == meta
        data = np.asarray(got)
        assert data.dtype == sent.dtype and data.shape == sent.shape
        assert data.tobytes() == sent.tobytes()
        # And into out= on the non-roots, the same broadcast again.
        out = None if rank == root else np.full(shape, 0, dtype)
        got = cai_mpi.bcast_array(sent if rank == root else None, root=root, out=out,
                                  meta=meta if rank == root else None)
        assert got.meta == meta and np.asarray(got).tobytes() == sent.tobytes()
        if out is not None:
            assert out.tobytes() == sent.tobytes() and np.shares_memory(np.asarray(got), out)


class Unsendable:
    """An object whose type name makes the root's error longer than the first broadcast block."""


Unsendable.__name__ = "Unsendable" + "X" * (2 * BROADCAST.size)


def test_a_root_error_longer_than_the_block_reaches_every_rank() -> None:
    for root in range(size):
        if rank == root:
            with pytest.raises(TypeError, match="cannot send or receive an object of type 'UnsendableXXX"):
                cai_mpi.bcast_array(Unsendable(), root=root, timeout=LIMIT)
        else:
            with pytest.raises(cai_mpi.CollectiveMismatchError,
                               match=f"root, rank {root}, could not send: TypeError: .*UnsendableX{{1000}}") as info:
                cai_mpi.bcast_array(None, root=root, timeout=LIMIT)
            assert str(info.value).endswith("or a host array (numpy array or buffer-protocol object)")  # all of it
        sent = np.arange(6.0) + root
        got = cai_mpi.bcast_array(sent if rank == root else None, root=root, timeout=LIMIT)
        assert np.asarray(got).tobytes() == sent.tobytes()


def test_scatter_and_gather_from_every_root_with_headers_longer_than_a_slot() -> None:
    """The other rooted collectives, with structured dtypes whose headers (~1 KiB) need a second step."""

    def piece(src: int, dst: int) -> np.ndarray[Any, Any]:
        dtype = FIELDS if (src + dst) % 2 else np.dtype("<i8")
        return make(dtype, (dst + 2,), 1000 * src + dst)

    for root in range(size):
        got = cai_mpi.scatter_array([piece(root, r) for r in range(size)] if rank == root else None, root=root)
        expected = piece(root, rank)
        assert got.source == root and np.asarray(got).dtype == expected.dtype
        assert np.asarray(got).tobytes() == expected.tobytes()
        gathered = cai_mpi.gather_array(piece(rank, root), root=root)
        if rank != root:
            assert gathered is None
            continue
        assert gathered is not None and [a.source for a in gathered] == list(range(size))
        for r, a in enumerate(gathered):
            assert np.asarray(a).dtype == piece(r, root).dtype and np.asarray(a).tobytes() == piece(r, root).tobytes()
