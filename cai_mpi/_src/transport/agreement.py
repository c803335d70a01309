"""How the ranks of a collective agree on what they do, whatever the world's size: one small vote per call.

Every rank hashes what all ranks must share (the operation, root, op, dtype, shape, wire order: whatever decides
the MPI calls each rank makes) into a fingerprint, and its own description into a second (gather-like
collectives let descriptions differ). One ``Allreduce(MAX)`` of six integers, ``[common, -common, own, -own,
failed, device]``, tells every rank the same thing from the same bytes: whether all fingerprints are equal
(``max(h) == -max(-h)``), whether all descriptions are, whether a rank failed, whether a rank holds device
memory. Its size does not depend on the number of ranks. Descriptions travel only where they are needed (the
root's in ``bcast_array``, every rank's in gather-like collectives only when they differ); when the vote says
the ranks disagree, or one failed, every rank joins the error path (``disagree``: a gather of short texts) and
raises, naming who had what.

In the steady state a call costs one round: every rank remembers the signature the previous call of the same
kind agreed on (``PrivateComms.agreed``: a ``signature.Signature``, the same on every rank because it was agreed),
and ``engine.steady`` posts the payload collective shaped by it (its own data where its call matches, scratch where
it does not, so every rank makes the same MPI calls) together with the vote, keeping the result when the vote says
everyone matched. Where every rank receives every rank's payload (an allgather), the payload collective carries
each rank's ballot (``Ballot.words``) instead, and each rank counts them itself (``Ballot.tally``): no vote.

A collective that times out leaves its communicator out of step (MPI cannot withdraw a collective):
``settle`` marks it, and every later collective on it raises at once (``check_in_step``), naming the call
that timed out. Point-to-point on the same communicator is unaffected.
"""

from __future__ import annotations

import hashlib
import struct
from collections.abc import Callable, Sequence
from typing import Any, NoReturn, cast

import numpy as np
from mpi4py import MPI

from ..arrays.operands import DeviceSource
from ..core.header import MessageInfo, decode, encode_header
from ..core.memo import Memo
from ..errors import CollectiveMismatchError
from ..progress.deadlines import Deadline, collective_expired
from ..progress.driving import complete_by
from ..progress.posted import PostedRequest
from ..progress.waits import MPIWait
from .privcomm import PrivateComms
from .signature import NOBODY, WORD_BYTES, WORDS, Ballot

__all__ = [
    "BLOCKING", "NONBLOCKING", "NOBODY", "PERSISTENT", "PIECE_SLOT_BYTES", "SLOT_BYTES", "SPECULATE_BYTES", "WORDS",
    "WORD_BYTES",
    "Ballot", "Contribution", "Dealt", "Exchange", "Joined", "broadcast", "check_in_step", "collective",
    "describe_source", "described", "disagree", "exchange", "fingerprint", "pack", "posted", "prepared",
    "raise_failures", "read", "reason", "scatter", "settle", "unpack", "vote",
]

#: Payloads of at most this many bytes (by the remembered signature) are posted with the vote, speculatively;
#: larger ones follow the vote with MPI's blocking collective (docs/benchmarks.md has the measurement). A constant,
#: not a setting: every rank must make the same choice, or one posts a collective the others never join.
SPECULATE_BYTES = 64 * 1024
_ERROR = b"\x00ERR"  # starts a failure's text; the headers exchanged here have payload tag 0: four NULs
_UNLIMITED = 1 << 62
#: Bytes per rank of the exchange: a contribution whose prefix, header and payload fit travels whole in it.
#: The same on every rank (a constant, not a setting); docs/benchmarks-history.md has the measurement that chose it.
SLOT_BYTES = 1024
#: The slot of each piece of a ``scatter`` or an ``exchange`` (an alltoall): one per rank or per pair, so its size
#: multiplies with the world's; it carries a header (51 B for a vector) and a payload of up to 48 B with it.
PIECE_SLOT_BYTES = 128
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
    return described(src, meta)[0]


def described(src: np.ndarray[Any, Any] | DeviceSource, meta: bytes = b"") -> tuple[bytes, int]:
    """The header that describes ``src`` (``describe_source``) and its fingerprint, through the memo of
    descriptions: a call like an earlier one neither encodes nor hashes."""
    if isinstance(src, np.ndarray):
        key = (src.dtype, src.shape, _fortran(src), meta)
    else:
        desc = src.desc
        key = (desc.dtype, desc.shape, not desc.is_c_contiguous and desc.is_f_contiguous, meta)
    got = _DESCRIBED.get(key)
    if got is None:
        blob = encode_header(key[0], key[1], fortran=key[2], payload_tag=0, meta_bytes=meta)
        got = _DESCRIBED.remember(key, (blob, fingerprint(blob)))
    return got


