"""Point-to-point transfer: send_array / recv_array and their nonblocking forms."""

from __future__ import annotations

import threading
from collections.abc import Generator
from typing import Any, TypeVar

import numpy as np
from mpi4py import MPI

from . import comms as _comms
from .array import Array
from .buffers import Outgoing, Target, resolve_outgoing, resolve_target
from .comms import Channels, channels
from .config import Config, config
from .datatypes import describable, strided_type
from .errors import ProtocolError, RecvMismatchError
from .hostmem import host_pool
from .runtime import get_runtime
from .runtime.base import DeviceBuffer, MemoryKind, Runtime
from .staging import internal_stream, staged_recv, staged_send
from .waitables import EventWait, MPIWait, PostedRequest, Request, Waitable, _active, complete
from .wire import (
    FLAG_INLINE,
    FLAGS_OFFSET,
    HEADER_BUFFER_BYTES,
    PREFIX_BYTES,
    Header,
    decode_cached,
    decode_inline,
    decode_plain,
    encode_header,
    encode_meta,
    inline_prefix,
    plain_header,
    plain_payload_tag,
    plain_template,
)

__all__ = ["irecv_array", "isend_array", "recv_array", "send_array"]

ANY_SOURCE: int = MPI.ANY_SOURCE
ANY_TAG: int = MPI.ANY_TAG
PROC_NULL: int = MPI.PROC_NULL
_BYTE = MPI.BYTE

T = TypeVar("T")
_tls = threading.local()
_header_buffers: list[bytearray] = []  # free list for nonblocking receives
# The (dtype, shape, header prefix) of the last small message sent: loops send one shape over and over.
_last_inline: tuple[Any, Any, bytes] = (None, None, b"")


def _take_header_buffer() -> bytearray:
    try:
        return _header_buffers.pop()
    except IndexError:
        return bytearray(HEADER_BUFFER_BYTES)


def _as_int(name: str, value: Any) -> int:
    if type(value) is int:  # the common case, without the slower isinstance checks
        return value
    if not isinstance(value, (int, np.integer)) or isinstance(value, bool):
        raise TypeError(f"{name} must be an int, got {type(value).__name__}")
    return int(value)


def _check_rank(name: str, value: Any, chans: Channels, *, wildcard: bool) -> int:
    rank = _as_int(name, value)
    if 0 <= rank < chans.size or (wildcard and rank == ANY_SOURCE) or rank == PROC_NULL:
        return rank
    raise ValueError(f"{name}={rank} is not a rank of this communicator (size {chans.size})")


def _check_tag(value: Any, chans: Channels, *, wildcard: bool) -> int:
    tag = _as_int("tag", value)
    if 0 <= tag <= chans.tag_ub or (wildcard and tag == ANY_TAG):
        return tag
    raise ValueError(f"tag={tag} is outside 0..{chans.tag_ub} (MPI.TAG_UB)")


def _raw(ptr: int, nbytes: int, chans: Channels, rt: Runtime, *, readonly: bool = False) -> MPI.buffer:
    """An MPI view of raw memory. Under the simulated runtime, also prove device memory never reaches
    an MPI library that is not CUDA-aware (it would crash on a real GPU)."""
    if rt.name == "simulated" and not chans.aware.aware and rt.locate(ptr).kind is MemoryKind.DEVICE:
        raise AssertionError(f"cai_mpi bug: device pointer {ptr:#x} handed to a non-CUDA-aware MPI")
    return MPI.buffer.fromaddress(ptr, nbytes, readonly=readonly)


# ---------------------------------------------------------------------------------------------------------
# sending


def _payload_chunks(nbytes: int, chunk: int) -> list[tuple[int, int]]:
    return [(off, min(chunk, nbytes - off)) for off in range(0, nbytes, chunk)]


