"""Edge paths end to end, which one-process tests alone used to reach: chunk boundaries, Fortran-ordered
device data, and a timed-out receive whose message matched while it was being cancelled. Any size >= 2.

Each case here failed on a bug planted in the core that passed every other MPI test: a chunk count rounded
down (``MessageInfo.nchunks``), a descriptor that never reports Fortran order, an ignored cancel result.
"""

from __future__ import annotations

import gc
import time
from collections.abc import Iterator
from typing import Any

import numpy as np
import pytest
from mpi4py import MPI
from ordering import assert_nothing_waiting

import cai_mpi
from cai_mpi._src.config import reload_config
from cai_mpi._src.core.header import encode_header
from cai_mpi._src.progress import posted, requests
from cai_mpi._src.progress.waits import Waitable
from cai_mpi._src.runtime.base import Runtime
from cai_mpi._src.transport.privcomm import private_comms
from cai_mpi.testing import DoubleDeviceArray, FakeCudaArray, SimulatedRuntime, use_runtime

pytestmark = pytest.mark.mpi(min_size=2)

comm = MPI.COMM_WORLD
rank, size = comm.Get_rank(), comm.Get_size()
nxt, prv = (rank + 1) % size, (rank - 1) % size
CHUNK = 64  # bytes per payload message (CAI_MPI_MAX_MESSAGE_BYTES for host data, CAI_MPI_CHUNK_BYTES staged)
# k chunks exactly, one byte over, one byte short
SIZES = [k * CHUNK + d for k in (1, 2, 3) for d in (-1, 0, 1)]


def payload(nbytes: int, seed: int) -> np.ndarray[Any, Any]:
    return np.random.default_rng(seed).integers(0, 256, nbytes, dtype=np.uint8)


def ring(obj: Any, **recv_kwargs: Any) -> cai_mpi.Array:
    req = cai_mpi.isend_array(obj, nxt, tag=41)
    got = cai_mpi.recv_array(prv, 41, **recv_kwargs)
    req.wait()
    return got


def strided_out(nbytes: int) -> tuple[np.ndarray[Any, Any], np.ndarray[Any, Any]]:
    """A receive buffer every other byte of a larger one (a layout MPI takes as a derived datatype)."""
    base = np.full(2 * nbytes, 0xEE, np.uint8)
    return base, base[::2]


@pytest.fixture
def simulated_gpu() -> Iterator[SimulatedRuntime]:
    with use_runtime(SimulatedRuntime()) as rt:
        assert isinstance(rt, SimulatedRuntime)
        yield rt


# -- chunk boundaries -------------------------------------------------------------------------------------------


@pytest.mark.parametrize("into", ["new", "out", "strided-out"])
@pytest.mark.parametrize("nbytes", SIZES)
def test_host_payloads_at_chunk_boundaries(nbytes: int, into: str) -> None:
    reload_config({"CAI_MPI_MAX_MESSAGE_BYTES": str(CHUNK), "CAI_MPI_INLINE_BYTES": "0"})
    expected = payload(nbytes, prv)
    base, out = strided_out(nbytes) if into == "strided-out" else (None, np.zeros(nbytes, np.uint8))
    got = ring(payload(nbytes, rank), out=None if into == "new" else out)
    assert np.asarray(got).tobytes() == expected.tobytes()
    if into != "new":
        assert out.tobytes() == expected.tobytes()
    if base is not None:
        assert (base[1::2] == 0xEE).all()  # nothing written between the elements


@pytest.mark.usefixtures("simulated_gpu")
@pytest.mark.parametrize("into", ["device", "host", "strided-host-out"])
@pytest.mark.parametrize("nbytes", SIZES)
def test_staged_device_payloads_at_chunk_boundaries(nbytes: int, into: str) -> None:
    reload_config({"CAI_MPI_CHUNK_BYTES": str(CHUNK), "CAI_MPI_INLINE_BYTES": "0"})
    assert not cai_mpi.cuda_aware()  # (the wheels are not: device memory is staged through pinned chunks)
    expected = payload(nbytes, prv)
    sent = FakeCudaArray(payload(nbytes, rank), device=True)
    if into == "device":
        got = ring(sent)
        assert got.device == 0 and got.numpy().tobytes() == expected.tobytes()
    elif into == "host":
        got = ring(sent, device="host")
        assert got.device == "host" and np.asarray(got).tobytes() == expected.tobytes()
    else:
        base, out = strided_out(nbytes)
        ring(sent, out=out)
        assert out.tobytes() == expected.tobytes() and (base[1::2] == 0xEE).all()


def test_host_to_staged_device_at_chunk_boundaries(simulated_gpu: SimulatedRuntime) -> None:
    reload_config({"CAI_MPI_CHUNK_BYTES": str(CHUNK), "CAI_MPI_INLINE_BYTES": "0"})
    for nbytes in SIZES:
        out = FakeCudaArray(np.zeros(nbytes, np.uint8), device=True)
        ring(payload(nbytes, rank + 1000 * nbytes), out=out)
        assert out.host.tobytes() == payload(nbytes, prv + 1000 * nbytes).tobytes()


