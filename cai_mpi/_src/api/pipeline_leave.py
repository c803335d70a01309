"""Leaving a ``Pipeline``: collective over its stages, which agree on whether any of them failed, receive whatever
is still in flight to them (items self-described or bare), and free the pipeline's communicators, so nothing is
left unmatched; or, past the leaving deadline, abandon the pipeline."""

from __future__ import annotations

import math
from collections import deque
from types import TracebackType
from typing import Any

import numpy as np
from mpi4py import MPI

from ..arrays.array import Array
from ..errors import PipelineError, TimeoutError
from ..progress.backoff import Backoff
from ..progress.deadlines import Deadline, deadline
from ..progress.requests import PostedRequest, Request
from .p2p import recv_array
from .pipeline_wire import CREDIT, DESCRIBED, NOTICE, NOTICE_BYTES, SWITCH, encode_notice, failure_from

__all__ = ["Leaving", "wait_pauses"]

# What each stage tells the others on leaving: the failing stage (else the size), messages sent downstream
# (items and the end of the stream), messages received from upstream, credits sent, whether a receive is
# still posted upstream.
_FAILED, _SENT, _RECEIVED, _CREDITS, _POSTED = range(5)


def wait_pauses(due: Deadline | None) -> Backoff:
    """A stage's waits between polls: a millisecond of yields (an item or a credit usually comes sooner than any
    ``time.sleep``, even of 0, returns), then sleeps backing off to 100 microseconds, never past ``due``."""
    return Backoff(spin=1e-3, step=1e-6, most=1e-4, until=math.inf if due is None else due.at)