def _send_gen(
    out: Outgoing, chans: Channels, dest: int, tag: int, meta_bytes: bytes, cfg: Config, rt: Runtime
) -> Generator[Waitable, None, None]:
    nbytes = out.nbytes
    hcomm, pcomm = chans.header, chans.payload
    host = out.host
    if nbytes == 0:
        # Nothing to read, wherever the (possibly NULL) pointer lives: the header is the whole message.
        header = encode_header(out.dtype, out.shape, fortran=False, payload_tag=0, meta_bytes=meta_bytes)
        yield MPIWait([hcomm.Isend([header, MPI.BYTE], dest, tag)], final=True)
        return
    if host is not None and nbytes <= cfg.inline_bytes:
        # Small host payload rides inside the header: one message, no payload tag needed.
        header = encode_header(
            out.dtype, out.shape, fortran=out.fortran, payload_tag=0, meta_bytes=meta_bytes,
            inline=out.wire_bytes(),
        )
        yield MPIWait([hcomm.Isend([header, MPI.BYTE], dest, tag)], final=True)
        return

    ptag = chans.next_payload_tag()
    reqs: list[MPI.Request] = []
    if host is not None or (out.location.kind is MemoryKind.DEVICE and chans.aware.aware):
        # MPI reads the memory directly: host, managed, or device through a CUDA-aware MPI.
        if out.contiguous or out.fortran:
            chunk = cfg.max_message_bytes if nbytes > cfg.max_message_bytes else 0
            header = encode_header(
                out.dtype, out.shape, fortran=out.fortran, payload_tag=ptag, chunk_bytes=chunk,
                meta_bytes=meta_bytes,
            )
            reqs.append(hcomm.Isend([header, MPI.BYTE], dest, tag))
            for off, n in _payload_chunks(nbytes, chunk or nbytes):
                buf = _raw(out.ptr + off, n, chans, rt, readonly=True)
                reqs.append(pcomm.Isend([buf, n, MPI.BYTE], dest, ptag))
            yield MPIWait(reqs, final=True)
            return
        strides = host.strides if host is not None else out.desc.byte_strides  # type: ignore[union-attr]
        if (
            nbytes <= cfg.max_message_bytes
            and (host is not None or cfg.device_datatypes)
            and describable(out.shape, tuple(strides))
        ):
            # Strided data MPI may read: it gathers it in place through a derived datatype (no copy).
            # For device memory only on request (CAI_MPI_DEVICE_DATATYPES=1): CUDA-aware MPIs differ
            # widely in how fast they handle device datatypes, so packing on the device is the default.
            dtype_mpi, low = strided_type(out.shape, tuple(strides), out.dtype.itemsize)
            extent = dtype_mpi.Get_extent()[1]
            header = encode_header(out.dtype, out.shape, fortran=False, payload_tag=ptag, meta_bytes=meta_bytes)
            reqs.append(hcomm.Isend([header, MPI.BYTE], dest, tag))
            buf = _raw(out.ptr + low, extent, chans, rt, readonly=True)
            reqs.append(pcomm.Isend([buf, 1, dtype_mpi], dest, ptag))
            yield MPIWait(reqs, final=True)
            return
        if host is not None:
            # Too large for one message, or a layout MPI datatypes mishandle: send a contiguous copy.
            packed = np.ascontiguousarray(host)
            yield from _send_gen(
                Outgoing.from_host(packed, out.keep), chans, dest, tag, meta_bytes, cfg, rt
            )
            return

    # Device memory: pack strided data on the device, then send directly (CUDA-aware) or staged.
    assert out.desc is not None and out.location.ordinal is not None
    ordinal = out.location.ordinal
    src_ptr = out.ptr
    packed_buf: DeviceBuffer | None = None
    fortran = out.fortran
    if not (out.contiguous or out.fortran):
        stream = internal_stream(rt, ordinal)
        packed_buf = rt.pack(out.desc, ordinal, stream)
        ev = rt.record_event(stream)
        if out.desc.stream is not None:
            # CAI v3: the producer's stream must not run ahead into the data before the pack is done.
            rt.stream_wait_event(out.desc.stream, ev, ordinal)
        yield EventWait(ev)
        src_ptr, fortran = packed_buf.ptr, False
    if chans.aware.aware:
        chunk = cfg.max_message_bytes if nbytes > cfg.max_message_bytes else 0
    else:
        chunk = min(cfg.chunk_bytes, nbytes)
    header = encode_header(
        out.dtype, out.shape, fortran=fortran, payload_tag=ptag, chunk_bytes=chunk, meta_bytes=meta_bytes
    )
    hreq = hcomm.Isend([header, MPI.BYTE], dest, tag)
    if chans.aware.aware:
        for off, n in _payload_chunks(nbytes, chunk or nbytes):
            buf = _raw(src_ptr + off, n, chans, rt, readonly=True)
            reqs.append(pcomm.Isend([buf, n, MPI.BYTE], dest, ptag))
    else:
        yield from staged_send(rt, pcomm, dest, ptag, src_ptr, nbytes, chunk, ordinal)
    yield MPIWait([hreq, *reqs], final=True)
    del packed_buf


