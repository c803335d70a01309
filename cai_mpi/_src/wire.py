"""The cai_mpi header: a versioned, self-describing binary record, decoded strictly (docs/protocol.md)."""

from __future__ import annotations

import functools
import json
import math
import struct
import warnings
from typing import Any, NamedTuple

import numpy as np

from .errors import CAIError, ProtocolError

__all__ = [
    "FLAG_CHANNEL",
    "FLAG_FORTRAN",
    "FLAG_INLINE",
    "FLAGS_OFFSET",
    "HEADER_BUFFER_BYTES",
    "Header",
    "MAGIC",
    "MAX_DTYPE_BYTES",
    "MAX_INLINE_BYTES",
    "MAX_META_BYTES",
    "MAX_NDIM",
    "PAYLOAD_TAG_FIELD",
    "PREFIX_BYTES",
    "PROTOCOL_VERSION",
    "decode_cached",
    "decode_header",
    "decode_inline",
    "decode_plain",
    "plain_header",
    "plain_payload_tag",
    "plain_template",
    "inline_prefix",
    "encode_header",
    "encode_meta",
]

MAGIC = b"CAIM"
PROTOCOL_VERSION = 1

# magic, version, flags, ndim, reserved, payload_nbytes, chunk_bytes, payload_tag, dtype_len, reserved,
# meta_len, reserved
_PREFIX = struct.Struct("<4sBBBBQQiHHII")
PREFIX_BYTES = _PREFIX.size  # 40
FLAGS_OFFSET = 5  # the flags byte of the prefix

FLAG_INLINE = 0x01  # the payload follows the header in the same message
FLAG_STRUCTURED = 0x02  # the dtype field is a JSON numpy descr, not a typestr
FLAG_META = 0x04  # a JSON meta dict follows the dtype field
FLAG_FORTRAN = 0x08  # payload bytes are in Fortran (column-major) order
FLAG_CHANNEL = 0x10  # opens a persistent channel: later payloads follow on the payload tag, headerless
_KNOWN_FLAGS = FLAG_INLINE | FLAG_STRUCTURED | FLAG_META | FLAG_FORTRAN | FLAG_CHANNEL

MAX_NDIM = 64
MAX_DTYPE_BYTES = 16 << 10
MAX_META_BYTES = 16 << 10
MAX_INLINE_BYTES = 64 << 10
#: Every header fits in this many bytes: receivers post buffers of this size.
HEADER_BUFFER_BYTES = PREFIX_BYTES + 8 * MAX_NDIM + MAX_DTYPE_BYTES + MAX_META_BYTES + MAX_INLINE_BYTES


