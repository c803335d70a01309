"""A reduction split at the message limit (``transport.bigcount.reduce``): only the root of a ``Reduce``, and every
rank of an ``Allreduce``, reduces in place; every other rank sends its own piece. MPI makes ``MPI_IN_PLACE`` at a
non-root erroneous: Open MPI's wheel refuses it, MPICH's happens to take it, so a slip there passed every MPI test on
MPICH (a survivor of the mutation run, docs/testing.md). The rule is checked on the calls themselves, made through a
stand-in for the collective call's steps; tests/mpi/test_collectives_mpi.py reduces to a root below other ranks."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
from mpi4py import MPI

from cai_mpi._src.transport.bigcount import reduce


class _Comm:
    def __init__(self, rank: int) -> None:
        self.rank = rank

    def Get_rank(self) -> int:
        return self.rank


class _Steps:
    """What ``reduce`` uses of a call's ``Joined``: its communicator's rank, and each collective it is asked for."""

    def __init__(self, rank: int) -> None:
        self.comm = _Comm(rank)
        self.calls: list[tuple[str, tuple[Any, ...]]] = []

    def __call__(self, name: str, *args: Any) -> None:
        self.calls.append((name, args))


@pytest.mark.parametrize(("rank", "root", "in_place"), [
    (0, 0, True), (1, 0, False), (2, 1, False), (0, 1, False), (3, 1, False), (0, None, True), (2, None, True),
], ids=["root-0", "above-root-0", "above-root-1", "below-root-1", "far-above-root", "allreduce-0", "allreduce-2"])
def test_only_the_root_of_a_split_reduce_reduces_in_place(rank: int, root: int | None, in_place: bool) -> None:
    data = np.arange(40.0)
    address = data.ctypes.data
    steps = _Steps(rank)
    reduce(steps, address, address, 40, MPI.DOUBLE, MPI.SUM, root, 64)  # (8 per call)
    assert [name for name, _ in steps.calls] == ["Reduce" if root is not None else "Allreduce"] * 5
    for _name, args in steps.calls:
        assert (args[0] is MPI.IN_PLACE) is in_place, f"rank {rank}, root {root}: send buffer {args[0]!r}"
        if root is not None and rank != root:
            assert args[1] is None  # (a non-root's receive buffer is not significant)
