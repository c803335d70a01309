"""Point-to-point: send_array / recv_array and their nonblocking forms, each a plan from the transport and a
way to post it (blocking ``Send``/``Recv``, or ``Isend``/``Irecv`` driven by a Request)."""

from __future__ import annotations

import threading
from collections.abc import Generator
from typing import Any

import numpy as np
from mpi4py import MPI

from ..arrays.array import Array
from ..arrays.operands import RecvTarget, Target, recv_target, send_source
from ..config import config
from ..progress.deadlines import Awaited, deadline
from ..progress.requests import PostedRequest, Request, _active, complete, drive
from ..progress.waits import MPIWait, Waitable
from ..runtime import get_runtime
from ..runtime.base import Runtime
from ..transport import PREPARED, Inbox, Outbound, give_back_inbox, header_failure, plan_recv, plan_send, take_inbox
from ..transport.privcomm import PrivateComms
from .validation import (
    ANY_SOURCE,
    ANY_TAG,
    PROC_NULL,
    Device,
    check_comm,
    check_meta,
    check_rank,
    check_sync,
    check_tag,
    receive_device,
)

__all__ = [
    "ANY_SOURCE", "ANY_TAG", "PROC_NULL", "irecv_array", "isend_array", "recv_array", "send_array", "sendrecv_array",
]

_BYTE = MPI.BYTE


# -- sending --------------------------------------------------------------------------------------------------


def _outbound(fn: str, obj: Any, dest: Any, tag: Any, comm: Any, sync: Any, meta: Any) -> tuple[
    PrivateComms, int, int, Outbound | None, Any
]:
    """Validate a send's arguments and plan its message (None for PROC_NULL): the one body of every send."""
    pc = check_comm(fn, comm)
    if type(dest) is not int or not 0 <= dest < pc.size:
        dest = check_rank(fn, "dest", dest, pc, wildcard=False)
    if type(tag) is not int or not 0 <= tag <= pc.tag_ub:
        tag = check_tag(fn, tag, pc, wildcard=False)
    meta_bytes = check_meta(fn, meta)
    if sync is not None:
        sync = check_sync(fn, sync)
    rt = get_runtime()
    src = obj if type(obj) is np.ndarray else send_source(fn, obj, sync, rt)
    if dest == PROC_NULL:
        return pc, dest, tag, None, src
    return pc, dest, tag, plan_send(src, pc, meta_bytes, config(), rt, dest), src


def _post(fn: str, out: Outbound, pc: PrivateComms, dest: int, tag: int, keep: Any) -> Request[None]:
    """Post ``out`` with Isend: a Request that completes when the MPI operations (and steps) have."""
    header, ptag, payload, steps, _in_place = out
    about = Awaited(fn, True, dest, tag, pc.header)
    if steps is None:
        return PostedRequest(_messages(pc, header, payload, dest, tag, ptag), None, keep=(keep, payload), about=about)
    return Request(_prepared_then_posted(steps, pc, header, payload, dest, tag, ptag), keep=(keep, payload),
                   about=about)


def _messages(pc: PrivateComms, header: bytes, payload: list[Any], dest: int, tag: int, ptag: int) -> list[MPI.Request]:
    reqs = [pc.header.Isend([header, _BYTE], dest, tag)]
    for spec in payload:
        reqs.append(pc.payload.Isend(spec, dest, ptag))
    return reqs


def _prepared_then_posted(
    steps: Generator[Waitable, None, None], pc: PrivateComms, header: bytes, payload: list[Any], dest: int, tag: int,
    ptag: int,
) -> Generator[Waitable, None, None]:
    """The steps run up to PREPARED first (allocations, the device pack, the first staging copy): a failure there
    raises before anything is posted. Then the messages go out and the steps go on; a failure from then on the
    steps announce to the receiver, and the header is still waited for."""
    if next(steps) is not PREPARED:
        raise AssertionError("a send's steps must yield PREPARED first")
    reqs = _messages(pc, header, payload, dest, tag, ptag)
    try:
        yield from steps
    except Exception:
        yield MPIWait(reqs)
        raise
    yield MPIWait(reqs, final=True)