@pytest.fixture
def staged_double(on_double: Any) -> Iterator[tuple[Runtime, MPI.Comm]]:
    """The real CUDA runtime on the driver double, staged (not CUDA-aware: device memory faults on host access)."""
    with on_double(False) as made:
        yield made


def test_staged_payloads_at_chunk_boundaries_on_the_driver_double(staged_double: tuple[Runtime, MPI.Comm]) -> None:
    rt, comm_ = staged_double
    reload_config({"CAI_MPI_CHUNK_BYTES": str(CHUNK), "CAI_MPI_INLINE_BYTES": "0"})
    for nbytes in SIZES:
        for device in (None, "host"):
            req = cai_mpi.isend_array(DoubleDeviceArray(rt, payload(nbytes, rank)), nxt, 45, comm_)
            got = cai_mpi.recv_array(prv, 45, comm_, device=device)
            req.wait()
            data = got.numpy() if device is None else np.asarray(got)
            assert got.device == (0 if device is None else "host")
            assert data.tobytes() == payload(nbytes, prv).tobytes(), (nbytes, device)


def test_fortran_ordered_device_data_arrives_fortran_ordered_on_the_driver_double(
    staged_double: tuple[Runtime, MPI.Comm]
) -> None:
    rt, comm_ = staged_double
    reload_config({"CAI_MPI_CHUNK_BYTES": "1000"})

    def data(r: int) -> np.ndarray[Any, Any]:
        return np.random.default_rng(r).standard_normal((30, 40))

    x = DoubleDeviceArray(rt, data(rank).T.copy().reshape(-1), view=((30, 40), (8, 240)))
    got = cai_mpi.sendrecv_array(x, nxt, 46, prv, 46, comm_)
    assert got.device == 0 and got.__cuda_array_interface__["strides"] == (8, 240)
    assert np.array_equal(got.numpy(), data(prv))


# -- Fortran order on the device ----------------------------------------------------------------------------------


def fortran_device(seed: int) -> tuple[FakeCudaArray, np.ndarray[Any, Any]]:
    data = np.random.default_rng(seed).standard_normal((70, 90))
    return FakeCudaArray(data.T.copy(), device=True, shape=(70, 90), strides=(8, 560)), data


@pytest.mark.usefixtures("simulated_gpu")
@pytest.mark.parametrize("chunk", ["1000", "4194304"])
def test_fortran_ordered_device_data_arrives_fortran_ordered(chunk: str) -> None:
    """A contiguous F-ordered array travels as it lies and lands in F order (no repacking), on the device."""
    reload_config({"CAI_MPI_CHUNK_BYTES": chunk})
    sent, _ = fortran_device(rank)
    expected = fortran_device(prv)[1]
    got = ring(sent)
    cai = got.__cuda_array_interface__
    assert got.device == 0 and cai["shape"] == (70, 90) and cai["strides"] == (8, 560)
    assert np.array_equal(got.numpy(), expected)
    host = ring(sent, device="host")
    assert np.asarray(host).flags.f_contiguous and not np.asarray(host).flags.c_contiguous
    assert np.array_equal(np.asarray(host), expected)
    gathered = cai_mpi.allgather_array(sent)
    for r, a in enumerate(gathered):
        assert a.__cuda_array_interface__["strides"] == (8, 560)
        assert np.array_equal(a.numpy(), fortran_device(r)[1])


# -- a receive that times out just as its message matches --------------------------------------------------------


class Race:
    """How a test sees that a receive's message has arrived, and how often a wait lost the race."""

    def __init__(self) -> None:
        self.lost = 0
        # A one-shot receive's request: tested without being freed (MPI_Request_get_status). A persistent one
        # is given its own test (MPICH deactivates a persistent request whose status was read that way).
        self.persistent_arrived: Any = None


@pytest.fixture
def late_header(monkeypatch: pytest.MonkeyPatch) -> Iterator[Race]:
    """Every wait for a receive that a timeout may withdraw gives up (reports the deadline passed) just after its
    message matched, without completing the request: the race a timeout loses when the message comes at the
    last moment. The receive must then find its cancel refused and receive the message."""
    real = requests.complete_by
    race = Race()

    def too_late(waitable: Waitable, due: Any, me: object = None) -> bool:
        if waitable.cancellable:  # a one-shot receive of a header
            req = waitable.reqs[0]  # type: ignore[attr-defined]
            while not req.Get_status():
                time.sleep(1e-3)
        elif getattr(me, "_cancellable", False):  # a channel's next message: one persistent receive
            while not race.persistent_arrived():
                comm.Iprobe(MPI.ANY_SOURCE, 9999)  # (MPI progresses inside MPI calls only)
                time.sleep(1e-3)
        else:
            return real(waitable, due, me)
        race.lost += 1
        return False

    monkeypatch.setattr(requests, "complete_by", too_late)
    monkeypatch.setattr(posted, "complete_by", too_late)  # (a channel's next message: a PostedRequest)
    yield race


