"""A communicator the user passes (not COMM_WORLD): its private duplicates are found call after call, and once the
user frees it, or frees another, every call refuses it and none reaches the freed duplicates."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np
from mpi4py import MPI

import cai_mpi
from cai_mpi._src.transport.privcomm import private_comms


def refusal(call: Callable[[], Any]) -> BaseException | None:
    try:
        call()
    except Exception as exc:  # (whatever it is: the assertion says what it should have been)
        return exc
    return None


def test_the_same_communicator_finds_the_same_duplicates_each_call() -> None:
    comm = MPI.COMM_SELF.Dup()
    try:
        first = private_comms(comm)
        assert private_comms(comm) is first
        got = cai_mpi.allgather_array(np.arange(3.0), comm)
        assert [np.asarray(a).tolist() for a in got] == [[0.0, 1.0, 2.0]]
        assert private_comms(comm) is first
    finally:
        comm.Free()


def test_a_freed_communicator_is_refused_after_being_used() -> None:
    comm = MPI.COMM_SELF.Dup()
    cai_mpi.allgather_array(np.arange(3.0), comm)
    pc = private_comms(comm)
    comm.Free()
    assert pc.header == MPI.COMM_NULL  # (its duplicates went with it)
    for call in (lambda: cai_mpi.allgather_array(np.arange(3.0), comm), lambda: private_comms(comm)):
        exc = refusal(call)
        assert isinstance(exc, ValueError) and "COMM_NULL" in str(exc), exc


def test_freeing_another_communicator_leaves_this_ones_duplicates() -> None:
    mine, other = MPI.COMM_SELF.Dup(), MPI.COMM_SELF.Dup()
    try:
        pc = private_comms(mine)
        private_comms(other)
        private_comms(mine)
        other.Free()
        assert private_comms(mine) is pc and pc.header != MPI.COMM_NULL
        got = cai_mpi.allgather_array(np.arange(2, dtype=np.int16), mine)
        assert np.asarray(got[0]).tolist() == [0, 1]
    finally:
        mine.Free()
