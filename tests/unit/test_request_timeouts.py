"""Request.wait(timeout): an unmatched receive is withdrawn; anything under way is finished in the background with
its memory kept alive; a message that matched gets time of its own for the rest. Steps stand in for MPI here."""

from __future__ import annotations

import gc
import threading
import weakref
from collections.abc import Generator

import pytest
from mpi4py import MPI

import cai_mpi
from cai_mpi._src.progress.deadlines import Awaited
from cai_mpi._src.progress.driving import complete, is_pending, pending_count
from cai_mpi._src.progress.requests import Request
from cai_mpi._src.progress.waits import Waitable


class Flag(Waitable):
    """A step that completes once ``set``; a cancellable one reports ``withdrawn`` when cancelled."""

    def __init__(self, *, cancellable: bool = False, withdrawn: bool = True) -> None:
        self.event = threading.Event()
        self.cancellable = cancellable
        self.withdrawn = withdrawn
        self.cancelled = False

    def set(self) -> None:
        self.event.set()

    def test(self) -> bool:
        return self.event.is_set()

    def wait(self) -> None:
        self.event.wait()

    def cancel(self) -> bool:
        self.cancelled = self.withdrawn
        return self.withdrawn


class Memory:
    """Stands for a buffer MPI is using."""


RECEIVE = Awaited("irecv_array", False, 1, 5, MPI.COMM_WORLD)


def receive(header: Flag, payload: Flag, cleaned: list[str]) -> Generator[Waitable, None, str]:
    try:
        yield header
    finally:
        cleaned.append("inbox")
    yield payload
    return "data"


def test_an_unmatched_receive_is_withdrawn_and_cleaned_up() -> None:
    header, payload, cleaned = Flag(cancellable=True), Flag(), []
    req = Request(receive(header, payload, cleaned), about=RECEIVE)
    with pytest.raises(cai_mpi.TimeoutError) as info:
        req.wait(timeout=0.05)
    assert info.value.cancelled and header.cancelled and cleaned == ["inbox"]
    assert "irecv_array: the message from rank 1 with tag 5 on MPI_COMM_WORLD did not arrive within 0.05 s" in str(
        info.value)
    assert req.done and not is_pending(req)


def test_a_message_that_matched_while_being_cancelled_is_received() -> None:
    header, payload, cleaned = Flag(cancellable=True, withdrawn=False), Flag(), []
    payload.set()
    req = Request(receive(header, payload, cleaned), about=RECEIVE)
    assert req.wait(timeout=0.05) == "data"


def test_a_payload_past_its_time_is_finished_in_the_background_with_its_memory_kept() -> None:
    header, payload, cleaned = Flag(cancellable=True), Flag(), []
    header.set()
    memory = Memory()
    alive = weakref.ref(memory)
    req = Request(receive(header, payload, cleaned), keep=memory, about=RECEIVE)
    del memory
    with pytest.raises(cai_mpi.TimeoutError) as info:
        req.wait(timeout=0.05)
    assert not info.value.cancelled and "arrived, but its payload did not complete" in str(info.value)
    del req
    gc.collect()
    assert alive() is not None and pending_count() == 1  # MPI still owns it: the abandoned request keeps it
    payload.set()
    done = Flag()
    done.set()
    complete(done)  # any later wait drives the abandoned request to its end
    gc.collect()
    assert alive() is None and pending_count() == 0


def test_the_rest_of_a_matched_transfer_gets_its_own_timeout() -> None:
    header, payload, cleaned = Flag(cancellable=True), Flag(), []
    threading.Timer(2.0, header.set).start()
    threading.Timer(4.5, payload.set).start()  # past the first deadline, within the renewed one (seconds of slack)
    req = Request(receive(header, payload, cleaned), about=RECEIVE)
    assert req.wait(timeout=4.0) == "data"


class Broken(Waitable):
    """A step whose MPI wait and test fail (a peer's death, an MPI error)."""

    def test(self) -> bool:
        raise MPI.Exception(MPI.ERR_OTHER)

    def wait(self) -> None:
        raise MPI.Exception(MPI.ERR_OTHER)


@pytest.mark.parametrize("how", ["wait", "wait(timeout)", "test"])
def test_a_failing_wait_is_raised_inside_the_steps_so_they_clean_up_first(how: str) -> None:
    cleaned: list[str] = []
    req = Request(receive(Flag(), Flag(), cleaned), about=RECEIVE)
    req._pending = Broken()  # (the header's receive fails while it is awaited)
    with pytest.raises(MPI.Exception):
        if how == "test":
            req.test()
            req.wait()
        else:
            req.wait(timeout=30 if how == "wait(timeout)" else None)
    assert cleaned == ["inbox"], "the steps' cleanup did not run before the error reached the caller"
    assert req.done and not is_pending(req), "a request whose wait failed is left pending"
    with pytest.raises(MPI.Exception):  # the same error again, not a hang
        req.wait()


def test_a_real_receive_past_its_time_names_the_user_s_communicator() -> None:
    """The receive waits on cai_mpi's private duplicate; the message names the communicator the user passed,
    exactly (not the duplicate's own name, nor a piece of it)."""
    me = MPI.COMM_WORLD.Get_rank()
    with pytest.raises(cai_mpi.TimeoutError) as info:
        cai_mpi.recv_array(me, 5, timeout=0.05)
    assert info.value.cancelled
    assert str(info.value).startswith(
        f"recv_array: the message from rank {me} with tag 5 on MPI_COMM_WORLD did not arrive within 0.05 s")
    comm = MPI.COMM_WORLD.Dup()
    try:
        comm.Set_name("solver")
        with pytest.raises(cai_mpi.TimeoutError, match=f"^recv_array: the message from rank {me} with any tag on "
                                                       "solver did not arrive"):
            cai_mpi.recv_array(me, comm=comm, timeout=0.05)
    finally:
        comm.Free()