def _inline_message(obj: np.ndarray[Any, Any]) -> bytes:
    """Header and payload of a small host array as one message, in C order unless the array is F-ordered."""
    global _last_inline
    if obj.ndim > 1 and obj.flags.f_contiguous and not obj.flags.c_contiguous:
        # Contiguous arrays keep their order, small ones too (the prefix cache is for C order).
        return encode_header(obj.dtype, obj.shape, fortran=True, payload_tag=0, inline=obj.tobytes(order="F"))
    dtype, shape, prefix = _last_inline
    if dtype is not obj.dtype or shape != obj.shape:
        dtype, shape = obj.dtype, obj.shape
        prefix = inline_prefix(dtype, shape)
        _last_inline = (dtype, shape, prefix)
    return prefix + obj.tobytes()


def isend_array(
    obj: Any,
    dest: int,
    tag: int = 0,
    comm: MPI.Comm | None = None,
    *,
    sync: bool | None = None,
    meta: dict[str, Any] | None = None,
) -> Request[None]:
    """Start sending ``obj`` to ``dest``; returns a Request (``wait()`` -> None, ``test()`` -> bool).

    The producer's stream is synchronized before this returns (see
    ``send_array``), so work you enqueue afterwards cannot race with the
    data MPI reads; modifying the buffer before ``wait()`` is an error.
    The request keeps ``obj`` alive until it completes.
    """
    chans = channels(comm)
    dest = _check_rank("dest", dest, chans, wildcard=False)
    tag = _check_tag(tag, chans, wildcard=False)
    if type(obj) is Array and obj._host is not None:
        obj = obj._host
    if meta is None and type(obj) is np.ndarray and dest != PROC_NULL:
        # Host data that MPI takes as it is: post everything now, nothing to drive later.
        nbytes, cfg = obj.nbytes, config()
        if 0 < nbytes <= cfg.inline_bytes:
            msg = _inline_message(obj)
            return PostedRequest([chans.header.Isend([msg, _BYTE], dest, tag)], None, keep=msg)
        flags = obj.flags
        if nbytes and nbytes <= cfg.max_message_bytes and (flags.c_contiguous or flags.f_contiguous):
            fortran = not flags.c_contiguous
            ptag = chans.next_payload_tag()
            header = plain_header(obj.dtype, obj.shape, fortran, ptag)
            reqs = [
                chans.header.Isend([header, _BYTE], dest, tag),
                chans.payload.Isend([obj.T if fortran else obj, _BYTE], dest, ptag),
            ]
            return PostedRequest(reqs, None, keep=(obj, header))
    meta_bytes = encode_meta(meta)
    rt = get_runtime()
    out = resolve_outgoing(obj, sync, rt)
    if dest == MPI.PROC_NULL:
        return Request(iter(()), None)  # type: ignore[arg-type]
    cfg = config()
    return Request(_send_gen(out, chans, dest, tag, meta_bytes, cfg, rt), keep=(obj, out))


