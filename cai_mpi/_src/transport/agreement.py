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
    "BLOCKING", "NONBLOCKING", "NOBODY", "PERSISTENT", "SPECULATE_BYTES", "WORDS", "WORD_BYTES",
    "Ballot", "Contribution", "Joined", "check_in_step", "collective", "describe_source", "described", "disagree",
    "fingerprint", "fortran_order", "pack", "posted", "prepared", "raise_failures", "read", "reason", "settle",
    "unpack", "vote",
]

#: Payloads of at most this many bytes (by the remembered signature) are posted with the vote, speculatively;
#: larger ones follow the vote with MPI's blocking collective (docs/collectives.md says why; the size is not a
#: measured optimum: docs/benchmarks.md, issue 42's runs). A constant, not a setting: every rank must make the same
#: choice, or one posts a collective the others never join.
SPECULATE_BYTES = 64 * 1024
_ERROR = b"\x00ERR"  # starts a failure's text; the headers exchanged here have payload tag 0: four NULs
_UNLIMITED = 1 << 62


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


def fortran_order(src: np.ndarray[Any, Any]) -> bool:
    """Does host array ``src`` travel in F order (F-contiguous and not C-contiguous; C order otherwise)?"""
    return src.ndim > 1 and not src.flags.c_contiguous and src.flags.f_contiguous


def describe_source(src: np.ndarray[Any, Any] | DeviceSource, meta: bytes = b"") -> bytes:
    """The header that describes ``src`` (its dtype, shape and wire order, plus ``meta``)."""
    return described(src, meta)[0]


def described(src: np.ndarray[Any, Any] | DeviceSource, meta: bytes = b"") -> tuple[bytes, int]:
    """The header that describes ``src`` (``describe_source``) and its fingerprint, through the memo of
    descriptions: a call like an earlier one neither encodes nor hashes."""
    if isinstance(src, np.ndarray):
        key = (src.dtype, src.shape, fortran_order(src), meta)
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
