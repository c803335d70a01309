"""The cai_mpi header: encode/decode round trips, strict decoding, and encode_meta's refusals.

Every decoding test runs twice: through the strict decoder, and through the cached decoder the receive
path uses (warmed with the same header first, so a cached decoding is what answers).
"""

from __future__ import annotations

import contextlib
import json
import math
import re
import struct
import warnings
from collections.abc import Iterator
from typing import Any, NamedTuple

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

from cai_mpi._src.core import header
from cai_mpi._src.core.header import (
    FLAG_FORTRAN,
    FLAG_INLINE,
    HEADER_BUFFER_BYTES,
    MAGIC,
    MAX_META_BYTES,
    MAX_NDIM,
    PROTOCOL_VERSION,
    decode_header,
    encode_header,
    encode_meta,
)
from cai_mpi._src.errors import CAIError, CaiMpiError, ProtocolError

pytestmark = pytest.mark.one_wheel  # (the header codec is pure Python: the MPI library cannot change its outcome)

BIG = 1 << 62
# The documented layout, restated to catch silent changes: payload tag, magic, version, flags, ndim,
# reserved, dtype length, reserved, meta length, reserved, payload bytes, chunk bytes.
PREFIX = struct.Struct("<i4sBBBBHHIIQQ")
VERSION_AT, FLAGS_AT = 8, 9
FLAG_STRUCTURED = 0x02
FLAG_META = 0x04


class Decoded(NamedTuple):
    dtype: np.dtype[Any]
    shape: tuple[int, ...]
    fortran: bool
    payload_nbytes: int
    chunk_bytes: int
    payload_tag: int
    meta: dict[str, Any] | None
    inline: bytes | None
    channel: bool
    nchunks: int


MODE = "strict"


@pytest.fixture(autouse=True, scope="module", params=["strict", "cached"])
def decoder(request: pytest.FixtureRequest) -> Iterator[str]:
    global MODE
    MODE = request.param
    yield MODE
    MODE = "strict"


def in_buffer(msg: bytes) -> bytearray:
    buf = bytearray(HEADER_BUFFER_BYTES + len(msg))
    buf[: len(msg)] = msg
    return buf


def decode(msg: bytes, nbytes: int | None = None, max_payload_bytes: int = BIG) -> Decoded:
    """Decode ``msg[:nbytes]`` with the decoder under test (the cached one twice: filling, then hitting)."""
    n = len(msg) if nbytes is None else nbytes
    if MODE == "strict":
        info, tag = decode_header(msg, n, max_payload_bytes=max_payload_bytes)
    else:
        buf = in_buffer(msg)
        first = header.decode(buf, n, max_payload_bytes)
        info, tag = header.decode(buf, n, max_payload_bytes)
        assert (info, tag) == first
    inline = bytes(msg[info.header_nbytes : info.header_nbytes + info.payload_nbytes]) if info.inline else None
    return Decoded(info.dtype, info.shape, info.fortran, info.payload_nbytes, info.chunk_bytes, tag, info.meta, inline,
                   info.channel, info.nchunks)


def craft(
    dfield: bytes,
    shape: tuple[int, ...] = (1,),
    *,
    payload_nbytes: int = 0,
    flags: int = 0,
    meta: bytes = b"",
    ndim: int | None = None,
    payload_tag: int = 0,
    chunk_bytes: int = 0,
    magic: bytes = MAGIC,
    version: int = PROTOCOL_VERSION,
    tail: bytes = b"",
) -> bytes:
    """A header assembled by hand, field by field (consistent lengths unless told otherwise)."""
    n = len(shape) if ndim is None else ndim
    return (
        PREFIX.pack(
            payload_tag, magic, version, flags | (FLAG_META if meta else 0), n, 0, len(dfield), 0, len(meta), 0,
            payload_nbytes, chunk_bytes,
        )
        + struct.pack(f"<{len(shape)}Q", *shape)
        + dfield
        + meta
        + tail
    )


