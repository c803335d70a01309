"""What each rank asks MPI to move per one-shot collective call does not grow with the number of ranks (issue 38):
a PMPI counter loaded under mpiexec (``scripts/bench/collective_traffic.py``) counts, at 2, 4 and 8 ranks, the
bytes each rank receives and the MPI calls each call makes in the steady state. The reductions, bcast, scatter and
allreduce_arrays stay within 256 B of their 2-rank traffic; gather grows by the payload only, allgather by the
payload and the agreement's words it carries (24 B per rank), alltoall by one description slot per rank; a repeated
call makes its MPI calls concurrently (nonblocking, completed together: one round), or one MPI call (allgather: one
Allgather; alltoall: one Alltoall; a small bcast: one Allreduce whose slot carries the root's bytes), and scatter and
alltoall add a payload collective only for pieces over a slot."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import pytest

from cai_mpi._src.transport.slots import PIECE

PAYLOAD = 8  # bytes per rank in every call the program makes


@pytest.fixture(scope="module")
def counted(mpicount: tuple[Any, Path]) -> dict[int, dict[str, dict[str, Any]]]:
    traffic, library = mpicount
    return {p: traffic.measure(p, library, Path(sys.prefix)) for p in (2, 4, 8)}


@pytest.mark.parametrize("name", ["allreduce_array", "reduce_array", "bcast_array", "scatter_array",
                                  "allreduce_arrays", "scatter_array_8KiB"])
def test_traffic_does_not_grow_with_the_world(counted: dict[int, dict[str, dict[str, Any]]], name: str) -> None:
    sizes = {p: counted[p][name]["bytes"] for p in counted}
    assert max(sizes.values()) - sizes[2] <= 256, f"{name}: bytes received per call by world size: {sizes}"


@pytest.mark.parametrize("name, words", [("allgather_array", 24), ("gather_array", 0)])
def test_gathers_grow_by_the_payload_only(counted: dict[int, dict[str, dict[str, Any]]], name: str,
                                          words: int) -> None:
    """(and, for allgather, the agreement's words that every rank's payload carries: at most 24 B per rank)"""
    sizes = {p: counted[p][name]["bytes"] for p in counted}
    for p, received in sizes.items():
        assert received - sizes[2] <= (PAYLOAD + words) * (p - 2) + 64, f"{name}: bytes received per call: {sizes}"


def test_alltoall_grows_by_one_slot_per_rank(counted: dict[int, dict[str, dict[str, Any]]]) -> None:
    """Every rank receives one fixed-size slot from every rank (its description, with its payload when it fits):
    what an all-to-all must grow by, and no more."""
    sizes = {p: counted[p]["alltoall_array"]["bytes"] for p in counted}
    for p, received in sizes.items():
        assert received == PIECE.size * p, f"alltoall_array: bytes received per call: {sizes}"


@pytest.mark.parametrize("name, calls", [
    ("scatter_array", {"Allreduce": 1, "Scatter": 1}),  # (the vote on the root, then one slot per rank)
    ("scatter_array_8KiB", {"Allreduce": 1, "Scatter": 1, "Alltoallw": 1}),  # (and the pieces over their slots)
    ("alltoall_array", {"Alltoall": 1}),  # (no root, nothing to agree on: every rank sees every rank's slot)
    ("alltoall_array_8KiB", {"Alltoall": 1, "Alltoallw": 1}),
    ("scatter_array_timeout", {"Iallreduce": 1, "Iscatter": 1}),  # (timeout=: MPI's nonblocking forms, as many)
    ("alltoall_array_timeout", {"Ialltoall": 1}),

    ("allreduce_array", {"Iallreduce": 2}),
    ("reduce_array", {"Iallreduce": 1, "Ireduce": 1}),
    ("bcast_array", {"Allreduce": 1}),  # (the root's bytes travel in the vote's slot: one collective)
    ("bcast_array_1KiB", {"Allreduce": 1}),  # (the largest payload the vote's slot carries)
    ("bcast_array_8KiB", {"Iallreduce": 1, "Ibcast": 1}),  # (over it: the payload's own collective, with the vote)
    ("allgather_array", {"Allgather": 1}),  # (every rank's words with its payload: every rank checks them all)
    ("gather_array", {"Iallreduce": 1, "Igather": 1}),
    ("allreduce_arrays", {"Iallreduce": 2}),  # (16 float64 arrays: one bucket)
    # (after large calls of two shapes, whose vote goes first: a call unlike them is agreed on and then repeated)
    ("allreduce_array_after_large", {"Iallreduce": 2}),
    ("allgather_array_after_large", {"Allgather": 1}),
    # (past SPECULATE_BYTES the vote goes first; pieces described alike, of any size, travel in MPI's plain gathers)
    ("allgather_array_large", {"Allreduce": 1, "Allgather": 1}),
    ("gather_array_large", {"Allreduce": 1, "Gather": 1}),
])
def test_a_repeated_call_is_one_round(counted: dict[int, dict[str, dict[str, Any]]], name: str,
                                      calls: dict[str, int]) -> None:
    """The vote and the payload collective posted together, nonblocking, and completed together; or one collective
    that carries both."""
    for p in counted:
        assert counted[p][name]["calls"] == calls, (p, counted[p][name])


@pytest.mark.parametrize("name, calls", [
    ("gather_array_mixed", {"Allreduce": 1, "Allgather": 1, "Allgatherv": 1, "Gather": 1}),
    ("allgather_array_mixed", {"Allreduce": 1, "Allgather": 2, "Allgatherv": 1}),
])
def test_pieces_of_one_size_described_differently_travel_in_the_plain_gathers(
        counted: dict[int, dict[str, dict[str, Any]]], name: str, calls: dict[str, int]) -> None:
    """Ranks whose pieces differ in description but not in size (float64 and int64, 64 B each) have no signature to
    keep: every call votes, exchanges the descriptions (an Allgather of their lengths, an Allgatherv of the texts),
    then moves the payload in MPI's Gather or Allgather (as fast as a gather of known shapes), not the v-forms."""
    for p in counted:
        assert counted[p][name]["calls"] == calls, (p, counted[p][name])
