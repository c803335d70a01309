"""Every send form and every receive form post through the transport's one body per direction (transport/post.py):
blocking, nonblocking and with a deadline, for each way a payload travels (inline, one contiguous message, F order,
a derived datatype, a strided copy, chunks), into new memory and into out=. Each pair is checked byte for byte, and
a refused out= is refused the same way whatever the form. Passes at any world size >= 2."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

import numpy as np
import pytest
from mpi4py import MPI

import cai_mpi
from cai_mpi._src.config import reload_config

pytestmark = pytest.mark.mpi(min_size=2)

comm = MPI.COMM_WORLD
rank, size = comm.Get_rank(), comm.Get_size()
nxt, prv = (rank + 1) % size, (rank - 1) % size


def _layouts() -> dict[str, Callable[[int], np.ndarray[Any, Any]]]:
    def base(seed: int, n: int) -> np.ndarray[Any, Any]:
        return np.random.default_rng(seed).standard_normal(n)

    return {
        "inline": lambda s: base(s, 1),
        "contiguous": lambda s: base(s, 3000),
        "fortran": lambda s: np.asfortranarray(base(s, 600).reshape(20, 30)),
        "strided": lambda s: base(s, 4000)[::3],  # a derived datatype
        "reversed": lambda s: base(s, 700)[::-1],  # negative strides
        "chunked": lambda s: base(s, 50),  # 400 bytes in 64-byte messages (CAI_MPI_MAX_MESSAGE_BYTES below)
    }


LAYOUTS = _layouts()


@pytest.fixture(autouse=True)
def _small_messages(request: pytest.FixtureRequest) -> Iterator[None]:
    if "chunked" in request.node.name:
        reload_config({"CAI_MPI_MAX_MESSAGE_BYTES": "64"})
    try:
        yield
    finally:
        reload_config()


def _send(form: str, x: np.ndarray[Any, Any], tag: int) -> Callable[[], None]:
    """Start sending ``x`` to the next rank in ``form``; the returned function finishes it."""
    if form == "blocking":
        return lambda: cai_mpi.send_array(x, nxt, tag)
    if form == "deadline":
        return lambda: cai_mpi.send_array(x, nxt, tag, timeout=60)
    req = cai_mpi.isend_array(x, nxt, tag)
    return lambda: req.wait(timeout=60 if form == "nonblocking-deadline" else None)


def _recv(form: str, tag: int, out: Any) -> cai_mpi.Array:
    if form == "blocking":
        return cai_mpi.recv_array(prv, tag, out=out, device="host" if out is None else None)
    if form == "deadline":
        return cai_mpi.recv_array(prv, tag, out=out, device="host" if out is None else None, timeout=60)
    req = cai_mpi.irecv_array(prv, tag, out=out, device="host" if out is None else None)
    return req.wait(timeout=60 if form == "nonblocking-deadline" else None)


FORMS = ["blocking", "deadline", "nonblocking", "nonblocking-deadline"]


@pytest.mark.slow  # (192 cases: every pair of forms around the ring; at 2 ranks, as the >2 GiB transfer)
@pytest.mark.parametrize("layout", list(LAYOUTS))
@pytest.mark.parametrize("send_form", FORMS)
@pytest.mark.parametrize("recv_form", FORMS)
@pytest.mark.parametrize("into", ["new", "out"])
def test_every_form_pair_delivers_every_layout(layout: str, send_form: str, recv_form: str, into: str) -> None:
    sent = LAYOUTS[layout](rank)
    expected = LAYOUTS[layout](prv)
    out = np.zeros_like(expected) if into == "out" else None  # (same layout as the sender's)
    if rank % 2 == 0:  # even ranks send first, odd ones receive first (blocking sends on both would deadlock)
        finish = _send(send_form, sent, 40)
        if send_form.startswith("nonblocking"):
            got = _recv(recv_form, 40, out)
            finish()
        else:
            finish()
            got = _recv(recv_form, 40, out)
    else:
        got = _recv(recv_form, 40, out)
        _send(send_form, sent, 40)()
    assert np.asarray(got).shape == expected.shape
    assert np.array_equal(np.asarray(got), expected)
    if out is not None:
        assert np.shares_memory(np.asarray(got), out)
        assert np.array_equal(out, expected)
    assert got.source == prv and got.tag == 40


@pytest.mark.parametrize("layout", ["inline", "contiguous", "chunked"])
@pytest.mark.parametrize("form", FORMS)
def test_a_refused_out_is_refused_alike_in_every_form(layout: str, form: str) -> None:
    """The payload is received and discarded, then RecvMismatchError, and the next message arrives intact."""
    sent = LAYOUTS[layout](rank)
    finish = _send("nonblocking", sent, 41)
    with pytest.raises(cai_mpi.RecvMismatchError, match="does not fit out="):
        _recv(form, 41, np.zeros(sent.size + 1))
    finish()
    req = cai_mpi.isend_array(sent, nxt, 42)
    assert np.array_equal(np.asarray(_recv(form, 42, None)), LAYOUTS[layout](prv))
    req.wait()


@pytest.mark.parametrize("timeout", [None, 60])
@pytest.mark.parametrize("layout", list(LAYOUTS))
def test_sendrecv_delivers_every_layout_with_and_without_a_deadline(layout: str, timeout: float | None) -> None:
    got = cai_mpi.sendrecv_array(LAYOUTS[layout](rank), nxt, 43, prv, 43, device="host", timeout=timeout)
    assert np.array_equal(np.asarray(got), LAYOUTS[layout](prv))


@pytest.mark.parametrize("timeout", [None, 60])
@pytest.mark.parametrize("layout", ["inline", "contiguous", "fortran", "strided"])
def test_channels_post_through_the_persistent_poster_with_and_without_a_deadline(
    layout: str, timeout: float | None
) -> None:
    """The first message posts header and payload as persistent requests, the later ones start the payload's."""
    x = LAYOUTS[layout](rank).copy()
    expected_first = LAYOUTS[layout](prv)
    with cai_mpi.send_channel(x, nxt, 44) as tx, cai_mpi.recv_channel(prv, 44, device="host") as rx:
        for step in range(3):
            x[...] = LAYOUTS[layout](rank) + step
            req = tx.isend()
            got = rx.recv(timeout=timeout)
            req.wait(timeout=timeout)
            assert np.array_equal(np.asarray(got), expected_first + step)
        if rank % 2 == 0:  # the blocking send: even ranks first (blocking sends on both would deadlock)
            tx.send(timeout=timeout)
            got = rx.recv(timeout=timeout)
        else:
            got = rx.recv(timeout=timeout)
            tx.send(timeout=timeout)
        assert np.array_equal(np.asarray(got), expected_first + 2)
    assert tx._wire.header_request is None  # the header's persistent request was freed once it had gone
