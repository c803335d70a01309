"""A channel's wire: the described stream bound in place, one buffer at each end (docs/protocol.md, "Persistent
channels").

The first message is an ordinary self-described one (header flag CHANNEL), posted through the one posting body
with the persistent poster; every later message starts the one persistent payload request again over the same
memory, with no header to build or parse. ``BoundSend`` and ``BoundRecv`` own those persistent requests: they
start them, make the Request a started message is, and free them. Where ``stream.py`` receives into a ring of its
own buffers (the receiver keeps each item), a bound stream lands every message in one buffer the user reads
between messages, so it needs no credits: a message is received only when the user asks for it.

A channel end at ``PROC_NULL`` (a wall of a non-periodic grid) has a wire with no requests (``NullSend``,
``NullRecv``): as MPI's persistent requests to and from ``PROC_NULL``, every message completes at once.
"""

from __future__ import annotations

from collections.abc import Callable, Generator, Sequence
from typing import Any

from mpi4py import MPI

from ..arrays.array import Array
from ..arrays.operands import Target
from ..progress.deadlines import Awaited
from ..progress.posted import PostedRequest
from ..progress.requests import Request
from ..progress.waits import MPIWait, Waitable
from ..runtime.base import Runtime
from .plans import RecvPlan, SendPlan
from .post import PERSISTENT, post_send, receive_steps
from .privcomm import PrivateComms

__all__ = ["BoundRecv", "BoundSend", "NullRecv", "NullSend", "free_request"]


def free_request(req: MPI.Request | None, mpi: Any = MPI) -> None:  # (``mpi``: this module's MPI, even during teardown)
    if req is not None and mpi.Is_initialized() and not mpi.Is_finalized() and req != mpi.REQUEST_NULL:
        req.Free()


class BoundSend:
    """The sending end: the first message's header and the payload bound as persistent sends over the sender's
    memory. ``opened`` once the first message has started; its header's request is freed once it has gone."""

    __slots__ = ("_header", "_payload", "opened")

    # Reached through the class: teardown may clear this module's globals before it frees a channel.
    _free = staticmethod(free_request)

    def __init__(self, plan: SendPlan, pc: PrivateComms, dest: int, tag: int) -> None:
        self._header: MPI.Prequest | None
        self._header, self._payload = post_send(plan, pc, dest, tag, PERSISTENT)
        self.opened = False

    def send_now(self) -> None:
        """A later message, blocking: start the payload and wait for it (the common case, nothing else)."""
        req = self._payload
        req.Start()
        req.Wait()

    def start(self, keep: Any, about: Awaited) -> Request[None]:
        """A later message, started now: a Request with nothing left to drive."""
        req = self._payload
        req.Start()
        return PostedRequest([req], None, keep=keep, about=about)

    def message_steps(self) -> Generator[Waitable, None, None]:
        """One message as steps: the header too on the first, then the payload."""
        reqs: list[MPI.Request] = [self._payload]
        header = self._header
        if header is not None:  # the first message
            self.opened = True
            reqs.append(header)
            header.Start()
        self._payload.Start()
        yield MPIWait(reqs, final=True)
        if header is not None:
            self._header = None
            self._free(header)

    def free(self) -> None:
        """Free the persistent requests (none may be active: MPI would still own their memory)."""
        header, self._header = self._header, None
        self._free(header)
        self._free(self._payload)

    @property
    def header_request(self) -> MPI.Prequest | None:
        """The first message's header request until it has gone (then None)."""
        return self._header


class BoundRecv:
    """The receiving end: the first message is received self-described (``open_steps``), and its payload's receive,
    posted persistent into the landing the header chose, is what every later message starts (``bound``)."""

    __slots__ = ("bound", "payload")

    _free = staticmethod(free_request)

    def __init__(self) -> None:
        self.payload: MPI.Prequest | None = None
        self.bound = False  # (an attribute, not a property: every message of a channel asks)

    def open_steps(self, pc: PrivateComms, source: int, tag: int, target: Target | None, ordinal: int | None,
                   rt: Runtime, bind: Callable[[Array], None]) -> Generator[Waitable, None, Array]:
        """The first message: its header says what the channel carries (``bind`` is told the Array at once, before
        the payload completes); its payload's receive is kept for every later message."""

        def posted(plan: RecvPlan, reqs: Sequence[Any]) -> None:
            assert plan.result is not None
            self.payload = reqs[0]
            self.bound = True
            bind(plan.result)

        plan = yield from receive_steps("recv_channel", pc, source, tag, target, ordinal, rt, PERSISTENT,
                                        channel=True, posted=posted)
        assert plan.result is not None
        return plan.result

    def receive_now(self) -> None:
        """A later message, blocking: start the payload receive and wait for it (the common case)."""
        req = self.payload
        assert req is not None
        req.Start()
        req.Wait()

    def start(self, result: Array, keep: Any, about: Awaited) -> Request[Array]:
        """A later message, started now: a Request a timeout may withdraw (the message then waits for the next
        start)."""
        req = self.payload
        assert req is not None
        req.Start()
        return PostedRequest([req], result, keep=keep, about=about, cancellable=True)

    def message_steps(self) -> Generator[Waitable, None, None]:
        """A later message as steps."""
        req = self.payload
        assert req is not None
        req.Start()
        yield MPIWait([req], final=True, cancellable=True)

    def free(self) -> None:
        self._free(self.payload)


class NullSend(BoundSend):
    """The sending end to ``PROC_NULL``: nothing is posted, and every message completes at once."""

    __slots__ = ()

    def __init__(self) -> None:  # (no plan, no request: the base's __init__ would post them)
        self._header, self.opened = None, True

    def send_now(self) -> None:
        pass

    def start(self, keep: Any, about: Awaited) -> Request[None]:
        return PostedRequest([], None, keep=keep, about=about)

    def message_steps(self) -> Generator[Waitable, None, None]:
        yield from ()

    def free(self) -> None:
        pass


class NullRecv(BoundRecv):
    """The receiving end from ``PROC_NULL``: bound from the start (there is no description to wait for), and every
    message completes at once with the channel's Array as it is (``operands.proc_null_array``)."""

    __slots__ = ()

    def __init__(self) -> None:
        self.payload, self.bound = None, True

    def receive_now(self) -> None:
        pass

    def start(self, result: Array, keep: Any, about: Awaited) -> Request[Array]:
        return PostedRequest([], result, keep=keep, about=about)

    def message_steps(self) -> Generator[Waitable, None, None]:
        yield from ()