# (dtype, shape, wire order, meta) -> (header, its fingerprint): the descriptions collectives contributed before
_DESCRIBED: Memo[tuple[Any, ...], tuple[bytes, int]] = Memo()


def read(blob: bytes) -> MessageInfo | str:
    """A contribution's description: the decoded header (through the decoder's memo of headers seen before: one
    call after another describes the same arrays), or the text of the failure it reports."""
    if blob.startswith(_ERROR):
        return blob[len(_ERROR):].decode(errors="replace")
    return decode(blob, len(blob), _UNLIMITED)[0]


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


#: The forms a collective is posted in: MPI's blocking call, its nonblocking form, its persistent form.
BLOCKING, NONBLOCKING, PERSISTENT = "blocking", "nonblocking", "persistent"


def collective(comm: MPI.Comm, name: str, form: str, *args: Any) -> Any:
    """MPI's collective ``name`` on ``comm`` in ``form`` (``"Allreduce"``: ``comm.Allreduce``, ``comm.Iallreduce``,
    ``comm.Allreduce_init``): the posting table of every collective cai_mpi makes, the one place that names mpi4py's
    collective methods (the API modules name the collective and the form: tests/unit/test_wire_in_transport.py)."""
    method = _METHODS.get((name, form))
    if method is None:
        method = _method(name, form)
    return getattr(comm, method)(*args)


def _method(name: str, form: str) -> str:
    """mpi4py's method for collective ``name`` in ``form``."""
    if form == BLOCKING:
        return name
    if form == NONBLOCKING:
        return "I" + name[0].lower() + name[1:]
    assert form == PERSISTENT, form
    return name + "_init"


#: The table itself, for the collectives cai_mpi makes (``_method`` spells any other)
_METHODS = {(name, form): _method(name, form) for form in (BLOCKING, NONBLOCKING, PERSISTENT) for name in (
    "Allgather", "Allgatherv", "Allreduce", "Alltoall", "Alltoallv", "Alltoallw", "Barrier", "Bcast", "Gather",
    "Gatherv", "Reduce", "Scatter", "Scatterv")}


def posted(comm: MPI.Comm, name: str, *args: Any) -> MPI.Request:
    """MPI's nonblocking form of collective ``name`` (``"Allreduce"``: ``comm.Iallreduce(*args)``)."""
    return cast("MPI.Request", collective(comm, name, NONBLOCKING, *args))


def prepared(comm: MPI.Comm, name: str, *args: Any) -> MPI.Prequest:
    """MPI's persistent form of collective ``name`` (``"Allreduce"``: ``comm.Allreduce_init(*args)``)."""
    return cast("MPI.Prequest", collective(comm, name, PERSISTENT, *args))


class Joined:
    """The collective steps of one call after its vote, on ``pc.header``, where every rank must arrive: with a
    deadline each is MPI's nonblocking form, abandoned with TimeoutError if some rank has not come (``settle``), so
    every wait of the call is bounded by its ``timeout=``; without one, MPI's blocking collective. ``keep``: what
    owns the memory the steps' buffers point at (kept alive past a timeout, while MPI may still use it)."""

    __slots__ = ("comm", "due", "fn", "keep", "pc")

    def __init__(self, fn: str, pc: PrivateComms, due: Deadline | None, keep: Any = None) -> None:
        self.fn, self.pc, self.due, self.keep = fn, pc, due, keep
        self.comm = pc.header

    def __call__(self, name: str, *args: Any) -> None:
        """Collective ``name`` (``"Bcast"``, ...) with ``args`` on ``pc.header``."""
        if self.due is None:
            collective(self.comm, name, BLOCKING, *args)
            return
        settle(self.fn, self.pc, [posted(self.comm, name, *args)], self.due, (args, self.keep))

    def allgather(self, blob: bytes) -> list[bytes]:
        """Every rank's ``blob``, on every rank: an Allgather of the lengths, an Allgatherv of the bytes."""
        size = self.comm.Get_size()
        counts = np.empty(size, np.int64)
        self("Allgather", np.array([len(blob)], np.int64), counts)
        lengths = [int(n) for n in counts]
        displs = [sum(lengths[:i]) for i in range(size)]
        data = bytearray(max(sum(lengths), 1))
        self("Allgatherv", [blob or bytearray(1), len(blob), MPI.BYTE], [data, (lengths, displs), MPI.BYTE])
        return unpack(data, lengths)


