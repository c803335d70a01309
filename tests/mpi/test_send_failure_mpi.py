"""A send that fails either posts nothing or tells the receiver: an out-of-memory in the pack or the staging, a
sticky CUDA error while a staged send is under way, a host pack that raises MemoryError. The receiver never
waits for a payload that will not come, and the next message on the same communicator arrives intact.

Each rank runs cai_mpi's real CUDA runtime on its own CUDA driver double (finite memory, sticky errors). Every
receive has a timeout, so a regression fails instead of hanging the run."""

from __future__ import annotations

import time
from collections.abc import Iterator
from typing import Any

import numpy as np
import pytest
from mpi4py import MPI

import cai_mpi
from cai_mpi._src.config import reload_config
from cai_mpi._src.runtime.base import Runtime
from cai_mpi._src.transport import send as send_module
from cai_mpi.testing import DoubleDeviceArray

pytestmark = [pytest.mark.mpi(min_size=2), pytest.mark.timeout(120)]

world = MPI.COMM_WORLD
rank, size = world.Get_rank(), world.Get_size()
nxt, prv = (rank + 1) % size, (rank - 1) % size
NOTHING_COMES = 1.0  # seconds a receive waits for a message that must not come
ARRIVES = 60.0  # seconds at most for one that must
N = 50_000  # float64: several staging chunks of 64 KiB


@pytest.fixture(params=["direct", "staged"])
def gpu(request: pytest.FixtureRequest, on_double: Any) -> Iterator[tuple[Runtime, MPI.Comm]]:
    with on_double(request.param == "direct", settings={"CAI_MPI_CHUNK_BYTES": "65536"}) as both:
        yield both


@pytest.fixture
def staged(on_double: Any) -> Iterator[tuple[Runtime, MPI.Comm]]:
    with on_double(False, settings={"CAI_MPI_CHUNK_BYTES": "65536"}) as both:
        yield both


def payload(r: int, n: int = N) -> np.ndarray[Any, Any]:
    return (np.arange(n) * (r + 1) + r).astype("<f8")


def strided(rt: Runtime, r: int) -> tuple[DoubleDeviceArray, np.ndarray[Any, Any]]:
    """Every other element of a device array: sending it packs it on the device first."""
    data = payload(r, 2 * N)
    return DoubleDeviceArray(rt, data, view=((N,), (16,))), data[::2]


def host_of(a: cai_mpi.Array) -> np.ndarray[Any, Any]:
    return np.asarray(a) if a.device == "host" else a.numpy()


def nothing_arrives(comm: MPI.Comm, tag: int) -> None:
    """The failed send posted nothing: the receive matches nothing and is withdrawn."""
    with pytest.raises(cai_mpi.TimeoutError) as caught:
        cai_mpi.recv_array(prv, tag, comm, timeout=NOTHING_COMES)
    assert caught.value.cancelled, f"rank {rank}: a header came from rank {prv} without its payload"
    world.Barrier()  # no rank sends the next message before every rank has given up on this one


def the_next_message_arrives(rt: Runtime, comm: MPI.Comm, tag: int) -> None:
    x, _ = strided(rt, rank + 10)
    req = cai_mpi.isend_array(x, nxt, tag, comm)
    got = cai_mpi.recv_array(prv, tag, comm, timeout=ARRIVES)
    req.wait()
    assert np.array_equal(host_of(got), payload(prv + 10, 2 * N)[::2]), "the message after the failure changed"


@pytest.mark.parametrize("blocking", [False, True], ids=["isend", "send"])
def test_an_out_of_memory_in_the_pack_posts_nothing(gpu: tuple[Runtime, MPI.Comm], blocking: bool) -> None:
    rt, comm = gpu
    double = rt.driver_double  # type: ignore[attr-defined]
    x, _ = strided(rt, rank)
    capacity = double.device_memory_bytes
    double.device_memory_bytes = double.device_memory_in_use(0) + 4096  # the pack's buffer does not fit
    try:
        with pytest.raises(cai_mpi.CudaError, match="OUT_OF_MEMORY"):
            if blocking:
                cai_mpi.send_array(x, nxt, 7, comm)
            else:
                cai_mpi.isend_array(x, nxt, 7, comm).wait()
    finally:
        double.device_memory_bytes = capacity
    world.Barrier()  # every failed send has done whatever it does before anyone receives
    nothing_arrives(comm, 7)
    the_next_message_arrives(rt, comm, 7)


