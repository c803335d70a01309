"""What the ranks of a collective tell each other before (or instead of) moving payloads: each contribution's
description (a cai_mpi header without payload tag), or why a rank has nothing to contribute.

The exchange is one collective of fixed-size slots (``SLOT_BYTES`` per rank: an ``Allgather``, or the root's
``Bcast``). A slot holds a short prefix, the header, and, when the whole contribution fits, the payload too
(host data only): when every rank's fits, that one collective was the whole operation. The prefix says so
(``fused``), so every rank reads the same answer from the same bytes and takes the same path without another
message; otherwise the headers longer than a slot send their rest, then MPI's collective moves the payloads.

Every rank takes part in every step whatever went wrong locally, so a bad argument on one rank becomes an
error on every rank instead of a hang: the rank that failed raises its own exception, the others raise
``CollectiveMismatchError`` naming it.
"""

from __future__ import annotations

import struct
from collections.abc import Callable, Sequence
from typing import Any, cast

import numpy as np
from mpi4py import MPI

from ..arrays.operands import DeviceSource
from ..core.header import MessageInfo, decode, encode_header
from ..errors import CollectiveMismatchError
from ..progress.deadlines import Deadline, collective_expired
from ..progress.driving import complete_by
from ..progress.requests import PostedRequest
from ..progress.waits import MPIWait

__all__ = [
    "SLOT_BYTES", "Contribution", "Exchange", "broadcast", "describe_source", "exchange", "joined", "pack",
    "payload_room", "raise_failures", "read", "unpack",
]

_ERROR = b"\x00ERR"  # starts a failure's text; the headers exchanged here have payload tag 0: four NULs
_UNLIMITED = 1 << 62
#: Bytes per rank of the exchange: a contribution whose prefix, header and payload fit travels whole in it.
#: The same on every rank (a constant, not a setting); docs/benchmarks.md has the measurement that chose it.
SLOT_BYTES = 1024
_HEAD = struct.Struct("<iiq")  # the length of the header (or failure text), flags, the payload's bytes
_FUSED = 1  # the slot holds all of this rank's contribution: its header and its payload
_ALIGN = 16  # a payload in a slot starts at a multiple of this (any dtype's alignment; slots are 64-aligned)
ROOM = SLOT_BYTES - _HEAD.size  # header bytes a slot carries


class Contribution:
    """One rank's part of a collective: its description (``blob``: a header, or a failure's text), the
    source it describes, and the exception when it has none."""

    __slots__ = ("blob", "error", "source")

    def __init__(self, blob: bytes, source: Any = None, error: BaseException | None = None) -> None:
        self.blob, self.source, self.error = blob, source, error

    @classmethod
    def attempt(cls, describe: Callable[[], tuple[bytes, Any]]) -> Contribution:
        """``describe()`` -> ``(header, source)``; an exception becomes a failure every rank will hear of."""
        try:
            blob, source = describe()
        except Exception as exc:
            return cls.failed(exc)
        return cls(blob, source)

    @classmethod
    def failed(cls, exc: BaseException) -> Contribution:
        """A rank that has nothing to contribute, and why."""
        return cls(_ERROR + f"{type(exc).__name__}: {exc}".encode(errors="replace"), None, exc)


def _fortran(src: np.ndarray[Any, Any]) -> bool:
    """Does host array ``src`` travel in F order (F-contiguous and not C-contiguous; C order otherwise)?"""
    return src.ndim > 1 and not src.flags.c_contiguous and src.flags.f_contiguous


def describe_source(src: np.ndarray[Any, Any] | DeviceSource, meta: bytes = b"") -> bytes:
    """The header that describes ``src`` (its dtype, shape and wire order, plus ``meta``)."""
    if isinstance(src, np.ndarray):
        dtype, shape = src.dtype, src.shape
        fortran = _fortran(src)
    else:
        desc = src.desc
        dtype, shape = desc.dtype, desc.shape
        fortran = not desc.is_c_contiguous and desc.is_f_contiguous
    return encode_header(dtype, shape, fortran=fortran, payload_tag=0, meta_bytes=meta)


def read(blob: bytes) -> MessageInfo | str:
    """A contribution's description: the decoded header, or the text of the failure it reports."""
    known = _seen.get(blob)
    if known is not None:
        return known
    if blob.startswith(_ERROR):
        return blob[len(_ERROR):].decode(errors="replace")
    info, _tag = decode(blob, len(blob), _UNLIMITED)
    if info.meta is None and len(blob) <= ROOM:  # (a meta dict is the receiver's to change: never shared)
        if len(_seen) >= 256:
            _seen.clear()
        _seen[blob] = info
    return info


# Headers seen before, whole (collective headers have payload tag 0, so the bytes are the key): one call after
# another describes the same arrays, and this lookup is cheaper than decoding (even the decoder's cached path).
_seen: dict[bytes, MessageInfo] = {}