def valid_header(inline: bool = False, meta: dict[str, Any] | None = None) -> bytes:
    dtype = np.dtype([("a", ">f4"), ("b", "<i2", (2,))])
    payload = bytes(range(3 * 2 * dtype.itemsize)) if inline else None
    return encode_header(
        dtype,
        (3, 2),
        fortran=True,
        payload_tag=77,
        chunk_bytes=4096,
        meta_bytes=encode_meta(meta if meta is not None else {"k": [1, 2.5, None, "s"]}),
        inline=payload,
    )


# ---------------------------------------------------------------------------------------------
# layout and simple round trips


def test_prefix_layout_is_40_bytes_and_starts_with_the_payload_tag() -> None:
    assert header.PREFIX_BYTES == PREFIX.size == 40
    hdr = encode_header(np.dtype("<f8"), (2, 3), fortran=False, payload_tag=9, chunk_bytes=1024)
    assert hdr == PREFIX.pack(9, MAGIC, 2, 0, 2, 0, 3, 0, 0, 0, 48, 1024) + struct.pack("<2Q", 2, 3) + b"<f8"


def test_plain_round_trip() -> None:
    hdr = encode_header(np.dtype(">c8"), (4, 0, 2), fortran=False, payload_tag=3)
    h = decode(hdr)
    assert (
        h.dtype,
        h.shape,
        h.fortran,
        h.payload_nbytes,
        h.chunk_bytes,
        h.payload_tag,
        h.meta,
        h.inline,
    ) == (
        np.dtype(">c8"),
        (4, 0, 2),
        False,
        0,
        0,
        3,
        None,
        None,
    )
    assert h.nchunks == 0


def test_inline_round_trip_and_flags() -> None:
    payload = np.arange(6, dtype="<i4").tobytes()
    hdr = encode_header(np.dtype("<i4"), (2, 3), fortran=True, payload_tag=0, inline=memoryview(payload))
    assert hdr[FLAGS_AT] == FLAG_INLINE | FLAG_FORTRAN
    h = decode(hdr)
    assert h.fortran is True
    assert h.inline is not None
    assert bytes(h.inline) == payload
    assert h.payload_nbytes == 24
    assert h.nchunks == 0


def test_nchunks() -> None:
    def h(chunk: int, shape: tuple[int, ...]) -> Decoded:
        return decode(encode_header(np.dtype("u1"), shape, fortran=False, payload_tag=1, chunk_bytes=chunk))

    assert h(0, (1000,)).nchunks == 1
    assert h(100, (1000,)).nchunks == 10
    assert h(101, (1000,)).nchunks == 10
    assert h(99, (1000,)).nchunks == 11
    assert h(100, (0,)).nchunks == 0


def test_decode_reads_only_the_first_nbytes_of_a_bigger_buffer() -> None:
    hdr = valid_header(inline=True)
    h = decode(bytes(in_buffer(hdr)), len(hdr))
    assert h.inline is not None
    assert bytes(h.inline) == bytes(range(48))
    assert h.meta == {"k": [1, 2.5, None, "s"]}


def test_max_ndim_round_trips_and_more_is_refused_at_encode() -> None:
    shape = (1,) * MAX_NDIM
    h = decode(encode_header(np.dtype("<f4"), shape, fortran=False, payload_tag=0))
    assert h.shape == shape
    with pytest.raises(CAIError, match="'shape' has 65 dimensions; cai_mpi sends at most 64"):
        encode_header(np.dtype("<f4"), (1,) * (MAX_NDIM + 1), fortran=False, payload_tag=0)


def test_huge_descr_is_refused_at_encode() -> None:
    dtype = np.dtype([(f"field_number_{i:05d}", "<f8") for i in range(600)])
    with pytest.raises(CAIError, match=r"'descr' is \d+ bytes as JSON; the limit is 16384"):
        encode_header(dtype, (1,), fortran=False, payload_tag=0)


# ---------------------------------------------------------------------------------------------
# hypothesis round trip

