"""cai_mpi's private duplicates of each user communicator, cached on it with MPI attribute caching."""

from __future__ import annotations

import itertools
import threading
from typing import TYPE_CHECKING, Any

from mpi4py import MPI

from .detect import CudaAwareness, agree, detect_local

if TYPE_CHECKING:
    from .signature import Signature

__all__ = ["WORLD", "PrivateComms", "cuda_aware", "init_world", "private_comms"]


class PrivateComms:
    """The two private duplicates cai_mpi uses for one user communicator.

    Headers travel on ``header`` with the user's tag, so ``source``/``tag``
    and ANY_SOURCE/ANY_TAG keep their mpi4py meaning; payloads travel on
    ``payload`` with a per-message tag, so no header receive (even ANY_TAG
    in another thread) can ever match a payload.
    """

    __slots__ = ("__weakref__", "_tags", "agreed", "aware", "header", "out_of_step", "payload", "size", "tag_ub")

    def __init__(self, comm: MPI.Comm) -> None:
        self.header: MPI.Comm = comm.Dup()
        self.payload: MPI.Comm = comm.Dup()
        self.header.Set_name(f"cai_mpi-header({comm.Get_name()})")
        self.payload.Set_name(f"cai_mpi-payload({comm.Get_name()})")
        tag_ub = comm.Get_attr(MPI.TAG_UB)
        self.tag_ub: int = int(tag_ub) if tag_ub is not None else 32767
        self._tags = itertools.count()
        self.size: int = comm.Get_remote_size() if isinstance(comm, MPI.Intercomm) else comm.Get_size()
        # Both sides of a message must pick compatible routes: agree once, here, while collective.
        comm_for_agreement = self.header if not self.header.Is_inter() else None
        local = detect_local()
        self.aware: CudaAwareness = agree(comm_for_agreement, local) if comm_for_agreement else local
        #: the signature each kind of one-shot collective last agreed on, by kind (``transport.engine``): the
        #: same on every rank, since it was agreed
        self.agreed: dict[str, Signature] = {}
        #: why this communicator's collectives are out of step (a collective timed out on this rank), or None
        self.out_of_step: str | None = None

    def next_payload_tag(self) -> int:
        # itertools.count is atomic under the GIL; wrapping needs tag_ub messages in flight to collide.
        return next(self._tags) % self.tag_ub

    def free(self) -> None:
        for c in (self.header, self.payload):
            if c != MPI.COMM_NULL and not MPI.Is_finalized():
                c.Free()


def _delete_attr(comm: MPI.Comm, keyval: int, pc: Any) -> None:
    global _last
    if isinstance(pc, PrivateComms):
        _last = _NONE  # (before the duplicates go: no look-up may find them afterwards)
        pc.free()


#: The attribute key under which a communicator keeps its private duplicates, made by the first ``_attach`` (an
#: application may import cai_mpi before it initializes MPI); until then no communicator has any.
_keyval: int | None = None
_create_lock = threading.Lock()
#: The last communicator other than COMM_WORLD looked up and its duplicates: a program passes the same ``comm`` call
#: after call, and MPI's attribute look-up costs more than the rest of a call's checks. Forgotten whenever any
#: communicator's duplicates are freed (``_delete_attr``, which MPI calls when the user frees a communicator).
_NONE: tuple[Any, Any] = (None, None)
_last: tuple[MPI.Comm | None, PrivateComms | None] = _NONE
#: COMM_WORLD's private communicators once made (``init_world``), else None: a module attribute, not a function,
#: since every call on COMM_WORLD reads it.
WORLD: PrivateComms | None = None


def init_world() -> None:
    """Duplicate COMM_WORLD now (at import, when every rank imports cai_mpi), if MPI is initialized."""
    global WORLD
    if WORLD is None and MPI.Is_initialized() and not MPI.Is_finalized():
        WORLD = _attach(MPI.COMM_WORLD)


def _attach(comm: MPI.Comm) -> PrivateComms:
    global _keyval
    with _create_lock:  # (one key and one set of duplicates, whichever thread comes first)
        if _keyval is None:
            _keyval = MPI.Comm.Create_keyval(delete_fn=_delete_attr)
        pc = comm.Get_attr(_keyval)
        if not isinstance(pc, PrivateComms):
            pc = PrivateComms(comm)
            comm.Set_attr(_keyval, pc)
        return pc


def private_comms(comm: MPI.Comm | None) -> PrivateComms:
    """The private duplicates of ``comm`` (None: COMM_WORLD).

    For a communicator other than COMM_WORLD the first call is collective
    over that communicator (it duplicates it twice).
    """
    if comm is None or comm is MPI.COMM_WORLD:
        if WORLD is None:
            init_world()
            if WORLD is None:
                raise RuntimeError("MPI is not initialized (or already finalized): call MPI.Init() first")
        return WORLD
    global _last
    last, known = _last
    if comm is last:
        assert known is not None
        return known
    if not isinstance(comm, MPI.Comm):
        raise TypeError(f"comm must be an mpi4py MPI.Comm or None, got {type(comm).__name__}")
    if comm == MPI.COMM_NULL:
        raise ValueError("comm is MPI.COMM_NULL")
    key = _keyval
    pc = None if key is None else comm.Get_attr(key)
    if not isinstance(pc, PrivateComms):
        pc = _attach(comm)
    _last = (comm, pc)
    return pc


def cuda_aware(comm: MPI.Comm | None = None) -> CudaAwareness:
    """Is the MPI library CUDA-aware for ``comm``? Detected once per communicator and agreed by all ranks.

    Args:
        comm: None for COMM_WORLD; the first call for any other communicator is collective over it.

    Returns:
        A CudaAwareness: ``aware`` (also its truth value), where the answer came from (``source``), the
        MPI library and a sentence on what it means for device buffers.

    Raises:
        ValueError: CAI_MPI_CUDA_AWARE is set to something other than a yes or no.
    """
    return private_comms(comm).aware