def test_an_out_of_pinned_memory_for_staging_posts_nothing(gpu: tuple[Runtime, MPI.Comm]) -> None:
    rt, comm = gpu
    if cai_mpi.cuda_aware(comm).aware:
        # Nothing is staged through a CUDA-aware MPI; assert that the same send goes through instead.
        x = DoubleDeviceArray(rt, payload(rank))
        rt.driver_double.pinned_memory_bytes = 0  # type: ignore[attr-defined]
        req = cai_mpi.isend_array(x, nxt, 8, comm)
        assert np.array_equal(host_of(cai_mpi.recv_array(prv, 8, comm, timeout=ARRIVES)), payload(prv))
        req.wait()
        return
    double = rt.driver_double  # type: ignore[attr-defined]
    x = DoubleDeviceArray(rt, payload(rank))
    double.pinned_memory_bytes = double.pinned_bytes_outstanding + 4096  # one staging block does not fit
    try:
        with pytest.raises(cai_mpi.CudaError, match="OUT_OF_MEMORY"):
            cai_mpi.isend_array(x, nxt, 8, comm).wait()
    finally:
        double.pinned_memory_bytes = None
    world.Barrier()
    # Received into host memory (a staged receive into the device would need pinned memory too).
    with pytest.raises(cai_mpi.TimeoutError) as caught:
        cai_mpi.recv_array(prv, 8, comm, device="host", timeout=NOTHING_COMES)
    assert caught.value.cancelled, f"rank {rank}: a header came from rank {prv} without its payload"
    world.Barrier()
    the_next_message_arrives(rt, comm, 8)


def _fault_at_the_first_wait(rt: Runtime) -> None:
    """A kernel on the legacy default stream that makes an illegal access once the sender first waits for device
    work (after its header went out): cai_mpi's blocking stream runs its copies after it."""
    double = rt.driver_double  # type: ignore[attr-defined]
    start = len(double.calls)

    def kernel() -> None:
        until = time.monotonic() + 30
        while time.monotonic() < until and not any(
            name in ("cuEventQuery", "cuEventSynchronize", "cuStreamSynchronize") for name, _ctx in double.calls[start:]
        ):
            time.sleep(0.001)

    with rt.driver.on(0):  # type: ignore[attr-defined]
        double.launch(1, kernel, fault=True)


@pytest.mark.parametrize("device", [None, "host"])
@pytest.mark.parametrize("blocking", [False, True], ids=["isend", "send"])
def test_a_sticky_error_during_a_send_is_reported_to_the_receiver(
    gpu: tuple[Runtime, MPI.Comm], device: str | None, blocking: bool
) -> None:
    """Rank 0 sends to every other rank and its context dies under way. A staged send has posted its header when
    that shows: each receiver raises an error naming rank 0's failure. For a CUDA-aware MPI the strided array is
    packed (without CuPy: through pinned memory, waited for) before anything is posted: nothing reaches the
    receivers, which take the next message intact."""
    rt, comm = gpu
    aware = cai_mpi.cuda_aware(comm).aware
    if rank == 0:
        sources = {dest: strided(rt, 0)[0] if aware else DoubleDeviceArray(rt, payload(0)) for dest in range(1, size)}
        _fault_at_the_first_wait(rt)
        if aware:  # the pack is waited for before anything is posted: each send fails at once, posting nothing
            for dest in range(1, size):
                with pytest.raises(cai_mpi.CudaError, match="ILLEGAL_ADDRESS"):
                    if blocking:
                        cai_mpi.send_array(sources[dest], dest, 9, comm, sync=False)
                    else:
                        cai_mpi.isend_array(sources[dest], dest, 9, comm, sync=False).wait(timeout=ARRIVES)
        else:
            # Every send is posted before the context dies (a send started after it fails at once, posting nothing).
            others = [cai_mpi.isend_array(sources[dest], dest, 9, comm, sync=False) for dest in range(2, size)]
            with pytest.raises(cai_mpi.CudaError, match="ILLEGAL_ADDRESS"):
                if blocking:
                    cai_mpi.send_array(sources[1], 1, 9, comm, sync=False)
                else:
                    cai_mpi.isend_array(sources[1], 1, 9, comm, sync=False).wait(timeout=ARRIVES)
            for req in others:
                with pytest.raises(cai_mpi.CudaError, match="ILLEGAL_ADDRESS"):
                    req.wait(timeout=ARRIVES)
        rt.driver_double.clear_fault(0)  # type: ignore[attr-defined]
    elif not aware:
        with pytest.raises(cai_mpi.SenderFailedError, match=r"rank 0 .*ILLEGAL_ADDRESS") as caught:
            cai_mpi.recv_array(0, 9, comm, device=device, timeout=ARRIVES)
        assert caught.value.source == 0 and caught.value.tag == 9
    # The communicator is in step: the next message from rank 0 arrives intact.
    if rank == 0:
        reqs = [cai_mpi.isend_array(DoubleDeviceArray(rt, payload(dest)), dest, 9, comm) for dest in range(1, size)]
        for req in reqs:
            req.wait(timeout=ARRIVES)
    else:
        got = cai_mpi.recv_array(0, 9, comm, device=device, timeout=ARRIVES)
        assert np.array_equal(host_of(got), payload(rank))


