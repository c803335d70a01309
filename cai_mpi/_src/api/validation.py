"""Argument checks at the public boundary, once: each error names the function, the argument, what was
expected and what came. Past this module the code trusts its arguments."""

from __future__ import annotations

from typing import Any, Literal

import numpy as np
from mpi4py import MPI

from ..arrays.array import Array
from ..core.header import encode_meta
from ..runtime.base import Runtime
from ..transport import privcomm
from ..transport.privcomm import PrivateComms

__all__ = [
    "ANY_SOURCE", "ANY_TAG", "PROC_NULL", "check_comm", "check_device", "check_meta", "check_rank", "check_sync",
    "check_tag", "outgoing_meta", "receive_device",
]

ANY_SOURCE: int = MPI.ANY_SOURCE
ANY_TAG: int = MPI.ANY_TAG
PROC_NULL: int = MPI.PROC_NULL

Device = Literal["host"] | int | None


def check_comm(fn: str, comm: Any) -> PrivateComms:
    """cai_mpi's private communicators for ``comm`` (None: COMM_WORLD); the first use of another is collective."""
    if comm is None and (world := privcomm.WORLD) is not None:
        return world
    try:
        return privcomm.private_comms(comm)
    except (TypeError, ValueError, RuntimeError) as exc:
        raise type(exc)(f"{fn}: {exc}") from None


def _as_int(fn: str, name: str, value: Any) -> int:
    if isinstance(value, (int, np.integer)) and not isinstance(value, (bool, np.bool_)):
        return int(value)
    raise TypeError(f"{fn}: {name} must be an int, got {type(value).__name__} {value!r}")


def _shown(value: int, names: dict[int, str]) -> str:
    """A rank or tag for an error message: MPI's special values by name (their numbers differ between MPIs)."""
    return names.get(value, str(value))


_SPECIAL_RANKS = {ANY_SOURCE: "ANY_SOURCE", MPI.ROOT: "MPI.ROOT"}
_SPECIAL_TAGS = {ANY_TAG: "ANY_TAG"}


def check_rank(fn: str, name: str, value: Any, pc: PrivateComms, *, wildcard: bool) -> int:
    """A rank of ``pc``'s communicator, PROC_NULL, or (``wildcard``) ANY_SOURCE."""
    if type(value) is int and (0 <= value < pc.size or (wildcard and value == ANY_SOURCE)):
        return value
    rank = _as_int(fn, name, value)
    if 0 <= rank < pc.size or rank == PROC_NULL or (wildcard and rank == ANY_SOURCE):
        return rank
    allowed = "a rank, PROC_NULL or ANY_SOURCE" if wildcard else "a rank or PROC_NULL"
    raise ValueError(f"{fn}: {name}={_shown(rank, _SPECIAL_RANKS)} is not {allowed} of this communicator "
                     f"(size {pc.size})")


def check_tag(fn: str, value: Any, pc: PrivateComms, *, wildcard: bool, name: str = "tag") -> int:
    """A tag in 0..MPI.TAG_UB, or (``wildcard``) ANY_TAG."""
    if type(value) is int and (0 <= value <= pc.tag_ub or (wildcard and value == ANY_TAG)):
        return value
    tag = _as_int(fn, name, value)
    if 0 <= tag <= pc.tag_ub or (wildcard and tag == ANY_TAG):
        return tag
    raise ValueError(f"{fn}: {name}={_shown(tag, _SPECIAL_TAGS)} is outside 0..{pc.tag_ub} (MPI.TAG_UB)"
                     f"{' or ANY_TAG' if wildcard else ''}")


def check_device(fn: str, device: Any) -> Device:
    """None (a GPU when this rank has one, else host), "host", or a non-negative GPU ordinal."""
    if device is None or device == "host":
        return device  # type: ignore[no-any-return]
    if isinstance(device, (int, np.integer)) and not isinstance(device, (bool, np.bool_)) and device >= 0:
        return int(device)
    raise ValueError(f"{fn}: device must be None, 'host' or a GPU ordinal (an int >= 0), got {device!r}")


def receive_device(fn: str, device: Any, rt: Runtime) -> int | None:
    """The GPU ordinal a receive without ``out=`` lands on (``device=`` checked), or None for host memory."""
    device = check_device(fn, device)
    if device is None:
        return rt.current_device()
    if device == "host":
        return None
    count = rt.device_count()
    if device >= count:
        raise ValueError(
            f"{fn}: device={device}, but this rank has {count} usable GPU(s) (runtime {rt.name!r}); "
            "use device='host' or an ordinal below the count"
        )
    return int(device)


def check_meta(fn: str, meta: Any) -> bytes:
    """``meta`` encoded for the header (b"" for None); a bad one is a TypeError or ValueError naming ``fn``."""
    if meta is None:
        return b""
    try:
        return encode_meta(meta)
    except (TypeError, ValueError) as exc:
        raise type(exc)(f"{fn}: {exc}") from None


def outgoing_meta(fn: str, obj: Any, meta: Any) -> bytes:
    """The ``meta`` a send carries, encoded: ``meta=`` when given, else a forwarded ``Array``'s own (a received
    Array is forwarded as it is), else none."""
    if meta is None:
        if type(obj) is np.ndarray or not isinstance(obj, Array) or obj.meta is None:
            return b""  # (the common send: no call)
        meta = obj.meta
    return check_meta(fn, meta)


def check_sync(fn: str, sync: Any) -> bool | None:
    """None (follow CAI_MPI_SYNC), True or False."""
    if sync is None or sync is True or sync is False:
        return sync
    raise TypeError(f"{fn}: sync must be None, True or False, got {sync!r}")