def isend_array(
    obj: Any,
    dest: int,
    tag: int = 0,
    comm: MPI.Comm | None = None,
    *,
    sync: bool | None = None,
    meta: dict[str, Any] | None = None,
) -> Request[None]:
    """Start sending ``obj`` to ``dest``; see ``send_array``.

    Args:
        obj: an object exporting ``__cuda_array_interface__`` (CuPy, PyTorch, Numba...), a host array
            (numpy or any buffer), or a received ``Array`` (forwarded as it is).
        dest: the destination rank in ``comm`` (``PROC_NULL``: nothing is sent).
        tag: 0..MPI.TAG_UB; the receiver may match it or use ANY_TAG.
        comm: None for COMM_WORLD; the first use of any other communicator is collective over it
            (cai_mpi duplicates it).
        sync: None follows ``CAI_MPI_SYNC`` (default on); False skips the producer synchronization
            (the CAI v3 consumer opt-out).
        meta: a small JSON dict delivered as ``Array.meta``.

    The producer's stream is synchronized before this returns, so work you enqueue afterwards cannot race
    with the data MPI reads; modifying the buffer before ``wait()`` is an error. The request keeps ``obj``
    alive until it completes.

    Returns:
        A Request: ``wait()`` returns None; ``test()`` returns ``(True, None)`` once the send completed, else
        ``(False, None)``.

    Raises:
        TypeError, ValueError, CAIError, StreamError, CudaError: as in ``send_array`` (a CudaError that the GPU
            reports only after the message went out is raised by ``wait()``).
    """
    pc, dest, tag, out, src = _outbound("isend_array", obj, dest, tag, comm, sync, meta)
    if out is None:
        return PostedRequest([], None)
    return _post("isend_array", out, pc, dest, tag, keep=(obj, src))


def send_array(
    obj: Any,
    dest: int,
    tag: int = 0,
    comm: MPI.Comm | None = None,
    *,
    sync: bool | None = None,
    meta: dict[str, Any] | None = None,
    timeout: float | None = None,
) -> None:
    """Send any CAI object (or host array, or Array) to rank ``dest``; the message describes itself.

    Before MPI reads the data, the exporter's stream is synchronized (CAI v3 rules; for exporters that give no
    stream, the legacy default stream and every blocking stream: see the guide's stream policy). Any layout,
    dtype and size.

    Args:
        obj: an object exporting ``__cuda_array_interface__`` (CuPy, PyTorch, Numba...), a host array
            (numpy or any buffer), or a received ``Array`` (forwarded as it is).
        dest: the destination rank in ``comm`` (``PROC_NULL``: nothing is sent).
        tag: 0..MPI.TAG_UB; the receiver may match it or use ANY_TAG.
        comm: None for COMM_WORLD; the first use of any other communicator is collective over it
            (cai_mpi duplicates it).
        sync: None follows ``CAI_MPI_SYNC`` (default on); False skips the producer synchronization
            (the CAI v3 consumer opt-out).
        meta: a small JSON dict delivered as ``Array.meta``.
        timeout: seconds to wait at most for MPI to be done with ``obj`` (None: ``CAI_MPI_TIMEOUT``, off by
            default).

    Returns:
        None, once MPI no longer needs ``obj``'s memory (you may modify it).

    Raises:
        TypeError, ValueError: a bad argument (the message names it).
        CAIError: ``obj``'s ``__cuda_array_interface__`` breaks the specification.
        StreamError: the producer's stream cannot be synchronized.
        CudaError: a device array could not be packed or staged (out of device or pinned memory, a CUDA
            error): nothing was sent, or, for an error the GPU reports only later, the receiver was told (its
            receive raises SenderFailedError and the communicator stays usable).
        TimeoutError: ``timeout`` passed; MPI cannot withdraw a send, so it stays posted (``obj`` is kept
            alive and must not be modified) and completes if the receiver receives it.

    Example:
        >>> send_array(cupy.arange(10), dest=1, meta={"step": 3})  # doctest: +SKIP
    """
    due = deadline("send_array", timeout)
    pc, dest, tag, out, src = _outbound("send_array", obj, dest, tag, comm, sync, meta)
    if out is None:
        return
    header, ptag, payload, steps, _in_place = out
    if steps is None and not _active and due is None:
        pc.header.Send([header, _BYTE], dest, tag)
        for spec in payload:
            pc.payload.Send(spec, dest, ptag)
        return
    # Other requests need driving meanwhile, steps do, or the wait has a deadline.
    _post("send_array", out, pc, dest, tag, keep=(obj, src))._wait_until(due)


