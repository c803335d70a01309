"""The cai_mpi header: a versioned, self-describing binary record (docs/protocol.md), and its caches.

Every byte offset of the format is named here and nowhere else. The payload tag, the one field that
changes between messages of a stream of same-shaped arrays, comes first: the rest of a header can
then be recognised as "the same as before" with one comparison, and its decoding reused. That reuse
is data of the one decoding path (``decode``), which checks the current limits on every message.
"""

from __future__ import annotations

import json
import math
import struct
import warnings
from typing import Any, NamedTuple

import numpy as np

from ..errors import CAIError, ProtocolError
from .memo import Memo
from .meta import MAX_META_BYTES, encode_meta

__all__ = [
    "FLAG_CHANNEL",
    "FLAG_FORTRAN",
    "FLAG_INLINE",
    "FLAG_MAY_FAIL",
    "FLAG_META",
    "FLAG_STRUCTURED",
    "HEADER_BUFFER_BYTES",
    "MAGIC",
    "MAX_DTYPE_BYTES",
    "MAX_INLINE_BYTES",
    "MAX_META_BYTES",
    "MAX_NDIM",
    "PREFIX_BYTES",
    "PROTOCOL_VERSION",
    "HeaderMemo",
    "MessageInfo",
    "decode",
    "decode_header",
    "encode_header",
    "encode_meta",
    "inline_message",
    "refuse_unsendable",
]

MAGIC = b"CAIM"
PROTOCOL_VERSION = 2

# The fixed prefix, little-endian: payload tag, magic, version, flags, ndim, reserved, dtype field length,
# reserved, meta length, reserved, payload byte count, chunk bytes. The shape (u64 each), the dtype field,
# the meta JSON and an inline payload follow, in that order. Offsets: payload tag 0, magic 4 (MAGIC_AT), version 8,
# flags 9.
_PREFIX = struct.Struct("<i4sBBBBHHIIQQ")
PREFIX_BYTES = _PREFIX.size  # 40
MAGIC_AT = 4
SHAPE_AT = PREFIX_BYTES
_TAG = struct.Struct("<i")

FLAG_INLINE = 0x01  # the payload follows the header in the same message
FLAG_STRUCTURED = 0x02  # the dtype field is a JSON numpy descr, not a typestr
FLAG_META = 0x04  # a JSON meta dict follows the dtype field
FLAG_FORTRAN = 0x08  # payload bytes are in Fortran (column-major) order
FLAG_CHANNEL = 0x10  # opens a persistent channel: later payloads follow on the payload tag, headerless
# The sender still works on the payload after posting this header (a device pack, staging): if that fails, the
# payload messages it could not send arrive empty and its error follows (transport/failure.py).
FLAG_MAY_FAIL = 0x20
_KNOWN_FLAGS = FLAG_INLINE | FLAG_STRUCTURED | FLAG_META | FLAG_FORTRAN | FLAG_CHANNEL | FLAG_MAY_FAIL

MAX_NDIM = 64
MAX_DTYPE_BYTES = 16 << 10
MAX_INLINE_BYTES = 64 << 10
_MAX_ARRAY_BYTES = 2**63 - 1  # the most bytes one numpy array may span
#: Every header fits in this many bytes: receivers post buffers of this size.
HEADER_BUFFER_BYTES = PREFIX_BYTES + 8 * MAX_NDIM + MAX_DTYPE_BYTES + MAX_META_BYTES + MAX_INLINE_BYTES


