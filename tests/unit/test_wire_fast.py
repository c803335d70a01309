"""The cached fast decoders accept exactly what decode_header accepts for their message kinds."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

from cai_mpi._src import wire
from cai_mpi._src.errors import ProtocolError
from cai_mpi._src.wire import (
    HEADER_BUFFER_BYTES,
    PAYLOAD_TAG_FIELD,
    decode_header,
    decode_inline,
    decode_plain,
    encode_header,
    inline_prefix,
    plain_header,
    plain_template,
)


def buf(msg: bytes) -> bytearray:
    b = bytearray(HEADER_BUFFER_BYTES)
    b[: len(msg)] = msg
    return b


@pytest.mark.parametrize("dtype", ["<f8", ">i2", "?", [("a", "<i4"), ("b", "<f8", (2,))]])
@pytest.mark.parametrize("shape", [(), (1,), (3, 5)])
def test_inline_prefix_round_trip(dtype: object, shape: tuple[int, ...]) -> None:
    dt = np.dtype(dtype)  # type: ignore[call-overload]
    payload = np.arange(int(np.prod(shape)) * dt.itemsize, dtype=np.uint8).tobytes()
    msg = inline_prefix(dt, shape) + payload
    assert msg == encode_header(dt, shape, fortran=False, payload_tag=0, inline=payload)
    for _ in range(2):  # the second call is served from the cache
        fast = decode_inline(buf(msg), len(msg))
        assert fast is not None
        got_shape, got_dtype, offset, nbytes = fast
        assert (got_shape, got_dtype, nbytes) == (shape, dt, len(payload))
        assert msg[offset : offset + nbytes] == payload


def test_inline_rejects_truncation_and_other_kinds() -> None:
    msg = inline_prefix(np.dtype("<f8"), (2,)) + bytes(16)
    assert decode_inline(buf(msg), len(msg) - 1) is None  # truncated payload
    assert decode_inline(buf(msg), 10) is None
    with_meta = encode_header(np.dtype("<f8"), (2,), fortran=False, payload_tag=0, meta_bytes=b'{"a":1}',
                              inline=bytes(16))
    assert decode_inline(buf(with_meta), len(with_meta)) is None
    bad = bytearray(msg)
    bad[:4] = b"XXXX"
    assert decode_inline(buf(bytes(bad)), len(bad)) is None


@pytest.mark.parametrize("fortran", [False, True])
def test_plain_header_carries_its_payload_tag(fortran: bool) -> None:
    dt = np.dtype("<c16")
    for ptag in (0, 7, 2**31 - 1):
        msg = bytes(plain_header(dt, (4, 6), fortran, ptag))
        assert msg == encode_header(dt, (4, 6), fortran=fortran, payload_tag=ptag)
        assert decode_plain(buf(msg), len(msg), 1 << 40) == ((4, 6), dt, fortran, 4 * 6 * 16, ptag)
        full = decode_header(buf(msg), len(msg), max_payload_bytes=1 << 40)
        assert full.payload_tag == ptag


def test_plain_enforces_the_payload_limit_every_time() -> None:
    msg = bytes(plain_header(np.dtype("u1"), (1000,), False, 3))
    assert decode_plain(buf(msg), len(msg), 1 << 40) is not None  # cached now
    assert decode_plain(buf(msg), len(msg), 999) is None  # the limit is checked on cache hits too


def test_plain_rejects_chunked_inline_and_meta_headers() -> None:
    dt = np.dtype("u1")
    chunked = encode_header(dt, (1000,), fortran=False, payload_tag=1, chunk_bytes=100)
    meta = encode_header(dt, (1000,), fortran=False, payload_tag=1, meta_bytes=b"{}")
    inline = encode_header(dt, (4,), fortran=False, payload_tag=0, inline=bytes(4))
    for msg in (chunked, meta, inline):
        assert decode_plain(buf(msg), len(msg), 1 << 40) is None


def _payload_tag_impls() -> list[object]:
    impls = [pytest.param(wire._plain_payload_tag, id="python")]
    try:
        from cai_mpi._src._wirefast import plain_payload_tag as c_impl
    except ImportError:
        impls.append(pytest.param(None, id="c", marks=pytest.mark.skip(reason="_wirefast was not built")))
    else:
        impls.append(pytest.param(c_impl, id="c"))
    return impls


@pytest.mark.parametrize("match", _payload_tag_impls())
def test_plain_payload_tag_reads_the_tag_of_the_template_header_only(match: Any) -> None:
    header = plain_header(np.dtype("<f4"), (3, 7), False, 0)
    template = plain_template(header, len(header))
    assert template == bytes(header)  # tag 0: the template is the header itself
    for ptag in (0, 1, 1234, 2**31 - 1):
        msg = buf(bytes(plain_header(np.dtype("<f4"), (3, 7), False, ptag)))
        assert match(msg, len(header), template) == ptag
        assert match(msg, len(header) - 1, template) == -1  # another length: another header
        assert match(msg, len(header) + 1, template) == -1
    negative = buf(bytes(header))
    PAYLOAD_TAG_FIELD.pack_into(negative, 24, -5)
    assert match(negative, len(header), template) == -1  # no valid header has a negative tag
    # Any byte outside the tag field that differs makes it another header.
    for i in [*range(24), *range(28, len(header))]:
        other = buf(bytes(header))
        other[i] ^= 0x01
        assert match(other, len(header), template) == -1, f"byte {i}"
    assert match(bytearray(header[:30]), len(header), template) == -1  # n beyond the buffer: no read past it
    assert match(buf(bytes(header)), len(header), b"") == -1  # the empty template matches nothing


def test_plain_payload_tag_is_the_c_one_where_built() -> None:
    try:
        from cai_mpi._src import _wirefast
    except ImportError:
        pytest.skip("_wirefast was not built")
    assert wire.plain_payload_tag is _wirefast.plain_payload_tag


def test_decode_cached_gives_what_decode_header_gives() -> None:
    dt = np.dtype("<f4")
    messages = [
        bytes(plain_header(dt, (4, 6), False, 9)),
        bytes(plain_header(dt, (4, 6), True, 10)),  # Fortran order
        encode_header(dt, (4, 6), fortran=False, payload_tag=3, meta_bytes=b'{"a":1}'),
        encode_header(dt, (4, 6), fortran=False, payload_tag=3, chunk_bytes=32),
        encode_header(dt, (2,), fortran=False, payload_tag=0, inline=bytes(8)),
        encode_header(dt, (0,), fortran=False, payload_tag=0),
    ]
    for msg in messages:
        for _ in range(2):  # the second time from the cache
            expected = decode_header(buf(msg), len(msg), max_payload_bytes=1 << 40)
            assert wire.decode_cached(buf(msg), len(msg), max_payload_bytes=1 << 40) == expected
    plain = messages[0]
    with pytest.raises(ProtocolError):  # a cached header still meets the payload limit
        wire.decode_cached(buf(plain), len(plain), max_payload_bytes=4 * 6 * 4 - 1)