# -- receiving ------------------------------------------------------------------------------------------------

_tls = threading.local()  # a blocking receive uses its thread's own inbox


def _receive_args(fn: str, source: Any, tag: Any, comm: Any, out: Any, device: Any) -> tuple[
    PrivateComms, int, int, Any, int | None, Runtime
]:
    """Validate a receive's arguments; an unusable ``out=`` is refused before any message is matched."""
    pc = check_comm(fn, comm)
    if type(source) is not int or not 0 <= source < pc.size:
        source = check_rank(fn, "source", source, pc, wildcard=True)
    if type(tag) is not int or not 0 <= tag <= pc.tag_ub:
        tag = check_tag(fn, tag, pc, wildcard=True)
    rt = get_runtime()
    if out is not None:
        return pc, source, tag, recv_target(fn, out, rt), None, rt
    return pc, source, tag, None, rt.current_device() if device is None else receive_device(fn, device, rt), rt


def _from_proc_null(target: Target | None, tag: int) -> Array:
    """A receive from PROC_NULL completes at once with no data (MPI semantics): an Array over ``out=`` as it is
    (a plain numpy array is its own target), or an empty host Array without ``out=``."""
    if target is None:
        return Array._over_host(np.empty(0, np.uint8), PROC_NULL, tag, None)
    if type(target) is np.ndarray:
        return Array._over_host(target, PROC_NULL, tag, None)
    assert isinstance(target, RecvTarget)
    if target.host is not None:
        return Array._over_host(target.host, PROC_NULL, tag, None, target.owner)
    assert target.desc is not None and target.ordinal is not None
    return Array(target.desc.replace(stream=None), device=target.ordinal, owner=target.owner, source=PROC_NULL,
                 tag=tag)


def recv_array(
    source: int = ANY_SOURCE,
    tag: int = ANY_TAG,
    comm: MPI.Comm | None = None,
    *,
    out: Any = None,
    device: Device = None,
    timeout: float | None = None,
) -> Array:
    """Receive an array sent with ``send_array``, no shape or dtype needed (``out=``: an Array over it, no copy).

    Args:
        source: the sending rank, or ANY_SOURCE (PROC_NULL: returns at once, with no data).
        tag: the tag to match, or ANY_TAG.
        comm: None for COMM_WORLD; the first use of another communicator is collective.
        out: a writable CAI object or host array to receive into. The header is checked against it
            first; on a mismatch the payload is received and discarded, then RecvMismatchError raised.
        device: without ``out=``: None (a GPU when this rank has one, else host), "host", or a GPU ordinal.
        timeout: seconds to wait at most for the message (None: ``CAI_MPI_TIMEOUT``, off by default); once it
            has arrived, its payload gets as long again.

    Returns:
        An Array carrying the data, its descriptor, ``source``, ``tag`` and ``meta``; with ``out=``, an Array over
        ``out=``'s memory (no copy). From PROC_NULL nothing is received (MPI's rule): an Array over ``out=``, its
        contents untouched, or without ``out=`` an empty uint8 host Array; ``source`` is PROC_NULL, ``meta`` None.

    Raises:
        TypeError, ValueError: a bad argument (the message names it).
        RecvMismatchError: the message does not fit ``out=`` (nothing is left unreceived).
        ProtocolError: the header cannot be decoded, or announces more than CAI_MPI_MAX_PAYLOAD_BYTES.
        TimeoutError: no message came within ``timeout``: the receive was cancelled, so a later message is
            not swallowed and the communicator stays usable.
    """
    due = deadline("recv_array", timeout)
    if due is not None:
        return _start_recv("recv_array", source, tag, comm, out, device)._wait_until(due)
    pc = check_comm("recv_array", comm)
    if type(source) is not int or not 0 <= source < pc.size:
        source = check_rank("recv_array", "source", source, pc, wildcard=True)
    if type(tag) is not int or not 0 <= tag <= pc.tag_ub:
        tag = check_tag("recv_array", tag, pc, wildcard=True)
    rt = get_runtime()
    if out is None:
        target, ordinal = None, rt.current_device() if device is None else receive_device("recv_array", device, rt)
    else:
        target, ordinal = recv_target("recv_array", out, rt), None
    return _receive("recv_array", pc, source, tag, target, ordinal, rt)


