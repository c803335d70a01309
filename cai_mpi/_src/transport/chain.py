"""A chain of described streams over the ranks of a communicator, rank r to rank r + 1 (a ``Pipeline``'s wire).

The chain owns every MPI resource of it: two duplicates of the user's communicator (data: the streams' items;
control: credits, notices and the leaving agreement), each rank's two edges (``StreamOut`` to the next rank,
``StreamIn`` from the previous one), its ``Notices``, and the collective steps that open it (the duplicates and
the bare-payload handshake) and close it (one ``Iallgather`` of each rank's counts, then freeing the duplicates), or
abandon it (a rank that gives up tells every other one, so none waits for its part of the close).
What the counts mean, and when to credit, is the owner's.
"""

from __future__ import annotations

from typing import Any

import numpy as np
from mpi4py import MPI

from ..progress.posted import PostedRequest
from .notices import Notices
from .privcomm import private_comms
from .stream import StreamIn, StreamOut, exchange_bare_ok

__all__ = ["Chain"]

ABANDONED = 3  # the tag of an empty control message: "this rank abandoned the chain" (the stream's use 0 and 2)


class Chain:
    """This rank's place in a chain over ``comm`` (collective: every rank of ``comm`` makes its own).

    ``name`` is the owner's, for errors about an item (``<name>.send``, ``<name>.recv``); ``takes_bare``: this rank
    receives into host memory. ``down``/``up``: the edges (None at the last/first rank); ``notices``: tag
    ``notice_tag`` of the control communicator, at most ``notice_bytes`` each.
    """

    def __init__(self, comm: MPI.Intracomm, *, name: str, window: int, takes_bare: bool, notice_tag: int,
                 notice_bytes: int) -> None:
        self.rank, self.size = comm.Get_rank(), comm.Get_size()
        self._data, self._control = data, control = comm.Dup(), comm.Dup()
        data.Set_name(f"cai_mpi-pipeline-data({comm.Get_name()})")
        control.Set_name(f"cai_mpi-pipeline-control({comm.Get_name()})")
        private_comms(data)  # collective on first use: make it now, while every rank is here
        previous = MPI.PROC_NULL if self.rank == 0 else self.rank - 1
        following = MPI.PROC_NULL if self.rank == self.size - 1 else self.rank + 1
        # Bare payloads go only to a rank that receives into host memory: it says so once.
        bare = exchange_bare_ok(control, previous, following, takes_bare)
        self.down: StreamOut | None = None if following == MPI.PROC_NULL else StreamOut(
            data, control, following, bare=bare, window=window, fn=f"{name}.send")
        self.up: StreamIn | None = None if previous == MPI.PROC_NULL else StreamIn(
            data, control, previous, fn=f"{name}.recv")
        self.notices = Notices(control, notice_tag, notice_bytes)
        self._agreement: tuple[MPI.Request, np.ndarray[Any, Any], np.ndarray[Any, Any]] | None = None

    def agree(self, mine: np.ndarray[Any, Any]) -> np.ndarray[Any, Any]:
        """Start gathering every rank's ``mine`` (int64 counts, collective): where row r will hold rank r's once
        ``agreed()``."""
        everyone = np.empty((self.size, len(mine)), np.int64)
        self._agreement = (self._control.Iallgather(mine, everyone), mine, everyone)
        return everyone

    def agreed(self) -> bool:
        assert self._agreement is not None
        return bool(self._agreement[0].Test())

    def free(self) -> None:
        """Free the duplicates (collective; every edge settled)."""
        self._data.Free()
        self._control.Free()

    def abandoned(self) -> int | None:
        """A rank that abandoned the chain (it will do nothing more for it), if one said so."""
        status = MPI.Status()
        return status.Get_source() if self._control.Iprobe(MPI.ANY_SOURCE, ABANDONED, status) else None

    def abandon(self, error: BaseException) -> None:
        """Out of step with the other ranks: tell every other rank (``abandoned``); what MPI may still touch
        finishes in the background (the agreement, which completes if the others come later; the control messages
        in flight); this rank's receives are withdrawn; the duplicates are left as they are (never freed: so their
        context, and a late message on it, is never reused)."""
        control = self._control
        told = [control.Isend([b"", MPI.BYTE], rank, ABANDONED) for rank in range(self.size) if rank != self.rank]
        PostedRequest(told, None).abandon(error)
        agreement = self._agreement
        if agreement is not None:
            PostedRequest([agreement[0]], None, keep=agreement[1:]).abandon(error)
        self.notices.abandon(error)
        if self.down is not None:
            self.down.abandon(error)
        if self.up is not None:
            self.up.abandon(error)
