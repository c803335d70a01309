"""Hostile and corrupt cai_mpi headers: how to make them, and what the decoder must do with them.

``check_decoder(msg, limit)`` is the property every fuzzer here checks: whatever bytes arrive as a header
message, the strict decoder, the cached decoder and a header memo agree, each either raising ProtocolError or
returning a decoding the receive path can act on as it is (below), and decoding allocates nothing in
proportion to what a header announces. ``CORRUPT`` lists headers a broken or hostile peer could send, for the
MPI test that sends them on cai_mpi's private communicator. Nothing here imports MPI: the coverage-guided
fuzzer (tests/fuzz_header.py) loads the wire format alone.
"""

from __future__ import annotations

import json
import math
import struct
import tracemalloc
import warnings
from typing import Any, NamedTuple

import numpy as np

from cai_mpi._src.core import header
from cai_mpi._src.core.header import (
    HEADER_BUFFER_BYTES,
    MAX_NDIM,
    HeaderMemo,
    MessageInfo,
    decode_header,
    encode_header,
)
from cai_mpi._src.errors import ProtocolError

__all__ = [
    "CORRUPT", "FIELDS", "LIMIT", "Corrupt", "check_decoder", "craft", "seed_headers",
]

#: The payload limit the fuzzers decode with: small, so that a decoding's buffers can really be made.
LIMIT = 1 << 20
#: The largest payload tag the header can hold (an i32).
I32_MAX = 2**31 - 1
#: Allocation allowed while decoding one header: a constant plus a multiple of the header's own length (JSON
#: objects cost more than their text), never anything in proportion to the sizes the header announces.
ALLOC_BASE, ALLOC_PER_BYTE = 1 << 20, 64

# The prefix, little-endian (docs/protocol.md): payload tag, magic, version, flags, ndim, reserved, dtype length,
# reserved, meta length, reserved, payload bytes, chunk bytes.
PREFIX = struct.Struct("<i4sBBBBHHIIQQ")
#: Byte offset and struct format of each prefix field, for mutations.
FIELDS = {
    "payload_tag": (0, "<i"), "version": (8, "<B"), "flags": (9, "<B"), "ndim": (10, "<B"), "reserved0": (11, "<B"),
    "dtype_len": (12, "<H"), "reserved1": (14, "<H"), "meta_len": (16, "<I"), "reserved2": (20, "<I"),
    "payload_nbytes": (24, "<Q"), "chunk_bytes": (32, "<Q"),
}
FLAG_INLINE, FLAG_STRUCTURED, FLAG_META, FLAG_CHANNEL = 0x01, 0x02, 0x04, 0x10


def craft(dfield: bytes, shape: tuple[int, ...], payload_nbytes: int | None = None, *, flags: int = 0,
          meta: bytes = b"", payload_tag: int = 5, chunk_bytes: int = 0, magic: bytes = b"CAIM", version: int = 2,
          ndim: int | None = None, tail: bytes = b"") -> bytes:
    """A header assembled field by field (lengths consistent unless told otherwise; ``payload_nbytes`` None:
    what ``shape`` and a plain ``dfield`` make)."""
    if payload_nbytes is None:
        payload_nbytes = math.prod(shape) * np.dtype(dfield.decode()).itemsize
    return (
        PREFIX.pack(payload_tag, magic, version, flags | (FLAG_META if meta else 0), len(shape) if ndim is None
                    else ndim, 0, len(dfield), 0, len(meta), 0, payload_nbytes, chunk_bytes)
        + struct.pack(f"<{len(shape)}Q", *shape) + dfield + meta + tail
    )


def seed_headers() -> list[bytes]:
    """Valid header messages of every kind, for mutation and as the coverage-guided fuzzer's corpus."""
    structured = np.dtype([("a", ">f4"), ("b", "<i2", (2,)), ("c", [("d", "S3")])], align=True)
    meta = json.dumps({"step": 3, "names": ["x", "y"], "t": 0.5, "ok": None}).encode()
    seeds = [
        encode_header(np.dtype("<f8"), (4,), fortran=False, payload_tag=7),
        encode_header(np.dtype("|u1"), (), fortran=False, payload_tag=0, inline=b"\x01"),
        encode_header(np.dtype("<c16"), (3, 0, 2), fortran=False, payload_tag=9),
        encode_header(np.dtype(">i4"), (2, 3), fortran=True, payload_tag=11, inline=bytes(24)),
        encode_header(np.dtype("<M8[ns]"), (5,), fortran=False, payload_tag=1, chunk_bytes=16),
        encode_header(structured, (3, 2), fortran=False, payload_tag=77, meta_bytes=meta),
        encode_header(structured, (2,), fortran=False, payload_tag=3, meta_bytes=meta,
                      inline=bytes(2 * structured.itemsize)),
        encode_header(np.dtype("<f4"), (8, 8), fortran=False, payload_tag=12, channel=True),
        encode_header(np.dtype("<U3"), (1,) * 8, fortran=False, payload_tag=2),
    ]
    return [bytes(s) for s in seeds]


