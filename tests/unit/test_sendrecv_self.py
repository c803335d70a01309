"""sendrecv_array takes mpi4py's argument order (obj, dest, sendtag, source, recvtag, comm), and every error it
raises names sendrecv_array, whichever half found it. One rank exchanging with itself, no launcher needed."""

from __future__ import annotations

import inspect
from typing import Any

import numpy as np
import pytest
from mpi4py import MPI

import cai_mpi

me = MPI.COMM_WORLD.Get_rank()


def test_the_signature_is_mpi4py_s_order() -> None:
    params = list(inspect.signature(cai_mpi.sendrecv_array).parameters.values())
    positional = [p.name for p in params if p.kind is p.POSITIONAL_OR_KEYWORD]
    assert positional == ["obj", "dest", "sendtag", "source", "recvtag", "comm"]
    assert [p.name for p in params if p.kind is p.KEYWORD_ONLY] == ["out", "device", "sync", "meta", "timeout"]
    assert cai_mpi.sendrecv_array.__defaults__ == (0, MPI.ANY_SOURCE, MPI.ANY_TAG, None)


def test_positional_arguments_mean_what_mpi4py_s_mean() -> None:
    """``sendrecv_array(x, dest, sendtag, source, recvtag)``: the third argument is the send tag."""
    got = cai_mpi.sendrecv_array(np.arange(5), me, 7, me, 7)
    assert np.asarray(got).tolist() == [0, 1, 2, 3, 4] and got.tag == 7 and got.source == me
    # The defaults receive any source and any tag: the third argument alone tags the send.
    got = cai_mpi.sendrecv_array(np.arange(3.0), me, 11)
    assert np.asarray(got).tolist() == [0.0, 1.0, 2.0] and got.tag == 11


BAD: list[tuple[str, dict[str, Any], type[BaseException], str]] = [
    ("dest", {"dest": 99}, ValueError, "dest=99"),
    ("sendtag", {"sendtag": -3}, ValueError, "tag"),
    ("source", {"source": 99}, ValueError, "source=99"),
    ("recvtag", {"recvtag": "x"}, TypeError, "tag"),
    ("out", {"out": object()}, TypeError, "out="),
    ("device", {"device": "gpu"}, ValueError, "device"),
    ("sync", {"sync": "yes"}, TypeError, "sync"),
    ("meta", {"meta": {"f": object()}}, TypeError, "meta"),
    ("timeout", {"timeout": -1}, ValueError, "timeout"),
    ("comm", {"comm": "world"}, TypeError, "comm"),
    ("obj", {"obj": object()}, TypeError, "object"),
]


@pytest.mark.parametrize(("what", "kw", "error", "says"), BAD, ids=[case[0] for case in BAD])
def test_a_bad_argument_is_named_by_sendrecv_array_and_nothing_is_sent(
    what: str, kw: dict[str, Any], error: type[BaseException], says: str
) -> None:
    args: dict[str, Any] = {"obj": np.arange(4), "dest": me, "sendtag": 5, "source": me, "recvtag": 5, **kw}
    with pytest.raises(error, match=f"^sendrecv_array: .*{says}") as info:
        cai_mpi.sendrecv_array(**args)
    assert "recv_array:" not in str(info.value).replace("sendrecv_array:", "")
    # Nothing was left on cai_mpi's communicators: the next message is the next one received.
    req = cai_mpi.isend_array(np.arange(2), me, 6)
    assert np.asarray(cai_mpi.recv_array(me, 6)).tolist() == [0, 1]
    req.wait()
    assert not MPI.COMM_WORLD.Iprobe(MPI.ANY_SOURCE, MPI.ANY_TAG)


def test_a_message_that_does_not_fit_out_is_named_by_sendrecv_array() -> None:
    with pytest.raises(cai_mpi.RecvMismatchError, match=r"^sendrecv_array: the message from rank"):
        cai_mpi.sendrecv_array(np.arange(3.0), me, 8, me, 8, out=np.zeros(4))
    got = cai_mpi.sendrecv_array(np.arange(2.0), me, 8, me, 8)  # the communicator stayed in step
    assert np.asarray(got).tolist() == [0.0, 1.0]