@pytest.mark.parametrize("nbytes", [24, 256 << 10], ids=["inline", "with-payload"])
@pytest.mark.parametrize("how", ["recv_array", "irecv_array"])
def test_a_message_that_matches_while_its_receive_times_out_is_received(
    late_header: Race, nbytes: int, how: str
) -> None:
    sent = payload(nbytes, rank)
    req = cai_mpi.isend_array(sent, nxt, tag=43, meta={"from": rank})
    if how == "recv_array":
        got = cai_mpi.recv_array(prv, 43, timeout=30.0)
    else:
        got = cai_mpi.irecv_array(prv, 43).wait(timeout=30.0)
    req.wait()
    assert late_header.lost == 1  # the receive did lose the race
    assert got.source == prv and got.meta == {"from": prv}
    assert np.asarray(got).tobytes() == payload(nbytes, prv).tobytes()
    # Nothing of it is left behind: the next message is the next one.
    follow = cai_mpi.isend_array(np.arange(3), nxt, tag=43)
    assert np.asarray(cai_mpi.recv_array(prv, 43, timeout=30.0)).tolist() == [0, 1, 2]
    follow.wait()


def test_a_channel_message_that_matches_while_its_receive_times_out_is_received(late_header: Race) -> None:
    buf = np.zeros(100, np.int64)
    out = np.zeros(100, np.int64)
    with cai_mpi.send_channel(buf, nxt, 44) as tx, cai_mpi.recv_channel(prv, 44, out=out) as rx:
        for step in range(3):  # the first message opens the channel; the others are its persistent receive
            expected = np.arange(100) * (prv + 1) + step
            late_header.persistent_arrived = lambda: out.tobytes() == expected.tobytes()  # noqa: B023
            buf[:] = np.arange(100) * (rank + 1) + step
            req = tx.isend()
            got = rx.recv(timeout=30.0)
            req.wait()
            assert np.asarray(got).tobytes() == expected.tobytes()
    assert late_header.lost == 3  # every receive lost the race, and still got its message


def test_a_dropped_receive_whose_message_matched_still_takes_its_payload() -> None:
    """A receive dropped after its header matched takes its message whole (docs/reliability.md, lifetime under
    faults): its payload is still received, into memory kept for it, or the sender would wait for ever and the
    payload stay unmatched on the private communicator."""
    big = payload(256 << 10, rank)  # over any eager limit: the send completes only once the payload is received
    sends = [cai_mpi.isend_array(big, nxt, 47), cai_mpi.isend_array(np.arange(4), nxt, 48)]
    dropped = cai_mpi.irecv_array(prv, 47)
    pending = dropped._pending
    assert pending is not None and pending.cancellable
    while not pending.reqs[0].Get_status():  # type: ignore[attr-defined]  # (the header matched; not freed)
        time.sleep(1e-3)
    del dropped, pending
    gc.collect()
    follow = cai_mpi.recv_array(prv, 48, timeout=30.0)  # (any wait drives the dropped receive on)
    assert np.asarray(follow).tolist() == [0, 1, 2, 3]
    for req in sends:
        req.wait(timeout=30.0)
    assert_nothing_waiting()


@pytest.mark.parametrize("into", ["new", "out", "strided-out"])
@pytest.mark.parametrize("how", ["recv_array", "irecv_array"])
def test_an_empty_payload_announced_apart_posts_no_receive(how: str, into: str) -> None:
    """docs/protocol.md: an empty payload has no payload message, inline or not. cai_mpi's own senders always send
    an empty array inline, so this header comes raw, as another sender of the protocol may write it; the receiver
    returns the empty array without waiting for a payload message, and the next message arrives intact."""
    pc = private_comms(None)
    shape = (4, 0, 2)
    follow = np.arange(5.0)
    if rank == 0:
        header = encode_header(np.dtype("<f4"), shape, fortran=False, payload_tag=pc.next_payload_tag())
        pc.header.Send([header, MPI.BYTE], 1, 49)
        cai_mpi.send_array(follow, 1, 49, timeout=30.0)
    elif rank == 1:
        out = {"new": None, "out": np.empty(shape, "<f4"), "strided-out": np.empty((4, 0, 4), "<f4")[..., ::2]}[into]
        try:
            if how == "recv_array":
                got = cai_mpi.recv_array(0, 49, out=out, timeout=30.0)
            else:
                got = cai_mpi.irecv_array(0, 49, out=out).wait(timeout=30.0)
        except cai_mpi.TimeoutError:
            pytest.fail("the receive waited for a payload message an empty payload never has")
        data = np.asarray(got)
        assert (data.shape, data.dtype) == (shape, np.dtype("<f4"))
        assert np.asarray(cai_mpi.recv_array(0, 49, timeout=30.0)).tolist() == follow.tolist()
    assert_nothing_waiting()
