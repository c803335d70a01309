"""Leaving a ``Pipeline``: collective over its stages, which agree on whether any of them failed, receive whatever
is still in flight to them (items self-described or bare), and free the pipeline's communicators, so nothing is
left unmatched; or, past the leaving deadline (one timeout once a failure is known), abandon the pipeline and say
so, and a stage that comes later goes without the ones that abandoned it."""

from __future__ import annotations

import math
from collections.abc import Callable
from types import TracebackType
from typing import Any

import numpy as np

from ..errors import PipelineError, TimeoutError
from ..progress.backoff import Backoff
from ..progress.deadlines import Deadline, deadline
from ..transport.chain import Chain
from ..transport.notices import Notices
from ..transport.stream import StreamIn, StreamOut
from .pipeline_wire import encode_notice, failure_from

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
    reads then. The state is the Pipeline's (made in its ``__init__``); its edges settle themselves
    (``StreamOut.settle``, ``StreamIn.drain`` and ``settle``)."""

    stage: int
    first: bool
    last: bool
    depth: int
    _size: int
    _timeout: float | None
    _chain: Chain
    _down: StreamOut | None
    _up: StreamIn | None
    _ended: bool
    _left: bool
    _meta: dict[str, Any] | None
    _notices: Notices
    _report: PipelineError | None  # (while leaving)
    _watch: bool  # (while leaving)

    # (the Pipeline's own)
    def close(self) -> None: ...
    def _reap(self) -> None: ...

    def _notify(self, error: BaseException, *, own: bool = True) -> None:
        """Tell every other stage that this one failed (they raise PipelineError, wherever they wait)."""
        self._notices.send_all(encode_notice(self.stage, self._meta, error, own))

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
        down, up = self._down, self._up
        mine = np.array([self.stage if failed_here else self._size, 0 if down is None else down.sent,
                         0 if up is None else up.received, 0 if up is None else up.credits_sent,
                         up is not None and up.posted], np.int64)
        chain = self._chain
        everyone = chain.agree(mine)
        # A failure known here (this stage's, or one reported to it): a stage that does not leave within a timeout
        # of it is stuck, and the others go without it.
        heard = failed_here or isinstance(error, PipelineError) or self._notices.first is not None
        due = self._leaving_deadline(heard)
        backoff = wait_pauses(due)
        while not chain.agreed():  # meanwhile sends of this stage that still need driving (staging) go on
            self._reap()
            if not heard and self._notices.test() is not None:
                heard = True
                due = self._leaving_deadline(heard)
                backoff.until = math.inf if due is None else due.at
            # A stage that gave up on this one need not drive the agreement any more: go without it at once.
            gone = heard and chain.abandoned() is not None
            if (gone or not backoff.pause()) and not chain.agreed():  # (a last look: the agreement may have come)
                assert due is not None
                if not heard:
                    raise self._gave_up(due) from error
                self._gave_up(due)
                return self._outcome(self._failing(failed_here, error), failed_here, error, self._heard_first())
        failing = int(everyone[:, _FAILED].min())
        self._report = None
        # After a failure, a stage that gave up on the agreement abandoned the pipeline: no wait for its part would
        # end, and this stage raises PipelineError either way. (Without a failure, leaving waits as it always did: a
        # late stage's outcome must not hang on whether a message to one that gave up had already gone.)
        self._watch = failing != self._size
        try:
            self._settle(everyone)
        except _Abandoned as gone:  # a stage gave up on the others before this one came: go without it too
            chain.abandon(gone)
            return self._outcome(failing, failed_here, error, self._report or self._heard_first())
        chain.free()
        return self._outcome(failing, failed_here, error, self._report)

    def _outcome(self, failing: int, failed_here: bool, error: BaseException | None,
                 report: PipelineError | None) -> None:
        """Leaving's end, once the lowest failing stage is known (``failing``; the size: none): nothing, this
        stage's own exception going on, or the failing stage's report."""
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

    def _failing(self, failed_here: bool, error: BaseException | None) -> int:
        """The failing stage as this one knows it, without the agreement: itself, else the one reported to it."""
        if failed_here:
            return self.stage
        if isinstance(error, PipelineError):
            return error.rank
        first = self._heard_first()
        assert first is not None
        return first.rank

    def _heard_first(self) -> PipelineError | None:
        """The report of the failure notice this stage read while it waited, if it read one."""
        raw = self._notices.first
        return None if raw is None else failure_from(raw)

    def _leaving_deadline(self, heard: bool) -> Deadline | None:
        """How long leaving waits for every stage to leave. Once a failure is known (``heard``), one ``timeout``:
        every stage hears of it at its next wait, each of which ends within a timeout. Else a stage leaves once its
        stream has ended: behind the last item still on its way to it, and at most ``depth`` + 1 items per stage can
        be; when no stage's wait times out, the next arrives within ``timeout``. So no healthy pipeline waits longer
        than ``timeout`` once per stage and item in flight (work a stage does after its stream ended counts too)."""
        due = deadline("Pipeline", self._timeout)
        return due if due is None or heard else Deadline(due.seconds * self._size * (self.depth + 1))

    def _gave_up(self, due: Deadline) -> TimeoutError:
        """Some stage did not leave in time: the pipeline is abandoned (``Chain.abandon``: every other stage is told,
        what MPI may still touch finishes in the background, the communicators are left as they are, out of step:
        not freed)."""
        error = TimeoutError(
            f"Pipeline: stage {self.stage} waited {due.seconds:g} s for every stage to leave the pipeline (leaving is "
            f"collective over {self._size} stages); the pipeline is abandoned: its pending messages finish in the "
            "background, and the communicator you gave it stays usable", due.seconds, False)
        self._chain.abandon(error)
        return error

    def _until(self, done: Callable[[], bool]) -> None:
        """A wait of leaving after the agreement (for what another stage sends or receives as it leaves): until
        ``done()``, or (``_watch``: after a failure) ``_Abandoned`` when a stage abandoned the pipeline (it will not do
        its part)."""
        backoff = wait_pauses(None)
        while not done():
            gone = self._chain.abandoned() if self._watch else None
            if gone is not None:
                raise _Abandoned(gone)
            backoff.pause()

    def _settle(self, everyone: np.ndarray[Any, Any]) -> None:
        """Take the failure report of the lowest failing stage (``_report``: each failing stage sent one to everyone,
        before the agreement), receive what is still in flight to this stage, and wait for what it sent."""
        me, down, up, wait = self.stage, self._down, self._up, self._until
        failed = sum(1 for r in range(self._size) if everyone[r, _FAILED] != self._size and r != me)
        reports = [failure_from(raw) for raw in self._notices.collect(failed, wait)]
        self._report = min(reports, key=lambda r: r.rank) if reports else None
        # A receive posted downstream that nothing sent will ever match gets an empty message.
        if down is not None and everyone[me + 1, _POSTED] and down.sent == everyone[me + 1, _RECEIVED]:
            down.end()
        if up is not None:
            missing = int(everyone[me - 1, _SENT]) - up.received
            if up.posted:
                missing = max(missing, 1)  # (the stage above sent one more to match it, as just above)
            up.drain(missing, wait)
        if down is not None:  # credits sent from downstream, then everything sent has been received downstream
            down.settle(int(everyone[me + 1, _CREDITS]), wait)
        self._notices.finish(wait)
        if up is not None:
            up.settle(wait)


class _Abandoned(Exception):
    """Stage ``stage`` abandoned the pipeline while this one left it."""

    def __init__(self, stage: int) -> None:
        super().__init__(f"Pipeline: stage {stage} abandoned the pipeline")
        self.stage = stage
