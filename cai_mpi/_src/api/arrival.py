"""Where the piece a data collective receives lands (``out=``, the caller's GPU, host memory, or a view of the slot
it came in), shared by ``bcast_array`` (``collectives.py``) and ``scatter_array``/``alltoall_array``
(``scatters.py``)."""

from __future__ import annotations

import ctypes
from typing import Any

import numpy as np

from ..arrays.array import Array
from ..arrays.operands import DeviceSource, Target, describe_target, mismatch, recv_target
from ..core.header import MessageInfo
from ..errors import RecvMismatchError
from ..runtime.base import Runtime
from ..transport import internal_stream
from ..transport.agreement import Contribution
from ..transport.contiguous import Landing, host_view
from ..transport.privcomm import PrivateComms
from ..transport.slots import Exchange
from .collective_call import NO_TAG
from .validation import receive_device

__all__ = ["land", "put", "receiver", "slot_view", "source_nbytes"]


def receiver(fn: str, out: Any, device: Any, rt: Runtime) -> tuple[Target | None, int | None, Exception | None]:
    """``out=`` or the default device, resolved without raising: a collective must take part whatever happens."""
    try:
        if out is not None:
            return recv_target(fn, out, rt), None, None
        return None, receive_device(fn, device, rt), None
    except Exception as exc:
        return None, None, exc


def land(
    fn: str, info: MessageInfo, target: Target | None, ordinal: int | None, trouble: Exception | None, source: int,
    pc: PrivateComms, rt: Runtime, held: bool,
) -> tuple[Landing, Exception | None]:
    """Where this rank's piece lands; on a bad ``out=`` a scratch buffer, and the error to raise afterwards.
    ``held``: MPI's write may be discarded or complete after a timeout, so it does not land in ``out=`` itself."""
    if trouble is None and target is not None:
        why = mismatch(target, info.shape, info.dtype)
        if why is not None:
            trouble = RecvMismatchError(
                f"{fn}: the piece from rank {source} ({info.describe()}) does not fit out= "
                f"({describe_target(target)}): {why}; it was received and discarded"
            )
    if trouble is not None:
        scratch = np.empty(max(info.payload_nbytes, 1), np.uint8)
        return Landing(scratch.ctypes.data, info.payload_nbytes, lambda: Array.from_host(scratch)), trouble
    return Landing.plan(info, target, ordinal, source, NO_TAG, rt, direct=pc.aware.aware, held=held), None


def put(landing: Landing, payload: np.ndarray[Any, Any], rt: Runtime, ordinal: int | None) -> None:
    """Write a payload carried in the description's slot (``payload``: its bytes) where ``landing`` wants it."""
    n = payload.nbytes
    if not n:
        return
    if landing.device and ordinal is not None:
        stream = internal_stream(rt, ordinal)
        rt.copy_async(landing.address, payload.ctypes.data, n, stream)
        rt.record_event(stream).synchronize()
    else:
        ctypes.memmove(landing.address, payload.ctypes.data, n)


def slot_view(ex: Exchange, i: int, info: MessageInfo) -> np.ndarray[Any, Any]:
    """Piece ``i``'s payload as an array over the exchange's own buffer (no copy)."""
    return host_view(ex.slots, info.dtype, info.shape, ex.start(i), info.fortran)


def source_nbytes(c: Contribution) -> int:
    """The payload bytes of a contribution (0 when it has no source: a failure, or nothing to send)."""
    src: np.ndarray[Any, Any] | DeviceSource | None = c.source
    return 0 if src is None else (src.nbytes if isinstance(src, np.ndarray) else src.desc.nbytes)
