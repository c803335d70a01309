"""What a device message costs in CUDA driver calls, counted on the driver double (which sees every call): a 4 KiB
device array sent and received by one rank, with the user's context current, on each route. A change that adds
calls fails here; docs/benchmarks-history.md ("Driver calls per device message") has the table. The double and
the user's context come from tests/driver_counting.py (eager: the counts do not depend on timing)."""

from __future__ import annotations

import collections
import contextlib
import gc
from collections.abc import Callable, Iterator
from typing import Any

import numpy as np
import pytest
from driver_counting import user_context_on_double
from mpi4py import MPI

import cai_mpi
from cai_mpi._src.arrays.array import Array
from cai_mpi.testing import CudaDriverDouble, DoubleDeviceArray

me = MPI.COMM_WORLD.Get_rank()
N = 512  # float64: 4 KiB

#: The most driver calls each phase of one message may make: (route, layout) -> {phase: calls}. Lower a number
#: when a change saves calls; raising one needs the reason in the commit and in docs/benchmarks.md.
#: The direct route's landing costs one cuStreamSynchronize: MPI may write a pool block only once the work the pool
#: ordered before it has run (issue 44, ``transport.pieces.device_landing``).
BUDGET: dict[tuple[str, str], dict[str, int]] = {
    ("direct", "contiguous"): {"pair": 6, "release": 4},
    ("staged", "contiguous"): {"pair": 11, "release": 4},
    ("direct", "strided"): {"pair": 15, "release": 4},
    ("staged", "strided"): {"pair": 18, "release": 4},
    ("direct", "collective"): {"call": 9, "release": 4},
    ("staged", "collective"): {"call": 13, "release": 4},
}
#: Issue 33's budget (16), lowered by issue 44: the staged contiguous pair and its release together. The pair
#: between two ranks, as a user writes it, is counted by tests/mpi/test_driver_budget_mpi.py.
STAGED_PAIR_AND_RELEASE = 15
#: ``cuCtxGetCurrent`` per point-to-point pair: one per direction (a call of the API layer is one scope: its
#: producer check, its plan and the steps it runs before returning), one more where a wait runs a later step.
CONTEXT_QUERIES = {("direct", "contiguous"): 2, ("staged", "contiguous"): 2, ("direct", "strided"): 3,
                   ("staged", "strided"): 2}


@contextlib.contextmanager
def counted(direct: bool, monkeypatch: pytest.MonkeyPatch) -> Iterator[tuple[Any, CudaDriverDouble, MPI.Comm]]:
    """The runtime on a counting double, and a communicator routing device data in place (``direct``) or staged."""
    monkeypatch.setenv("CAI_MPI_CUDA_AWARE", "1" if direct else "0")
    comm = MPI.COMM_WORLD.Dup()
    try:
        with user_context_on_double(cuda_aware=direct) as (rt, d):
            yield rt, d, comm
    finally:
        comm.Free()


def source(rt: Any, layout: str) -> DoubleDeviceArray:
    if layout == "strided":  # every other element of 8 KiB
        return DoubleDeviceArray(rt, np.arange(2 * N, dtype=np.float64), stream=1, view=((N,), (16,)))
    return DoubleDeviceArray(rt, np.arange(N, dtype=np.float64), stream=1)


def phases(d: CudaDriverDouble, steps: dict[str, Callable[[], Any]]) -> dict[str, collections.Counter[str]]:
    """The driver calls each step makes, by function name."""
    found = {}
    for name, step in steps.items():
        d.calls.clear()
        step()
        found[name] = collections.Counter(call for call, _ctx in d.calls)
    return found


def message(rt: Any, d: CudaDriverDouble, comm: MPI.Comm, layout: str) -> dict[str, collections.Counter[str]]:
    """One message's calls, after three messages to warm every cache and pool: the send and the receive (one
    rank: its receive drives its send, so the pair is counted together), and the release of the received Array."""
    x = source(rt, layout)
    held: list[Any] = []

    def pair() -> None:
        req = cai_mpi.isend_array(x, me, 5, comm)
        held.append(cai_mpi.recv_array(me, 5, comm, device=0))
        req.wait()

    def release() -> None:
        got = held.pop()
        assert np.array_equal(got.to_host(), np.arange(N, dtype=np.float64) * (2 if layout == "strided" else 1))
        d.calls.clear()  # (to_host is the user's business, not the message's)
        del got
        gc.collect()

    for _ in range(3):
        phases(d, {"pair": pair, "release": release})
    return phases(d, {"pair": pair, "release": release})


