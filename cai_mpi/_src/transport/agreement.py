"""What the ranks of a collective tell each other before the payloads move: each contribution's description
(a cai_mpi header without payload tag), or why a rank has nothing to contribute.

Every rank takes part in every step whatever went wrong locally, so a bad argument on one rank becomes an
error on every rank instead of a hang: the rank that failed raises its own exception, the others raise
``CollectiveMismatchError`` naming it.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from ..arrays.operands import DeviceSource
from ..core.header import MessageInfo, decode, encode_header
from ..errors import CollectiveMismatchError

__all__ = ["Contribution", "describe_source", "pack", "raise_failures", "read", "unpack"]

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


def describe_source(src: np.ndarray[Any, Any] | DeviceSource, meta: bytes = b"") -> bytes:
    """The header that describes ``src`` (its dtype, shape and wire order, plus ``meta``)."""
    if isinstance(src, np.ndarray):
        dtype, shape = src.dtype, src.shape
        fortran = src.ndim > 1 and not src.flags.c_contiguous and src.flags.f_contiguous
    else:
        desc = src.desc
        dtype, shape = desc.dtype, desc.shape
        fortran = not desc.is_c_contiguous and desc.is_f_contiguous
    return encode_header(dtype, shape, fortran=fortran, payload_tag=0, meta_bytes=meta)


def read(blob: bytes) -> MessageInfo | str:
    """A contribution's description: the decoded header, or the text of the failure it reports."""
    if blob.startswith(_ERROR):
        return blob[len(_ERROR):].decode(errors="replace")
    info, _tag = decode(blob, len(blob), _UNLIMITED)  # (the cached decoder: collectives repeat their headers)
    return info


def raise_failures(fn: str, described: Sequence[MessageInfo | str | None], mine: Contribution, rank: int) -> None:
    """After an exchange: if any rank could not contribute, raise on this one (its own exception on the rank
    that failed, CollectiveMismatchError naming the failed ranks on the others)."""
    failed = {r: d for r, d in enumerate(described) if isinstance(d, str)}
    if mine.error is not None:
        raise mine.error
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