# -- the property -------------------------------------------------------------------------------------------------

Outcome = tuple[MessageInfo, int] | str  # a decoding, or the ProtocolError's message


def _outcome(decode: Any, *args: Any, **kw: Any) -> Outcome:
    try:
        result: tuple[MessageInfo, int] = decode(*args, **kw)
        return result
    except ProtocolError as err:
        return str(err)


def check_decoder(msg: bytes, limit: int = LIMIT, *, measure: bool = False) -> Outcome:
    """The decoder's property for one header message ``msg`` (raises AssertionError, or lets another exception
    out, when it does not hold). ``measure``: also bound what decoding allocates (tracemalloc must be on)."""
    msg = msg[:HEADER_BUFFER_BYTES]  # a longer message does not fit any receive buffer: MPI refuses it first
    n = len(msg)

    def decoded(decode: Any, *args: Any, **kw: Any) -> Outcome:
        if not measure:
            return _outcome(decode, *args, **kw)
        before = tracemalloc.get_traced_memory()[0]
        tracemalloc.reset_peak()
        outcome = _outcome(decode, *args, **kw)
        grew = tracemalloc.get_traced_memory()[1] - before
        assert grew <= ALLOC_BASE + ALLOC_PER_BYTE * n, f"{decode.__qualname__} of {n} bytes allocated {grew} bytes"
        return outcome

    with warnings.catch_warnings():
        warnings.simplefilter("error")  # a warning escaping the decoder is another exception
        strict = decoded(decode_header, msg, n, max_payload_bytes=limit)
        buf = bytearray(HEADER_BUFFER_BYTES)
        buf[:n] = msg
        buf[n : n + 64] = b"\xff" * min(64, HEADER_BUFFER_BYTES - n)  # stale bytes after the message
        cached = [decoded(header.decode, buf, n, limit) for _ in range(2)]  # filling the cache, then hitting it
        memo = HeaderMemo()
        remembered = [decoded(memo.decode, buf, n, limit) for _ in range(2)]
    for other in (*cached, *remembered):
        assert _same(other, strict), f"decoders disagree on {msg!r}: {other!r} and {strict!r}"
    if not isinstance(strict, str):
        _check_usable(msg, *strict, limit)
    return strict


def _same(a: Outcome, b: Outcome) -> bool:
    if isinstance(a, str) or isinstance(b, str):
        return isinstance(a, str) and isinstance(b, str)  # (the cached paths may word a refusal alike or not)
    return a == b