def collective(rt: Any, d: CudaDriverDouble, comm: MPI.Comm) -> dict[str, collections.Counter[str]]:
    """One allreduce of a 4 KiB device array, landing on the device, and the release of its result."""
    x = source(rt, "contiguous")
    held: list[Any] = []

    def call() -> None:
        held.append(cai_mpi.allreduce_array(x, comm=comm))

    def release() -> None:
        held.pop()
        gc.collect()

    for _ in range(3):
        phases(d, {"call": call, "release": release})
    return phases(d, {"call": call, "release": release})


@pytest.mark.parametrize("layout", ["contiguous", "strided", "collective"])
@pytest.mark.parametrize("route", ["direct", "staged"])
def test_a_device_message_stays_within_its_driver_call_budget(
    route: str, layout: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    with counted(route == "direct", monkeypatch) as (rt, d, comm):
        if layout == "collective":
            if comm.Get_size() != 1:
                comm = comm.Split(me, 0)  # (one rank: the landing is what is counted)
            found = collective(rt, d, comm)
        else:
            found = message(rt, d, comm, layout)
    budget = BUDGET[(route, layout)]
    spent = {phase: sum(calls.values()) for phase, calls in found.items()}
    assert spent == {phase: min(spent[phase], budget[phase]) for phase in budget}, (spent, found)
    if (route, layout) in CONTEXT_QUERIES:
        assert found["pair"]["cuCtxGetCurrent"] <= CONTEXT_QUERIES[(route, layout)], found
    if (route, layout) == ("staged", "contiguous"):
        assert spent["pair"] + spent["release"] <= STAGED_PAIR_AND_RELEASE, found
    made = sum(found.values(), collections.Counter())
    # Per message: no event or stream created or destroyed (both pooled), no device attribute read (cached).
    assert not {"cuEventCreate", "cuEventDestroy", "cuStreamCreate", "cuStreamDestroy", "cuDeviceGetAttribute",
                "cuCtxPushCurrent", "cuCtxPopCurrent"} & set(made), made


def test_to_host_creates_no_stream_per_call(monkeypatch: pytest.MonkeyPatch) -> None:
    with counted(False, monkeypatch) as (rt, d, _comm):
        got = Array.from_device(rt.alloc_device(N * 8, 0, handed_out=True), (N,), np.dtype(np.float64))
        d.write_device(got.descriptor.ptr, np.arange(N, dtype=np.float64).tobytes())
        assert np.array_equal(got.to_host(), np.arange(N, dtype=np.float64))
        d.calls.clear()
        for _ in range(3):
            assert np.array_equal(got.to_host(), np.arange(N, dtype=np.float64))
        made = collections.Counter(call for call, _ctx in d.calls)
        assert made["cuStreamCreate"] == made["cuStreamDestroy"] == made["cuEventCreate"] == 0, made
        del got  # (retired while the double is open)


@pytest.mark.parametrize("route", ["direct", "staged"])
def test_a_nonblocking_receive_asks_the_driver_no_more_than_a_blocking_one(
    route: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``irecv_array`` + ``isend_array`` + ``waitall`` lands a device message with the calls of ``recv_array``: its
    landing and its device steps run in context scopes too."""
    with counted(route == "direct", monkeypatch) as (rt, d, comm):
        x = source(rt, "contiguous")
        held: list[Any] = []

        def blocking() -> None:
            req = cai_mpi.isend_array(x, me, 5, comm)
            held.append(cai_mpi.recv_array(me, 5, comm, device=0))
            req.wait()

        def nonblocking() -> None:
            got, _ = cai_mpi.waitall([cai_mpi.irecv_array(me, 5, comm, device=0), cai_mpi.isend_array(x, me, 5, comm)])
            held.append(got)

        def release() -> None:
            assert np.array_equal(held.pop().to_host(), np.arange(N, dtype=np.float64))
            gc.collect()

        for _ in range(3):
            phases(d, {"blocking": blocking, "release": release, "nonblocking": nonblocking, "release ": release})
        found = phases(d, {"blocking": blocking, "nonblocking": nonblocking})
        held.clear()
        gc.collect()
    assert found["nonblocking"]["cuCtxGetCurrent"] <= found["blocking"]["cuCtxGetCurrent"], found
    assert sum(found["nonblocking"].values()) <= sum(found["blocking"].values()), found