SCALARS = (
    hnp.integer_dtypes(endianness="?")
    | hnp.unsigned_integer_dtypes(endianness="?")
    | hnp.floating_dtypes(endianness="?")
    | hnp.complex_number_dtypes(endianness="?")
    | hnp.boolean_dtypes()
    | hnp.datetime64_dtypes(endianness="?")
    | hnp.timedelta64_dtypes(endianness="?")
    | hnp.byte_string_dtypes(endianness="?", min_len=1, max_len=8)
    | hnp.unicode_string_dtypes(endianness="?", min_len=1, max_len=4)
)
FIELD_NAMES = st.text(st.characters(codec="utf-8", exclude_categories=["Cs"]), min_size=1, max_size=6)
SUBSHAPES = st.none() | st.lists(st.integers(0, 3), min_size=1, max_size=2).map(tuple)


def structured(inner: st.SearchStrategy[np.dtype[Any]]) -> st.SearchStrategy[np.dtype[Any]]:
    # hnp.array_dtypes would also draw titled fields, which have their own test below
    field = st.tuples(inner, SUBSHAPES)
    return st.lists(st.tuples(FIELD_NAMES, field), min_size=1, max_size=3, unique_by=lambda f: f[0]).map(
        lambda fields: np.dtype([(name, t) if sub is None else (name, t, sub) for name, (t, sub) in fields])
    )


# Zero-itemsize dtypes cannot be sent (encode_header refuses them; see test_zero_itemsize_refused).
DTYPES = st.recursive(SCALARS, structured, max_leaves=6).filter(lambda d: d.itemsize > 0)
JSON = st.recursive(
    st.none()
    | st.booleans()
    | st.integers(-(2**70), 2**70)
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(max_size=10),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=6), inner, max_size=4),
    max_leaves=12,
)
METAS = st.none() | st.dictionaries(st.text(max_size=8), JSON, max_size=5)


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    dtype=DTYPES,
    shape=st.lists(st.integers(0, 4), min_size=0, max_size=6).map(tuple),
    fortran=st.booleans(),
    meta=METAS,
    inline=st.booleans(),
    chunk_bytes=st.integers(0, 2**64 - 1),
    payload_tag=st.integers(0, 2**31 - 1),
    data=st.data(),
)
def test_round_trip(
    dtype: np.dtype[Any],
    shape: tuple[int, ...],
    fortran: bool,
    meta: dict[str, Any] | None,
    inline: bool,
    chunk_bytes: int,
    payload_tag: int,
    data: st.DataObject,
) -> None:
    nbytes = math.prod(shape) * dtype.itemsize
    payload = data.draw(st.binary(min_size=nbytes, max_size=nbytes)) if inline and nbytes <= 1 << 16 else None
    meta_bytes = encode_meta(meta)
    hdr = encode_header(
        dtype,
        shape,
        fortran=fortran,
        payload_tag=payload_tag,
        chunk_bytes=chunk_bytes,
        meta_bytes=meta_bytes,
        inline=payload,
    )
    h = decode(hdr, max_payload_bytes=nbytes)
    assert h.dtype == dtype
    assert h.dtype.str == dtype.str
    assert h.dtype.descr == dtype.descr
    assert h.shape == shape
    assert h.fortran is fortran
    assert h.payload_nbytes == nbytes
    assert h.chunk_bytes == chunk_bytes
    assert h.payload_tag == (0 if payload is not None else payload_tag)  # an inline header carries no tag
    if meta is None:
        assert h.meta is None
    else:
        assert json.dumps(h.meta) == json.dumps(meta)  # exact: True stays True, 1.0 stays 1.0
    if payload is None:
        assert h.inline is None
    else:
        assert h.inline is not None
        assert bytes(h.inline) == payload
    # one byte less or more is never accepted, also right after the header itself was
    for n in (len(hdr) - 1, len(hdr) + 1):
        with pytest.raises(ProtocolError):
            decode(hdr + b"\0", n)


def outcome(decoder: Any, msg: bytes, n: int) -> Any:
    """What a decoder makes of ``msg[:n]``: its answer, or the fact that it refused."""
    try:
        info, tag = decoder(msg, n)
    except ProtocolError:
        return "refused"
    return info, tag