def raise_failures(fn: str, described: Sequence[MessageInfo | str | None], mine: Contribution, rank: int) -> None:
    """After an exchange: if any rank could not contribute, raise on this one (its own exception on the rank
    that failed, CollectiveMismatchError naming the failed ranks on the others)."""
    if mine.error is not None:
        raise mine.error
    failed = {r: d for r, d in enumerate(described) if isinstance(d, str)}
    if failed:
        detail = "; ".join(f"rank {r}: {text}" for r, text in sorted(failed.items()))
        raise CollectiveMismatchError(f"{fn}: {len(failed)} rank(s) could not take part ({detail})")


def pack(blobs: Sequence[bytes]) -> tuple[bytes, list[int], list[int]]:
    """Blobs back to back: ``(data, counts, displacements)``."""
    counts = [len(b) for b in blobs]
    displs = [sum(counts[:i]) for i in range(len(counts))]
    return b"".join(blobs), counts, displs


def unpack(data: bytes | bytearray, counts: Sequence[int]) -> list[bytes]:
    out, off = [], 0
    for n in counts:
        out.append(bytes(data[off : off + n]))
        off += n
    return out


def joined(fn: str, comm: MPI.Intracomm, due: Deadline | None, collective: str, *args: Any) -> None:
    """A collective's first step, where every rank must arrive: ``comm.<collective>(*args)``; with a deadline its
    nonblocking form, which is abandoned (its buffers kept alive) with TimeoutError if some rank has not come."""
    if due is None:
        getattr(comm, collective)(*args)
        return
    req = getattr(comm, "I" + collective[0].lower() + collective[1:])(*args)
    if not complete_by(MPIWait([req]), due):
        error = collective_expired(fn, comm, due)
        PostedRequest([req], None, keep=args)._abandon(error)
        raise error


# -- slots ----------------------------------------------------------------------------------------------------