# -- the vote -------------------------------------------------------------------------------------------------

def fingerprint(data: bytes | str) -> int:
    """A 61-bit hash of ``data``: its negation is a fingerprint too, and both stay above ``NOBODY``."""
    raw = data.encode() if isinstance(data, str) else data
    return int.from_bytes(hashlib.blake2b(raw, digest_size=8).digest(), "little", signed=True) >> 3


def check_in_step(fn: str, pc: PrivateComms) -> None:
    """Refuse a collective on a communicator whose collectives are out of step (one timed out here)."""
    if pc.out_of_step is not None:
        raise CollectiveMismatchError(
            f"{fn}: this communicator's collectives are out of step since {pc.out_of_step}, and MPI cannot withdraw "
            "a collective: a new one could match the one still posted on another rank. Use another communicator "
            "for collectives (point-to-point on this one still works), or end the job")


def settle(fn: str, pc: PrivateComms, reqs: list[MPI.Request], due: Deadline | None, keep: Any) -> None:
    """Wait for posted collectives; past ``due``, leave them to finish in the background (``keep`` alive), mark
    the communicator out of step, and raise TimeoutError."""
    if due is None:
        MPI.Request.Waitall(reqs)
        return
    if not complete_by(MPIWait(reqs), due):
        error = collective_expired(fn, pc.header, due)
        pc.out_of_step = f"{fn} timed out after {due.seconds:g} s on this rank"
        PostedRequest(reqs, None, keep=keep).abandon(error)
        raise error


def vote(fn: str, pc: PrivateComms, ballot: Ballot, due: Deadline | None,
         speculative: Sequence[MPI.Request] = (), keep: Any = None) -> Ballot:
    """Every rank's ballot, combined (``ballot.votes`` then holds the result), with the ``speculative`` payload
    collectives already posted completing with it."""
    comm = pc.header
    if not speculative and due is None:
        comm.Allreduce(MPI.IN_PLACE, [ballot.votes, MPI.INT64_T], MPI.MAX)
    else:
        reqs = [*speculative, comm.Iallreduce(MPI.IN_PLACE, [ballot.votes, MPI.INT64_T], MPI.MAX)]
        settle(fn, pc, reqs, due, (ballot, keep))
    return ballot


def disagree(fn: str, steps: Joined, text: str, error: BaseException | None, what: str) -> NoReturn:
    """The error path, after a vote that did not agree (every rank is here): every rank's ``text`` (its
    description, or with ``error`` why it could not take part) to every rank, then this rank's own ``error``, or
    CollectiveMismatchError naming what each rank had (``what``: the rule they broke)."""
    texts = [(t[1:].decode(errors="replace"), t[:1] == b"!")
             for t in steps.allgather((b"!" if error is not None else b" ") + text.encode(errors="replace"))]
    if error is not None:
        raise error
    failed = "; ".join(f"rank {r}: could not take part ({t})" for r, (t, bad) in enumerate(texts) if bad)
    if failed:
        raise CollectiveMismatchError(f"{fn}: {failed}")
    had = "; ".join(f"rank {r}: {t}" for r, (t, _bad) in enumerate(texts))
    raise CollectiveMismatchError(f"{fn}: {what}, but {had}")


def reason(exc: BaseException) -> str:
    """What ``disagree`` tells the other ranks of this rank's failure."""
    return f"{type(exc).__name__}: {exc}"


# -- slots ----------------------------------------------------------------------------------------------------


