"""The fixed-size slots a collective's descriptions travel in, once a vote has seen every rank arrive.

A slot starts with a 16-byte head (the length of the header or failure text, flags, the payload's bytes), then as
much of the header as fits, then, 16-aligned, the payload when the whole contribution fits (``FUSED``). Every rank
reads the same head, so every rank takes the same next step: nothing more, the rest of a long header, or a payload
collective. ``bcast_array`` sends the root's slot (``broadcast``); ``scatter_array`` one slot per rank
(``scatter``) and ``alltoall_array`` one per pair (``exchange``), smaller (``PIECE``), because their count
multiplies with the world's.
"""

from __future__ import annotations

import struct
from collections.abc import Sequence
from typing import Any, cast

import numpy as np
from mpi4py import MPI

from ..core.header import MessageInfo
from .agreement import Contribution, Joined, fortran_order, pack, read, unpack

__all__ = ["BROADCAST", "PIECE", "Dealt", "Exchange", "Slots", "broadcast", "exchange", "scatter"]

_HEAD = struct.Struct("<iiq")  # the length of the header (or failure text), flags, the payload's bytes
_FUSED = 1  # the slot holds all of this rank's contribution: its header and its payload
_ALIGN = 16  # a payload in a slot starts at a multiple of this (any dtype's alignment; slots are 64-aligned)


