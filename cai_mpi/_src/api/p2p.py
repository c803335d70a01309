"""Point-to-point: send_array / recv_array and their nonblocking forms. Each validates its arguments, gets a plan
from the transport and hands it to the transport's one posting body for its direction (``transport.post``) with a
poster: MPI's blocking calls when nothing else needs driving and no deadline is set, else a Request
(``isend_plan``/``ireceive``) waited for until the deadline."""

from __future__ import annotations

from typing import Any

import numpy as np
from mpi4py import MPI

from ..arrays.array import Array
from ..arrays.operands import Target, proc_null_array, recv_target
from ..config import Config, config
from ..progress.deadlines import Deadline, deadline
from ..progress.driving import PENDING
from ..progress.posted import PostedRequest
from ..progress.requests import Request, wait_until
from ..runtime import get_runtime
from ..runtime.base import Runtime
from ..transport import BLOCKING, SendPlan, ireceive, isend_plan, plan_object, post_send, receive
from ..transport.privcomm import PrivateComms
from .validation import (
    ANY_SOURCE,
    ANY_TAG,
    PROC_NULL,
    Device,
    check_comm,
    check_rank,
    check_sync,
    check_tag,
    outgoing_meta,
    receive_device,
)

__all__ = [
    "ANY_SOURCE", "ANY_TAG", "PROC_NULL", "irecv_array", "isend_array", "recv_array", "send_array", "sendrecv_array",
]


# -- sending --------------------------------------------------------------------------------------------------


def _outbound(fn: str, obj: Any, dest: Any, tag: Any, comm: Any, sync: Any, meta: Any, cfg: Config,
              out: Target | None = None, receives: bool = False) -> tuple[PrivateComms, int, int, SendPlan | None, Any]:
    """Validate a send's arguments and plan its message (``transport.plan_object``: None for PROC_NULL)."""
    pc = check_comm(fn, comm)
    if type(dest) is not int or not 0 <= dest < pc.size:
        dest = check_rank(fn, "dest", dest, pc, wildcard=False)
    if type(tag) is not int or not 0 <= tag <= pc.tag_ub:
        tag = check_tag(fn, tag, pc, wildcard=False)
    meta_bytes = outgoing_meta(fn, obj, meta)
    if sync is not None:
        sync = check_sync(fn, sync)
    plan, src = plan_object(fn, obj, pc, dest, sync, meta_bytes, cfg, out, receives)
    return pc, dest, tag, plan, src


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
        meta: a small JSON dict delivered as ``Array.meta`` (None: a forwarded Array's own ``meta``; ``{}``
            sends none).

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
    if type(obj) is np.ndarray:  # host memory: no device call to scope
        return _isend(obj, dest, tag, comm, sync, meta)
    with get_runtime().context_scope():  # one for the producer's check, the plan and the steps run before returning
        return _isend(obj, dest, tag, comm, sync, meta)  # (the request's later steps, run by waits, open their own)


def _isend(obj: Any, dest: Any, tag: Any, comm: Any, sync: Any, meta: Any) -> Request[None]:
    pc, dest, tag, plan, src = _outbound("isend_array", obj, dest, tag, comm, sync, meta, config())
    if plan is None:
        return PostedRequest([], None)
    return isend_plan("isend_array", plan, pc, dest, tag, (obj, src))


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
        meta: a small JSON dict delivered as ``Array.meta`` (None: a forwarded Array's own ``meta``; ``{}``
            sends none).
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
    cfg = config()
    due = None if timeout is None and cfg.timeout is None else deadline("send_array", timeout)
    if type(obj) is np.ndarray:  # host memory: no device call to scope
        return _send(obj, dest, tag, comm, sync, meta, cfg, due)
    with get_runtime().context_scope():  # (a blocking call: its steps and waits too, since the user cannot switch
        return _send(obj, dest, tag, comm, sync, meta, cfg, due)  # contexts inside)


def _send(obj: Any, dest: Any, tag: Any, comm: Any, sync: Any, meta: Any, cfg: Config, due: Deadline | None) -> None:
    pc, dest, tag, plan, src = _outbound("send_array", obj, dest, tag, comm, sync, meta, cfg)
    if plan is None:
        return
    if plan.steps is None and due is None and not PENDING:
        post_send(plan, pc, dest, tag, BLOCKING)  # nothing to drive, nothing to time: MPI's blocking calls
    else:
        wait_until(isend_plan("send_array", plan, pc, dest, tag, (obj, src)), due)