def send_array(
    obj: Any,
    dest: int,
    tag: int = 0,
    comm: MPI.Comm | None = None,
    *,
    sync: bool | None = None,
    meta: dict[str, Any] | None = None,
) -> None:
    """Send any CAI object (or host array, or Array) to rank ``dest``; the message describes itself.

    Before MPI reads the data, the exporter's stream is synchronized
    (CAI v3 rules; ``sync=False`` skips it, ``CAI_MPI_SYNC=0`` changes the
    default). ``meta`` is a small JSON dict delivered as ``Array.meta``.
    ``comm=None`` means COMM_WORLD; the first use of any other communicator
    is collective over it (cai_mpi duplicates it).

    Example:
        >>> send_array(cupy.arange(10), dest=1, meta={"step": 3})  # doctest: +SKIP
    """
    if type(obj) is Array and obj._host is not None:
        obj = obj._host  # forwarding a received host Array: send its data like any host array
    if comm is None and meta is None and type(obj) is np.ndarray and not _active:
        # The hot paths: a host array to COMM_WORLD, with blocking MPI calls only. Every statement here
        # costs ~1% of an 8-byte ping-pong: keep it lean.
        chans = _comms._world or channels(None)
        nbytes, cfg = obj.nbytes, config()
        if type(dest) is int and type(tag) is int and 0 <= dest < chans.size and 0 <= tag <= chans.tag_ub:
            if 0 < nbytes <= cfg.inline_bytes:
                chans.header.Send([_inline_message(obj), _BYTE], dest, tag)  # header and payload: one message
                return
            flags = obj.flags
            if nbytes and nbytes <= cfg.max_message_bytes and (flags.c_contiguous or flags.f_contiguous):
                fortran = not flags.c_contiguous
                ptag = chans.next_payload_tag()
                header = plain_header(obj.dtype, obj.shape, fortran, ptag)
                hreq = chans.header.Isend([header, _BYTE], dest, tag)
                chans.payload.Send([obj.T if fortran else obj, _BYTE], dest, ptag)
                hreq.Wait()
                return
    _drive(isend_array(obj, dest, tag, comm, sync=sync, meta=meta))


# ---------------------------------------------------------------------------------------------------------
# receiving


def _mismatch(h: Header, target: Target) -> str | None:
    if tuple(h.shape) != target.shape:
        return "shapes differ"
    if h.dtype != target.dtype:
        return "dtypes differ"
    if target.readonly:
        return "out= is read-only"
    if target.self_overlapping:
        return "out= has overlapping strides (elements share memory)"
    return None


def _discard(pcomm: MPI.Comm, h: Header, source: int) -> Generator[Waitable, None, None]:
    """Receive and drop a payload so nothing stays unmatched on the communicator."""
    if h.nchunks == 0:
        return
    chunk = h.chunk_bytes or h.payload_nbytes
    scratch = np.empty(min(chunk, h.payload_nbytes), np.uint8)
    # A channel's first payload is one message even when empty.
    chunks = _payload_chunks(h.payload_nbytes, chunk) if h.payload_nbytes else [(0, 0)]
    for _off, n in chunks:
        yield MPIWait([pcomm.Irecv([scratch, n, MPI.BYTE], source, h.payload_tag)])


def _recv_into_host(
    pcomm: MPI.Comm, h: Header, source: int, dst: np.ndarray[Any, Any]
) -> Generator[Waitable, None, None]:
    """Receive the payload into host array ``dst`` viewed in wire order (C-contiguous or strided)."""
    nbytes = h.payload_nbytes
    if h.inline is not None:
        if dst.flags.c_contiguous:
            dst.reshape(-1).view(np.uint8)[:] = np.frombuffer(h.inline, np.uint8)
        else:
            np.copyto(dst, np.frombuffer(h.inline, h.dtype).reshape(dst.shape), casting="no")
        return
    if nbytes == 0:
        return
    if dst.flags.c_contiguous:
        chunk = h.chunk_bytes or nbytes
        if chunk >= nbytes:
            reqs = [pcomm.Irecv([dst, nbytes, MPI.BYTE], source, h.payload_tag)]
        else:
            whole = MPI.buffer(dst)
            reqs = [
                pcomm.Irecv([whole[off : off + n], n, MPI.BYTE], source, h.payload_tag)
                for off, n in _payload_chunks(nbytes, chunk)
            ]
        yield MPIWait(reqs, final=True)  # what follows is local work (build the Array, copy out a temporary)
    elif h.nchunks == 1 and describable(dst.shape, dst.strides):
        dtype_mpi, low = strided_type(dst.shape, dst.strides, dst.itemsize)
        buf = MPI.buffer.fromaddress(dst.ctypes.data + low, dtype_mpi.Get_extent()[1])
        yield MPIWait([pcomm.Irecv([buf, 1, dtype_mpi], source, h.payload_tag)], final=True)
    else:
        tmp = np.empty(dst.shape, dst.dtype)
        yield from _recv_into_host(pcomm, h, source, tmp)
        np.copyto(dst, tmp, casting="no")


