"""A received ``Array`` forwarded as it is keeps its ``meta`` (issue 34): ``send_array``, ``isend_array``,
``sendrecv_array`` and ``send_channel`` carry it unless ``meta=`` is given, as ``Pipeline.send`` does. One rank
sending to itself, no launcher needed."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np
import pytest
from mpi4py import MPI

import cai_mpi

me = MPI.COMM_WORLD.Get_rank()
META = {"step": 3, "name": "grad.w", "scale": [1, 2]}


def received(meta: dict[str, Any] | None = META, tag: int = 1) -> cai_mpi.Array:
    """An Array as a receive hands it out: data from this rank, carrying ``meta``."""
    req = cai_mpi.isend_array(np.arange(6, dtype="<i4").reshape(2, 3), me, tag, meta=meta)
    got = cai_mpi.recv_array(me, tag)
    req.wait()
    assert got.meta == meta
    return got


def by_isend(obj: Any, **kw: Any) -> cai_mpi.Array:
    req = cai_mpi.isend_array(obj, me, 2, **kw)
    got = cai_mpi.recv_array(me, 2)
    req.wait()
    return got


def by_send(obj: Any, **kw: Any) -> cai_mpi.Array:
    req = cai_mpi.irecv_array(me, 2)  # posted first: the blocking send to this rank itself then completes
    cai_mpi.send_array(obj, me, 2, **kw)
    return req.wait()


def by_sendrecv(obj: Any, **kw: Any) -> cai_mpi.Array:
    return cai_mpi.sendrecv_array(obj, me, 2, me, 2, **kw)


def by_channel(obj: Any, **kw: Any) -> cai_mpi.Array:
    with cai_mpi.send_channel(obj, me, 2, **kw) as tx, cai_mpi.recv_channel(me, 2) as rx:
        received, sent = rx.irecv(), tx.isend()  # (nonblocking: this rank is both ends)
        got = received.wait()
        sent.wait()
        return got


FORWARDERS: list[Callable[..., cai_mpi.Array]] = [by_send, by_isend, by_sendrecv, by_channel]
IDS = ["send_array", "isend_array", "sendrecv_array", "send_channel"]


@pytest.mark.parametrize("forward", FORWARDERS, ids=IDS)
def test_a_forwarded_array_keeps_its_meta(forward: Callable[..., cai_mpi.Array]) -> None:
    got = forward(received())
    assert got.meta == META
    assert np.asarray(got).tolist() == [[0, 1, 2], [3, 4, 5]] and got.dtype == np.dtype("<i4")


@pytest.mark.parametrize("forward", FORWARDERS, ids=IDS)
def test_meta_given_replaces_the_forwarded_one(forward: Callable[..., cai_mpi.Array]) -> None:
    got = forward(received(), meta={"step": 4})
    assert got.meta == {"step": 4}
    assert np.asarray(got).tolist() == [[0, 1, 2], [3, 4, 5]]


@pytest.mark.parametrize("forward", FORWARDERS, ids=IDS)
def test_an_empty_meta_given_drops_it(forward: Callable[..., cai_mpi.Array]) -> None:
    got = forward(received(), meta={})
    assert not got.meta


@pytest.mark.parametrize("forward", FORWARDERS, ids=IDS)
def test_an_array_received_without_meta_is_forwarded_without(forward: Callable[..., cai_mpi.Array]) -> None:
    assert forward(received(meta=None)).meta is None


def test_a_plain_numpy_array_still_has_no_meta() -> None:
    assert by_send(np.arange(3)).meta is None