def _receive(fn: str, pc: PrivateComms, source: int, tag: int, target: Target | None, ordinal: int | None,
             rt: Runtime) -> Array:
    """The blocking receive of validated arguments, in the calling thread (errors name ``fn``)."""
    if source == PROC_NULL:
        return _from_proc_null(target, tag)
    try:
        inbox = _tls.inbox
    except AttributeError:
        inbox = _tls.inbox = Inbox()
    try:
        if not _active:
            pc.header.Recv(inbox.msg, source, tag, inbox.status)
        else:
            complete(MPIWait([pc.header.Irecv(inbox.msg, source, tag)], inbox.status))
    except MPI.Exception as exc:
        raise header_failure(fn, exc, inbox.status) from None
    result, sender, ptag, payload, steps = plan_recv(fn, inbox, target, ordinal, pc, config(), rt)
    if payload:
        if len(payload) == 1 and not _active:
            pc.payload.Recv(payload[0], sender, ptag)
        else:
            complete(MPIWait([pc.payload.Irecv(spec, sender, ptag) for spec in payload]))
    if steps is not None:
        drive(steps)
    return result


def irecv_array(
    source: int = ANY_SOURCE,
    tag: int = ANY_TAG,
    comm: MPI.Comm | None = None,
    *,
    out: Any = None,
    device: Device = None,
) -> Request[Array]:
    """Start receiving an array (into ``out=``: ``wait()`` returns an Array over it, no copy); see ``recv_array``.

    Args:
        source: the sending rank, or ANY_SOURCE (PROC_NULL: completes at once, with no data).
        tag: the tag to match, or ANY_TAG.
        comm: None for COMM_WORLD; the first use of another communicator is collective.
        out: a writable CAI object or host array to receive into. The header is checked against it
            first; on a mismatch the payload is received and discarded, and ``wait()`` raises RecvMismatchError.
        device: without ``out=``: None (a GPU when this rank has one, else host), "host", or a GPU ordinal.

    Returns:
        A Request: ``wait()`` returns the Array; ``test()`` returns ``(True, array)`` once it arrived, else
        ``(False, None)``.

    Raises:
        TypeError, ValueError: a bad argument, as in ``recv_array``. Errors about the message itself
            (RecvMismatchError, ProtocolError, TimeoutError) are raised by ``wait()``.
    """
    return _start_recv("irecv_array", source, tag, comm, out, device)


def _start_recv(fn: str, source: Any, tag: Any, comm: Any, out: Any, device: Any) -> Request[Array]:
    pc, source, tag, target, ordinal, rt = _receive_args(fn, source, tag, comm, out, device)
    return _post_recv(fn, pc, source, tag, target, ordinal, rt, out)


def _post_recv(fn: str, pc: PrivateComms, source: int, tag: int, target: Target | None, ordinal: int | None,
               rt: Runtime, out: Any) -> Request[Array]:
    """The nonblocking receive of validated arguments: its header receive is posted now (errors name ``fn``)."""
    if source == PROC_NULL:
        return PostedRequest([], _from_proc_null(target, tag))
    inbox = take_inbox()
    hreq = pc.header.Irecv(inbox.msg, source, tag)
    return Request(_receive_steps(fn, hreq, inbox, target, ordinal, pc, rt), keep=(out, inbox),
                   about=Awaited(fn, False, source, tag, pc.header))


