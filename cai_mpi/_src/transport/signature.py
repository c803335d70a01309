"""The words of a collective's vote (``transport.agreement``): this call's (``Ballot``) and what the last call of a
kind agreed on, on a communicator (``Signature``): one typed signature for every one-shot collective, made with its
vote words ready, so a call in the steady state compares bytes and hashes nothing.
"""

from __future__ import annotations

import copy
import struct
from collections.abc import Sequence
from typing import Any

import numpy as np
from mpi4py import MPI

from ..core.header import MessageInfo

__all__ = ["NOBODY", "VOTE", "WORDS", "WORD_BYTES", "Ballot", "Bucket", "Signature", "vote_head"]

#: ``own`` of a rank that describes nothing in this vote (a non-root of ``bcast_array``): below every fingerprint
NOBODY = -(1 << 62)
#: How many integers ``Ballot.words`` are: what a payload collective carries per rank in place of a vote
WORDS = 3
#: The vote's six integers (``Ballot.votes``: common, -common, own, -own, failed, device), little-endian int64:
#: MPI reduces them as ``MPI.INT64_T``
VOTE = struct.Struct("<6q")
#: ``Ballot.words``: what a payload collective carries per rank in place of a vote
WORD_BYTES = struct.Struct(f"<{WORDS}q")


def vote_head(common: int, own: int = NOBODY) -> bytes:
    """The first five words of the vote's result when every rank voted ``common`` and (where ``own`` is not
    ``NOBODY``) every described rank ``own``, and none failed: ``Ballot.matches`` compares the bytes."""
    return VOTE.pack(common, -common, own, -own if own != NOBODY else NOBODY, 0, 0)[:40]


class Ballot:
    """This rank's vote (``votes``: six int64 words, as bytes MPI reduces in place), and after the vote (``seen``:
    the MAX over every rank) what every rank reads from it."""

    __slots__ = ("_seen", "_words", "votes")

    def __init__(self, common: int, own: int = NOBODY, failed: bool = False, device: bool = False) -> None:
        self._words = (common, own, int(failed))
        self.votes = bytearray(VOTE.pack(common, -common, own, -own if own != NOBODY else NOBODY, int(failed),
                                          int(device)))
        self._seen: tuple[int, ...] | list[int] | None = None

    @property
    def seen(self) -> Sequence[int]:
        """The vote's six words, once counted (``votes`` holds the MAX over every rank), or tallied."""
        if self._seen is None:
            self._seen = VOTE.unpack_from(self.votes)
        return self._seen

    def words(self) -> bytes:
        """What this ballot says in ``WORDS`` integers (common, own, failed; ``WORD_BYTES``), for a collective that
        carries them to every rank with its payload instead of voting."""
        return WORD_BYTES.pack(*self._words)

    def tally(self, words: np.ndarray[Any, Any]) -> None:
        """Count every rank's ``words`` (one row per rank): ``seen`` is then what the vote would have said (every
        rank holds the same rows, so every rank reads the same answer), but for ``device``: words do not carry it."""
        common, own, failed = words[:, 0], words[:, 1], words[:, 2]
        negated = np.where(own != NOBODY, -own, NOBODY)
        self._seen = [int(common.max()), int((-common).max()), int(own.max()), int(negated.max()),
                      int(failed.max()), 0]

    @property
    def agreed(self) -> bool:
        """Every rank had the same common fingerprint, and none failed."""
        v = self.seen
        return v[0] == -v[1] and v[4] == 0

    @property
    def same_common(self) -> bool:
        """Every rank had the same common fingerprint (some may have failed)."""
        return self.seen[0] == -self.seen[1]

    def matches(self, head: bytes) -> bool:
        """Every rank voted what ``head`` (``vote_head``) says: the same common fingerprint, the same own one where
        it is not ``NOBODY``, and no failure (after a vote; a tally compares its words)."""
        if self._seen is None:
            return self.votes.startswith(head)
        return VOTE.pack(*self._seen).startswith(head)

    @property
    def alike(self) -> bool:
        """Every rank that described something described the same (after ``agreed``)."""
        v = self.seen
        return v[2] == -v[3] or (v[2] == NOBODY and v[3] == NOBODY)

    @property
    def own(self) -> int:
        return self.seen[2]

    @property
    def device(self) -> bool:
        """Some rank holds device memory."""
        return bool(self.seen[5])


#: One reduction of a signature: its element count, MPI datatype and MPI op
Bucket = tuple[int, MPI.Datatype, MPI.Op]


class Signature:
    """What the last call of a kind agreed on, on a communicator (``PrivateComms.agreed[kind]``, the same on every
    rank since it was agreed): the common fingerprint, the description every contributing rank had (``own``,
    ``info``), the payload's bytes, the root (-1 for none) and, for reductions, each ``Bucket``. ``head`` and
    ``words`` are the vote's result and the ballot's words of a call that matches it, made once."""

    __slots__ = ("buckets", "common", "head", "info", "nbytes", "own", "root", "words")

    def __init__(self, common: int, own: int = NOBODY, *, info: MessageInfo | None = None, nbytes: int | None = None,
                 root: int = -1, buckets: Sequence[Bucket] = ()) -> None:
        self.common, self.own, self.info, self.root, self.buckets = common, own, info, root, tuple(buckets)
        self.nbytes = nbytes if nbytes is not None else info.payload_nbytes if info is not None else 0
        self.head = vote_head(common, own)
        self.words = WORD_BYTES.pack(common, own, 0)

    def described(self) -> MessageInfo:
        """``info``, of a signature that has one (gathers, bcast)."""
        assert self.info is not None, "internal error: a signature without a description"
        return self.info

    def fresh_info(self) -> MessageInfo:
        """``info`` with a meta dict of its own (each result's is the caller's to change)."""
        info = self.described()
        return info if info.meta is None else info._replace(meta=copy.deepcopy(info.meta))