def _payload_at(nblob: int) -> int:
    """Where a payload starts in a slot whose header is ``nblob`` bytes long."""
    return -(-(_HEAD.size + nblob) // _ALIGN) * _ALIGN


def payload_room(header_nbytes: int) -> int:
    """The most payload bytes a slot carries with a header of ``header_nbytes`` (a larger payload, or a longer
    header, takes the path of MPI's own collective)."""
    return SLOT_BYTES - _payload_at(header_nbytes)


def _fill(slots: memoryview, at: int, mine: Contribution, nbytes: int, payload: np.ndarray[Any, Any] | None,
          c_order: bool) -> bool:
    """Write ``mine`` into the slot at byte ``at``: its prefix, its header's start and, when the whole fits and a
    host ``payload`` is given, the payload's bytes in wire order (``describe_source``'s, or C order). Returns
    whether the whole did fit."""
    blob = mine.blob
    nblob = len(blob)
    start = _payload_at(nblob)
    fused = (mine.error is not None and nblob <= ROOM) or (payload is not None and start + nbytes <= SLOT_BYTES)
    _HEAD.pack_into(slots, at, nblob, _FUSED if fused else 0, nbytes)
    head = at + _HEAD.size
    slots[head : head + min(nblob, ROOM)] = blob if nblob <= ROOM else blob[:ROOM]
    if fused and payload is not None and nbytes:
        slots[at + start : at + start + nbytes] = payload.tobytes("F" if not c_order and _fortran(payload) else "C")
    return fused


class Exchange:
    """What one exchange told every rank: each rank's description (``described``: a MessageInfo, or a failure's
    text), its payload size, and whether every contribution travelled whole (``fused``): then ``payload(r)``
    is rank r's payload bytes, in the slots this exchange received."""

    __slots__ = ("_starts", "alike", "described", "fused", "sizes", "slots")

    def __init__(self, slots: np.ndarray[Any, Any], described: list[MessageInfo | str], sizes: list[int],
                 starts: list[int], fused: bool, alike: bool = False) -> None:
        self.slots, self.described, self.sizes, self._starts, self.fused = slots, described, sizes, starts, fused
        #: every rank's slot starts with this rank's bytes: one header (no failure, no meta), one payload size
        self.alike = alike

    def payload(self, rank: int) -> np.ndarray[Any, Any]:
        """Rank ``rank``'s payload bytes."""
        at = self._starts[rank]
        return self.slots[at : at + self.sizes[rank]]

    def start(self, rank: int) -> int:
        """Where rank ``rank``'s payload starts in ``slots``."""
        return self._starts[rank]

    def infos(self) -> list[MessageInfo]:
        """The descriptions, once ``raise_failures`` has found no failure among them."""
        return cast("list[MessageInfo]", self.described)


def _read_slots(slots: memoryview, count: int) -> tuple[
    list[MessageInfo | str], dict[int, bytes], list[int], list[int], bool
]:
    """Each slot's description (the start of it, by rank, where a header is longer than a slot), payload size and
    payload offset; and whether every slot holds its whole contribution."""
    described: list[MessageInfo | str] = []
    longer: dict[int, bytes] = {}
    sizes, starts, fused = [], [], True
    unpack_from, head = _HEAD.unpack_from, _HEAD.size
    for at in range(0, count * SLOT_BYTES, SLOT_BYTES):
        nblob, flags, nbytes = unpack_from(slots, at)
        blob = bytes(slots[at + head : at + head + min(nblob, ROOM)])
        if nblob > ROOM:
            longer[len(described)] = blob
        described.append(read(blob) if nblob <= ROOM else "")
        sizes.append(nbytes)
        starts.append(at + _payload_at(nblob))
        fused = fused and flags == _FUSED
    return described, longer, sizes, starts, fused


def _alike(slots: np.ndarray[Any, Any], view: memoryview, at: int, blob: bytes, size: int) -> Exchange | None:
    """The exchange when every slot starts as this rank's own (at byte ``at``) and its header was decoded before:
    one comparison per slot instead of a copy and a lookup (the ranks of a reduction, or of a gather of
    same-shaped arrays, describe the same thing). None otherwise: then each slot is read on its own."""
    info = _seen.get(blob)
    if info is None:  # (never a failure's text, a header with meta, or one longer than a slot)
        return None
    n = _HEAD.size + len(blob)  # the prefix (header length, flags, payload size) and the header
    own = view[at : at + n]
    for other in range(0, size * SLOT_BYTES, SLOT_BYTES):
        if other != at and view[other : other + n] != own:
            return None
    _nblob, flags, nbytes = _HEAD.unpack_from(view, at)
    start = _payload_at(len(blob))
    return Exchange(slots, [info] * size, [nbytes] * size, list(range(start, size * SLOT_BYTES, SLOT_BYTES)),
                    flags == _FUSED, alike=True)


def exchange(
    fn: str, comm: MPI.Intracomm, mine: Contribution, nbytes: int, due: Deadline | None, *,
    payload: np.ndarray[Any, Any] | None = None, c_order: bool = False,
) -> Exchange:
    """Every rank's contribution, everywhere: one ``Allgather`` of slots (``payload``: this rank's host data of
    ``nbytes`` bytes, carried when it fits, in ``describe_source``'s order or, with ``c_order``, in C order), and
    an ``Allgatherv`` of the headers longer than a slot, if any."""
    size = comm.Get_size()
    slots = np.empty(SLOT_BYTES * size, np.uint8)
    view, at = slots.data, comm.Get_rank() * SLOT_BYTES
    _fill(view, at, mine, nbytes, payload, c_order)
    if due is None:
        comm.Allgather(MPI.IN_PLACE, [slots, SLOT_BYTES, MPI.BYTE])
    else:
        joined(fn, comm, due, "Allgather", MPI.IN_PLACE, [slots, SLOT_BYTES, MPI.BYTE])
    same = _alike(slots, view, at, mine.blob, size)
    if same is not None:
        return same
    described, longer, sizes, starts, fused = _read_slots(view, size)
    if longer:  # long headers (meta, structured dtypes) or failure texts: their rest
        lengths = [_HEAD.unpack_from(slots.data, r * SLOT_BYTES)[0] for r in range(size)]
        counts = [max(n - ROOM, 0) for n in lengths]
        rest = bytearray(max(sum(counts), 1))
        displs = [sum(counts[:i]) for i in range(size)]
        comm.Allgatherv(mine.blob[ROOM:], [rest, (counts, displs), MPI.BYTE])
        for r, tail in enumerate(unpack(rest, counts)):
            if r in longer:
                described[r] = read(longer[r] + tail)
    return Exchange(slots, described, sizes, starts, fused)


def broadcast(
    fn: str, comm: MPI.Intracomm, root: int, mine: Contribution, nbytes: int, due: Deadline | None, *,
    payload: np.ndarray[Any, Any] | None = None,
) -> Exchange:
    """The root's contribution, everywhere: one ``Bcast`` of the root's slot (with its host ``payload`` when it
    fits), and a second of the rest of a header longer than a slot, if it is."""
    slot = np.empty(SLOT_BYTES, np.uint8)
    if comm.Get_rank() == root:  # (the root knows what it sends: it reads nothing back)
        fused = _fill(slot.data, 0, mine, nbytes, payload, False)
        if due is None:
            comm.Bcast([slot, SLOT_BYTES, MPI.BYTE], root)
        else:
            joined(fn, comm, due, "Bcast", [slot, SLOT_BYTES, MPI.BYTE], root)
        if len(mine.blob) > ROOM:
            comm.Bcast(bytearray(mine.blob[ROOM:]), root)
        return Exchange(slot, [read(mine.blob)], [nbytes], [_payload_at(len(mine.blob))], fused)
    if due is None:
        comm.Bcast([slot, SLOT_BYTES, MPI.BYTE], root)
    else:
        joined(fn, comm, due, "Bcast", [slot, SLOT_BYTES, MPI.BYTE], root)
    described, longer, sizes, starts, fused = _read_slots(slot.data, 1)
    if longer:
        rest = bytearray(_HEAD.unpack_from(slot.data, 0)[0] - ROOM)
        comm.Bcast(rest, root)
        described = [read(longer[0] + bytes(rest))]
    return Exchange(slot, described, sizes, starts, fused)