def _receive_steps(
    fn: str, hreq: MPI.Request, inbox: Inbox, target: Any, ordinal: int | None, pc: PrivateComms, rt: Runtime
) -> Generator[Waitable, None, Array]:
    try:
        try:
            yield MPIWait([hreq], inbox.status, cancellable=True)
        except MPI.Exception as exc:
            raise header_failure(fn, exc, inbox.status) from None
        result, sender, ptag, payload, steps = plan_recv(fn, inbox, target, ordinal, pc, config(), rt)
    finally:
        give_back_inbox(inbox)
    if payload:
        reqs = [pc.payload.Irecv(spec, sender, ptag) for spec in payload]
        yield MPIWait(reqs, final=steps is None)
    if steps is not None:
        yield from steps
    return result


def sendrecv_array(
    obj: Any,
    dest: int,
    sendtag: int = 0,
    source: int = ANY_SOURCE,
    recvtag: int = ANY_TAG,
    comm: MPI.Comm | None = None,
    *,
    out: Any = None,
    device: Device = None,
    sync: bool | None = None,
    meta: dict[str, Any] | None = None,
    timeout: float | None = None,
) -> Array:
    """Send ``obj`` to ``dest`` and receive from ``source`` at once, deadlock-free (``out=``: an Array over it).

    The arguments come in mpi4py's order (``Comm.sendrecv(sendobj, dest, sendtag, recvbuf, source, recvtag)``,
    without ``recvbuf``): ``sendrecv_array(x, right, 0, left)`` sends to ``right`` with tag 0 and receives from
    ``left``.

    Args:
        obj: what to send (anything ``send_array`` takes).
        dest: the rank to send to; ``PROC_NULL`` sends nothing.
        sendtag: the tag of the message sent, as ``send_array``'s ``tag``.
        source: the rank to receive from, or ANY_SOURCE; ``PROC_NULL`` receives nothing.
        recvtag: the tag to match, or ANY_TAG.
        comm: None for COMM_WORLD; the first use of another communicator is collective.
        out: a writable CAI object or host array to receive into, checked against the message first (a
            mismatch discards the payload and raises RecvMismatchError).
        device: without ``out=``: None (a GPU when this rank has one, else host), "host", or a GPU ordinal.
        sync: for the array sent: None follows ``CAI_MPI_SYNC`` (default on); False skips the producer
            synchronization.
        meta: a small JSON dict sent with ``obj``, delivered as the receiver's ``Array.meta``.
        timeout: seconds each half (the send, the receive) may wait at most (None: ``CAI_MPI_TIMEOUT``, off by
            default).

    Every argument is checked before anything is sent, and errors name ``sendrecv_array``.

    Returns:
        The received Array (over ``out=`` when given). From ``source=PROC_NULL``: an Array over ``out=``, its
        contents untouched, or without ``out=`` an empty uint8 host Array (as ``recv_array``); the send half
        still goes to ``dest``.

    Raises:
        TypeError, ValueError, CAIError, StreamError, RecvMismatchError, ProtocolError, TimeoutError: as in
            ``send_array`` and ``recv_array``.

    Example:
        >>> left, right = cart.Shift(0, 1)  # doctest: +SKIP
        >>> ghost = sendrecv_array(field[-2], right, 0, left, 0, cart, out=field_ghost)  # doctest: +SKIP
    """
    fn = "sendrecv_array"
    due = deadline(fn, timeout)
    pc, source, recvtag, target, ordinal, rt = _receive_args(fn, source, recvtag, comm, out, device)
    pc, dest, sendtag, plan, src = _outbound(fn, obj, dest, sendtag, comm, sync, meta)
    sent = None if plan is None else _post(fn, plan, pc, dest, sendtag, keep=(obj, src))
    try:
        if due is None:
            return _receive(fn, pc, source, recvtag, target, ordinal, rt)
        return _post_recv(fn, pc, source, recvtag, target, ordinal, rt, out)._wait_until(due)
    finally:
        if sent is not None:
            sent._wait_until(deadline(fn, timeout))
