"""Persistent collectives: the same collective on the same buffers again and again, agreed once.

``allreduce_init``, ``bcast_init``, ``allgather_init`` and ``reduce_init`` agree on every rank's shape and dtype
(and op, root) once, with one small collective, then bind MPI-4's persistent collective (``Allreduce_init``...)
to the buffers: each use is MPI's own ``Start`` and ``Wait`` on them, nothing else. Results land in the same
memory every time. Where a rank holds device memory the ranks use MPI's nonblocking collective per start instead
(device memory is staged per start, exactly as the one-shot collectives do); where an MPI lacks the MPI-4 calls,
too.
"""

from __future__ import annotations

import ctypes
from typing import Any

import numpy as np
from mpi4py import MPI

from ..arrays.array import NO_SOURCE, NO_TAG, Array
from ..arrays.operands import DeviceSource, RecvTarget, describe_target, mismatch, recv_target, send_source
from ..config import config
from ..core.header import MessageInfo, refuse_unsendable
from ..progress.driving import idle
from ..transport import Landing, device_landing, outgoing
from ..transport.agreement import posted, prepared
from .agreed import agree
from .collective_call import setup
from .lifecycle import PersistentLifecycle
from .reduce_ops import native_dtype, parse_op, reduce_datatype
from .validation import check_sync

__all__ = ["PersistentCollective", "single_allreduce_init"]


def _view(address: int, shape: tuple[int, ...], dtype: np.dtype[Any]) -> np.ndarray[Any, Any]:
    """A numpy array over host memory at ``address``."""
    n = int(np.prod(shape, dtype=np.int64)) * dtype.itemsize
    if n == 0:
        return np.empty(shape, dtype)
    view: np.ndarray[Any, Any] = np.frombuffer(memoryview((ctypes.c_char * n).from_address(address)), dtype)
    return view.reshape(shape)


def _address(a: np.ndarray[Any, Any]) -> int:
    return int(a.__array_interface__["data"][0]) if a.size else 0


def _where(src: np.ndarray[Any, Any] | DeviceSource) -> tuple[int, tuple[int, ...]]:
    return (src.desc.ptr, src.desc.shape) if isinstance(src, DeviceSource) else (_address(src), src.shape)