@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    dtype=DTYPES,
    shape=st.lists(st.integers(0, 4), min_size=0, max_size=4).map(tuple),
    fortran=st.booleans(),
    inline=st.booleans(),
    payload_tag=st.integers(0, 2**31 - 1),
    data=st.data(),
)
def test_the_cache_answers_a_corrupted_header_exactly_as_the_strict_decoder(
    dtype: np.dtype[Any], shape: tuple[int, ...], fortran: bool, inline: bool, payload_tag: int, data: st.DataObject
) -> None:
    """The receive path's cached decoder, warmed with a valid header, then given a corrupted variant of
    it (a byte changed, the message cut or extended, the tag negative) agrees with the strict decoder."""
    nbytes = math.prod(shape) * dtype.itemsize
    payload = bytes(nbytes) if inline and nbytes <= 4096 else None
    hdr = encode_header(dtype, shape, fortran=fortran, payload_tag=payload_tag, inline=payload)
    header.decode(in_buffer(hdr), len(hdr), BIG)  # the cache now holds this header
    kind = data.draw(st.sampled_from(["byte", "cut", "extend", "tag"]))
    msg = bytearray(hdr)
    if kind == "byte":
        at = data.draw(st.integers(0, len(msg) - 1))
        msg[at] = data.draw(st.integers(0, 255).filter(lambda v: v != hdr[at]))
    elif kind == "tag":
        msg[:4] = struct.pack("<i", data.draw(st.integers(-(2**31), -1)))
    n = len(msg) + {"cut": -data.draw(st.integers(1, len(msg))), "extend": data.draw(st.integers(1, 64))}.get(kind, 0)
    limit = data.draw(st.sampled_from([BIG, nbytes, max(nbytes - 1, 0)]))
    strict = outcome(lambda m, k: decode_header(m, k, max_payload_bytes=limit), bytes(in_buffer(bytes(msg))), n)
    cached = outcome(lambda m, k: header.decode(in_buffer(m), k, limit), bytes(msg), n)
    assert cached == strict


def test_round_trip_of_titled_structured_dtype() -> None:
    dtype = np.dtype([(("a title", "t"), "<f4"), ("u", "<i4")])
    h = decode(encode_header(dtype, (2,), fortran=False, payload_tag=0))
    assert h.dtype == dtype


@pytest.mark.parametrize(
    "dtype",
    [
        np.dtype([("a", "u1"), ("b", "<f8")], align=True),
        np.dtype({"names": ["a", "b"], "formats": ["<i2", "<f4"], "offsets": [4, 8], "itemsize": 16}),
    ],
    ids=["aligned", "offsets"],
)
def test_round_trip_of_padded_structured_dtype(dtype: np.dtype[Any]) -> None:
    h = decode(encode_header(dtype, (2,), fortran=False, payload_tag=0))
    assert h.dtype.names == dtype.names
    assert h.dtype == dtype


# ---------------------------------------------------------------------------------------------
# strict decoding


def test_valid_headers_decode() -> None:
    for inline in (False, True):
        h = decode(valid_header(inline=inline))
        assert (h.shape, h.fortran, h.payload_tag, h.chunk_bytes) == ((3, 2), True, 0 if inline else 77, 4096)


def test_wrong_magic() -> None:
    hdr = valid_header()
    for bad in (b"CAIN", b"\0\0\0\0", b"MIAC"):
        msg = re.escape(f"not a cai_mpi header: magic {bad!r}, expected b'CAIM'")
        with pytest.raises(ProtocolError, match=msg):
            decode(hdr[:4] + bad + hdr[8:])


def test_a_protocol_1_peer_is_named() -> None:
    old = struct.pack("<4sBBBBQQiHHII", MAGIC, 1, 0, 1, 0, 4, 0, 9, 3, 0, 0, 0) + struct.pack("<Q", 1) + b"<f4"
    with pytest.raises(ProtocolError, match="the sender speaks cai_mpi protocol 1"):
        decode(old)


@pytest.mark.parametrize("version", [0, 1, 3, 255])
def test_unknown_protocol_version(version: int) -> None:
    hdr = bytearray(valid_header())
    hdr[VERSION_AT] = version
    with pytest.raises(ProtocolError, match=f"cai_mpi protocol version {version} is not supported"):
        decode(bytes(hdr))