def _payload_at(nblob: int) -> int:
    """Where a payload starts in a slot whose header is ``nblob`` bytes long."""
    return -(-(_HEAD.size + nblob) // _ALIGN) * _ALIGN


def payload_room(header_nbytes: int, slot: int = SLOT_BYTES) -> int:
    """The most payload bytes a slot of ``slot`` bytes carries with a header of ``header_nbytes`` (a larger
    payload, or a longer header, takes the path of MPI's own collective)."""
    return slot - _payload_at(header_nbytes)


def _fill(slots: memoryview, at: int, mine: Contribution, nbytes: int, payload: np.ndarray[Any, Any] | None,
          c_order: bool, slot: int = SLOT_BYTES) -> bool:
    """Write ``mine`` into the slot of ``slot`` bytes at byte ``at``: its prefix, its header's start and, when the
    whole fits and a host ``payload`` is given, the payload's bytes in wire order (``describe_source``'s, or C
    order). Returns whether the whole did fit."""
    blob = mine.blob
    nblob = len(blob)
    start = _payload_at(nblob)
    room = slot - _HEAD.size
    fused = (mine.error is not None and nblob <= room) or (payload is not None and start + nbytes <= slot)
    _HEAD.pack_into(slots, at, nblob, _FUSED if fused else 0, nbytes)
    head = at + _HEAD.size
    slots[head : head + min(nblob, room)] = blob if nblob <= room else blob[:room]
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


def _read_slots(slots: memoryview, count: int, slot: int = SLOT_BYTES) -> tuple[
    list[MessageInfo | str], dict[int, bytes], list[int], list[int], bool
]:
    """Each slot's description (the start of it, by rank, where a header is longer than a slot), payload size and
    payload offset; and whether every slot holds its whole contribution."""
    described: list[MessageInfo | str] = []
    longer: dict[int, bytes] = {}
    sizes, starts, fused = [], [], True
    unpack_from, head, room = _HEAD.unpack_from, _HEAD.size, slot - _HEAD.size
    for at in range(0, count * slot, slot):
        nblob, flags, nbytes = unpack_from(slots, at)
        blob = bytes(slots[at + head : at + head + min(nblob, room)])
        if nblob > room:
            longer[len(described)] = blob
        described.append(read(blob) if nblob <= room else "")
        sizes.append(nbytes)
        starts.append(at + _payload_at(nblob))
        fused = fused and flags == _FUSED
    return described, longer, sizes, starts, fused


def broadcast(
    steps: Joined, root: int, mine: Contribution, nbytes: int, *, payload: np.ndarray[Any, Any] | None = None,
) -> Exchange:
    """The root's description, everywhere, once a vote has seen every rank arrive: one ``Bcast`` of the root's slot
    (with its host ``payload`` when it fits), and a second of the rest of a header longer than a slot, if it is."""
    slot = np.empty(SLOT_BYTES, np.uint8)
    if steps.comm.Get_rank() == root:  # (the root knows what it sends: it reads nothing back)
        fused = _fill(slot.data, 0, mine, nbytes, payload, False)
        steps("Bcast", [slot, SLOT_BYTES, MPI.BYTE], root)
        if len(mine.blob) > ROOM:
            steps("Bcast", bytearray(mine.blob[ROOM:]), root)
        return Exchange(slot, [read(mine.blob)], [nbytes], [_payload_at(len(mine.blob))], fused)
    steps("Bcast", [slot, SLOT_BYTES, MPI.BYTE], root)
    described, longer, sizes, starts, fused = _read_slots(slot.data, 1)
    if longer:
        rest = bytearray(_HEAD.unpack_from(slot.data, 0)[0] - ROOM)
        steps("Bcast", rest, root)
        described = [read(longer[0] + bytes(rest))]
    return Exchange(slot, described, sizes, starts, fused)


#: (in the slots of ``scatter`` and ``exchange``: what the sender says of every slot it sends in the collective,
#: so every rank that hears from it takes the same next steps) some slot of this sender's does not hold its whole
#: contribution: a payload collective follows; some header (or failure text) of this sender's is longer than a slot:
#: its rest follows
_APART, _LONG = 2, 4
_SLOT, _ROOM = PIECE_SLOT_BYTES, PIECE_SLOT_BYTES - _HEAD.size  # (a piece's slot, and the header bytes it carries)


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
    """One slot per destination (``_fill``), each then marked with what the sender says of all of them (``_APART``,
    ``_LONG``): ``(which held their whole contribution, those marks)``."""
    view = slots.data
    sent = [_fill(view, i * _SLOT, c, n, p, False, _SLOT)
            for i, (c, n, p) in enumerate(zip(parts, sizes, payloads, strict=True))]
    marks = (0 if all(sent) else _APART) | (_LONG if any(len(c.blob) > _ROOM for c in parts) else 0)
    if marks:
        for i, whole in enumerate(sent):
            _HEAD.pack_into(view, i * _SLOT, len(parts[i].blob), marks | (_FUSED if whole else 0), sizes[i])
    return sent, marks


def _rests(parts: Sequence[Contribution]) -> tuple[bytes, list[int], list[int]]:
    """The rest of each header longer than a slot, back to back: ``(data, counts, displacements)``."""
    return pack([c.blob[_ROOM:] for c in parts])


def _heard(slots: np.ndarray[Any, Any], count: int, rests: bytes | bytearray | None, rcounts: Sequence[int]) -> tuple[
    list[MessageInfo | str], list[int], list[int], list[bool]
]:
    """``count`` slots received, read (with ``rests``: the rests of the long headers, ``rcounts`` bytes each)."""
    described, longer, sizes, starts, _fused = _read_slots(slots.data, count, _SLOT)
    if longer:
        assert rests is not None
        for i, rest in enumerate(unpack(rests, rcounts)):
            if i in longer:
                described[i] = read(longer[i] + rest)
    whole = [bool(_HEAD.unpack_from(slots.data, i * _SLOT)[1] & _FUSED) for i in range(count)]
    return described, sizes, starts, whole


def _long_rest(slots: np.ndarray[Any, Any], i: int) -> int:
    """How many bytes of the header in slot ``i`` did not fit it."""
    return max(int(_HEAD.unpack_from(slots.data, i * _SLOT)[0]) - _ROOM, 0)


def scatter(steps: Joined, root: int, parts: Sequence[Contribution], sizes: Sequence[int],
            payloads: Sequence[np.ndarray[Any, Any] | None]) -> Dealt:
    """This rank's description from ``root`` (one entry), once a vote has agreed on the root: one ``Scatter`` of one
    slot per rank (with its host payload, ``payloads[r]``, when it fits), and a ``Scatterv`` of the rests of headers
    longer than a slot when the root has any. ``parts``, ``sizes`` and ``payloads`` (one per rank) on the root, empty
    elsewhere. Every rank learns from its slot what the root did with all of them, so all make the same calls."""
    me = steps.comm.Get_rank()
    if me == root:  # (the root keeps its own slot where it wrote it: MPI_IN_PLACE)
        slots = np.empty(len(parts) * _SLOT, np.uint8)
        sent, marks = _deal(slots, parts, sizes, payloads)
        steps("Scatter", [slots, _SLOT, MPI.BYTE], MPI.IN_PLACE, root)
        if marks & _LONG:
            data, counts, displs = _rests(parts)
            steps("Scatterv", [data or bytearray(1), (counts, displs), MPI.BYTE], MPI.IN_PLACE, root)
        at = root * _SLOT
        return Dealt(slots, [read(parts[root].blob)], [sizes[root]], [at + _payload_at(len(parts[root].blob))],
                     [sent[root]], sent, bool(marks & _APART))
    slot = np.empty(_SLOT, np.uint8)
    steps("Scatter", None, [slot, _SLOT, MPI.BYTE], root)
    marks = _HEAD.unpack_from(slot.data, 0)[1]
    rest = None
    if marks & _LONG:
        rest = bytearray(max(_long_rest(slot, 0), 1))
        steps("Scatterv", None, [rest, _long_rest(slot, 0), MPI.BYTE], root)
    described, nbytes, starts, whole = _heard(slot, 1, rest, [_long_rest(slot, 0)])
    return Dealt(slot, described, nbytes, starts, whole, [], bool(marks & _APART))


def exchange(steps: Joined, parts: Sequence[Contribution], sizes: Sequence[int],
             payloads: Sequence[np.ndarray[Any, Any] | None]) -> Dealt:
    """Every rank's description for this rank (one entry per source rank): one ``Alltoall`` of one slot per pair
    (``parts[d]``, with its host payload ``payloads[d]`` when it fits, to rank d), and an ``Alltoallv`` of the rests
    of headers longer than a slot when some rank has any. Every rank hears from every rank what it did with all of
    its slots, so all make the same calls."""
    count = len(parts)
    mine = np.empty(count * _SLOT, np.uint8)
    theirs = np.empty(count * _SLOT, np.uint8)
    sent, _marks = _deal(mine, parts, sizes, payloads)
    steps("Alltoall", [mine, _SLOT, MPI.BYTE], [theirs, _SLOT, MPI.BYTE])
    marks = 0
    for i in range(count):
        marks |= _HEAD.unpack_from(theirs.data, i * _SLOT)[1]
    rest, rcounts = None, [0] * count
    if marks & _LONG:
        data, counts, displs = _rests(parts)
        rcounts = [_long_rest(theirs, i) for i in range(count)]
        rest = bytearray(max(sum(rcounts), 1))
        steps("Alltoallv", [data or bytearray(1), (counts, displs), MPI.BYTE],
              [rest, (rcounts, [sum(rcounts[:i]) for i in range(count)]), MPI.BYTE])
    described, nbytes, starts, whole = _heard(theirs, count, rest, rcounts)
    return Dealt(theirs, described, nbytes, starts, whole, sent, bool(marks & _APART))