class MessageInfo(NamedTuple):
    """What a header says about its message, apart from the payload tag.

    ``header_nbytes`` is the length of the header proper; with ``inline`` the payload follows it in
    the same message. Headers without meta are cached and shared: treat an instance as immutable.
    """

    dtype: np.dtype[Any]
    shape: tuple[int, ...]
    fortran: bool
    payload_nbytes: int
    chunk_bytes: int
    meta: dict[str, Any] | None
    inline: bool
    channel: bool
    header_nbytes: int
    may_fail: bool = False

    @property
    def nchunks(self) -> int:
        """How many payload messages follow (0 when inline or empty; always 1 opening a channel)."""
        if self.channel:
            return 1
        if self.inline or self.payload_nbytes == 0:
            return 0
        return 1 if self.chunk_bytes == 0 else -(-self.payload_nbytes // self.chunk_bytes)

    def describe(self) -> str:
        order = "F" if self.fortran else "C"
        dt = self.dtype.str if self.dtype.names is None else str(self.dtype)
        return f"shape={self.shape} dtype={dt} order={order}"


# -- dtypes ---------------------------------------------------------------------------------------------------


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


def _dtype_field(dtype: np.dtype[Any]) -> tuple[bytes, int]:
    if dtype.names is not None or dtype.subdtype is not None:
        return json.dumps(_dtype_to_json(dtype), separators=(",", ":")).encode(), FLAG_STRUCTURED
    return dtype.str.encode(), 0


_plain_dtypes: dict[bytes, np.dtype[Any]] = {}  # typestr field -> dtype, for the few plain dtypes a program uses


def _dtype_from_field(field: bytes, structured: bool) -> np.dtype[Any]:
    if not structured:
        known = _plain_dtypes.get(field)
        if known is not None:
            return known
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # numpy deprecations for odd typestrs must not escape
        if structured:
            desc = json.loads(field)
            if not isinstance(desc, dict) or "names" not in desc:
                raise ValueError(f"a structured dtype must be a JSON object of fields, got {desc!r}")
            dtype = _dtype_from_json(desc)
        else:
            text = field.decode("ascii")
            dtype = np.dtype(text)
            # numpy also reads names ('float64'), comma lists ('f4,i4') and subarrays ('(2,)<f4', which would add
            # dimensions to the received array): a sender writes dtype.str, nothing else.
            if dtype.str != text:
                raise ValueError(f"{text!r} is not a type string as cai_mpi writes one (dtype.str, e.g. '<f8')")
    if dtype.hasobject:
        raise ValueError("object dtypes cannot travel between processes")
    if dtype.itemsize == 0:
        raise ValueError("zero-itemsize dtype")
    if not structured and len(_plain_dtypes) < 256:
        _plain_dtypes[field] = dtype
    return dtype


# -- encoding -------------------------------------------------------------------------------------------------


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
    may_fail: bool = False,
) -> bytes:
    """The header message; with ``inline`` (a bytes-like payload) the payload is appended to it. ``may_fail``:
    the sender may fail after posting it, and then marks its payload failed (``FLAG_MAY_FAIL``).

    Headers without meta come from a cache of templates: only the payload tag is written per message.
    """
    if not meta_bytes:
        key = (dtype, shape, fortran, chunk_bytes, inline is not None, channel, may_fail)
        cached = _templates.get(key)
        if cached is None:
            cached = _encode(dtype, shape, fortran, 0, chunk_bytes, b"", inline is not None, channel, may_fail)
            if inline is None:
                cached = cached[MAGIC_AT:]  # the payload tag is prepended per message
            _templates.remember(key, cached)
        if inline is None:
            return _TAG.pack(payload_tag) + cached
        return cached + inline  # type: ignore[no-any-return]  # (an inline header carries no payload tag)
    if inline is not None:
        return _encode(dtype, shape, fortran, 0, chunk_bytes, meta_bytes, True, channel, may_fail) + bytes(inline)
    return _encode(dtype, shape, fortran, payload_tag, chunk_bytes, meta_bytes, False, channel, may_fail)


def refuse_unsendable(dtype: np.dtype[Any], fn: str = "") -> None:
    """TypeError for a dtype whose elements no message can carry, prefixed with ``fn`` when given. Only a host
    array can have one: a CAI dict's typestr refuses both kinds (core/typestr.py)."""
    where = f"{fn}: " if fn else ""
    if dtype.hasobject:
        raise TypeError(f"{where}a host array of dtype {dtype} cannot be sent: its elements are references to Python "
                        "objects, not data another process can read; convert it to a numeric or fixed-width dtype "
                        "(astype), or send it pickled with mpi4py's comm.send")
    if dtype.itemsize == 0:
        raise TypeError(f"{where}a host array of dtype {dtype} cannot be sent: its itemsize is 0")