def _fault_after_copies(rt: Runtime, copies: int) -> None:
    """The context dies right after the ``copies``-th staging copy is enqueued: the copies before it have been sent."""
    double = rt.driver_double  # type: ignore[attr-defined]
    enqueue = rt.copy_async
    count = 0

    def copy_async(*args: Any) -> None:
        nonlocal count
        enqueue(*args)
        count += 1
        if count == copies:
            double.fault(0)

    rt.copy_async = copy_async  # type: ignore[method-assign]


@pytest.mark.parametrize("landing", ["device", "host", "out", "out-mismatch", "irecv"])
def test_a_staged_send_that_fails_half_way_is_received_and_reported(
    staged: tuple[Runtime, MPI.Comm], landing: str
) -> None:
    """Rank 0's context dies after the first chunk went out: each receiver takes the first chunk, the failure
    markers for the rest and rank 0's error, and raises; the next message arrives intact."""
    rt, comm = staged
    if rank == 0:
        for dest in range(1, size):
            x = DoubleDeviceArray(rt, payload(dest))
            _fault_after_copies(rt, 3)  # the third copy stages chunk 2: chunk 0 was sent before it
            with pytest.raises(cai_mpi.CudaError, match="ILLEGAL_ADDRESS"):
                cai_mpi.send_array(x, dest, 5, comm)
            del rt.copy_async  # type: ignore[method-assign]
            rt.driver_double.clear_fault(0)  # type: ignore[attr-defined]
        reqs = [cai_mpi.isend_array(DoubleDeviceArray(rt, payload(dest + 1)), dest, 5, comm) for dest in range(1, size)]
        for req in reqs:
            req.wait(timeout=ARRIVES)
        return
    error: type[Exception] = cai_mpi.SenderFailedError
    kwargs: dict[str, Any] = {"device": "host" if landing == "host" else None}
    if landing == "out":
        kwargs = {"out": np.zeros(N)}
    elif landing == "out-mismatch":
        kwargs, error = {"out": np.zeros(N + 1)}, cai_mpi.RecvMismatchError
    with pytest.raises(error, match=r"rank 0 " if error is cai_mpi.SenderFailedError else "does not fit"):
        if landing == "irecv":
            cai_mpi.irecv_array(0, 5, comm).wait(timeout=ARRIVES)
        else:
            cai_mpi.recv_array(0, 5, comm, timeout=ARRIVES, **kwargs)
    got = cai_mpi.recv_array(0, 5, comm, timeout=ARRIVES, **({"out": np.zeros(N)} if "out" in kwargs else kwargs))
    assert np.array_equal(host_of(got), payload(rank + 1)), "the message after the failed one arrived changed"


def test_a_host_pack_that_raises_memory_error_posts_nothing(monkeypatch: pytest.MonkeyPatch) -> None:
    comm = world.Dup()
    reload_config({"CAI_MPI_INLINE_BYTES": "0"})
    try:
        x = np.arange(5000, dtype=np.int8)[::-1]  # walked backwards byte by byte: copied, not a datatype

        def no_memory(*args: Any, **kwargs: Any) -> Any:
            raise MemoryError("the test's host is out of memory")

        with monkeypatch.context() as patch:
            patch.setattr(send_module.np, "ascontiguousarray", no_memory)
            with pytest.raises(MemoryError):
                cai_mpi.isend_array(x, nxt, 4, comm)
            with pytest.raises(MemoryError):
                cai_mpi.send_array(x, nxt, 4, comm)
        world.Barrier()
        nothing_arrives(comm, 4)
        req = cai_mpi.isend_array(np.arange(5000, dtype=np.int8)[::-1] + rank, nxt, 4, comm)
        got = cai_mpi.recv_array(prv, 4, comm, timeout=ARRIVES)
        req.wait()
        assert np.array_equal(np.asarray(got), np.arange(5000, dtype=np.int8)[::-1] + prv)
    finally:
        reload_config()
        comm.Barrier()
        comm.Free()