@pytest.mark.parametrize("flag", [0x40, 0x80, 0xF0])
def test_unknown_flags(flag: int) -> None:
    hdr = bytearray(valid_header())
    hdr[FLAGS_AT] |= flag
    with pytest.raises(ProtocolError, match=f"unknown header flags {flag & ~0x30:#x}"):
        decode(bytes(hdr))


def test_the_may_fail_flag_round_trips_only_on_headers_with_separate_payload_messages() -> None:
    """0x20: the sender may mark its payload failed after posting the header (docs/protocol.md)."""
    msg = encode_header(np.dtype("<f8"), (4, 5), fortran=False, payload_tag=3, chunk_bytes=64, may_fail=True)
    assert msg[FLAGS_AT] & 0x20
    info, tag = decode_header(msg, len(msg), max_payload_bytes=BIG)
    assert info.may_fail and tag == 3 and info.nchunks == 3
    buf = in_buffer(msg)
    assert header.decode(buf, len(msg), BIG)[0].may_fail and header.decode(buf, len(msg), BIG)[0].may_fail
    plain = encode_header(np.dtype("<f8"), (4, 5), fortran=False, payload_tag=3, chunk_bytes=64)
    assert not decode_header(plain, len(plain), max_payload_bytes=BIG)[0].may_fail  # a template of its own
    with pytest.raises(ValueError, match="separate payload messages"):
        encode_header(np.dtype("u1"), (1,), fortran=False, payload_tag=0, inline=b"x", may_fail=True)
    for flag in (0x01, 0x10):  # inline, channel-opening
        hdr = bytearray(valid_header(inline=flag == 0x01))
        hdr[FLAGS_AT] |= 0x20 | flag
        with pytest.raises(ProtocolError, match="cannot"):
            decode(bytes(hdr))


def test_channel_flag_round_trips_and_never_rides_inline() -> None:
    h = decode(encode_header(np.dtype("<f4"), (2, 3), fortran=True, payload_tag=9, channel=True))
    assert h.channel and h.fortran and h.payload_tag == 9 and h.nchunks == 1
    assert decode(encode_header(np.dtype("<f4"), (0,), fortran=False, payload_tag=9, channel=True)).nchunks == 1
    assert not decode(valid_header()).channel
    with pytest.raises(ValueError, match="inline"):
        encode_header(np.dtype("u1"), (1,), fortran=False, payload_tag=0, inline=b"x", channel=True)
    hdr = bytearray(valid_header(inline=True))
    hdr[FLAGS_AT] |= 0x10
    with pytest.raises(ProtocolError, match="channel-opening header cannot carry its payload inline"):
        decode(bytes(hdr))


@pytest.mark.parametrize("inline", [False, True])
def test_every_truncation_is_a_protocol_error(inline: bool) -> None:
    hdr = valid_header(inline=inline)
    for k in range(len(hdr)):
        with pytest.raises(ProtocolError):
            decode(hdr[:k])
        with pytest.raises(ProtocolError):
            decode(hdr, k)


def test_short_header_message() -> None:
    with pytest.raises(ProtocolError, match="truncated cai_mpi header: 39 bytes, need at least 40"):
        decode(valid_header()[:39])


@pytest.mark.parametrize("extra", [b"\0", b"garbage", bytes(1000)])
def test_trailing_garbage(extra: bytes) -> None:
    hdr = valid_header()
    with pytest.raises(
        ProtocolError, match=f"truncated or padded cai_mpi header: {len(hdr) + len(extra)} bytes"
    ):
        decode(hdr + extra)


@pytest.mark.parametrize("delta", [-4, -1, 1, 4, 1 << 40])
def test_payload_nbytes_inconsistent_with_shape(delta: int) -> None:
    hdr = craft(b"<f4", (2, 3), payload_nbytes=24 + delta)
    with pytest.raises(
        ProtocolError, match=rf"header says {24 + delta} payload bytes but shape \(2, 3\) x itemsize 4"
    ):
        decode(hdr)