def _recv_into_device(
    chans: Channels, rt: Runtime, h: Header, source: int, ptr: int, ordinal: int
) -> Generator[Waitable, None, None]:
    """Receive the payload into contiguous device memory at ``ptr`` (directly or staged)."""
    nbytes = h.payload_nbytes
    if nbytes == 0:
        return
    if h.inline is not None:
        stream = internal_stream(rt, ordinal)
        staging = np.frombuffer(h.inline, np.uint8).copy()  # the header buffer is reused after we return
        rt.copy_async(ptr, staging.ctypes.data, nbytes, stream)
        yield EventWait(rt.record_event(stream))
        return
    chunk = h.chunk_bytes or nbytes
    if chans.aware.aware:
        reqs = [
            chans.payload.Irecv([_raw(ptr + off, n, chans, rt), n, MPI.BYTE], source, h.payload_tag)
            for off, n in _payload_chunks(nbytes, chunk)
        ]
        yield MPIWait(reqs)
    else:
        yield from staged_recv(rt, chans.payload, source, h.payload_tag, ptr, nbytes, chunk, ordinal)


def _pick_device(device: Any, rt: Runtime) -> int | None:
    """The GPU ordinal to receive into, or None for host memory."""
    if device is None:
        return rt.current_device() if rt.device_count() > 0 else None
    if device == "host":
        return None
    if isinstance(device, (int, np.integer)) and not isinstance(device, bool):
        count = rt.device_count()
        if not 0 <= int(device) < count:
            raise ValueError(
                f"device={device}: this rank has {count} usable GPU(s) (runtime {rt.name!r}); "
                "use device='host' or an ordinal below the count"
            )
        return int(device)
    raise ValueError(f"device must be None, 'host' or a GPU ordinal, got {device!r}")


def _recv_gen(
    chans: Channels,
    hbuf: bytearray,
    status: MPI.Status,
    header_wait: Waitable | None,
    target: Target | None,
    device: Any,
    rt: Runtime,
    cfg: Config,
) -> Generator[Waitable, None, Array]:
    if header_wait is not None:
        yield header_wait
    source, tag = status.Get_source(), status.Get_tag()
    h = decode_cached(hbuf, status.Get_count(MPI.BYTE), max_payload_bytes=cfg.max_payload_bytes)
    if h.channel:
        yield from _discard(chans.payload, h, source)
        raise ProtocolError(
            f"recv_array: the message from rank {source} (tag {tag}: {h.describe()}) opens a persistent "
            "channel (send_channel); receive it with cai_mpi.recv_channel. Its payload was discarded"
        )
    if target is not None:
        problem = _mismatch(h, target)
        if problem is not None:
            yield from _discard(chans.payload, h, source)
            raise RecvMismatchError(
                f"recv_array: the message from rank {source} (tag {tag}: {h.describe()}) does not fit "
                f"out= ({target.describe()}): {problem}; the payload was received and discarded"
            )
        # The receive buffer may still be in use by its producer: wait before MPI writes (CAI v3).
        target.sync_before_write(rt)
        if target.host is not None:
            dst = target.host.T if h.fortran else target.host
            yield from _recv_into_host(chans.payload, h, source, dst)
            return Array.from_host(target.host, owner=target.owner, source=source, tag=tag, meta=h.meta)
        assert target.desc is not None and target.ordinal is not None
        wire_desc = target.desc.transposed() if h.fortran else target.desc
        if wire_desc.is_c_contiguous:
            yield from _recv_into_device(chans, rt, h, source, target.desc.ptr, target.ordinal)
        else:
            tmp = rt.alloc_device(h.payload_nbytes, target.ordinal)
            yield from _recv_into_device(chans, rt, h, source, tmp.ptr, target.ordinal)
            stream = internal_stream(rt, target.ordinal)
            rt.unpack(tmp.ptr, wire_desc, target.ordinal, stream)
            yield EventWait(rt.record_event(stream))
            del tmp
        return Array(
            target.desc.replace(stream=None), device=target.ordinal, owner=target.owner, source=source, tag=tag,
            meta=h.meta,
        )

    ordinal = _pick_device(device, rt)
    if ordinal is None:
        arr = host_pool().take_array(h.payload_nbytes, h.shape, h.dtype, h.fortran)
        yield from _recv_into_host(chans.payload, h, source, arr.T if h.fortran else arr)
        return Array.from_host(arr, source=source, tag=tag, meta=h.meta)
    dbuf = rt.alloc_device(h.payload_nbytes, ordinal)
    yield from _recv_into_device(chans, rt, h, source, dbuf.ptr, ordinal)
    return Array.from_device(dbuf, h.shape, h.dtype, fortran=h.fortran, source=source, tag=tag, meta=h.meta)