def _encode(
    dtype: np.dtype[Any], shape: tuple[int, ...], fortran: bool, payload_tag: int, chunk_bytes: int,
    meta_bytes: bytes, inline: bool, channel: bool, may_fail: bool = False,
) -> bytes:
    ndim = len(shape)
    if ndim > MAX_NDIM:
        raise CAIError(f"'shape' has {ndim} dimensions; cai_mpi sends at most {MAX_NDIM}")
    refuse_unsendable(dtype)
    dfield, flags = _dtype_field(dtype)
    if len(dfield) > MAX_DTYPE_BYTES:
        raise CAIError(f"'descr' is {len(dfield)} bytes as JSON; the limit is {MAX_DTYPE_BYTES}")
    if channel and inline:
        raise ValueError("a channel-opening header never carries its payload inline")
    if may_fail and (inline or channel):
        raise ValueError("only a header followed by separate payload messages may announce a failure in them")
    flags |= (
        (FLAG_FORTRAN if fortran else 0) | (FLAG_META if meta_bytes else 0)
        | (FLAG_CHANNEL if channel else 0) | (FLAG_INLINE if inline else 0) | (FLAG_MAY_FAIL if may_fail else 0)
    )
    nbytes = math.prod(shape) * dtype.itemsize
    prefix = _PREFIX.pack(
        payload_tag, MAGIC, PROTOCOL_VERSION, flags, ndim, 0, len(dfield), 0, len(meta_bytes), 0, nbytes, chunk_bytes
    )
    return b"".join((prefix, struct.pack(f"<{ndim}Q", *shape), dfield, meta_bytes))


def inline_message(arr: np.ndarray[Any, Any], meta_bytes: bytes = b"") -> bytes:
    """Header and payload of a small host array as one message: C order, or F order for F-contiguous arrays."""
    global _last_inline
    dtype, shape = arr.dtype, arr.shape
    fortran = False
    if len(shape) > 1:
        flags = arr.flags
        fortran = flags.f_contiguous and not flags.c_contiguous
    if meta_bytes:
        return encode_header(dtype, shape, fortran=fortran, payload_tag=0, meta_bytes=meta_bytes,
                             inline=arr.tobytes("F" if fortran else "C"))
    last_dtype, last_shape, last_fortran, template = _last_inline
    if dtype is not last_dtype or shape != last_shape or fortran != last_fortran:
        # Not the same as the previous small message: the general cache (and the one memo) takes over.
        template = encode_header(dtype, shape, fortran=fortran, payload_tag=0, inline=b"")
        _last_inline = (dtype, shape, fortran, template)
    return template + (arr.tobytes("F") if fortran else arr.tobytes())


# -- decoding -------------------------------------------------------------------------------------------------


def decode_header(buf: Any, nbytes: int, *, max_payload_bytes: int) -> tuple[MessageInfo, int]:
    """Decode the first ``nbytes`` of ``buf`` strictly: ``(info, payload_tag)``, or ProtocolError.

    Sizes are checked before the caller allocates anything: a header announcing more than
    ``max_payload_bytes`` is refused.
    """
    mv = memoryview(buf)[:nbytes]
    if nbytes < PREFIX_BYTES:
        raise ProtocolError(
            f"truncated cai_mpi header: {nbytes} bytes, need at least {PREFIX_BYTES} "
            "(is another library sending on cai_mpi's private communicator?)"
        )
    (payload_tag, magic, version, flags, ndim, _r0, dlen, _r1, mlen, _r2, payload_nbytes, chunk_bytes) = (
        _PREFIX.unpack_from(mv)
    )
    if magic != MAGIC:
        if bytes(mv[:4]) == MAGIC:  # protocol 1 put the magic first
            raise ProtocolError("the sender speaks cai_mpi protocol 1: run the same cai_mpi version on every rank")
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
    channel = bool(flags & FLAG_CHANNEL)
    if inline and channel:
        raise ProtocolError("a channel-opening header cannot carry its payload inline")
    may_fail = bool(flags & FLAG_MAY_FAIL)
    if may_fail and (inline or channel):
        raise ProtocolError("an inline or channel-opening header cannot announce failure markers in its payload")
    if mlen and not flags & FLAG_META:
        raise ProtocolError(f"header announces {mlen} bytes of meta but not the meta flag")
    header_nbytes = PREFIX_BYTES + 8 * ndim + dlen + mlen
    expected = header_nbytes + (payload_nbytes if inline else 0)
    if nbytes != expected:
        raise ProtocolError(f"truncated or padded cai_mpi header: {nbytes} bytes, the fields say {expected}")
    shape = struct.unpack_from(f"<{ndim}Q", mv, SHAPE_AT)
    off = SHAPE_AT + 8 * ndim
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
    count = math.prod(shape)
    # numpy refuses such a shape when the receiver allocates (also a zero-size one: (0, 2**64-1)).
    if (count or math.prod(n for n in shape if n)) * dtype.itemsize > _MAX_ARRAY_BYTES:
        raise ProtocolError(f"header shape {shape} of {dtype.itemsize}-byte items does not fit a 64-bit address space")
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
    if channel and 0 < chunk_bytes < payload_nbytes:
        raise ProtocolError(
            f"a channel-opening header announces its payload in chunks of {chunk_bytes} bytes: a channel's payload "
            "is one message"
        )
    if inline:
        payload_tag = 0  # nothing follows an inline header: its payload tag field means nothing
    elif payload_tag < 0:
        raise ProtocolError(f"negative payload tag {payload_tag}")
    info = MessageInfo(dtype, shape, bool(flags & FLAG_FORTRAN), payload_nbytes, chunk_bytes, meta, inline, channel,
                       header_nbytes, may_fail)
    return info, payload_tag