class Header(NamedTuple):
    """A decoded header. ``inline`` is a memoryview of the payload when it travelled inside the header."""

    dtype: np.dtype[Any]
    shape: tuple[int, ...]
    fortran: bool
    payload_nbytes: int
    chunk_bytes: int
    payload_tag: int
    meta: dict[str, Any] | None
    inline: memoryview | None
    channel: bool = False  # the message opens a persistent channel (recv_channel)

    @property
    def nchunks(self) -> int:
        """How many MPI messages carry the payload (0 when inline or empty; always 1 opening a channel)."""
        if self.channel:
            return 1
        if self.inline is not None or self.payload_nbytes == 0:
            return 0
        if self.chunk_bytes == 0:
            return 1
        return -(-self.payload_nbytes // self.chunk_bytes)

    def describe(self) -> str:
        order = "F" if self.fortran else "C"
        return f"shape={self.shape} dtype={self.dtype.str if self.dtype.names is None else self.dtype} order={order}"


def _dtype_to_json(dt: np.dtype[Any]) -> Any:
    """An exact JSON form of any non-object dtype: names, formats, offsets, itemsize (padding kept)."""
    if dt.subdtype is not None:
        base, shape = dt.subdtype
        return {"base": _dtype_to_json(base), "shape": list(shape)}
    if dt.names is None:
        return dt.str
    fields = dt.fields
    assert fields is not None
    out: dict[str, Any] = {
        "names": list(dt.names),
        "formats": [_dtype_to_json(fields[n][0]) for n in dt.names],
        "offsets": [fields[n][1] for n in dt.names],
        "itemsize": dt.itemsize,
    }
    titles = [f[2] if len(f) > 2 else None for f in (tuple(fields[n]) for n in dt.names)]
    if any(t is not None for t in titles):
        out["titles"] = titles
    if dt.isalignedstruct:
        out["aligned"] = True
    return out


def _dtype_from_json(x: Any) -> np.dtype[Any]:
    if isinstance(x, str):
        return np.dtype(x)
    if not isinstance(x, dict):
        raise ValueError(f"not a dtype description: {x!r}")
    if "base" in x:
        return np.dtype((_dtype_from_json(x["base"]), tuple(x["shape"])))
    spec = {
        "names": x["names"],
        "formats": [_dtype_from_json(f) for f in x["formats"]],
        "offsets": x["offsets"],
        "itemsize": x["itemsize"],
    }
    if "titles" in x:
        spec["titles"] = x["titles"]
    dt: np.dtype[Any] = np.dtype(spec, align=bool(x.get("aligned", False)))  # type: ignore[call-overload]
    return dt


@functools.lru_cache(maxsize=256)
def _dtype_field(dtype: np.dtype[Any]) -> tuple[bytes, int]:
    if dtype.names is not None or dtype.subdtype is not None:
        return json.dumps(_dtype_to_json(dtype), separators=(",", ":")).encode(), FLAG_STRUCTURED
    return dtype.str.encode(), 0


@functools.lru_cache(maxsize=256)
def _dtype_from_field(field: bytes, structured: bool) -> np.dtype[Any]:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # numpy deprecations for odd typestrs must not escape
        return _parse_dtype_field(field, structured)


def _parse_dtype_field(field: bytes, structured: bool) -> np.dtype[Any]:
    if structured:
        desc = json.loads(field)
        if not isinstance(desc, dict):
            raise ValueError(f"a structured dtype must be a JSON object, got {desc!r}")
        dtype = _dtype_from_json(desc)
    else:
        dtype = np.dtype(field.decode("ascii"))
    if dtype.hasobject:
        raise ValueError("object dtypes cannot travel between processes")
    if dtype.itemsize == 0:
        raise ValueError("zero-itemsize dtype")
    return dtype


def encode_meta(meta: Any) -> bytes:
    """Serialise ``meta`` for the header, refusing anything that would not come back identical."""
    if meta is None:
        return b""
    if not isinstance(meta, dict):
        raise TypeError(f"meta must be a dict of JSON values, got {type(meta).__name__}")
    try:
        raw = json.dumps(meta, separators=(",", ":"), allow_nan=False).encode()
    except (TypeError, ValueError) as exc:
        raise TypeError(f"meta must hold only JSON values (str keys; str, int, float, bool, None, list, dict): {exc}")\
            from None
    if len(raw) > MAX_META_BYTES:
        raise ValueError(f"meta is {len(raw)} bytes as JSON; the limit is {MAX_META_BYTES} bytes")
    if json.loads(raw) != meta:
        raise TypeError(
            "meta would not survive JSON unchanged (non-str dict keys or tuples?): "
            f"{meta!r} would arrive as {json.loads(raw)!r}"
        )
    return raw


def encode_header(
    dtype: np.dtype[Any],
    shape: tuple[int, ...],
    *,
    fortran: bool,
    payload_tag: int,
    chunk_bytes: int = 0,
    meta_bytes: bytes = b"",
    inline: Any = None,
    channel: bool = False,
) -> bytes:
    """Build the header message (with the payload appended when ``inline`` is given)."""
    ndim = len(shape)
    if ndim > MAX_NDIM:
        raise CAIError(f"'shape' has {ndim} dimensions; cai_mpi sends at most {MAX_NDIM}")
    if dtype.itemsize == 0 or dtype.hasobject:
        raise CAIError(f"dtype {dtype} cannot be sent (itemsize 0 or Python objects)")
    dfield, flags = _dtype_field(dtype)
    if len(dfield) > MAX_DTYPE_BYTES:
        raise CAIError(f"'descr' is {len(dfield)} bytes as JSON; the limit is {MAX_DTYPE_BYTES}")
    if fortran:
        flags |= FLAG_FORTRAN
    if meta_bytes:
        flags |= FLAG_META
    if channel:
        if inline is not None:
            raise ValueError("a channel-opening header never carries its payload inline")
        flags |= FLAG_CHANNEL
    nbytes = math.prod(shape) * dtype.itemsize
    parts: list[Any] = [
        _PREFIX.pack(
            MAGIC, PROTOCOL_VERSION, flags | (FLAG_INLINE if inline is not None else 0), ndim, 0,
            nbytes, chunk_bytes, payload_tag, len(dfield), 0, len(meta_bytes), 0,
        ),
        struct.pack(f"<{ndim}Q", *shape),
        dfield,
        meta_bytes,
    ]
    if inline is not None:
        parts.append(inline)
    return b"".join(parts)


_inline_prefixes: dict[tuple[np.dtype[Any], tuple[int, ...]], bytes] = {}
_inline_headers: dict[bytes, tuple[tuple[int, ...], np.dtype[Any], int, int]] = {}
_FAST_CACHE_LIMIT = 1024
_plain_templates: dict[tuple[np.dtype[Any], tuple[int, ...], bool], bytes] = {}


def inline_prefix(dtype: np.dtype[Any], shape: tuple[int, ...]) -> bytes:
    """The header of a meta-less, C-ordered inline message: append the payload bytes and send.

    Cached per (dtype, shape): the hot small-message path builds no header at all.
    """
    key = (dtype, shape)
    prefix = _inline_prefixes.get(key)
    if prefix is None:
        prefix = encode_header(dtype, shape, fortran=False, payload_tag=0, inline=b"")
        if len(_inline_prefixes) >= _FAST_CACHE_LIMIT:
            _inline_prefixes.clear()
        _inline_prefixes[key] = prefix
    return prefix


def decode_inline(buf: Any, nbytes: int) -> tuple[tuple[int, ...], np.dtype[Any], int, int] | None:
    """Fast decoding of the commonest header: inline payload, C order, no meta.

    Returns ``(shape, dtype, payload_offset, payload_nbytes)``, or None when the header is anything
    else (decode_header then does the full, strict work). Every header it accepts was once fully
    decoded by decode_header: the cache is keyed by all header bytes before the payload.
    """
    if nbytes < PREFIX_BYTES:
        return None
    end = PREFIX_BYTES + 8 * buf[6] + (buf[28] | buf[29] << 8)
    key = bytes(buf[:end]) if type(buf) is not memoryview else buf[:end].tobytes()
    hit = _inline_headers.get(key)
    if hit is None:
        if buf[5] & ~FLAG_STRUCTURED != FLAG_INLINE or key[:4] != MAGIC:
            return None
        try:
            full = decode_header(buf, nbytes, max_payload_bytes=MAX_INLINE_BYTES)
        except ProtocolError:
            return None
        if full.meta is not None or full.chunk_bytes:
            return None
        hit = (full.shape, full.dtype, end, full.payload_nbytes)
        if len(_inline_headers) >= _FAST_CACHE_LIMIT:
            _inline_headers.clear()
        _inline_headers[key] = hit
    return hit if nbytes == end + hit[3] else None


_plain_headers: dict[bytes, tuple[tuple[int, ...], np.dtype[Any], bool, int]] = {}
_PTAG = struct.Struct("<i")
#: The payload tag field of the header prefix (int32 at byte 24), for callers that patch or peek at it.
PAYLOAD_TAG_FIELD = _PTAG


def plain_header(dtype: np.dtype[Any], shape: tuple[int, ...], fortran: bool, payload_tag: int) -> bytearray:
    """The header of a meta-less, one-message payload, from a per-(dtype, shape, order) template."""
    key = (dtype, shape, fortran)
    template = _plain_templates.get(key)
    if template is None:
        template = encode_header(dtype, shape, fortran=fortran, payload_tag=0)
        if len(_plain_templates) >= _FAST_CACHE_LIMIT:
            _plain_templates.clear()
        _plain_templates[key] = template
    header = bytearray(template)
    _PTAG.pack_into(header, 24, payload_tag)
    return header


def decode_plain(
    buf: Any, nbytes: int, max_payload_bytes: int
) -> tuple[tuple[int, ...], np.dtype[Any], bool, int, int] | None:
    """Fast decoding of a meta-less header whose payload follows as one message.

    Returns ``(shape, dtype, fortran, payload_nbytes, payload_tag)`` or None (then use decode_header).
    Every accepted header matched, byte for byte apart from the payload tag, one that
    decode_header fully validated.
    """
    if nbytes < PREFIX_BYTES:
        return None
    end = PREFIX_BYTES + 8 * buf[6] + (buf[28] | buf[29] << 8)
    if nbytes != end:
        return None
    key = bytes(buf[:24]) + bytes(buf[28:end])
    hit = _plain_headers.get(key)
    if hit is None:
        try:
            full = decode_header(buf, nbytes, max_payload_bytes=1 << 62)
        except ProtocolError:
            return None
        if full.meta is not None or full.chunk_bytes or full.inline is not None or not full.payload_nbytes \
                or full.channel:
            return None
        hit = (full.shape, full.dtype, full.fortran, full.payload_nbytes)
        if len(_plain_headers) >= _FAST_CACHE_LIMIT:
            _plain_headers.clear()
        _plain_headers[key] = hit
    ptag = _PTAG.unpack_from(buf, 24)[0]
    return (*hit, ptag) if ptag >= 0 and hit[3] <= max_payload_bytes else None


def decode_cached(buf: Any, nbytes: int, *, max_payload_bytes: int) -> Header:
    """``decode_header``, with the commonest header (one payload message, no meta) from ``decode_plain``'s cache."""
    plain = decode_plain(buf, nbytes, max_payload_bytes)
    if plain is None:
        return decode_header(buf, nbytes, max_payload_bytes=max_payload_bytes)
    shape, dtype, fortran, payload_nbytes, payload_tag = plain
    return Header(dtype, shape, fortran, payload_nbytes, 0, payload_tag, None, None)


def plain_template(buf: Any, nbytes: int) -> bytes:
    """The header in ``buf[:nbytes]`` with its payload tag zeroed: what ``plain_payload_tag`` compares to.

    Only build it from a header ``decode_plain`` accepted: every header matching it is then valid.
    """
    template = bytearray(buf[:nbytes])
    template[24:28] = bytes(4)
    return bytes(template)


def _plain_payload_tag(buf: bytearray, nbytes: int, template: bytes) -> int:
    """The payload tag of ``buf[:nbytes]`` if it equals ``template`` outside the tag field, else -1."""
    if nbytes != len(template) or nbytes < 28 or buf[:24] != template[:24] or buf[28:nbytes] != template[28:]:
        return -1
    tag: int = _PTAG.unpack_from(buf, 24)[0]
    return tag if tag >= 0 else -1


try:  # the same in C: one call instead of half a microsecond of slicing per received message
    from ._wirefast import plain_payload_tag
except ImportError:  # pragma: no cover - built wherever a C compiler was present at install time
    plain_payload_tag = _plain_payload_tag


def decode_header(buf: Any, nbytes: int, *, max_payload_bytes: int) -> Header:
    """Decode the first ``nbytes`` of ``buf``; raise ProtocolError on anything malformed.

    Sizes are checked before the caller allocates anything: a header
    announcing more than ``max_payload_bytes`` is refused.
    """
    mv = memoryview(buf)[:nbytes]
    if nbytes < PREFIX_BYTES:
        raise ProtocolError(
            f"truncated cai_mpi header: {nbytes} bytes, need at least {PREFIX_BYTES} "
            "(is another library sending on cai_mpi's private communicator?)"
        )
    (magic, version, flags, ndim, _r0, payload_nbytes, chunk_bytes, payload_tag, dlen, _r1, mlen, _r2) = (
        _PREFIX.unpack_from(mv)
    )
    if magic != MAGIC:
        raise ProtocolError(f"not a cai_mpi header: magic {bytes(magic)!r}, expected {MAGIC!r}")
    if version != PROTOCOL_VERSION:
        raise ProtocolError(
            f"cai_mpi protocol version {version} is not supported (this is version {PROTOCOL_VERSION}): "
            "run the same cai_mpi version on every rank"
        )
    if flags & ~_KNOWN_FLAGS:
        raise ProtocolError(f"unknown header flags {flags & ~_KNOWN_FLAGS:#x}")
    if ndim > MAX_NDIM or dlen > MAX_DTYPE_BYTES or mlen > MAX_META_BYTES or dlen == 0:
        raise ProtocolError(f"header field sizes out of range: ndim={ndim} dtype={dlen}B meta={mlen}B")
    inline = bool(flags & FLAG_INLINE)
    if inline and flags & FLAG_CHANNEL:
        raise ProtocolError("a channel-opening header cannot carry its payload inline")
    fixed = PREFIX_BYTES + 8 * ndim + dlen + mlen
    expected = fixed + (payload_nbytes if inline else 0)
    if nbytes != expected:
        raise ProtocolError(f"truncated or padded cai_mpi header: {nbytes} bytes, the fields say {expected}")
    shape = struct.unpack_from(f"<{ndim}Q", mv, PREFIX_BYTES)
    off = PREFIX_BYTES + 8 * ndim
    try:
        dtype = _dtype_from_field(bytes(mv[off : off + dlen]), bool(flags & FLAG_STRUCTURED))
    except Exception as exc:  # numpy raises ValueError, TypeError, SyntaxError, RecursionError, ...
        raise ProtocolError(f"header dtype field is not a numpy dtype (or not one we can receive): {exc!r}") from None
    off += dlen
    meta = None
    if flags & FLAG_META:
        try:
            meta = json.loads(bytes(mv[off : off + mlen]))
        except (ValueError, RecursionError) as exc:
            raise ProtocolError(f"header meta is not JSON: {exc!r}") from None
        if not isinstance(meta, dict):
            raise ProtocolError(f"header meta must be a JSON object, got {type(meta).__name__}")
    off += mlen
    count = math.prod(shape)
    if count * dtype.itemsize != payload_nbytes:
        raise ProtocolError(
            f"header says {payload_nbytes} payload bytes but shape {shape} x itemsize {dtype.itemsize} "
            f"is {count * dtype.itemsize}"
        )
    if payload_nbytes > max_payload_bytes:
        raise ProtocolError(
            f"header announces {payload_nbytes} payload bytes, over the limit of {max_payload_bytes} "
            "(raise CAI_MPI_MAX_PAYLOAD_BYTES if this is intended)"
        )
    if payload_tag < 0:
        raise ProtocolError(f"negative payload tag {payload_tag}")
    return Header(
        dtype=dtype,
        shape=shape,
        fortran=bool(flags & FLAG_FORTRAN),
        payload_nbytes=payload_nbytes,
        chunk_bytes=chunk_bytes,
        payload_tag=payload_tag,
        meta=meta,
        inline=mv[off : off + payload_nbytes] if inline else None,
        channel=bool(flags & FLAG_CHANNEL),
    )