def irecv_array(
    source: int = ANY_SOURCE,
    tag: int = ANY_TAG,
    comm: MPI.Comm | None = None,
    *,
    out: Any = None,
    device: str | int | None = None,
) -> Request[Array]:
    """Start receiving an array; ``wait()`` returns the Array. See ``recv_array``."""
    chans = channels(comm)
    source = _check_rank("source", source, chans, wildcard=True)
    tag = _check_tag(tag, chans, wildcard=True)
    rt = get_runtime()
    target = resolve_target(out, rt) if out is not None else None  # a bad out= fails before matching
    hbuf = _take_header_buffer()
    status = MPI.Status()
    hreq = chans.header.Irecv([hbuf, MPI.BYTE], source, tag)
    gen = _recv_gen(chans, hbuf, status, MPIWait([hreq], status), target, device, rt, config())
    return Request(_returning_buffer(gen, hbuf), keep=(out, hbuf))


def _returning_buffer(gen: Generator[Waitable, None, Array], hbuf: bytearray) -> Generator[Waitable, None, Array]:
    try:
        return (yield from gen)
    finally:
        _header_buffers.append(hbuf)


class _RxState:
    """Per-thread receive state: the header buffer, its MPI message spec, and the last inline header seen.

    A stream of same-shaped small messages repeats one header byte for byte: when the header just
    received starts with ``inline_key``, ``inline_view`` (a typed view of the payload bytes in
    ``hbuf``) is the whole decoding, and copying it is the whole receive. Likewise a stream of
    larger messages repeats one header but for the payload tag: a header equal to
    ``plain_template`` outside the tag is described by ``plain_hit`` (shape, dtype, fortran, nbytes).
    """

    __slots__ = (
        "hbuf",
        "hview",
        "inline_key",
        "inline_total",
        "inline_view",
        "msg",
        "plain_hit",
        "plain_template",
        "status",
    )

    def __init__(self) -> None:
        self.hbuf = bytearray(HEADER_BUFFER_BYTES)
        self.hview = memoryview(self.hbuf)
        self.msg = [self.hbuf, _BYTE]
        self.status = MPI.Status()
        self.inline_key = b"\x00"  # no header starts with a NUL: the magic comes first
        self.inline_total = -1
        self.inline_view: np.ndarray[Any, Any] | None = None
        self.plain_template = b""  # matches no header
        self.plain_hit: tuple[tuple[int, ...], np.dtype[Any], bool, int] = ((), np.dtype(np.uint8), False, 0)


def _rx_state() -> _RxState:
    try:
        return _tls.rx  # type: ignore[no-any-return]
    except AttributeError:
        rx = _tls.rx = _RxState()
        return rx


def _inline_view(rx: _RxState, n: int) -> np.ndarray[Any, Any] | None:
    """The payload of the inline header in ``rx.hbuf`` (``n`` bytes) as a typed view, or None if not inline."""
    if n < PREFIX_BYTES:
        return None
    fast = decode_inline(rx.hview, n)
    if fast is None:
        return None
    shape, dtype, offset, nbytes = fast
    rx.inline_view = view = np.ndarray(shape, dtype, buffer=rx.hbuf, offset=offset)
    rx.inline_key, rx.inline_total = bytes(rx.hbuf[:offset]), offset + nbytes
    return view