def _check_usable(msg: bytes, info: MessageInfo, payload_tag: int, limit: int) -> None:
    """A decoding the receive path can act on as it is: every size bounded, every buffer makeable."""
    dtype, shape, nbytes = info.dtype, info.shape, info.payload_nbytes
    assert nbytes <= limit, info
    assert not dtype.hasobject and dtype.itemsize > 0, info
    assert dtype.subdtype is None, f"a subarray dtype would change the shape: {info}"
    assert len(shape) <= MAX_NDIM and math.prod(shape) * dtype.itemsize == nbytes, info
    assert info.header_nbytes + (nbytes if info.inline else 0) == len(msg), info
    assert not (info.inline and info.channel), info
    assert 0 <= payload_tag <= I32_MAX and (payload_tag == 0 or not info.inline), (payload_tag, info)
    assert info.meta is None or isinstance(info.meta, dict), info
    if not info.inline and nbytes:
        assert info.nchunks <= nbytes, info
    if info.channel:
        assert info.nchunks == 1, f"a channel's payload is one message: {info}"
    # What the receive path makes of it: the array (or, past what a test may allocate, a view of the same shape
    # that numpy checks alike), and the inline payload viewed in place (as Inbox does).
    made = np.empty(shape, dtype) if nbytes <= LIMIT else np.broadcast_to(np.empty((), dtype), shape)
    assert made.shape == shape and made.dtype == dtype and made.size * dtype.itemsize == nbytes
    if info.inline:
        view = np.frombuffer(msg, dtype, nbytes // dtype.itemsize, info.header_nbytes)
        view.reshape(shape[::-1] if info.fortran else shape)


# -- corrupt headers for the MPI test -------------------------------------------------------------------------------


class Corrupt(NamedTuple):
    """A header message no cai_mpi sender makes, and a fragment of the ProtocolError it must raise."""

    name: str
    message: bytes
    says: str


def _with(msg: bytes, field: str, value: int) -> bytes:
    at, fmt = FIELDS[field]
    out = bytearray(msg)
    struct.pack_into(fmt, out, at, value)
    return bytes(out)


_F8 = craft(b"<f8", (4,))  # a (4,) float64 header with its payload elsewhere (payload tag 5)
_INLINE = craft(b"<f8", (4,), flags=FLAG_INLINE, tail=np.arange(4.0).tobytes())

CORRUPT: tuple[Corrupt, ...] = (
    Corrupt("empty", b"", "truncated cai_mpi header: 0 bytes"),
    Corrupt("10 bytes", _F8[:10], "truncated cai_mpi header: 10 bytes"),
    Corrupt("cut by one byte", _F8[:-1], "truncated or padded"),
    Corrupt("inline payload cut short", _INLINE[:-3], "truncated or padded"),
    Corrupt("trailing garbage", _F8 + b"junk", "truncated or padded"),
    Corrupt("wrong magic", _F8[:4] + b"XXXX" + _F8[8:], "not a cai_mpi header"),
    Corrupt("protocol 1 (magic first)", b"CAIM\x01" + bytes(46), "protocol 1"),
    Corrupt("protocol version 3", _with(_F8, "version", 3), "version 3 is not supported"),
    Corrupt("unknown flag 0x80", _with(_F8, "flags", 0x80), "unknown header flags 0x80"),
    Corrupt("inline and channel", _with(_INLINE, "flags", FLAG_INLINE | FLAG_CHANNEL), "channel"),
    Corrupt("255 dimensions", _with(_F8, "ndim", 255), "field sizes out of range"),
    Corrupt("dtype field of 65535 bytes", _with(_F8, "dtype_len", 65535), "field sizes out of range"),
    Corrupt("meta of 4 GiB", _with(_F8, "meta_len", 2**32 - 1), "field sizes out of range"),
    Corrupt("empty dtype field", craft(b"", (4,), 32), "field sizes out of range"),
    Corrupt("payload bytes 2**64-1", _with(_F8, "payload_nbytes", 2**64 - 1), "header says"),
    Corrupt("shape of 2**62 bytes", craft(b"<f8", (2**59,)), "over the limit"),
    Corrupt("shape (0, 2**64-1)", craft(b"<f8", (0, 2**64 - 1)), "shape"),
    Corrupt("a channel's payload in chunks", craft(b"<f8", (4,), flags=FLAG_CHANNEL, chunk_bytes=8), "channel"),
    Corrupt("dtype '<x4'", craft(b"<x4", (4,), 16), "dtype"),
    Corrupt("dtype of Python objects", craft(b"|O", (4,), 32), "dtype"),
    Corrupt("subarray dtype '(2,)<f4'", craft(b"(2,)<f4", (4,), 32), "dtype"),
    Corrupt("subarray dtype in JSON", craft(b'{"base":"<f4","shape":[2]}', (4,), 32, flags=FLAG_STRUCTURED),
            "dtype"),
    Corrupt("dtype spelled 'float64'", craft(b"float64", (4,), 32), "dtype"),
    Corrupt("meta not JSON", craft(b"<f8", (4,), meta=b"{not json"), "meta"),
    Corrupt("meta a JSON list", craft(b"<f8", (4,), meta=b"[1, 2]"), "meta"),
    Corrupt("meta length without the meta flag", _with(craft(b"<f8", (4,), meta=b"{}"), "flags", 0), "meta"),
    Corrupt("negative payload tag", _with(_F8, "payload_tag", -3), "negative payload tag"),
    Corrupt("64 random bytes", bytes(np.random.default_rng(16).integers(0, 256, 64, dtype=np.uint8)), "header"),
)