class PersistentCollective(PersistentLifecycle):
    """One collective, created once by ``allreduce_init``, ``bcast_init``, ``allgather_init`` or ``reduce_init``
    on every rank, used any number of times.

    ``start()`` begins a use with the current contents of the input; ``wait(timeout=None)`` finishes it and
    returns the result; calling the object does both. The result lies in the same memory at every use (``out=``,
    the rank's own buffer for ``bcast_init``, or buffers allocated once at creation): the next use overwrites it,
    so copy what you keep. A started use must be waited for before the next ``start()``. ``close()`` (collective:
    every rank calls it) frees the MPI request; the object is also a context manager. Shape and dtype are fixed
    at creation: an input reshaped or reallocated since is refused with ``ValueError``, as is any use after
    ``close()``. A use still in flight when the object is dropped finishes in the background.
    """

    __slots__ = ("_count", "_datatype", "_direct_recv", "_direct_send", "_dtype", "_fast", "_finish", "_host_ok",
                 "_info", "_kind", "_mean", "_nbytes", "_obj", "_op", "_out", "_pack", "_persistent", "_ptr", "_recv",
                 "_req", "_result", "_root", "_rt", "_send", "_send_buffer", "_shape", "_sync", "_target", "_unpack")

    _result: Any
    _finish: Any
    _op: Any
    _unpack: Any

    def __init__(self, fn: str, kind: str, obj: Any, op: Any, root: int | None, comm: Any, out: Any,
                 sync: Any, timeout: Any = None) -> None:
        self._begin_life(fn, f"{fn.removesuffix('_init')} collective")
        self._req: MPI.Request | None = None
        self._fast = False
        pc, comm_, root_, rt, _cfg, due = setup(fn, comm, root, timeout)
        self._kind, self._obj, self._comm, self._rt, self._root = kind, obj, comm_, rt, root_
        me, size = comm_.Get_rank(), comm_.Get_size()
        _, on_device = agree(fn, pc, due, lambda: self._plan(obj, op, out, sync, me, size, pc.aware.aware))
        self._persistent = not on_device and hasattr(comm_, "Allreduce_init")
        if self._persistent:
            try:
                self._req = self._post(self._send, self._recv, persistent=True)
                self._reqs = [self._req]
            except NotImplementedError:  # an MPI without MPI-4's persistent collectives: nonblocking per start
                self._persistent = False
        self._fast = (self._persistent and type(obj) is np.ndarray and not self._pack and self._unpack is None
                      and not self._mean)
        self._open()

    def _plan(self, obj: Any, op: Any, out: Any, sync: Any, me: int, size: int,
              aware: bool) -> tuple[str, None, bool]:
        """This rank's part, decided locally (errors here become errors on every rank)."""
        fn, kind, rt = self._fn, self._kind, self._rt
        self._sync = check_sync(fn, sync)
        reduces = kind in ("allreduce", "reduce")
        gets = kind in ("allreduce", "allgather") or me == self._root or (kind == "bcast")
        mpi_op = parse_op(fn, op) if reduces else None
        src = send_source(fn, obj, self._sync, rt)
        self._ptr, self._shape = _where(src)
        dtype = src.desc.dtype if isinstance(src, DeviceSource) else src.dtype
        refuse_unsendable(dtype, fn)  # (MPI would move an object array's pointers)
        if reduces:
            assert mpi_op is not None
            dtype = native_dtype(fn, dtype, device=isinstance(src, DeviceSource))
            self._datatype = reduce_datatype(fn, dtype, mpi_op)
            self._op = mpi_op.for_bool(fn).mpi if dtype.kind == "b" else mpi_op.mpi
            self._mean = mpi_op.mean and gets
        else:
            self._datatype, self._op, self._mean = MPI.BYTE, None, False
        self._dtype = dtype
        nbytes = int(np.prod(self._shape, dtype=np.int64)) * dtype.itemsize
        self._nbytes = nbytes
        self._count = nbytes // max(self._datatype.Get_size(), 1)
        self._info = MessageInfo(dtype, self._shape, False, nbytes, 0, None, False, False, 0)
        self._out, self._unpack, self._send, self._recv, self._pack = out, None, 0, 0, False
        self._target: Any = None
        receives_into_obj = kind == "bcast" and me != self._root
        target: Any = None
        if receives_into_obj:
            target = recv_target(fn, obj, rt)
            why = mismatch(target, self._shape, dtype)
            if why is not None:
                raise ValueError(f"{fn}: this rank's buffer ({describe_target(target)}) cannot be received into: {why}")
        elif out is not None and reduces and gets:
            target = recv_target(fn, out, rt)
            why = mismatch(target, self._shape, dtype)
            if why is not None:
                raise ValueError(f"{fn}: out= ({describe_target(target)}) cannot hold the result "
                                 f"(shape={self._shape} dtype={dtype.str}): {why}")
        elif out is not None and not reduces:
            raise TypeError(f"{fn}: takes no out= (the result lies in buffers allocated once at creation)")
        device = isinstance(src, DeviceSource) or (isinstance(target, RecvTarget) and target.desc is not None)
        self._host_ok = not device
        self._direct_send = aware
        self._direct_recv = aware and not self._mean
        if device:
            self._plan_device(src, target, gets, receives_into_obj, size)
        else:
            self._plan_host(src, target, gets, receives_into_obj, size, reduces)
        text = (f"{kind} shape={self._shape} dtype={dtype.str}" + (f" op={getattr(mpi_op, 'name', '')}" if reduces
                else "") + (f" root={self._root}" if kind in ("bcast", "reduce") else ""))
        return text, None, device

    def _plan_host(self, src: Any, target: Any, gets: bool, into_obj: bool, size: int, reduces: bool) -> None:
        """Host memory on this rank: fixed send and receive addresses, packed and unpacked per use where the
        layout (or, for reductions, the byte order) is not what MPI reads."""
        dtype, shape = self._dtype, self._shape
        host = target if type(target) is np.ndarray else (target.host if isinstance(target, RecvTarget) else None)
        sends = not into_obj
        if sends:
            a = src
            self._pack = not a.flags.c_contiguous or (reduces and a.dtype != dtype)
            self._send_buffer = np.empty(shape, dtype) if self._pack else a
            self._send = _address(self._send_buffer)
        else:
            self._send_buffer = None
        if not gets:
            self._result = None
            return
        if self._kind == "bcast" and not into_obj:  # the root: its own buffer is the result
            self._result = Array.from_host(src, owner=self._obj, source=self._source, tag=NO_TAG)
            return
        if self._kind == "allgather":
            whole = np.empty((size, *shape), dtype)
            self._recv = _address(whole)
            self._result = [Array.from_host(whole[r, ...], owner=whole, source=r, tag=NO_TAG) for r in range(size)]
            return
        if host is None:  # no out= (allreduce, reduce): allocated once
            host = np.empty(shape, dtype)
        direct = host.flags.c_contiguous and host.flags.writeable
        landing = host if direct else np.empty(shape, dtype)
        self._unpack = None if direct else (host, landing)
        self._recv = _address(landing)
        self._result = Array.from_host(host, owner=self._out if self._out is not None else
                                       (self._obj if into_obj else host), source=self._source, tag=NO_TAG)
        if sends and self._recv and self._recv == self._send:
            self._send = -1  # out= is obj: MPI.IN_PLACE
        elif sends and self._recv and np.shares_memory(landing, self._send_buffer):
            raise ValueError(f"{self._fn}: out= overlaps the input without being the same array")

    def _plan_device(self, src: Any, target: Any, gets: bool, into_obj: bool, size: int) -> None:
        """Device memory on this rank: sent and received per use as the one-shot collectives do (directly on a
        CUDA-aware MPI, staged through pinned host memory otherwise), into memory chosen once."""
        rt, dtype, shape = self._rt, self._dtype, self._shape
        self._send_buffer = None
        if not gets:
            self._result = None
            return
        if self._kind == "bcast" and not into_obj:  # the root: its own buffer is the result
            self._result = (Array.from_host(src, owner=self._obj, source=self._source, tag=NO_TAG)
                            if isinstance(src, np.ndarray) else Array(src.desc.replace(stream=None),
                            device=src.ordinal, owner=src.owner, source=self._source, tag=NO_TAG))
            return
        if into_obj or self._out is not None:
            self._target = self._obj if into_obj else self._out
            self._result = None
            return
        ordinal = src.ordinal if isinstance(src, DeviceSource) else rt.current_device()
        whole_shape = (size, *shape) if self._kind == "allgather" else shape
        if ordinal is None:
            whole: Array = Array.from_host(np.empty(whole_shape, dtype), source=self._source)
        else:
            nbytes = int(np.prod(whole_shape, dtype=np.int64)) * dtype.itemsize
            buffer = device_landing(rt, nbytes, ordinal, direct=self._direct_recv, handed_out=True)
            whole = Array.from_device(buffer, whole_shape, dtype, source=self._source, tag=NO_TAG)
        self._target = whole
        if self._kind == "allgather":
            self._info = self._info._replace(shape=whole_shape, payload_nbytes=self._info.payload_nbytes * size)
            self._result = [_row(whole, r) for r in range(size)]
        else:
            self._result = None  # (the Array each use's landing returns)

    def _post(self, send: int, recv: int, *, persistent: bool) -> MPI.Request:
        """MPI's collective on these addresses: persistent (``*_init``) or nonblocking."""
        comm, kind, count, dt, nbytes = self._comm, self._kind, self._count, self._datatype, self._nbytes
        post = prepared if persistent else posted
        if kind == "bcast":
            mine = send if comm.Get_rank() == self._root else recv
            return post(comm, "Bcast", [MPI.buffer.fromaddress(mine, nbytes), count, dt], self._root)
        sbuf: Any = MPI.IN_PLACE if send == -1 else [MPI.buffer.fromaddress(send, nbytes, readonly=True), count, dt]
        if kind == "allgather":
            whole = [MPI.buffer.fromaddress(recv, nbytes * comm.Get_size()), count, dt]  # (count: per rank)
            return post(comm, "Allgather", sbuf, whole)
        rbuf: Any = None if kind == "reduce" and comm.Get_rank() != self._root else [
            MPI.buffer.fromaddress(recv, nbytes), count, dt]
        if kind == "allreduce":
            return post(comm, "Allreduce", sbuf, rbuf, self._op)
        return post(comm, "Reduce", sbuf, rbuf, self._op, self._root)

    def _current(self) -> Any:
        """The input as it is now (its producer synchronized: the stream policy), refused if it changed."""
        obj = self._obj
        if type(obj) is np.ndarray:
            if obj.shape != self._shape:
                raise self._changed("the array was reshaped", self._shape, obj.shape)
            return obj
        src = send_source(self._fn, obj, self._sync, self._rt)
        ptr, shape = _where(src)
        if shape != self._shape or ptr != self._ptr:
            raise self._changed("the array was reshaped or reallocated", self._shape, shape)
        return src

    def _begin(self) -> list[MPI.Request]:
        """A use on MPI's persistent request (host memory, packed first where needed), or a nonblocking
        collective (device memory, or an MPI without persistent collectives)."""
        src = self._current()
        if not self._host_ok:
            return [self._start_device(src)]
        if self._pack:
            np.copyto(self._send_buffer, src, casting="equiv" if self._kind != "bcast" else "no")
        self._finish = None
        if self._persistent:
            self._req.Start()  # type: ignore[union-attr]
            return self._reqs
        return [self._post(self._send, self._recv, persistent=False)]

    def _start_device(self, src: Any) -> MPI.Request:
        rt = self._rt
        piece = None if self._kind == "bcast" and self._comm.Get_rank() != self._root else outgoing(
            src, rt, direct=self._direct_send, c_order=True)
        landing = None
        if self._target is not None:
            landing = Landing.plan(self._info, recv_target(self._fn, self._target, rt), None, self._source, NO_TAG, rt,
                                   direct=self._direct_recv)
        send = 0 if piece is None else piece.address
        recv = 0 if landing is None else landing.address
        if self._kind == "bcast":
            send = recv if piece is None else send
        req = self._post(send, recv, persistent=False)

        def finish() -> Any:
            if piece is not None:
                piece.release()
            if landing is None:
                return self._result
            if self._mean and self._info.payload_nbytes:
                assert not landing.device
                total = _view(landing.address, self._shape, self._dtype)
                np.true_divide(total, self._dtype.type(self._comm.Get_size()), out=total)
            got = landing.finish()
            return self._result if self._kind == "allgather" else got

        self._finish = finish
        return req

    def _done(self) -> Any:
        """The result of a completed use: the device landing finished, or the host mean and unpack applied."""
        finish = self._finish
        if finish is not None:
            self._finish = None
            return finish()
        if self._mean:
            total = _view(self._recv, self._shape, self._dtype)
            np.true_divide(total, self._dtype.type(self._comm.Get_size()), out=total)
        unpack = self._unpack
        if unpack is not None:
            np.copyto(unpack[0], unpack[1])
        if self._kind == "allgather":
            return list(self._result)
        return self._result

    def __call__(self, timeout: float | None = None) -> Any:
        """``start()`` then ``wait(timeout)``: one use, with the input's current contents."""
        if self._fast and timeout is None and not self._started and idle() and config().timeout is None:
            if self._obj.shape != self._shape:
                self._current()  # (raises)
            req = self._req
            req.Start()  # type: ignore[union-attr]
            req.Wait()  # type: ignore[union-attr]
            return self._result if self._kind != "allgather" else list(self._result)
        self.start()
        return self.wait(timeout)

    @property
    def _source(self) -> int:
        """The ``source`` of this collective's result: the root of a broadcast; a reduction's comes from no single
        rank (PROC_NULL, as MPI's status says for no sender). An allgather's pieces name their rank (``_row``)."""
        return self._root if self._kind == "bcast" else NO_SOURCE

    def _shut(self) -> None:
        self._closed, self._fast = True, False

    def _memory(self) -> Any:
        return (self._finish, self._obj, self._out, getattr(self, "_send_buffer", None), self._result)

    def __repr__(self) -> str:
        return f"<cai_mpi persistent {self._what} shape={self._shape} dtype={self._dtype} {self._state()}>"


def _row(whole: Array, r: int) -> Array:
    """Row ``r`` of a device Array of shape (size, ...) as an Array of its own (same memory)."""
    desc = whole.descriptor
    shape = desc.shape[1:]
    nbytes = int(np.prod(shape, dtype=np.int64)) * desc.dtype.itemsize
    from ..core.descriptor import CAIDescriptor

    sub = CAIDescriptor.for_new_buffer(desc.ptr + r * nbytes if nbytes else 0, shape, desc.dtype,
                                       stream=desc.stream)
    return Array(sub, device=whole.device, owner=whole, source=r, tag=NO_TAG)


def single_allreduce_init(obj: Any, op: Any, comm: Any, out: Any, sync: Any, timeout: Any) -> PersistentCollective:
    """``allreduce_init`` of one array (see ``bucketed.allreduce_init``, which also takes lists and dicts)."""
    return PersistentCollective("allreduce_init", "allreduce", obj, op, None, comm, out, sync, timeout)
