"""Persistent channels (send_channel / recv_channel) between real MPI ranks, at any world size >= 2."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from typing import Any

import numpy as np
import pytest
from mpi4py import MPI
from ordering import write_after

import cai_mpi
from cai_mpi.testing import FakeCudaArray, SimulatedRuntime, SimulatedStream, use_runtime

pytestmark = pytest.mark.mpi(min_size=2)

comm = MPI.COMM_WORLD
rank, size = comm.Get_rank(), comm.Get_size()
nxt, prv = (rank + 1) % size, (rank - 1) % size
STRUCT = np.dtype([("id", "<i4"), ("pos", "<f8", (3,)), ("flag", "?")])


def make(dtype: Any, shape: tuple[int, ...], seed: int) -> np.ndarray[Any, Any]:
    dt = np.dtype(dtype)
    raw = np.random.default_rng(seed).integers(0, 256, size=int(np.prod(shape)) * dt.itemsize, dtype=np.uint8)
    return raw.view(dt).reshape(shape)


def same(got: Any, expected: np.ndarray[Any, Any]) -> bool:
    g = np.asarray(got)
    return bool(g.shape == expected.shape and g.dtype == expected.dtype
                and np.ascontiguousarray(g).tobytes() == np.ascontiguousarray(expected).tobytes())


@pytest.mark.parametrize("dtype", ["u1", "<f8", ">i4", "<c16", STRUCT], ids=str)
@pytest.mark.parametrize("shape", [(), (0,), (1,), (5, 3), (300, 301)], ids=str)
def test_ring_of_channels_many_messages(dtype: Any, shape: tuple[int, ...]) -> None:
    """Every message arrives exactly, in order; the receiver learns shape and dtype from the first."""
    x = make(dtype, shape, rank)
    tx = cai_mpi.send_channel(x, nxt, tag=3)
    rx = cai_mpi.recv_channel(prv, tag=3)
    for step in range(6):
        x[...] = make(dtype, shape, 100 * step + rank)
        req = tx.isend()
        got = rx.recv()
        req.wait()
        assert isinstance(got, cai_mpi.Array) and got.source == prv and got.tag == 3
        assert same(got, make(dtype, shape, 100 * step + prv))
        assert got is rx.array  # one Array over the channel's buffer
    assert rx.shape == shape and rx.dtype == np.dtype(dtype) and rx.source == prv
    tx.close()
    rx.close()
    tx.close()  # idempotent
    with pytest.raises(ValueError, match="closed"):
        tx.send()
    with pytest.raises(ValueError, match="closed"):
        rx.recv()


@pytest.mark.parametrize("layout", ["F", "strided"])
@pytest.mark.parametrize("use_out", [False, True])
def test_layouts_and_out(layout: str, use_out: bool) -> None:
    base = make("<f8", (12, 10), rank)
    x = np.asfortranarray(base) if layout == "F" else base[::2, ::-3]
    expected_of = (lambda s: np.asfortranarray(make("<f8", (12, 10), s))) if layout == "F" else \
        (lambda s: make("<f8", (12, 10), s)[::2, ::-3])
    out = np.empty(x.shape, order="F" if layout == "F" else "C") if use_out else None
    with cai_mpi.send_channel(x, nxt, tag=4) as tx, cai_mpi.recv_channel(prv, 4, out=out) as rx:
        for step in range(3):
            x[...] = expected_of(rank) + step
            req = tx.isend()
            got = rx.recv()
            req.wait()
            assert same(got, expected_of(prv) + step)
            if out is not None:
                assert np.shares_memory(np.asarray(got), out)


def test_blocking_pingpong_and_meta_and_any_source() -> None:
    """Pairs of ranks bounce one array; the channel binds to the sender found by ANY_SOURCE. Each pair has a
    communicator of its own, so no other rank's message can match the wildcards."""
    pair = comm.Split(rank // 2, rank)
    try:
        if pair.Get_size() == 1:
            pytest.skip("the odd rank out of an odd-sized world has no partner for a ping-pong")
        me, peer = pair.Get_rank(), 1 - pair.Get_rank()
        buf = np.zeros(4, np.int64)
        tx = cai_mpi.send_channel(buf, peer, tag=5, comm=pair, meta={"what": "counter"})
        rx = cai_mpi.recv_channel(cai_mpi.ANY_SOURCE, cai_mpi.ANY_TAG, comm=pair, out=buf)
        for _ in range(50):
            if me == 0:
                buf += 1
                tx.send()
                rx.recv()
            else:
                rx.recv()
                buf += 1
                tx.send()
        assert (buf == 100).all()  # each rank received the other's last count
        assert rx.source == peer and rx.tag == 5 and rx.meta == {"what": "counter"}
        assert rx.array.meta == {"what": "counter"}
        tx.close()
        rx.close()
    finally:
        pair.Free()


def test_irecv_posted_before_send() -> None:
    x = np.arange(10.0) + rank
    rx = cai_mpi.recv_channel(prv, 6)
    with cai_mpi.send_channel(x, nxt, 6) as tx:
        for step in range(4):
            r = rx.irecv()
            x += 1
            tx.send()
            got = r.wait()
            assert same(got, np.arange(10.0) + prv + step + 1)
    rx.close()


def test_channel_message_refused_by_recv_array_and_vice_versa() -> None:
    """Mixing the two APIs fails loudly on the receiver, and nothing stays unmatched."""
    x = np.arange(6, dtype="<i4") + rank
    tx = cai_mpi.send_channel(x, nxt, tag=8)
    req = tx.isend()
    with pytest.raises(cai_mpi.ProtocolError, match="recv_channel"):
        cai_mpi.recv_array(prv, 8)
    req.wait()
    tx.close()
    req = cai_mpi.isend_array(x, nxt, tag=8)
    rx = cai_mpi.recv_channel(prv, 8)
    with pytest.raises(cai_mpi.ProtocolError, match="send_array, not through a send_channel"):
        rx.recv()
    req.wait()
    # Still in step: an ordinary message goes through afterwards.
    req = cai_mpi.isend_array(x, nxt, tag=8)
    assert same(cai_mpi.recv_array(prv, 8), np.arange(6, dtype="<i4") + prv)
    req.wait()


def test_out_mismatch_is_refused_and_discarded() -> None:
    x = np.arange(6.0)
    tx = cai_mpi.send_channel(x, nxt, tag=9)
    req = tx.isend()
    rx = cai_mpi.recv_channel(prv, 9, out=np.empty(7))
    with pytest.raises(cai_mpi.RecvMismatchError, match="shapes differ"):
        rx.recv()
    req.wait()
    tx.close()
    comm.Barrier()


def test_bad_arguments() -> None:
    x = np.zeros(3)
    with pytest.raises(ValueError, match="not a rank"):
        cai_mpi.send_channel(x, size)
    with pytest.raises(ValueError, match="tag"):
        cai_mpi.send_channel(x, nxt, tag=-5)
    with pytest.raises(TypeError, match="meta"):
        cai_mpi.send_channel(x, nxt, meta={1: 2})  # type: ignore[dict-item]
    with pytest.raises(TypeError):
        cai_mpi.send_channel(object(), nxt)
    with pytest.raises(ValueError, match="source"):
        cai_mpi.recv_channel(size)


@pytest.fixture
def simulated_gpu() -> Iterator[SimulatedRuntime]:
    with use_runtime(SimulatedRuntime()) as rt:
        assert isinstance(rt, SimulatedRuntime)
        yield rt


def test_device_channel_needs_cuda_aware_mpi(simulated_gpu: SimulatedRuntime) -> None:
    assert not cai_mpi.cuda_aware()
    with pytest.raises(ValueError, match="CUDA-aware"):
        cai_mpi.send_channel(FakeCudaArray(np.zeros(4), device=True), nxt)
    # A host array to a rank whose default receive device is a GPU: device='host' receives it.
    x = np.arange(5.0) + rank
    with cai_mpi.send_channel(x, nxt, 10) as tx, cai_mpi.recv_channel(prv, 10, device="host") as rx:
        req = tx.isend()
        assert same(rx.recv(), np.arange(5.0) + prv)
        req.wait()


@pytest.mark.parametrize("sync", [None, False])
def test_device_channel_on_cuda_aware_mpi_syncs_every_send(simulated_gpu: SimulatedRuntime, sync: bool | None,
                                                           routed_dup: Any) -> None:
    """CUDA-aware: device memory goes to MPI in place, and the producer stream is synced before each send.

    With sync=False the receiver sees the stale data, which proves the test catches the race: the write then waits
    until the send is complete, so the data sent is the old whatever the ranks' timing.
    """
    aware = routed_dup(True)
    try:
        stream = SimulatedStream("channel-producer")
        x = FakeCudaArray.zeros(100_000, "<f8", stream=stream, device=True)
        tx = cai_mpi.send_channel(x, nxt, 11, comm=aware, sync=sync)
        # sync=False: received into host memory, since a receive into device memory waits for the whole
        # device before each message lands (this rank's producer stream included).
        where = 0 if sync is None else "host"
        with tx, cai_mpi.recv_channel(prv, 11, comm=aware, device=where) as rx:
            for step in range(1, 3):
                sent = threading.Event()
                if sync is None:
                    sent.set()  # (the send waits for the write: the write must not wait for the send)
                stream.enqueue(write_after, sent, x.host, float(step), delay=0.2)  # a slow "kernel" writing x
                req = tx.isend()
                got = rx.recv()
                req.wait()
                sent.set()
                stream.synchronize()
                assert got.device == where
                if sync is None:
                    assert (got.numpy() == step).all()
                else:
                    assert (got.numpy() == step - 1).all(), "sync=False should have sent before the write"
                comm.Barrier()
    finally:
        aware.Free()


def test_unclosed_channels_free_their_requests() -> None:
    """Dropping a channel, or leaving it open at exit, frees its MPI request (MPICH warns otherwise)."""
    import gc

    from cai_mpi._src.api import channel_ends

    x = np.arange(3.0)
    gc.collect()  # (earlier tests' unclosed channels, kept by cycles, are not collected during the count)
    before = channel_ends.open_channel_count()
    tx = cai_mpi.send_channel(x, nxt, tag=12)
    rx = cai_mpi.recv_channel(prv, 12)
    req = tx.isend()
    rx.recv()
    req.wait()
    assert channel_ends.open_channel_count() == before + 2
    preq = tx._wire._payload
    del tx, req
    gc.collect()
    assert preq == MPI.REQUEST_NULL  # freed by the garbage-collected channel
    channel_ends.free_open_channels()  # what the exit hook does before MPI finalizes
    assert rx._wire.payload == MPI.REQUEST_NULL
    with pytest.raises(ValueError, match="closed"):
        rx.recv()


def test_windows_of_isend_and_irecv_queue_without_blocking() -> None:
    """Like osu_bibw: both ranks post a window of irecvs and isends on one channel pair, then wait."""
    x = np.zeros(1000)
    with cai_mpi.send_channel(x, nxt, 13) as tx, cai_mpi.recv_channel(prv, 13) as rx:
        for _ in range(3):
            recvs = [rx.irecv() for _ in range(8)]
            sends = [tx.isend() for _ in range(8)]  # each queues behind the previous: none blocks
            for r in recvs:
                assert r.wait() is rx.array
            for s in sends:
                s.wait()
        # The queue keeps message order. All irecvs share the channel's buffer, so when the k-th
        # completes the buffer holds message k or a later one, never an earlier one.
        recvs = [rx.irecv() for _ in range(5)]
        got = []
        for k in range(5):
            x[:] = k + 1
            tx.send()
            got.append(float(np.asarray(recvs[k].wait())[0]))
        assert all(g >= k + 1 for k, g in enumerate(got)) and got == sorted(got) and got[-1] == 5.0
