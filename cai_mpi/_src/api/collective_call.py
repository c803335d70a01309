"""What every collective call of the API does first: check the arguments they share (the communicator, the
root, the timeout) and find the runtime and the settings. The data-moving collectives (``collectives``,
``gathers``) and the reductions (``reductions``) all start here; the exchange that follows is
``transport.engine``'s. Also what the data-moving ones share: the fingerprint of their operation and root.
"""

from __future__ import annotations

from typing import Any

from mpi4py import MPI

from ..arrays.array import NO_TAG
from ..config import Config, config
from ..core.memo import Memo
from ..progress.deadlines import Deadline, deadline
from ..runtime import get_runtime
from ..runtime.base import Runtime
from ..transport.agreement import check_in_step, fingerprint
from ..transport.privcomm import PrivateComms
from .validation import PROC_NULL, check_comm, check_rank

__all__ = ["NO_TAG", "bytes_at", "checked_root", "common_fingerprint", "setup"]

# (NO_TAG: collectives have no tag, so the Arrays they return carry MPI's ANY_TAG, -1 on every MPI library)


def setup(fn: str, comm: Any, root: Any = None, timeout: Any = None) -> tuple[
    PrivateComms, MPI.Intracomm, int, Runtime, Config, Deadline | None
]:
    """Validate the arguments every collective shares: ``(private comms, the communicator to use, root (-1 for
    none), the runtime, the settings, the deadline for every rank to join)``; refuses a communicator whose
    collectives are out of step (one timed out on this rank)."""
    due = deadline(fn, timeout)
    pc = check_comm(fn, comm)
    intra = pc.header
    if not isinstance(intra, MPI.Intracomm):
        raise TypeError(f"{fn}: collectives need an intracommunicator, got an MPI.Intercomm")
    check_in_step(fn, pc)
    rank = -1 if root is None else _root(fn, root, pc)
    return pc, intra, rank, get_runtime(), config(), due


def _root(fn: str, root: Any, pc: PrivateComms) -> int:
    rank = check_rank(fn, "root", root, pc, wildcard=False)
    if rank == PROC_NULL:
        raise ValueError(f"{fn}: root must be a rank of the communicator, not PROC_NULL")
    return rank


def checked_root(fn: str, root: Any, pc: PrivateComms) -> tuple[int, Exception | None]:
    """``root`` checked without raising: a one-shot collective takes part in its vote whatever its arguments, so a
    bad root on one rank is an error on every rank (that rank's own, ``CollectiveMismatchError`` elsewhere), not a
    hang. ``(root, None)``, or ``(-1, the error)``."""
    try:
        return _root(fn, root, pc), None
    except (TypeError, ValueError) as exc:
        return -1, exc


# (a Memo, as every cache of descriptions: one entry per operation and root a program uses, bounded by
# CAI_MPI_MEMO_ENTRIES, where a plain dict grew with every root of a large world)
_COMMON: Memo[tuple[str, int], int] = Memo()


def common_fingerprint(fn: str, root: int) -> int:
    """The fingerprint of what every rank of ``fn`` must share: the operation and its root."""
    fp = _COMMON.get((fn, root))
    if fp is None:
        fp = _COMMON.remember((fn, root), fingerprint(f"{fn} root={root}"))
    return fp


def bytes_at(address: int, nbytes: int, readonly: bool = False) -> Any:
    """An MPI buffer over ``nbytes`` at ``address`` (over address 0 when empty)."""
    return MPI.buffer.fromaddress(address if nbytes else 0, nbytes, readonly=readonly)