class Leaving:
    """What a ``Pipeline`` does on leaving its ``with`` block (``__exit__``), and the failure notices it sends and
    reads then. The state is the Pipeline's (made in its ``__init__``)."""

    stage: int
    first: bool
    last: bool
    depth: int
    _size: int
    _timeout: float | None
    _data: MPI.Intracomm
    _ctl: MPI.Intracomm
    _sent: int
    _received: int
    _credits_sent: int
    _credits_read: int
    _ended: bool
    _left: bool
    _meta: dict[str, Any] | None
    _sends: deque[Request[None]]
    _bare_sends: deque[MPI.Request]
    _control: deque[MPI.Request]
    _prefetch: Request[Array] | None
    _bare: MPI.Request | None
    _bare_status: MPI.Status
    _held: tuple[tuple[int, ...], np.dtype[Any], str | None] | None
    _credit_req: MPI.Prequest | None
    _credit_send: MPI.Prequest | None
    _credit_out: np.ndarray[Any, Any]
    _notice: bytearray
    _notice_req: MPI.Request
    _notice_status: MPI.Status
    _notices_received: int

    # (the Pipeline's own)
    def close(self) -> None: ...
    def _reap(self) -> None: ...
    def _send_end(self) -> None: ...
    def _post_next(self) -> None: ...
    def _unhold(self) -> None: ...

    def _notify(self, error: BaseException, *, own: bool = True) -> None:
        """Tell every other stage that this one failed (they raise PipelineError, wherever they wait)."""
        raw = encode_notice(self.stage, self._meta, error, own)
        for rank in range(self._size):
            if rank != self.stage:
                self._control.append(self._ctl.Isend(raw, rank, NOTICE))

    def __exit__(self, kind: type[BaseException] | None, error: BaseException | None, tb: TracebackType | None) -> None:
        failed_here = error is not None and not isinstance(error, PipelineError)
        if failed_here:
            assert error is not None
            self._notify(error)
        elif error is None:
            self.close()
            if not self._ended:  # left before the end of its stream: upstream would wait for it forever
                self._left = True
                failed_here = True
                self._notify(RuntimeError("it left the pipeline before the end of its stream"), own=False)
        mine = np.array([self.stage if failed_here else self._size, self._sent, self._received, self._credits_sent,
                         self._prefetch is not None or self._bare is not None], np.int64)
        everyone = np.empty((self._size, len(mine)), np.int64)
        agreed = self._ctl.Iallgather(mine, everyone)
        due = self._leaving_deadline()
        backoff = wait_pauses(due)
        while not agreed.Test():  # meanwhile sends of this stage that still need driving (staging) go on
            self._reap()
            if not backoff.pause():
                assert due is not None
                raise self._gave_up(agreed, (mine, everyone), due) from error
        report = self._settle(everyone)
        self._data.Free()
        self._ctl.Free()
        failing = int(everyone[:, _FAILED].min())
        if failing == self._size or (failed_here and not self._left):
            return  # no failure; or this stage's own exception goes on unchanged
        if isinstance(error, PipelineError) and error.rank == failing:
            return  # the report this stage already raised goes on (raising a copy would print it twice)
        if self._left and failing == self.stage:
            report = PipelineError(f"Pipeline: stage {self.stage} left the pipeline before the end of its stream",
                                   self.stage)
        elif report is None or report.rank != failing:
            report = PipelineError(f"Pipeline: stage {failing} failed", failing)
        raise report from None  # (error, if any, is the report of a stage that failed later: this one replaces it)

    def _leaving_deadline(self) -> Deadline | None:
        """How long leaving waits for every stage to leave. A stage leaves once its stream has ended: behind the
        last item still on its way to it, and at most ``depth`` + 1 items per stage can be; when no stage's wait
        times out, the next arrives within ``timeout``. So no healthy pipeline waits longer than ``timeout`` once
        per stage and item in flight (work a stage does after its stream ended counts too)."""
        due = deadline("Pipeline", self._timeout)
        return None if due is None else Deadline(due.seconds * self._size * (self.depth + 1))

    def _gave_up(self, agreed: MPI.Request, buffers: Any, due: Deadline) -> TimeoutError:
        """Some stage did not leave in time: keep what MPI may still touch (the agreement, which completes if the
        others leave later, and the control messages in flight) alive, withdraw this stage's control receives, and
        leave the pipeline's communicators as they are (out of step: not freed)."""
        error = TimeoutError(
            f"Pipeline: stage {self.stage} waited {due.seconds:g} s for every stage to leave the pipeline (leaving is "
            f"collective over {self._size} stages); the pipeline is abandoned: its pending messages finish in the "
            "background, and the communicator you gave it stays usable", due.seconds, False)
        PostedRequest([agreed], None, keep=buffers).abandon(error)
        if self._control:
            PostedRequest(list(self._control), None).abandon(error)
            self._control = deque()
        if self._bare_sends:
            PostedRequest(list(self._bare_sends), None).abandon(error)
            self._bare_sends = deque()
        for req in (self._credit_req, self._notice_req, self._bare):
            if req is not None and req != MPI.REQUEST_NULL:
                req.Cancel()
                req.Wait()
        if self._credit_req is not None:
            self._credit_req.Free()
        sending = self._credit_send
        if sending is not None and not sending.Test():
            PostedRequest([sending], None, keep=self._credit_out).abandon(error)  # (not freed: MPI still sends it)
        elif sending is not None:
            sending.Free()
        self._credit_req = self._credit_send = self._bare = None
        self._unhold()
        return error

    def _settle(self, everyone: np.ndarray[Any, Any]) -> PipelineError | None:
        """Receive what is still in flight to this stage, wait for what it sent, and return the failure report
        of the lowest failing stage (each failing stage sent one to everyone)."""
        me = self.stage
        # A receive posted downstream that nothing sent will ever match gets an empty message.
        if not self.last and everyone[me + 1, _POSTED] and self._sent == everyone[me + 1, _RECEIVED]:
            self._send_end()
        if not self.first:
            missing = int(everyone[me - 1, _SENT]) - self._received
            if self._prefetch is not None or self._bare is not None:
                missing = max(missing, 1)  # (the stage above sent one more to match it, as just above)
            for _ in range(missing):
                self._drain_one()
        if not self.last:  # credit messages sent from downstream; self._credits_read of them read so far
            missing = int(everyone[me + 1, _CREDITS]) - self._credits_read
            assert self._credit_req is not None
            if missing > 0:
                self._credit_req.Wait()
                missing -= 1
            else:
                self._credit_req.Cancel()
                self._credit_req.Wait()
            self._credit_req.Free()
            self._credit_req = None
            for _ in range(missing):
                self._ctl.Recv(np.zeros(1, np.int64), me + 1, CREDIT)
        reports = self._notices(sum(1 for r in range(self._size) if everyone[r, _FAILED] != self._size and r != me))
        while self._sends:  # everything sent has been (or is being) received downstream
            self._sends.popleft().wait()
        MPI.Request.Waitall(list(self._bare_sends))
        self._bare_sends = deque()
        MPI.Request.Waitall(list(self._control))
        self._control = deque()
        if self._credit_send is not None:
            self._credit_send.Wait()
            self._credit_send.Free()
            self._credit_send = None
        self._unhold()
        return min(reports, key=lambda r: r.rank) if reports else None

    def _drain_one(self) -> None:
        """Receive (and drop) the next message of the stream still in flight to this stage, whichever way it comes."""
        while True:
            if self._bare is None and self._prefetch is None and self._held is not None:
                self._post_next()
            if self._bare is not None:
                self._bare.Wait(self._bare_status)
                self._bare = None
                if self._bare_status.Get_tag() != SWITCH:
                    return
                self._unhold()
                continue
            if self._prefetch is not None:
                got = self._prefetch.wait()
                self._prefetch = None
            else:
                got = recv_array(self.stage - 1, MPI.ANY_TAG, self._data, device="host")
            if got.tag == DESCRIBED:
                self._held = (got.shape, got.dtype, None)
            return

    def _notices(self, expected: int) -> list[PipelineError]:
        """Read the ``expected`` failure notices sent to this stage (one may have been read already)."""
        reports = []
        if self._notices_received or expected > 0:
            if not self._notices_received:
                self._notice_req.Wait(self._notice_status)
            reports.append(failure_from(self._notice[: self._notice_status.Get_count(MPI.BYTE)]))
            expected -= 1
        else:
            self._notice_req.Cancel()
            self._notice_req.Wait()
        for _ in range(expected):
            status = MPI.Status()
            buf = bytearray(NOTICE_BYTES)
            self._ctl.Recv(buf, MPI.ANY_SOURCE, NOTICE, status)
            reports.append(failure_from(buf[: status.Get_count(MPI.BYTE)]))
        return reports

