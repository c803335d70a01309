"""send_array / recv_array between real MPI ranks; every test passes at any world size >= 2."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from typing import Any

import numpy as np
import pytest
from mpi4py import MPI
from ordering import write_after

import cai_mpi
from cai_mpi._src.config import reload_config
from cai_mpi.testing import FakeCudaArray, SimulatedRuntime, SimulatedStream, use_runtime

pytestmark = pytest.mark.mpi(min_size=2)

comm = MPI.COMM_WORLD
rank, size = comm.Get_rank(), comm.Get_size()
nxt, prv = (rank + 1) % size, (rank - 1) % size

STRUCT = np.dtype([("id", "<i4"), ("pos", "<f8", (3,)), ("flag", "?"), ("name", "S5")])
DTYPES = ["?", "i1", "u1", "<i2", "<i4", "<i8", "<u8", "<f2", "<f4", "<f8", "<c8", "<c16", ">i4", ">f8", STRUCT]
SHAPES = [(), (0,), (3, 0), (1,), (7,), (5, 3), (2, 3, 4), (1000,), (300, 301)]


def make(dtype: Any, shape: tuple[int, ...], seed: int) -> np.ndarray[Any, Any]:
    """Deterministic contents every rank can rebuild: the receiver knows what the sender sent."""
    dt = np.dtype(dtype)
    raw = np.random.default_rng(seed).integers(0, 256, size=int(np.prod(shape)) * dt.itemsize, dtype=np.uint8)
    return raw.view(dt).reshape(shape)


def assert_same(got: Any, expected: np.ndarray[Any, Any]) -> None:
    g = np.asarray(got)
    assert g.shape == expected.shape
    assert g.dtype == expected.dtype
    assert np.ascontiguousarray(g).tobytes() == np.ascontiguousarray(expected).tobytes()


def ring(obj: Any, **recv_kwargs: Any) -> cai_mpi.Array:
    req = cai_mpi.isend_array(obj, nxt, tag=7)
    got = cai_mpi.recv_array(prv, tag=7, **recv_kwargs)
    req.wait()
    return got


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("shape", SHAPES, ids=str)
def test_round_trip_dtypes_and_shapes(dtype: Any, shape: tuple[int, ...]) -> None:
    sent = make(dtype, shape, seed=rank)
    got = ring(sent)
    assert isinstance(got, cai_mpi.Array)
    assert got.source == prv and got.tag == 7 and got.device == "host"
    assert got.shape == shape and got.dtype == np.dtype(dtype)
    assert_same(got, make(dtype, shape, seed=prv))


@pytest.mark.parametrize("layout", ["C", "F", "reversed", "sliced", "transposed3d"])
@pytest.mark.parametrize("use_out", [False, True])
def test_layouts(layout: str, use_out: bool) -> None:
    def view(seed: int) -> np.ndarray[Any, Any]:
        base = make("<f8", (12, 10, 6), seed)
        return {
            "C": base,
            "F": np.asfortranarray(base),
            "reversed": base[::-1, ::-2, ::3],
            "sliced": base[2:9:3, 1:, ::2],
            "transposed3d": base.transpose(2, 0, 1),
        }[layout]

    expected = view(prv)
    if use_out:
        out = np.full(expected.shape, -1.0)
        got = ring(view(rank), out=out)
        assert_same(out, expected)
        assert np.shares_memory(np.asarray(got), out)
    else:
        got = ring(view(rank))
        assert_same(got, expected)
        if layout == "F":
            assert np.asarray(got).flags.f_contiguous  # contiguous layouts travel zero-copy, order kept
        else:
            assert np.asarray(got).flags.c_contiguous


@pytest.mark.parametrize("shape", [(3, 4), (12, 10, 6), (200, 300)], ids=["inline", "inline-8KiB", "two-messages"])
@pytest.mark.parametrize("how", ["blocking", "nonblocking"])
def test_fortran_order_arrives_fortran_ordered_at_any_size(shape: tuple[int, ...], how: str) -> None:
    """The guide's promise for contiguous arrays, on every send path (small ones travel inline). Around a ring,
    so every rank sends and checks what it receives at any world size (odd ones included)."""
    x = np.asfortranarray(make("<f8", shape, rank))
    expected = np.asfortranarray(make("<f8", shape, prv))
    if how == "nonblocking":
        req = cai_mpi.isend_array(x, nxt, tag=3)
        got = cai_mpi.recv_array(prv, 3)
        req.wait()
    elif rank % 2 == 0:  # (odd ranks receive first, so blocking sends cannot all wait on each other)
        cai_mpi.send_array(x, nxt, tag=3)
        got = cai_mpi.recv_array(prv, 3)
    else:
        got = cai_mpi.recv_array(prv, 3)
        cai_mpi.send_array(x, nxt, tag=3)
    assert_same(got, expected)
    assert np.asarray(got).flags.f_contiguous and not np.asarray(got).flags.c_contiguous


def test_out_with_other_layout_than_sender() -> None:
    expected = make("<i4", (20, 30), prv)
    out = np.zeros((60, 60), "<i4")[::3, ::-2]  # strided receive buffer
    ring(np.asfortranarray(make("<i4", (20, 30), rank)), out=out)
    assert_same(out, expected)


@pytest.mark.parametrize("version", [0, 1, 2, 3])
@pytest.mark.parametrize("strided", [False, True])
def test_cai_versions(version: int, strided: bool) -> None:
    def obj(seed: int) -> tuple[FakeCudaArray, np.ndarray[Any, Any]]:
        data = make("<f4", (8, 9), seed)
        if not strided:
            return FakeCudaArray(data, version=version), data
        # A negative-stride view of the same memory: rows reversed.
        fake = FakeCudaArray(data, version=version, strides=(-36, 4), offset=7 * 36)
        return fake, data[::-1]

    sent, _ = obj(rank)
    got = ring(sent)
    assert sent.cai_reads == 1  # the dict is read exactly once per send
    assert_same(got, obj(prv)[1])


def test_receive_into_cai_out_and_meta() -> None:
    expected = make("<c8", (4, 5), prv)
    out = FakeCudaArray.zeros((4, 5), "<c8")
    req = cai_mpi.isend_array(make("<c8", (4, 5), rank), nxt, tag=3, meta={"step": rank, "ids": [1, 2]})
    got = cai_mpi.recv_array(prv, 3, out=out)
    req.wait()
    assert_same(out.host, expected)
    assert got.meta == {"step": prv, "ids": [1, 2]}
    assert np.shares_memory(np.asarray(got), out.host)


@pytest.mark.parametrize(
    "bad_out, problem",
    [
        (lambda: np.zeros((4, 6), "<f8"), "shapes differ"),
        (lambda: np.zeros((4, 5), "<f4"), "dtypes differ"),
        (lambda: FakeCudaArray.zeros((4, 5), "<f8", readonly=True), "read-only"),
        (lambda: np.lib.stride_tricks.as_strided(np.zeros(5), (4, 5), (0, 8)), "overlapping"),
    ],
    ids=["shape", "dtype", "readonly", "overlap"],
)
@pytest.mark.parametrize("nbytes_class", ["inline", "payload"])
def test_out_mismatch_discards_and_stays_in_step(bad_out: Any, problem: str, nbytes_class: str) -> None:
    shape = (4, 5)
    reload_config({"CAI_MPI_INLINE_BYTES": "0"} if nbytes_class == "payload" else {})
    first = make("<f8", shape, rank)
    req1 = cai_mpi.isend_array(first, nxt, tag=11)
    req2 = cai_mpi.isend_array(make("<i8", (3,), rank), nxt, tag=11)
    with pytest.raises(cai_mpi.RecvMismatchError, match=problem) as info:
        cai_mpi.recv_array(prv, 11, out=bad_out())
    assert f"rank {prv}" in str(info.value)
    # The discarded payload must not be swallowed by (or confuse) the next receive.
    second = cai_mpi.recv_array(prv, 11)
    assert_same(second, make("<i8", (3,), prv))
    req1.wait()
    req2.wait()
    comm.Barrier()


def test_any_source_many_in_flight_nonblocking() -> None:
    per_rank = 20
    reload_config({"CAI_MPI_INLINE_BYTES": "64"})  # mix inline and two-message transfers
    reqs = [
        cai_mpi.isend_array(make("<i4", (i * 7 % 50,), 1000 * rank + i), 0, tag=i, meta={"i": i})
        for i in range(per_rank)
    ]
    if rank == 0:
        recvs = [cai_mpi.irecv_array(cai_mpi.ANY_SOURCE, cai_mpi.ANY_TAG) for _ in range(per_rank * size)]
        seen = set()
        for r in recvs:
            a = r.wait()
            assert a.meta == {"i": a.tag}
            assert_same(a, make("<i4", (a.tag * 7 % 50,), 1000 * a.source + a.tag))
            seen.add((a.source, a.tag))
        assert len(seen) == per_rank * size
    for r in reqs:
        r.wait()
    comm.Barrier()


def test_test_polls_to_completion() -> None:
    req = cai_mpi.irecv_array(prv, tag=21)
    comm.Barrier()
    assert req.test() == (False, None)  # nothing sent yet
    comm.Barrier()
    sreq = cai_mpi.isend_array(make("<f8", (50_000,), rank), nxt, tag=21)
    deadline = time.monotonic() + 30
    while not (req.test()[0] & sreq.test()[0]):
        assert time.monotonic() < deadline
    assert_same(req.wait(), make("<f8", (50_000,), prv))


def test_del_after_isend_is_safe() -> None:
    x = make("<f8", (200_000,), rank)
    req = cai_mpi.isend_array(x, nxt, tag=5)
    del x
    import gc

    gc.collect()
    got = cai_mpi.recv_array(prv, 5)
    req.wait()
    assert_same(got, make("<f8", (200_000,), prv))


@pytest.fixture
def simulated_streams() -> Iterator[None]:
    """Host memory whose producers are simulated streams: the simulated runtime without a GPU resolves them."""
    with use_runtime(SimulatedRuntime(devices=0)):
        yield


@pytest.mark.parametrize("sync", [None, False])
@pytest.mark.usefixtures("simulated_streams")
def test_race_stream_is_synchronized(sync: bool | None) -> None:
    """The sender enqueues a slow write on a (simulated) stream and sends at once.

    With the default policy the receiver must see the written data; with
    sync=False it must see the stale zeros, which proves the test can fail: the write then waits until the send is
    complete, so the zeros are what was sent whatever the ranks' timing.
    """
    if rank == 0:
        stream = SimulatedStream("race-producer")
        x = FakeCudaArray.zeros(100_000, "<f8", stream=stream)
        sent = threading.Event()
        if sync is None:
            sent.set()  # (the send waits for the write: the write must not wait for the send)
        stream.enqueue(write_after, sent, x.host, 42.0, delay=0.3)  # a slow "kernel" writing x
        cai_mpi.send_array(x, 1, tag=99, sync=sync)
        sent.set()
        stream.synchronize()
    elif rank == 1:
        got = np.asarray(cai_mpi.recv_array(0, 99))
        if sync is None:
            assert (got == 42.0).all()
        else:
            assert (got == 0.0).all(), "sync=False should have sent the data before the stream wrote it"
    comm.Barrier()


@pytest.mark.usefixtures("simulated_streams")
def test_receive_out_stream_synchronized_before_write() -> None:
    """A receive buffer still being written by its producer is waited for before MPI writes it."""
    if rank == 1:
        stream = SimulatedStream("out-producer")
        out = FakeCudaArray.zeros(1000, "<f8", stream=stream)
        stream.enqueue(out.host.fill, -5.0, delay=0.3)  # pending producer work on the buffer
        cai_mpi.recv_array(0, 98, out=out)
        stream.synchronize()
        assert_same(out.host, np.arange(1000.0))  # had the producer run after MPI, we'd see -5
    elif rank == 0:
        cai_mpi.send_array(np.arange(1000.0), 1, tag=98)
    comm.Barrier()


def test_only_two_ranks_talk_others_do_not_hang() -> None:
    if rank == 0:
        cai_mpi.send_array(np.arange(10), 1, tag=1)
    elif rank == 1:
        assert_same(cai_mpi.recv_array(0, 1), np.arange(10))
    comm.Barrier()


def test_pipeline_forwarding_keeps_descriptor_and_meta() -> None:
    data = make("<f4", (16, 8), 123)
    if rank == 0:
        cai_mpi.send_array(np.asfortranarray(data), 1, tag=2, meta={"mb": 4})
    else:
        a = cai_mpi.recv_array(rank - 1, 2)
        assert a.meta == {"mb": 4}
        assert_same(a, data)
        if rank + 1 < size:
            cai_mpi.send_array(a, rank + 1, tag=2, meta=a.meta)
    comm.Barrier()


def test_sub_communicator_first_use_is_collective() -> None:
    sub = comm.Split(rank % 2, rank)
    try:
        if sub.Get_size() >= 2:
            r, n = sub.Get_rank(), sub.Get_size()
            req = cai_mpi.isend_array(np.full(3, rank), (r + 1) % n, comm=sub)
            got = cai_mpi.recv_array((r - 1) % n, comm=sub)
            req.wait()
            assert got.source == (r - 1) % n
        else:
            cai_mpi.cuda_aware(sub)  # attach anyway: same collective path with one rank
    finally:
        sub.Free()  # frees cai_mpi's duplicates with it (attribute delete callback)


def test_user_any_tag_never_swallows_library_traffic() -> None:
    """A user's own Recv(ANY_TAG) on COMM_WORLD cannot match cai_mpi messages."""
    req = cai_mpi.isend_array(np.arange(5), nxt, tag=4)
    comm.send(("user", rank), dest=nxt, tag=4)
    assert comm.recv(source=prv, tag=MPI.ANY_TAG) == ("user", prv)
    assert_same(cai_mpi.recv_array(prv, 4), np.arange(5))
    req.wait()


