"""The one cache of descriptions: what was worked out once from a message's description (a header's bytes, a
decoded header's MessageInfo, a collective's plan), kept for the next call that repeats it.

Every such cache is a ``Memo``: one mechanism and one size setting (``CAI_MPI_MEMO_ENTRIES``). A program repeats a
few signatures; a memo that fills up forgets everything and starts again, so a program whose shapes never repeat
pays one rebuild per call and an ordinary one never does (an LRU's bookkeeping would cost every hit instead). What
holds an MPI resource (committed datatypes, freed when forgotten) is not a description and keeps its own cache.
"""

from __future__ import annotations

from typing import TypeVar

from ..config import config

__all__ = ["Memo"]

K = TypeVar("K")
V = TypeVar("V")


class Memo(dict[K, V]):
    """A dict of descriptions worked out before; ``remember`` adds one, within the size setting."""

    __slots__ = ()

    def remember(self, key: K, value: V) -> V:
        """Keep ``value`` for ``key`` (forgetting everything first when the memo is full); returns ``value``."""
        if len(self) >= config().memo_entries:
            self.clear()
        self[key] = value
        return value