def _payload_at(nblob: int) -> int:
    """Where a payload starts in a slot whose header is ``nblob`` bytes long."""
    return -(-(_HEAD.size + nblob) // _ALIGN) * _ALIGN


class Slots:
    """A slot size, and the layout of a contribution in slots of that size. The same on every rank (a constant,
    not a setting), or ranks would read each other's slots at different places."""

    __slots__ = ("room", "size")

    def __init__(self, size: int) -> None:
        self.size = size
        self.room = size - _HEAD.size  # header bytes a slot carries

    def payload_room(self, header_nbytes: int) -> int:
        """The most payload bytes a slot carries with a header of ``header_nbytes`` (a larger payload, or a longer
        header, takes the path of MPI's own collective)."""
        return self.size - _payload_at(header_nbytes)

    def fill(self, slots: memoryview, at: int, mine: Contribution, nbytes: int,
             payload: np.ndarray[Any, Any] | None, c_order: bool) -> bool:
        """Write ``mine`` into the slot at byte ``at``: its head, its header's start and, when the whole fits and a
        host ``payload`` is given, the payload's bytes in wire order (``describe_source``'s, or C order). Returns
        whether the whole did fit."""
        blob = mine.blob
        nblob, room = len(blob), self.room
        start = _payload_at(nblob)
        fused = (mine.error is not None and nblob <= room) or (payload is not None and start + nbytes <= self.size)
        _HEAD.pack_into(slots, at, nblob, _FUSED if fused else 0, nbytes)
        head = at + _HEAD.size
        slots[head : head + min(nblob, room)] = blob if nblob <= room else blob[:room]
        if fused and payload is not None and nbytes:
            wire = payload.tobytes("F" if not c_order and fortran_order(payload) else "C")
            slots[at + start : at + start + nbytes] = wire
        return fused

    def read(self, slots: memoryview, count: int) -> tuple[
        list[MessageInfo | str], dict[int, bytes], list[int], list[int], bool
    ]:
        """Each of ``count`` slots' description (the start of it, by rank, where a header is longer than a slot),
        payload size and payload offset; and whether every slot holds its whole contribution."""
        described: list[MessageInfo | str] = []
        longer: dict[int, bytes] = {}
        sizes, starts, fused = [], [], True
        unpack_from, head, room = _HEAD.unpack_from, _HEAD.size, self.room
        for at in range(0, count * self.size, self.size):
            nblob, flags, nbytes = unpack_from(slots, at)
            blob = bytes(slots[at + head : at + head + min(nblob, room)])
            if nblob > room:
                longer[len(described)] = blob
            described.append(read(blob) if nblob <= room else "")
            sizes.append(nbytes)
            starts.append(at + _payload_at(nblob))
            fused = fused and flags == _FUSED
        return described, longer, sizes, starts, fused

    def marks(self, slots: memoryview, i: int) -> int:
        """The flags in slot ``i``'s head."""
        return int(_HEAD.unpack_from(slots, i * self.size)[1])

    def long_rest(self, slots: memoryview, i: int) -> int:
        """How many bytes of the header in slot ``i`` did not fit it."""
        return max(int(_HEAD.unpack_from(slots, i * self.size)[0]) - self.room, 0)


#: ``bcast_array``'s slot: the root's contribution travels whole in it when its head, header and payload fit.
#: docs/benchmarks-history.md has the measurement that chose the size.
BROADCAST = Slots(1024)
#: The slot of each piece of a ``scatter`` or an ``exchange`` (an alltoall): one per rank or per pair, so its size
#: multiplies with the world's; it carries a header (51 B for a vector) and a payload of up to 48 B with it.
PIECE = Slots(128)


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


def broadcast(
    steps: Joined, root: int, mine: Contribution, nbytes: int, *, payload: np.ndarray[Any, Any] | None = None,
) -> Exchange:
    """The root's description, everywhere: one ``Bcast`` of the root's slot (with its host ``payload`` when it
    fits), and a second of the rest of a header longer than a slot, if it is."""
    size, room = BROADCAST.size, BROADCAST.room
    slot = np.empty(size, np.uint8)
    if steps.comm.Get_rank() == root:  # (the root knows what it sends: it reads nothing back)
        fused = BROADCAST.fill(slot.data, 0, mine, nbytes, payload, False)
        steps("Bcast", [slot, size, MPI.BYTE], root)
        if len(mine.blob) > room:
            steps("Bcast", bytearray(mine.blob[room:]), root)
        return Exchange(slot, [read(mine.blob)], [nbytes], [_payload_at(len(mine.blob))], fused)
    steps("Bcast", [slot, size, MPI.BYTE], root)
    described, longer, sizes, starts, fused = BROADCAST.read(slot.data, 1)
    if longer:
        rest = bytearray(BROADCAST.long_rest(slot.data, 0))
        steps("Bcast", rest, root)
        described = [read(longer[0] + bytes(rest))]
    return Exchange(slot, described, sizes, starts, fused)


#: (in the slots of ``scatter`` and ``exchange``: what the sender says of every slot it sends in the collective,
#: so every rank that hears from it takes the same next steps) some slot of this sender's does not hold its whole
#: contribution: a payload collective follows; some header (or failure text) of this sender's is longer than a slot:
#: its rest follows
_APART, _LONG = 2, 4


class Dealt(Exchange):
    """What a ``scatter`` or an ``exchange`` of slots told this rank: for each rank it heard from (``described`` and
    the rest, by position), whether its slot held the whole contribution (``whole``: then ``payload(i)`` is in
    ``slots``); whether each slot this rank sent held its whole (``sent``, by destination); and, the same on every
    rank, whether any piece of the collective travels apart from its slot (``apart``: a payload collective
    follows)."""

    __slots__ = ("apart", "sent", "whole")

    def __init__(self, slots: np.ndarray[Any, Any], described: list[MessageInfo | str], sizes: list[int],
                 starts: list[int], whole: list[bool], sent: list[bool], apart: bool) -> None:
        super().__init__(slots, described, sizes, starts, all(whole))
        self.whole, self.sent, self.apart = whole, sent, apart


def _deal(slots: np.ndarray[Any, Any], parts: Sequence[Contribution], sizes: Sequence[int],
          payloads: Sequence[np.ndarray[Any, Any] | None]) -> tuple[list[bool], int]:
    """One slot per destination (``PIECE.fill``), each then marked with what the sender says of all of them
    (``_APART``, ``_LONG``): ``(which held their whole contribution, those marks)``."""
    view, size = slots.data, PIECE.size
    sent = [PIECE.fill(view, i * size, c, n, p, False)
            for i, (c, n, p) in enumerate(zip(parts, sizes, payloads, strict=True))]
    marks = (0 if all(sent) else _APART) | (_LONG if any(len(c.blob) > PIECE.room for c in parts) else 0)
    if marks:
        for i, whole in enumerate(sent):
            _HEAD.pack_into(view, i * size, len(parts[i].blob), marks | (_FUSED if whole else 0), sizes[i])
    return sent, marks


def _rests(parts: Sequence[Contribution]) -> tuple[bytes, list[int], list[int]]:
    """The rest of each header longer than a slot, back to back: ``(data, counts, displacements)``."""
    return pack([c.blob[PIECE.room:] for c in parts])


def _heard(slots: np.ndarray[Any, Any], count: int, rests: bytes | bytearray | None, rcounts: Sequence[int]) -> tuple[
    list[MessageInfo | str], list[int], list[int], list[bool]
]:
    """``count`` slots received, read (with ``rests``: the rests of the long headers, ``rcounts`` bytes each)."""
    described, longer, sizes, starts, _fused = PIECE.read(slots.data, count)
    if longer:
        assert rests is not None
        for i, rest in enumerate(unpack(rests, rcounts)):
            if i in longer:
                described[i] = read(longer[i] + rest)
    whole = [bool(PIECE.marks(slots.data, i) & _FUSED) for i in range(count)]
    return described, sizes, starts, whole


def scatter(steps: Joined, root: int, parts: Sequence[Contribution], sizes: Sequence[int],
            payloads: Sequence[np.ndarray[Any, Any] | None]) -> Dealt:
    """This rank's description from ``root`` (one entry), once a vote has agreed on the root: one ``Scatter`` of one
    slot per rank (with its host payload, ``payloads[r]``, when it fits), and a ``Scatterv`` of the rests of headers
    longer than a slot when the root has any. ``parts``, ``sizes`` and ``payloads`` (one per rank) on the root, empty
    elsewhere. Every rank learns from its slot what the root did with all of them, so all make the same calls."""
    me, size = steps.comm.Get_rank(), PIECE.size
    if me == root:  # (the root keeps its own slot where it wrote it: MPI_IN_PLACE)
        slots = np.empty(len(parts) * size, np.uint8)
        sent, marks = _deal(slots, parts, sizes, payloads)
        steps("Scatter", [slots, size, MPI.BYTE], MPI.IN_PLACE, root)
        if marks & _LONG:
            data, counts, displs = _rests(parts)
            steps("Scatterv", [data or bytearray(1), (counts, displs), MPI.BYTE], MPI.IN_PLACE, root)
        at = root * size
        return Dealt(slots, [read(parts[root].blob)], [sizes[root]], [at + _payload_at(len(parts[root].blob))],
                     [sent[root]], sent, bool(marks & _APART))
    slot = np.empty(size, np.uint8)
    steps("Scatter", None, [slot, size, MPI.BYTE], root)
    marks = PIECE.marks(slot.data, 0)
    rest, missing = None, PIECE.long_rest(slot.data, 0)
    if marks & _LONG:
        rest = bytearray(max(missing, 1))
        steps("Scatterv", None, [rest, missing, MPI.BYTE], root)
    described, nbytes, starts, whole = _heard(slot, 1, rest, [missing])
    return Dealt(slot, described, nbytes, starts, whole, [], bool(marks & _APART))


def exchange(steps: Joined, parts: Sequence[Contribution], sizes: Sequence[int],
             payloads: Sequence[np.ndarray[Any, Any] | None]) -> Dealt:
    """Every rank's description for this rank (one entry per source rank): one ``Alltoall`` of one slot per pair
    (``parts[d]``, with its host payload ``payloads[d]`` when it fits, to rank d), and an ``Alltoallv`` of the rests
    of headers longer than a slot when some rank has any. Every rank hears from every rank what it did with all of
    its slots, so all make the same calls."""
    count, size = len(parts), PIECE.size
    mine = np.empty(count * size, np.uint8)
    theirs = np.empty(count * size, np.uint8)
    sent, _marks = _deal(mine, parts, sizes, payloads)
    steps("Alltoall", [mine, size, MPI.BYTE], [theirs, size, MPI.BYTE])
    marks = 0
    for i in range(count):
        marks |= PIECE.marks(theirs.data, i)
    rest, rcounts = None, [0] * count
    if marks & _LONG:
        data, counts, displs = _rests(parts)
        rcounts = [PIECE.long_rest(theirs.data, i) for i in range(count)]
        rest = bytearray(max(sum(rcounts), 1))
        steps("Alltoallv", [data or bytearray(1), (counts, displs), MPI.BYTE],
              [rest, (rcounts, [sum(rcounts[:i]) for i in range(count)]), MPI.BYTE])
    described, nbytes, starts, whole = _heard(theirs, count, rest, rcounts)
    return Dealt(theirs, described, nbytes, starts, whole, sent, bool(marks & _APART))
