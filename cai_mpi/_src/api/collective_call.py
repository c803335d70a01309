"""What every collective call of the API does first: check the arguments they share (the communicator, the
root, the timeout) and find the runtime and the settings. The data-moving collectives (``collectives``) and
the reductions (``reductions``) both start here; the exchange that follows is ``transport.agreement``'s.
"""

from __future__ import annotations

from typing import Any

from mpi4py import MPI

from ..arrays.array import NO_TAG
from ..config import Config, config
from ..progress.deadlines import Deadline, deadline
from ..runtime import get_runtime
from ..runtime.base import Runtime
from ..transport.privcomm import PrivateComms
from .validation import PROC_NULL, check_comm, check_rank

__all__ = ["NO_TAG", "setup"]

# (NO_TAG: collectives have no tag, so the Arrays they return carry MPI's ANY_TAG, -1 on every MPI library)


def setup(fn: str, comm: Any, root: Any = None, timeout: Any = None) -> tuple[
    PrivateComms, MPI.Intracomm, int, Runtime, Config, Deadline | None
]:
    """Validate the arguments every collective shares: ``(private comms, the communicator to use, root (-1 for
    none), the runtime, the settings, the deadline for every rank to join)``."""
    due = deadline(fn, timeout)
    pc = check_comm(fn, comm)
    intra = pc.header
    if not isinstance(intra, MPI.Intracomm):
        raise TypeError(f"{fn}: collectives need an intracommunicator, got an MPI.Intercomm")
    rank = -1
    if root is not None:
        rank = check_rank(fn, "root", root, pc, wildcard=False)
        if rank == PROC_NULL:
            raise ValueError(f"{fn}: root must be a rank of the communicator, not PROC_NULL")
    return pc, intra, rank, get_runtime(), config(), due
