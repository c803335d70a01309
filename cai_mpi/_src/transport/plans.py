"""What the planners decide and the poster posts: a send plan and a receive plan.

``send.plan_send`` makes a ``SendPlan``, ``receive.plan_recv`` a ``RecvPlan``; ``post.py`` puts their MPI
operations on the wire, blocking, nonblocking or persistent. One of each is made per message, so they are
slotted classes with every field set by the constructor (no per-field defaults to look up).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from ..arrays.array import Array
    from .pieces import Steps

__all__ = ["NO_MESSAGES", "RecvPlan", "SendPlan"]

#: The payload of a message that has none to post (an inline one): shared, never changed.
NO_MESSAGES: Sequence[Any] = ()


class SendPlan:
    """How one message is sent. Post ``header`` on the header communicator, then every spec of ``payload`` on the
    payload communicator with ``ptag``, then drive ``steps`` (None when nothing is left).

    ``steps`` first run up to ``PREPARED``: everything that can fail at once (allocations, the device pack, the
    first staging copy) runs before the header is posted, so that such a failure posts nothing; a later failure
    the steps announce to the receiver themselves (``failure.py``), and the header then carries FLAG_MAY_FAIL.
    ``in_place``: the payload specs read the source's own memory, so a persistent request may reuse them.
    """

    __slots__ = ("header", "in_place", "payload", "ptag", "steps")

    def __init__(self, header: bytes, ptag: int, payload: Sequence[Any], steps: Steps | None, in_place: bool) -> None:
        self.header = header
        self.ptag = ptag
        self.payload = payload
        self.steps = steps
        self.in_place = in_place


class RecvPlan:
    """Where one received message lands. Post every spec of ``payload`` on the payload communicator (from
    ``source``, with ``ptag``), then drive ``steps``; the receive then returns ``result``. A message this
    receive refuses has ``result`` None and ``steps`` that discard its payload, then raise why."""

    __slots__ = ("payload", "ptag", "result", "source", "steps")

    def __init__(self, result: Array | None, source: int, ptag: int, payload: Sequence[Any],
                 steps: Steps | None) -> None:
        self.result = result
        self.source = source
        self.ptag = ptag
        self.payload = payload
        self.steps = steps