def test_inline_payload_of_the_wrong_length_is_refused() -> None:
    for payload in (bytes(23), bytes(25)):
        hdr = encode_header(np.dtype("<f4"), (2, 3), fortran=False, payload_tag=0, inline=payload)
        with pytest.raises(ProtocolError):
            decode(hdr)


def test_payload_over_max_payload_bytes() -> None:
    hdr = encode_header(np.dtype("<f8"), (1000, 1000), fortran=False, payload_tag=1)
    assert decode(hdr, max_payload_bytes=8_000_000).payload_nbytes == 8_000_000
    with pytest.raises(
        ProtocolError, match="header announces 8000000 payload bytes, over the limit of 7999999"
    ):
        decode(hdr, max_payload_bytes=7_999_999)
    with pytest.raises(ProtocolError, match="over the limit of 0"):
        decode(hdr, max_payload_bytes=0)


def test_negative_payload_tag() -> None:
    with pytest.raises(ProtocolError, match="negative payload tag -5"):
        decode(craft(b"<f4", (1,), payload_nbytes=4, payload_tag=-5))


@pytest.mark.parametrize(
    "hdr",
    [
        craft(b"<f4", (1,) * 65, payload_nbytes=4),  # ndim over 64
        craft(b"", (1,), payload_nbytes=0),  # no dtype
        craft(b"<f4" + b" " * (16 << 10), (1,), payload_nbytes=4),  # dtype field over the limit
        craft(b"<f4", (1,), payload_nbytes=4, meta=b"{}" + b" " * (16 << 10)),  # meta over the limit
    ],
    ids=["ndim", "empty-dtype", "big-dtype", "big-meta"],
)
def test_field_sizes_out_of_range(hdr: bytes) -> None:
    with pytest.raises(ProtocolError, match="header field sizes out of range"):
        decode(hdr)


@pytest.mark.parametrize(
    ("dfield", "flags"),
    [
        (b"<x4", 0),
        (b"\xff\xfe", 0),
        (b"f4[3]", 0),
        (b"not json", FLAG_STRUCTURED),
        (b'"f4"', FLAG_STRUCTURED),
        (b"[[1,2]]", FLAG_STRUCTURED),
        (b'[["a"]]', FLAG_STRUCTURED),
        (b'[["a","<f4",5]]', FLAG_STRUCTURED),
        (b"5", FLAG_STRUCTURED),
        (b'[["a","nonsense"]]', FLAG_STRUCTURED),
        (b"\xff", FLAG_STRUCTURED),
    ],
)
def test_bad_dtype_field(dfield: bytes, flags: int) -> None:
    with pytest.raises(ProtocolError, match="header dtype field is not a numpy dtype"):
        decode(craft(dfield, (1,), payload_nbytes=4, flags=flags))


@pytest.mark.parametrize("meta", [b"{", b"nope", b"\xff\xfe\x00", b"{'a': 1}"])
def test_bad_meta(meta: bytes) -> None:
    with pytest.raises(ProtocolError, match="header meta is not JSON"):
        decode(craft(b"<f4", (1,), payload_nbytes=4, meta=meta))


@pytest.mark.parametrize("dfield", [b",", b"f4,,", b"i4,,f8"])
def test_dtype_field_syntax_error_is_a_protocol_error(dfield: bytes) -> None:
    hdr = craft(dfield, (1,), payload_nbytes=4)
    with pytest.raises(ProtocolError):
        decode(hdr)


@pytest.mark.parametrize("where", ["dtype", "meta"])
def test_deeply_nested_json_is_a_protocol_error(where: str) -> None:
    deep = b"[" * 5000 + b"]" * 5000
    if where == "dtype":
        hdr = craft(deep, (1,), payload_nbytes=4, flags=FLAG_STRUCTURED)
    else:
        hdr = craft(b"<f4", (1,), payload_nbytes=4, meta=deep)
    with pytest.raises(ProtocolError):
        decode(hdr)