def _recv_plain(rx: _RxState, chans: Channels, n: int, out: np.ndarray[Any, Any] | None) -> Array | None:
    """Finish a receive whose header (``n`` bytes) announced a payload in one message, into host memory.

    Returns None when the message needs the general path (which decodes the header again, strictly).
    """
    hbuf = rx.hbuf
    ptag = plain_payload_tag(hbuf, n, rx.plain_template)  # the last header again but for the tag?
    if ptag < 0:
        plain = decode_plain(hbuf, n, config().max_payload_bytes)
        if plain is None:
            return None
        rx.plain_hit, rx.plain_template, ptag = plain[:4], plain_template(hbuf, n), plain[4]
    # Receive the payload at once (every microsecond between header and payload receive costs
    # bandwidth), into a recycled buffer or out=.
    shape, dtype, fortran, nbytes = rx.plain_hit
    if nbytes > config().max_payload_bytes:
        return None  # the limit was lowered since this header was learnt: the general path refuses it
    status = rx.status
    peer = status.Get_source()
    if out is None:
        arr = host_pool().take_array(nbytes, shape, dtype, fortran)
        chans.payload.Recv([arr.T if fortran else arr, _BYTE], peer, ptag)
        return Array._received_host(arr, peer, status.Get_tag())
    if not fortran and out.shape == shape and (out.dtype is dtype or out.dtype == dtype):
        chans.payload.Recv([out, _BYTE], peer, ptag)
        return Array._received_host(out, peer, status.Get_tag())
    return None


def recv_array(
    source: int = ANY_SOURCE,
    tag: int = ANY_TAG,
    comm: MPI.Comm | None = None,
    *,
    out: Any = None,
    device: str | int | None = None,
) -> Array:
    """Receive an array sent with ``send_array``; no shape or dtype needed.

    Args:
        source, tag: as in mpi4py (ANY_SOURCE / ANY_TAG allowed).
        comm: None for COMM_WORLD; the first use of another communicator is collective.
        out: a writable CAI object or host array to receive into. The header
            is checked against it first; on mismatch RecvMismatchError is
            raised after the payload was received and discarded.
        device: None (a GPU when this rank has one, else host), "host", or a GPU ordinal.

    Returns:
        An Array carrying the data, its descriptor, ``source``, ``tag`` and ``meta``.
    """
    chans = _comms._world if comm is None else None
    if chans is None:
        chans = channels(comm)
    if type(source) is not int or not 0 <= source < chans.size:
        source = _check_rank("source", source, chans, wildcard=True)
    if type(tag) is not int or not 0 <= tag <= chans.tag_ub:
        tag = _check_tag(tag, chans, wildcard=True)
    try:
        rx = _tls.rx
    except AttributeError:
        rx = _rx_state()
    status = rx.status
    rt = get_runtime()
    target: Target | None = None
    if out is None:
        host = not rt.device_count() if device is None else device == "host"
    else:
        # A plain writable C-ordered ndarray takes the fast path; anything else is resolved (and refused
        # if it cannot be a receive buffer) before a message is matched.
        flags = out.flags if type(out) is np.ndarray else None
        host = flags is not None and flags.c_contiguous and flags.writeable
        if not host:
            target = resolve_target(out, rt)
    if _active:
        # Other requests of ours need driving while we wait for the header.
        complete(MPIWait([chans.header.Irecv(rx.msg, source, tag)], status))
    else:
        chans.header.Recv(rx.msg, source, tag, status)
        if host:
            n = status.Get_count(_BYTE)
            hbuf = rx.hbuf
            if n == rx.inline_total and hbuf.startswith(rx.inline_key):
                view = rx.inline_view  # the same small message as last time: no decoding at all
            elif hbuf[FLAGS_OFFSET] & FLAG_INLINE:
                view = _inline_view(rx, n)
            else:
                view = None
            if view is None:
                got = _recv_plain(rx, chans, n, out)
                if got is not None:
                    return got
            elif out is None:
                # The payload came inside the header (whose buffer is reused): copy it out.
                return Array._received_host(view.copy(), status.Get_source(), status.Get_tag())
            elif out.shape == view.shape and (out.dtype is view.dtype or out.dtype == view.dtype):
                out[...] = view
                return Array._received_host(out, status.Get_source(), status.Get_tag())
    if out is not None and target is None:
        target = resolve_target(out, rt)
    return _drive(_recv_gen(chans, rx.hbuf, rx.status, None, target, device, rt, config()))


def _drive(op: Request[T] | Generator[Waitable, None, T]) -> T:
    """Run a transfer to completion in the calling thread (blocking calls need no Request object)."""
    if isinstance(op, Request):
        return op.wait()
    try:
        while True:
            complete(next(op))
    except StopIteration as stop:
        return stop.value  # type: ignore[no-any-return]


__all__ += ["ANY_SOURCE", "ANY_TAG", "ProtocolError"]