# -- receiving ------------------------------------------------------------------------------------------------

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
        contents untouched, or without ``out=`` an empty uint8 host Array; as MPI's status says, ``source`` is
        PROC_NULL and ``tag`` ANY_TAG (whatever ``tag`` asked for); ``meta`` is None.

    Raises:
        TypeError, ValueError: a bad argument (the message names it).
        RecvMismatchError: the message does not fit ``out=`` (nothing is left unreceived).
        ProtocolError: the header cannot be decoded, or announces more than CAI_MPI_MAX_PAYLOAD_BYTES.
        TimeoutError: no message came within ``timeout``: the receive was cancelled, so a later message is
            not swallowed and the communicator stays usable.
    """
    cfg = config()
    due = None if timeout is None and cfg.timeout is None else deadline("recv_array", timeout)
    if type(out) is np.ndarray:  # host memory: no device call to scope
        return _recv(source, tag, comm, out, device, due, cfg)
    with get_runtime().context_scope():  # (the device it lands on, asked in _receive_args, and the whole receive)
        return _recv(source, tag, comm, out, device, due, cfg)


def _recv(source: Any, tag: Any, comm: Any, out: Any, device: Any, due: Deadline | None, cfg: Config) -> Array:
    pc, source, tag, target, ordinal, rt = _receive_args("recv_array", source, tag, comm, out, device)
    if source == PROC_NULL:
        return proc_null_array(target)
    return receive("recv_array", pc, source, tag, target, ordinal, rt, out, due, cfg)


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
    if type(out) is np.ndarray:  # host memory: no device call to scope
        return _irecv(source, tag, comm, out, device)
    with get_runtime().context_scope():  # (the device it lands on and what the receive does before returning)
        return _irecv(source, tag, comm, out, device)


def _irecv(source: Any, tag: Any, comm: Any, out: Any, device: Any) -> Request[Array]:
    pc, source, tag, target, ordinal, rt = _receive_args("irecv_array", source, tag, comm, out, device)
    if source == PROC_NULL:
        return PostedRequest([], proc_null_array(target))
    return ireceive("irecv_array", pc, source, tag, target, ordinal, rt, out)


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
            mismatch discards the payload and raises RecvMismatchError). ``obj`` itself (the same memory in the
            same layout) receives in place of what it sends, as MPI's ``Sendrecv_replace``: a copy of it is sent.
            Any other sharing of memory with ``obj`` is a ValueError.
        device: without ``out=``: None (a GPU when this rank has one, else host), "host", or a GPU ordinal.
        sync: for the array sent: None follows ``CAI_MPI_SYNC`` (default on); False skips the producer
            synchronization.
        meta: a small JSON dict sent with ``obj``, delivered as the receiver's ``Array.meta`` (None: a forwarded
            Array's own ``meta``; ``{}`` sends none).
        timeout: seconds each half (the send, the receive) may wait at most (None: ``CAI_MPI_TIMEOUT``, off by
            default).

    Every argument is checked before anything is sent, and errors name ``sendrecv_array``.

    Returns:
        The received Array (over ``out=`` when given). From ``source=PROC_NULL``: an Array over ``out=``, its
        contents untouched, or without ``out=`` an empty uint8 host Array (as ``recv_array``); the send half
        still goes to ``dest``.

    Raises:
        TypeError, ValueError, CAIError, StreamError, RecvMismatchError, ProtocolError, TimeoutError: as in
            ``send_array`` and ``recv_array``; ValueError also when ``out=`` shares memory with ``obj`` other
            than as ``obj`` itself.

    Example:
        >>> left, right = cart.Shift(0, 1)  # doctest: +SKIP
        >>> ghost = sendrecv_array(field[-2], right, 0, left, 0, cart, out=field_ghost)  # doctest: +SKIP
        >>> sendrecv_array(x, right, 0, left, 0, cart, out=x)  # x replaced by left's x  # doctest: +SKIP
    """
    fn = "sendrecv_array"
    due = deadline(fn, timeout)
    with get_runtime().context_scope():  # (a blocking call, as send_array's and recv_array's)
        pc, source, recvtag, target, ordinal, rt = _receive_args(fn, source, recvtag, comm, out, device)
        pc, dest, sendtag, plan, src = _outbound(fn, obj, dest, sendtag, comm, sync, meta, config(), target,
                                                 source != PROC_NULL)
        sent = None if plan is None else isend_plan(fn, plan, pc, dest, sendtag, (obj, src))
        try:
            if source == PROC_NULL:
                return proc_null_array(target)
            return receive(fn, pc, source, recvtag, target, ordinal, rt, out, due, config())
        finally:
            if sent is not None:
                wait_until(sent, deadline(fn, timeout))