@pytest.mark.parametrize(
    ("dfield", "flags", "nbytes"),
    [(b"|O", 0, 16), (b"O", 0, 16), (b'[["a","<f8"],["o","|O"]]', FLAG_STRUCTURED, 32)],
)
def test_object_dtype_from_the_wire_is_refused(dfield: bytes, flags: int, nbytes: int) -> None:
    hdr = craft(dfield, (2,), payload_nbytes=nbytes, flags=flags)
    with pytest.raises(ProtocolError):
        decode(hdr)


@pytest.mark.parametrize("meta", [b"5", b"[1,2]", b'"s"', b"null"])
def test_non_dict_meta_is_refused(meta: bytes) -> None:
    with pytest.raises(ProtocolError):
        decode(craft(b"<f4", (1,), payload_nbytes=4, meta=meta))


# ---------------------------------------------------------------------------------------------
# fuzz: decode_header raises ProtocolError and nothing else


def decode_only_protocol_errors(buf: bytes) -> None:
    with warnings.catch_warnings():
        # numpy deprecation warnings for odd typestrs ('a5') are not what this test is about
        warnings.simplefilter("ignore")
        with contextlib.suppress(ProtocolError):
            decode(buf)


@settings(max_examples=300, deadline=None)
@given(st.binary(max_size=300))
def test_fuzz_random_bytes(buf: bytes) -> None:
    decode_only_protocol_errors(buf)


@settings(max_examples=300, deadline=None)
@given(st.binary(max_size=300))
def test_fuzz_random_bytes_after_the_magic(tail: bytes) -> None:
    decode_only_protocol_errors(bytes(4) + MAGIC + bytes([PROTOCOL_VERSION]) + tail)


DTYPE_TEXT = st.text(alphabet="<>|=bBhHiIlLqQfdFDuUSVMm8421[](),: \"'xyz0", max_size=20)


@settings(max_examples=400, deadline=None)
@given(
    dfield=DTYPE_TEXT.map(str.encode) | st.binary(min_size=1, max_size=20),
    flags=st.integers(0, 0x0F),
    shape=st.lists(st.integers(0, 2**64 - 1) | st.integers(0, 5), max_size=4).map(tuple),
    payload_nbytes=st.integers(0, 2**64 - 1) | st.integers(0, 64),
    meta=st.binary(max_size=20) | JSON.map(lambda v: json.dumps(v).encode()),
    payload_tag=st.integers(-(2**31), 2**31 - 1),
)
def test_fuzz_consistent_lengths_random_fields(
    dfield: bytes, flags: int, shape: tuple[int, ...], payload_nbytes: int, meta: bytes, payload_tag: int
) -> None:
    if not dfield:
        dfield = b"?"
    inline_payload = b""
    if flags & FLAG_INLINE and payload_nbytes <= 64:
        inline_payload = bytes(payload_nbytes)
    hdr = craft(
        dfield,
        shape,
        payload_nbytes=payload_nbytes,
        flags=flags & ~FLAG_META,
        meta=meta,
        payload_tag=payload_tag,
        tail=inline_payload,
    )
    decode_only_protocol_errors(hdr)


# ---------------------------------------------------------------------------------------------
# encode_meta


def test_encode_meta_none_is_empty() -> None:
    assert encode_meta(None) == b""


def test_encode_meta_is_compact_json() -> None:
    assert (
        encode_meta({"a": [1, 2.5, None, True], "b": {"c": "é"}})
        == b'{"a":[1,2.5,null,true],"b":{"c":"\\u00e9"}}'
    )
    assert encode_meta({}) == b"{}"


@pytest.mark.parametrize("meta", [[1, 2], "s", 3, (("a", 1),), b"{}"])
def test_encode_meta_refuses_non_dict(meta: Any) -> None:
    with pytest.raises(TypeError, match=f"meta must be a dict of JSON values, got {type(meta).__name__}"):
        encode_meta(meta)


@pytest.mark.parametrize(
    "meta",
    [
        {"a": {1, 2}},
        {"a": b"bytes"},
        {"a": float("nan")},
        {"a": float("inf")},
        {"a": [float("-inf")]},
        {"a": object()},
        {(1, 2): "tuple key"},
    ],
)
def test_encode_meta_refuses_non_json_values(meta: dict[Any, Any]) -> None:
    with pytest.raises(TypeError, match="meta must hold only JSON values"):
        encode_meta(meta)