def test_a_timeout_is_named_by_sendrecv_array() -> None:
    with pytest.raises(cai_mpi.TimeoutError, match=r"^sendrecv_array: the message from rank") as info:
        cai_mpi.sendrecv_array(np.arange(3), MPI.PROC_NULL, 0, me, 9, timeout=0.05)
    assert info.value.cancelled


def test_an_out_that_overlaps_the_array_sent_says_how() -> None:
    """Shifted by two elements over the same extent is "partly"; the same bytes seen transposed are "in another
    layout". Either way nothing is sent and the memory is untouched."""
    buf = np.arange(8.0)
    with pytest.raises(ValueError, match=r"^sendrecv_array: out= shares memory with the array sent, partly \(") as info:
        cai_mpi.sendrecv_array(buf[0:4], me, 3, me, 3, out=buf[2:6])
    assert "element 0 +16 bytes from the sent one's" in str(info.value)
    with pytest.raises(ValueError, match=r"^sendrecv_array: out= shares memory with the array sent, in another layout"):
        cai_mpi.sendrecv_array(buf[0:6], me, 3, me, 3, out=buf[0:6].reshape(2, 3).T)
    assert buf.tolist() == [0.0, 1.0, 2.0, 3.0, 4.0, 5.0, 6.0, 7.0]
    assert not MPI.COMM_WORLD.Iprobe(MPI.ANY_SOURCE, MPI.ANY_TAG)


def _int8(n: int) -> np.ndarray[Any, Any]:
    return np.arange(n, dtype=np.int8)


# (what, sent, out=) as slices of one 10-byte buffer, in byte-sized elements so that one shared element is one shared
# byte: the overlap test is decided at its bounds, with reversed layouts (whose element 0 is their highest byte).
TOUCHING: list[tuple[str, slice, slice]] = [
    ("out just above", slice(0, 4), slice(4, 8)),
    ("out just below", slice(4, 8), slice(0, 4)),
    ("reversed sent, out just above", slice(3, None, -1), slice(4, 8)),
    ("reversed sent, out just below", slice(7, 3, -1), slice(0, 4)),
    ("reversed out just above", slice(0, 4), slice(7, 3, -1)),
    ("reversed out just below", slice(4, 8), slice(3, None, -1)),
    ("one element sent, out just above", slice(3, 4), slice(4, 5)),
]
OVERLAPPING: list[tuple[str, slice, slice]] = [
    ("out one element above", slice(0, 4), slice(3, 7)),
    ("out one element below", slice(4, 8), slice(1, 5)),
    ("reversed sent, out starting on its first byte", slice(3, None, -1), slice(3, 7)),
    ("reversed sent, out ending on its last byte", slice(7, 3, -1), slice(2, 5)),
    ("reversed out ending on the sent's first byte", slice(4, 8), slice(4, 0, -1)),
    ("one element sent, out starting on it", slice(3, 4), slice(3, 7)),
]


@pytest.mark.parametrize(("what", "sent", "into"), TOUCHING, ids=[case[0] for case in TOUCHING])
def test_an_out_that_only_touches_the_array_sent_receives_it(what: str, sent: slice, into: slice) -> None:
    buf = _int8(10)
    expected = buf[sent].tolist()
    got = cai_mpi.sendrecv_array(buf[sent], me, 4, me, 4, out=buf[into])
    assert np.asarray(got).tolist() == expected and buf[into].tolist() == expected
    untouched = np.ones(10, bool)
    untouched[into] = False
    assert buf[untouched].tolist() == _int8(10)[untouched].tolist()


@pytest.mark.parametrize(("what", "sent", "into"), OVERLAPPING, ids=[case[0] for case in OVERLAPPING])
def test_an_out_that_overlaps_the_array_sent_by_one_element_is_refused(what: str, sent: slice, into: slice) -> None:
    buf = _int8(10)
    with pytest.raises(ValueError, match=r"^sendrecv_array: out= shares memory with the array sent, partly \("):
        cai_mpi.sendrecv_array(buf[sent], me, 4, me, 4, out=buf[into])
    assert buf.tolist() == _int8(10).tolist()
    assert not MPI.COMM_WORLD.Iprobe(MPI.ANY_SOURCE, MPI.ANY_TAG)