# Header templates by description (encoding) and decodings by header bytes (decoding): ``Memo``s, the one cache of
# descriptions.
_templates: Memo[tuple[Any, ...], bytes] = Memo()
# The last small message's (dtype, shape, fortran order, header): loops send one shape again and again.
_last_inline: tuple[Any, tuple[int, ...], bool, bytes] = (None, (), False, b"")
_decoded: Memo[bytes, MessageInfo] = Memo()
# The last header decoded through the cache, as (its bytes from MAGIC_AT on, without an inline payload; the
# whole message's length; its decoding). One tuple, replaced whole: threads share it safely.
_NOTHING = MessageInfo(np.dtype(np.uint8), (), False, 0, 0, None, False, False, 0)


def decode(buf: bytes | bytearray, nbytes: int, max_payload_bytes: int) -> tuple[MessageInfo, int]:
    """``decode_header``, reusing the decoding of an identical header (but for the payload tag) seen before.

    Only headers without meta are reused (a meta dict is the receiver's to change), and the payload
    limit is checked on every message, cached or not.
    """
    if nbytes >= PREFIX_BYTES:
        _tag, _magic, _version, flags, ndim, _r0, dlen, *_rest = _PREFIX.unpack_from(buf)
        if not flags & FLAG_META:
            key = bytes(buf[MAGIC_AT : PREFIX_BYTES + 8 * ndim + dlen])
            info = _decoded.get(key)
            if info is None:
                info, tag = decode_header(buf, nbytes, max_payload_bytes=max_payload_bytes)
                _decoded.remember(key, info)
                return info, tag
            if info.inline:
                if nbytes == info.header_nbytes + info.payload_nbytes and info.payload_nbytes <= max_payload_bytes:
                    return info, 0
            else:
                tag = _TAG.unpack_from(buf)[0]
                if tag >= 0 and nbytes == info.header_nbytes and info.payload_nbytes <= max_payload_bytes:
                    return info, tag
    return decode_header(buf, nbytes, max_payload_bytes=max_payload_bytes)  # (and says what is wrong)


class HeaderMemo:
    """The last header decoded into one receive buffer: the next message of a stream of same-shaped arrays
    repeats it but for the payload tag, and is then recognised with one comparison.

    A memo is data of the one decoding path (``decode``): it answers only for a header equal to one that
    path accepted, and the payload limit is checked on every message.
    """

    __slots__ = ("_info", "_key", "_nbytes")

    def __init__(self) -> None:
        self._key = b"\x00"  # matches no header: no magic starts with a NUL
        self._nbytes = -1
        self._info = _NOTHING

    def decode(self, buf: bytearray, nbytes: int, max_payload_bytes: int) -> tuple[MessageInfo, int]:
        """``decode(buf, nbytes, max_payload_bytes)``, remembering the header for the next message."""
        info = self._info
        if nbytes == self._nbytes and buf.startswith(self._key, MAGIC_AT) and info.payload_nbytes <= max_payload_bytes:
            if info.inline:
                return info, 0
            tag: int = _TAG.unpack_from(buf)[0]
            if tag >= 0:
                return info, tag
        info, tag = decode(buf, nbytes, max_payload_bytes)
        if info.meta is None:
            self._key = bytes(buf[MAGIC_AT : info.header_nbytes])
            self._nbytes = nbytes
            self._info = info
        return info, tag
