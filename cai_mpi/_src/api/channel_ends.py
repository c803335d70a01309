"""What both ends of a channel share: the wire (``transport.bound``), the message in flight, closing and freeing."""

from __future__ import annotations

import atexit
import weakref
from types import TracebackType
from typing import Any

from ..errors import TimeoutError
from ..progress.deadlines import Awaited, Deadline, deadline
from ..progress.driving import complete_by
from ..progress.requests import Request, RequestWait, keep_past_exit, settled, wait_quietly, wait_until
from ..transport.bound import BoundRecv, BoundSend

__all__ = ["ChannelEnd", "free_open_channels", "open_channel_count"]


class ChannelEnd:
    """What both ends share: the wire (its persistent requests), the message in flight, closing and freeing.

    Messages of one channel are strictly ordered: a message started while the previous one is in flight
    queues behind it (the persistent request is single), so windows of isends or irecvs never block.
    """

    __slots__ = ("__weakref__", "_about", "_closed", "_inflight", "_wire")

    # Reached through the class: teardown may clear this module's globals before it frees a channel (``__del__``).
    _settled = staticmethod(settled)
    _about: Awaited  # what a timeout says this channel was waiting for
    _closed: bool
    _wire: BoundSend | BoundRecv
    _inflight: Request[Any] | None

    def _track(self) -> None:
        """Made and open: freed before MPI finalizes unless closed or collected first."""
        _open_channels.add(self)

    def _check_open(self, what: str) -> None:
        if self._closed:
            raise ValueError(f"{what} on a closed channel")

    def _queued(self) -> bool:
        """Whether a message is still in flight (the next one queues behind it). One found settled is forgotten, so
        every later message of a channel used one at a time asks nothing more."""
        inflight = self._inflight
        if inflight is None:
            return False
        if self._settled(inflight):
            self._inflight = None
            return False
        return True

    def close(self, timeout: float | None = None) -> None:
        """Wait for a message in flight, then free the channel's MPI request (idempotent).

        Args:
            timeout: seconds to wait at most (None: ``CAI_MPI_TIMEOUT``, off by default). Past it,
                ``TimeoutError``, and the channel is closed all the same: a send stays posted, its memory kept
                alive, and completes if the peer receives it (later cai_mpi waits finish it); a receive that
                matched nothing is withdrawn; the MPI request is freed once MPI is done with it.
        """
        fn = f"{type(self).__name__}.close"
        due = deadline(fn, timeout)  # (a bad timeout is refused before anything changes)
        if self._closed:
            return
        inflight = self._inflight
        if inflight is not None and not settled(inflight):
            if due is None:
                # Its error, if any, is its own wait()'s to raise (a failed recv() has raised it already).
                wait_quietly(inflight)
            else:
                withdrawn = self._settle_by(inflight, due)
                if withdrawn or not settled(inflight):
                    self._release()
                    about = self._about
                    raise Awaited(fn, about.sends, about.peer, about.tag, about.comm).expired(
                        due, cancelled=withdrawn, matched=True)
        self._release()

    @staticmethod
    def _settle_by(inflight: Request[Any], due: Deadline) -> bool:
        """Wait until ``due`` for the message in flight to settle: through its own wait, which withdraws a receive
        that matched nothing at ``due`` (then True) and leaves anything else to finish in the background; after an
        earlier timeout, for its completion in the background."""
        withdrawn = False
        if not inflight.done:
            try:
                wait_until(inflight, due)
            except TimeoutError as exc:
                withdrawn = exc.cancelled
            except BaseException:
                pass  # the message's own error is its own wait()'s to raise
        if not settled(inflight):
            complete_by(RequestWait(inflight), due)
        return withdrawn

    def _release(self) -> None:
        """No more messages; free the wire's MPI requests without waiting (close, exit, garbage collection). Not while a
        message is in flight: MPI still owns its memory, and a freed request would read as complete to its wait
        (which would then let the memory go). The request in flight holds the MPI request until it completes, and
        whoever frees the channel last (garbage collection, or the exit hook) frees it then."""
        if not hasattr(self, "_closed"):  # (a constructor that raised set nothing)
            return
        self._closed = True
        if not self._queued():
            self._wire.free()

    def __del__(self) -> None:
        self._release()

    def __exit__(self, kind: type[BaseException] | None, error: BaseException | None, tb: TracebackType | None) -> None:
        if error is None:
            self.close()
        else:  # leaving on an error: waiting for a peer now could hang, or hide the error behind another
            self._close_without_waiting()

    def _close_without_waiting(self) -> None:
        """Close now: a receive in flight that matched nothing is withdrawn; a send, or a receive whose message
        matched, goes on in the background (kept alive by its request, driven by later cai_mpi waits)."""
        inflight = self._inflight
        if inflight is not None and not inflight.done and not self._about.sends:
            try:
                wait_until(inflight, Deadline(0.0))
            except BaseException:
                pass  # withdrawn (its wait() says so), or its own error
        self._release()


# Channels not closed yet: their persistent requests are freed before MPI finalizes (MPICH reports
# "freeing inactive persistent request" otherwise), or when a channel is garbage collected.
_open_channels: weakref.WeakSet[ChannelEnd] = weakref.WeakSet()


def open_channel_count() -> int:
    """How many channels of this process are open (created, not closed nor collected): a leak check for tools."""
    return len(_open_channels)


@atexit.register
def free_open_channels() -> None:
    """Free every open channel's persistent requests (the exit hook: it runs before MPI_Finalize, since mpi4py
    finalizes from Py_AtExit, after the interpreter's teardown)."""
    for ch in list(_open_channels):
        inflight = ch._inflight
        if inflight is not None and not settled(inflight):
            # MPI still owns its memory: keep it past teardown, and its request active (freed, it would read as
            # complete to a later wait, which would then let the memory go).
            keep_past_exit(inflight)
            ch._closed = True
        else:
            ch._release()