@pytest.mark.parametrize(
    "meta",
    [
        {1: "int key"},
        {True: "bool key"},
        {None: "none key"},
        {1.5: "float key"},
    ],
)
def test_encode_meta_refuses_what_would_not_round_trip(meta: dict[Any, Any]) -> None:
    with pytest.raises(TypeError, match="meta would not survive JSON unchanged"):
        encode_meta(meta)


@pytest.mark.parametrize(
    ("meta", "arrives"),
    [
        ({"t": (1, 2)}, {"t": [1, 2]}),
        ({"t": [1, (2, (3,))]}, {"t": [1, [2, [3]]]}),
        ({"d": {"inner": ()}}, {"d": {"inner": []}}),
        ({"i": np.int64(-3), "u": np.uint8(200), "b": np.bool_(True)}, {"i": -3, "u": 200, "b": True}),
        ({"f": np.float32(0.5), "g": np.float64(2.25), "h": np.float16(1.5)}, {"f": 0.5, "g": 2.25, "h": 1.5}),
        ({"s": np.str_("x"), "step": np.array(7), "lr": np.array(1e-3)}, {"s": "x", "step": 7, "lr": 1e-3}),
        ({"shape": tuple(np.arange(3))}, {"shape": [0, 1, 2]}),
        ({"k": [np.int32(1), {"v": np.array(True)}]}, {"k": [1, {"v": True}]}),
    ],
    ids=["tuple", "nested-tuples", "empty-tuple", "numpy-ints", "numpy-floats", "0-d-arrays", "tuple-of-numpy",
         "deep-numpy"],
)
def test_encode_meta_takes_numpy_scalars_0d_arrays_and_tuples(meta: dict[str, Any], arrives: dict[str, Any]) -> None:
    raw = encode_meta(meta)
    got = decode(encode_header(np.dtype("u1"), (1,), fortran=False, payload_tag=0, meta_bytes=raw)).meta
    assert got == arrives
    assert json.dumps(got) == json.dumps(arrives)  # the same Python types (int stays int, bool stays bool)


@pytest.mark.parametrize(
    ("meta", "hint"),
    [
        ({"a": np.arange(3)}, r"numpy array of shape \(3,\).*\.tolist\(\)"),
        ({"a": np.float32(np.nan)}, "meta must hold only JSON values"),
        ({"a": np.datetime64("2026-01-01")}, "datetime64"),
        ({"a": np.array(b"x")}, "bytes"),
        ({"a": (1, {2})}, "meta must hold only JSON values"),
        ({np.int64(1): "numpy key"}, "str keys"),
    ],
)
def test_encode_meta_still_refuses_what_json_cannot_hold(meta: dict[Any, Any], hint: str) -> None:
    with pytest.raises(TypeError, match=hint):
        encode_meta(meta)


def test_encode_meta_size_limit_is_exact() -> None:
    overhead = len(b'{"a":""}')
    at_limit = {"a": "x" * (MAX_META_BYTES - overhead)}
    assert len(encode_meta(at_limit)) == MAX_META_BYTES == 16384
    h = decode(
        encode_header(np.dtype("u1"), (1,), fortran=False, payload_tag=0, meta_bytes=encode_meta(at_limit))
    )
    assert h.meta == at_limit
    over = {"a": "x" * (MAX_META_BYTES - overhead + 1)}
    with pytest.raises(ValueError, match="meta is 16385 bytes as JSON; the limit is 16384 bytes"):
        encode_meta(over)


def test_errors_are_caimpi_errors() -> None:
    assert issubclass(ProtocolError, CaiMpiError)
    with pytest.raises(CaiMpiError):
        decode(b"")


def test_zero_itemsize_refused() -> None:
    with pytest.raises(TypeError, match="cannot be sent: its itemsize is 0"):
        encode_header(np.dtype([("a", "?", (0,))]), (3,), fortran=False, payload_tag=0)
