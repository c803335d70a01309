"""What a collective call of a kind last agreed on, on a communicator (``Signature``), and the words of the vote
that check a call against it (``transport.agreement``'s ``Ballot``): one typed signature for every one-shot
collective, made with its vote words ready, so a call in the steady state compares bytes and hashes nothing.
"""

from __future__ import annotations

import copy
import struct
from collections.abc import Sequence

from mpi4py import MPI

from ..core.header import MessageInfo

__all__ = ["NOBODY", "VOTE", "WORDS", "WORD_BYTES", "Bucket", "Signature", "vote_head"]

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