def test_chunked_payload_over_max_message() -> None:
    reload_config({"CAI_MPI_MAX_MESSAGE_BYTES": "1000", "CAI_MPI_INLINE_BYTES": "0"})
    for obj in (make("<f8", (999,), rank), make("<f8", (50, 40), rank)[::-1, ::3]):
        exp = make("<f8", (999,), prv) if obj.ndim == 1 else make("<f8", (50, 40), prv)[::-1, ::3]
        assert_same(ring(obj), exp)
        out = np.zeros(exp.shape)
        ring(obj, out=out)
        assert_same(out, exp)


def test_threads_never_mix_header_and_payload() -> None:
    if MPI.Query_thread() < MPI.THREAD_MULTIPLE:
        pytest.skip("MPI does not provide THREAD_MULTIPLE")
    nthreads, per_thread = 4, 15
    reload_config({"CAI_MPI_INLINE_BYTES": "256"})
    errors: list[BaseException] = []

    def sender(t: int) -> None:
        try:
            for i in range(per_thread):
                n = 1 + (t * 31 + i * 17) % 500
                data = np.full(n, t * 1000 + i, dtype="<i8")
                cai_mpi.send_array(data, nxt, tag=12, meta={"t": t, "i": i})
        except BaseException as exc:
            errors.append(exc)

    def receiver() -> None:
        try:
            for _ in range(per_thread):
                a = cai_mpi.recv_array(cai_mpi.ANY_SOURCE, cai_mpi.ANY_TAG)
                t, i = a.meta["t"], a.meta["i"]
                n = 1 + (t * 31 + i * 17) % 500
                assert_same(a, np.full(n, t * 1000 + i, dtype="<i8"))
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=sender, args=(t,)) for t in range(nthreads)]
    threads += [threading.Thread(target=receiver) for _ in range(nthreads)]
    for th in threads:
        th.start()
    for th in threads:
        th.join(timeout=60)
    assert not any(th.is_alive() for th in threads), "threads hung"
    assert not errors, errors
    comm.Barrier()


def test_bad_arguments_fail_before_sending() -> None:
    with pytest.raises(ValueError, match="not a rank"):
        cai_mpi.send_array(np.zeros(1), size + 5)
    with pytest.raises(TypeError, match="JSON"):
        cai_mpi.send_array(np.zeros(1), nxt, meta={"x": {1, 2}})
    with pytest.raises(ValueError, match="limit"):
        cai_mpi.send_array(np.zeros(1), nxt, meta={"x": "a" * 20000})
    with pytest.raises(TypeError, match="cannot send"):
        cai_mpi.send_array([1, 2, 3], nxt)
    with pytest.raises(cai_mpi.CAIError, match="mask"):
        cai_mpi.send_array(FakeCudaArray(np.zeros(3), mask=np.zeros(3)), nxt)
    with pytest.raises(ValueError, match="tag"):
        cai_mpi.send_array(np.zeros(1), nxt, tag=-3)
    comm.Barrier()
