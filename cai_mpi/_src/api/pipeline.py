"""Pipeline: a chain of ranks passing self-describing arrays downstream, with back-pressure and errors
that reach every stage.

Stage ``r`` of ``comm`` receives from ``r - 1`` and sends to ``r + 1``: a chain of described streams
(``transport.chain``, which owns every MPI resource of it). Each edge is a described stream (``transport.stream``)
on a private duplicate of ``comm``: items travel by the one path of ``isend_array``/``irecv_array`` (their
headers and payloads on cai_mpi's own duplicates of it), except a run of items that keep the shape, dtype and
``meta`` of the one before, in host memory in C order, which travel as bare payloads into receives the next stage
posted ahead, until an item that differs. A second duplicate carries the control messages: the stream's credits
(how many items a stage has received; this module's policy sends one back upstream once per half window,
``depth // 2`` items, so a stream of small items does not cost a control message per item) and failure notices
(sent by a failing stage to every other one). A sender never has more than ``depth`` items sent and not yet
received downstream. Leaving the ``with`` block is collective: the stages agree on whether any of them failed,
receive whatever is still in flight, and free the duplicates, so nothing is left unmatched.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from typing import Any

import numpy as np
from mpi4py import MPI

from ..arrays.array import Array
from ..errors import TimeoutError
from ..progress.deadlines import deadline
from ..progress.driving import PENDING
from ..runtime import get_runtime
from ..transport.chain import Chain
from .pipeline_leave import Leaving, wait_pauses
from .pipeline_wire import NOTICE, NOTICE_BYTES, failure_from
from .validation import outgoing_meta, receive_device

__all__ = ["Pipeline"]

_SPIN = 20e-6  # seconds a wait polls before it pauses (yields, then sleeps) between polls


class Pipeline(Leaving):
    """A chain of the ranks of ``comm``: stage ``r`` receives from ``r - 1`` and sends to ``r + 1``.

    Constructing one is collective over ``comm``, and so is leaving its ``with`` block. ``send`` blocks
    only when ``depth`` items are sent and not yet received by the next stage; ``recv`` (and iteration,
    which receives the next item while you work on this one) returns None at the end of the stream.
    ``send`` keeps a reference to what it sends until MPI is done with it: dropping yours is safe,
    modifying the array in place before then is an error, as with any nonblocking send.

    ``timeout``: seconds a ``send`` or ``recv`` waits at most for a credit or an item (None:
    ``CAI_MPI_TIMEOUT``, off by default); past it, ``TimeoutError`` on that stage, which the others
    then see as its failure (``PipelineError``) at their next wait or on leaving the ``with`` block.
    Leaving waits for every stage to leave: once a failure is known, at most one ``timeout``, and then
    the pipeline is abandoned with the error leaving would have raised (a stage that comes later raises
    ``PipelineError`` at once); else at most ``timeout`` once per stage and item that may still be in
    flight (``timeout * size * (depth + 1)``), then ``TimeoutError``, and the pipeline is abandoned
    (its pending messages finish in the background; ``comm`` stays usable). See docs/reliability.md,
    "A stuck Pipeline stage".

    A failing stage's error reaches the others as ``PipelineError`` at their next wait (for an item, a credit,
    or on leaving); items it sent before it failed are not withdrawn, so a later stage may still receive some of
    them first (how many depends on timing). Items reach the next stage in the order sent, each once. See
    docs/reliability.md, "A failing Pipeline stage".

    Args:
        comm: the ranks of the chain, in order (None for COMM_WORLD); any intracommunicator.
        depth: the most items a stage may have sent and the next not yet received (an int >= 1).
        timeout: seconds a ``send`` or ``recv`` waits at most (None: ``CAI_MPI_TIMEOUT``, off by default).

    Attributes:
        stage: this rank's stage: its rank in ``comm``.
        first: True on stage 0, which only sends.
        last: True on the last stage, which only receives.
        depth: the ``depth`` it was made with.

    Example:
        >>> with cai_mpi.Pipeline() as pipe:  # doctest: +SKIP
        ...     if pipe.first:
        ...         for batch in batches:
        ...             pipe.send(batch, meta={"id": batch_id})
        ...     else:
        ...         for item in pipe:
        ...             if not pipe.last:
        ...                 pipe.send(work(item))  # keeps item.meta
    """

    def __init__(self, comm: MPI.Comm | None = None, *, depth: int = 2, timeout: float | None = None) -> None:
        self._timeout = timeout
        deadline("Pipeline", timeout)  # a bad timeout fails here, not at the first wait
        comm = MPI.COMM_WORLD if comm is None else comm
        if not isinstance(comm, MPI.Intracomm) or comm == MPI.COMM_NULL:
            raise TypeError(f"Pipeline: comm must be an mpi4py intracommunicator or None, got {comm!r}")
        if isinstance(depth, bool) or not isinstance(depth, (int, np.integer)) or depth < 1:
            raise ValueError(f"Pipeline: depth must be an int >= 1, got {depth!r}")
        self.depth = int(depth)
        self.stage, self._size = comm.Get_rank(), comm.Get_size()
        self.first, self.last = self.stage == 0, self.stage == self._size - 1
        # Bare payloads go only to a stage that receives into host memory (no GPU of its own).
        self._chain = chain = Chain(
            comm, name="Pipeline", window=self.depth,
            takes_bare=self.first or receive_device("Pipeline", None, get_runtime()) is None, notice_tag=NOTICE,
            notice_bytes=NOTICE_BYTES)
        self._down, self._up = chain.down, chain.up  # the edge to the next stage, and the edge from the previous one
        # Credits go back once per half window, not per item. The bound holds as before (a credit is a count of
        # items received, and the sender stays within depth of the last one it read); a sender blocked at depth
        # items always gets one, since every <= depth items received send it.
        self._credit_every = max(1, self.depth // 2)
        self._credited = 0
        self._closed = self.last  # the last stage has no stream to close
        self._ended = self.first  # the first stage has no stream to receive
        self._meta: dict[str, Any] | None = None  # of the item this stage works on, for failure reports
        self._notices = chain.notices
        self._left = False

    # -- the stream ------------------------------------------------------------------------------------------

    def send(self, obj: Any, *, meta: dict[str, Any] | None = None) -> None:
        """Send ``obj`` (anything ``send_array`` takes) to the next stage; a forwarded Array keeps its meta.

        Blocks while ``depth`` items are sent and not yet received downstream. An item with the shape, dtype
        and ``meta`` of the one this stage sent before (host memory of numbers in C order, to a stage without
        a GPU of its own) goes without its description, at about the cost of a raw ``Isend``.
        """
        down = self._down
        if down is None:
            raise ValueError(f"Pipeline.send: stage {self.stage} is the last stage: there is no next stage")
        if self._closed:
            raise ValueError(f"Pipeline.send: stage {self.stage} already closed its stream")
        if down.sent - down.acked >= self.depth:
            self._wait(self._room, "a credit from the next stage")
        down.send(obj, outgoing_meta("Pipeline.send", obj, meta))  # (None: a forwarded Array's own)

    def recv(self) -> Array | None:
        """The next item from the previous stage, or None at the end of the stream."""
        up = self._up
        if up is None:
            raise ValueError(f"Pipeline.recv: stage {self.stage} is the first stage: there is no previous stage")
        if self._ended:
            return None
        item = up.recv(self._wait_item)
        if item is None:
            self._ended = True
            return None
        if up.received - self._credited >= self._credit_every:
            up.credit()
            self._credited = up.received
        self._meta = item.meta
        return item

    def __iter__(self) -> Iterator[Array]:
        while (item := self.recv()) is not None:
            yield item

    def close(self) -> None:
        """End the stream: the next stage's ``recv`` returns None after the items sent before. Idempotent; does
        nothing on the last stage."""
        if not self._closed:
            self._closed = True
            assert self._down is not None
            self._down.close()

    # -- waiting, credits and failures ---------------------------------------------------------------------

    def _wait(self, done: Callable[[], bool], what: str) -> None:
        """Until ``done()``, keep everything moving and watch for a failure anywhere; past the timeout (``what``
        did not come), TimeoutError, which reaches the other stages as this stage's failure.

        Between polls, ``wait_pauses``.
        """
        stop = time.perf_counter() + _SPIN
        while True:  # polls only what it waits for (and requests that need driving): most waits end within microseconds
            if PENDING:
                self._reap()
            if done():
                return
            if time.perf_counter() >= stop:
                break
        due = deadline("Pipeline", self._timeout)
        backoff = wait_pauses(due)
        while True:
            self._reap()  # first: a credit read here ends the wait without another pause
            if done():
                return
            self._check_notice()
            if not backoff.pause():
                assert due is not None
                raise TimeoutError(f"Pipeline: stage {self.stage} waited {due.seconds:g} s for {what}", due.seconds,
                                   False)

    def _wait_item(self, done: Callable[[], bool]) -> None:
        self._wait(done, "an item from the previous stage")

    def _room(self) -> bool:
        """Whether the window has room for another item, once the credits that came are read."""
        down = self._down
        assert down is not None
        down.read_credits()
        return down.sent - down.acked < self.depth

    def _reap(self) -> None:
        """Account returned credits; forget completed sends (testing them also drives every cai_mpi request)."""
        if self._down is not None:
            self._down.reap()
        if self._up is not None:
            self._up.forget_sent()
        self._notices.forget_sent()

    def _check_notice(self) -> None:
        raw = self._notices.test()
        if raw is not None:
            raise failure_from(raw)

    def __enter__(self) -> Pipeline:
        return self

    def __repr__(self) -> str:
        sent = 0 if self._down is None else self._down.sent
        received = 0 if self._up is None else self._up.received
        return (f"<cai_mpi.Pipeline stage {self.stage} of {self._size}, depth {self.depth}, "
                f"{sent} sent, {received} received>")
