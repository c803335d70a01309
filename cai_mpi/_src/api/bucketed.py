"""Bucketed allreduce: many arrays reduced with one collective per dtype, not one per array.

The arrays of a list or dict are grouped by dtype; each group is copied back to back into one contiguous
bucket, reduced with one MPI Allreduce (``allreduce_arrays``) or one MPI-4 persistent Allreduce bound once to
the bucket (``allreduce_init`` of a list or dict), and the results are views of the bucket. Device arrays are
copied into and out of the host buckets (staged), whatever the MPI.

``allreduce_arrays`` is one vote (``transport.agreement``: the plan's fingerprint, whether a rank failed or holds
a device array; a fixed few bytes whatever the number of ranks), then one Allreduce per bucket; host arrays of
``DIRECT_BYTES`` or more are reduced on their own from their buffers (a copy into a bucket costs more than the
collective it saves). The persistent form votes once, at creation (``agreed.agree``).
"""

from __future__ import annotations

from collections.abc import Mapping
from math import prod
from typing import Any

import numpy as np
from mpi4py import MPI

from ..arrays.array import Array
from ..arrays.operands import DeviceSource, send_source
from ..core.memo import Memo
from ..runtime.base import Runtime
from ..transport.agreement import SPECULATE_BYTES, Ballot, Joined, fingerprint, prepared, reason, vote
from ..transport.bigcount import INT_MAX, reduce
from ..transport.engine import Call, steady, verdict
from ..transport.pieces import counted
from ..transport.pool import host_receive_pool
from ..transport.signature import Signature
from .agreed import agree
from .bucket_plan import DIRECT_BYTES, Direct, Plan, is_container
from .collective_call import setup
from .lifecycle import PersistentLifecycle
from .validation import check_sync

__all__ = ["DIRECT_BYTES", "BucketedAllreduce", "allreduce_arrays", "is_container"]


def _attempt(fn: str, objs: Any, op: Any, sync: Any, rt: Runtime) -> tuple[str, Plan, bool]:
    plan = Plan(fn, objs, op, sync, rt, split=True)
    return plan.text, plan, not all(isinstance(src, np.ndarray) for src in plan.sources)


# Plans of calls on host numpy arrays, by (op, keys, shapes, dtypes): a training loop reduces the same arrays
# every step, and the plan depends on nothing else (the arrays themselves are this call's, passed beside it).
_PLANS: Memo[Any, Plan] = Memo()
_NUMPY_ONLY = {np.ndarray}


def _reused(fn: str, objs: Any, op: Any, sync: Any, rt: Runtime) -> tuple[Plan, list[Any], bool]:
    """This call's plan (split: large host arrays reduced on their own), its arrays (``plan.sources``'s order),
    and whether all of them are host arrays; the plan reused when host numpy arrays of the same keys, shapes and
    dtypes were reduced before."""
    values = objs if type(objs) is list else (list(objs.values()) if type(objs) is dict else None)
    if values is None or not isinstance(op, str) or set(map(type, values)) != _NUMPY_ONLY:
        plan = Plan(fn, objs, op, sync, rt, split=True)
        return plan, plan.sources, all(isinstance(src, np.ndarray) for src in plan.sources)
    key = (op, None if type(objs) is list else tuple(objs), tuple([v.shape for v in values]),
           tuple([v.dtype for v in values]))
    cached = _PLANS.get(key)
    if cached is None:
        cached = _PLANS.remember(key, Plan(fn, objs, op, sync, rt, split=True))
        cached.sources = []  # (the cached plan is shared: this call's arrays are its own, and freed with the call)
        for bucket in cached.buckets:
            bucket.objs, bucket.ptrs = [], []
    else:
        check_sync(fn, sync)
    return cached, values, True


def allreduce_arrays(
    objs: Any, op: Any = "sum", comm: MPI.Comm | None = None, *, sync: bool | None = None,
    timeout: float | None = None,
) -> Any:
    """Reduce many arrays at once, element by element; every rank gets the results.

    One vote of a few integers checks that every rank reduces the same arrays with the same op; then each large
    host array (``DIRECT_BYTES`` or more) is reduced on its own, straight from its buffer, and the other arrays
    are grouped by dtype into contiguous buckets, one MPI Allreduce per bucket.

    Args:
        objs: a list or a dict of arrays (anything ``send_array`` takes, mixed dtypes and shapes); every rank
            passes the same keys, shapes and dtypes, in the same order.
        op: "sum", "prod", "min", "max", "mean" (alias "avg": the sum divided by the communicator size, in
            the input's dtype; floating and complex arrays only), or an mpi4py ``MPI.Op``. Bool arrays reduce with
            ``MPI.LAND``, ``MPI.LOR``, ``MPI.LXOR``, and "min"/"max" (logical and/or). Applied to every array.
        comm: None for COMM_WORLD; any intracommunicator.
        sync: None follows ``CAI_MPI_SYNC`` (default on); False skips the synchronization of this rank's
            producer streams.
        timeout: seconds to wait at most for every rank to join (None: ``CAI_MPI_TIMEOUT``, off by default).

    Returns:
        The same container (a list, or a dict with the same keys) of Arrays, each in its input's dtype in native
        byte order, in C order: host results are new host memory (small arrays views of one buffer per dtype); a
        device input's result is on its device (device arrays are staged through host memory and reduced there).

    Raises:
        CollectiveMismatchError: on every rank, when the ranks' keys, shapes, dtypes or ops differ (naming every
            rank's), or a rank could not take part (that rank raises its own error).
        TimeoutError: some rank did not join within ``timeout``.
    """
    fn = "allreduce_arrays"
    pc, comm_, _root, rt, cfg, due = setup(fn, comm, None, timeout)
    error: Exception | None = None
    try:
        plan, sources, host = _reused(fn, objs, op, sync, rt)
        ballot = Ballot(plan.fp, device=not host)
    except Exception as exc:
        error = exc
        ballot = Ballot(fingerprint(reason(exc)), failed=True)
    pool = host_receive_pool()  # (pooled: a result's memory serves a later call once the result is finalized)
    sig = pc.agreed.get(fn)
    if sig is not None:  # the steady state: ``engine.steady``, with the buckets filled when this call is the agreed one
        ours = None
        if error is None and host and plan.fp == sig.common:
            ours = _Buckets([pool.take_array((b.count,), b.dtype, b.count * b.dtype.itemsize) for b in plan.buckets])
            for bucket, buf in zip(plan.buckets, ours, strict=True):
                plan.fill(bucket, buf, sources, rt)
        ours = steady(fn, pc, ballot, due, sig, ours, _calls)
        if ours is not None and not ballot.device:
            return _results(plan, ours, [], comm_.Get_size(), rt)
    else:
        vote(fn, pc, ballot, due)
    steps = verdict(fn, pc, ballot, due, "" if error is not None else plan.text, error,
                    "every rank must reduce the same keys, shapes, dtypes and op")
    if ballot.device and plan.direct:  # (every rank alike: which arrays go alone must not depend on where they lie)
        plan = Plan(fn, objs, op, sync, rt)
        sources = plan.sources
    small = not ballot.device and not plan.direct and sum(b.count * b.dtype.itemsize for b in plan.buckets) \
        <= SPECULATE_BYTES
    if small:  # (every rank alike: the vote agreed on the plan and on where the arrays lie)
        pc.agreed[fn] = Signature(plan.fp, buckets=[(b.count, b.datatype, b.op) for b in plan.buckets])
    else:
        pc.agreed.pop(fn, None)
    alone = [pool.take_array(d.shape, d.dtype, d.dtype.itemsize * prod(d.shape)) for d in plan.direct]
    reduced: list[np.ndarray[Any, Any]] = []
    steps.keep = (alone, reduced)
    for d, result in zip(plan.direct, alone, strict=True):
        _direct(steps, d, sources[d.position], result, cfg.max_message_bytes)
    for bucket in plan.buckets:
        buf = pool.take_array((bucket.count,), bucket.dtype, bucket.count * bucket.dtype.itemsize)
        reduced.append(buf)
        plan.fill(bucket, buf, sources, rt)
        if bucket.count * bucket.dtype.itemsize <= cfg.max_message_bytes and bucket.count <= INT_MAX:
            steps("Allreduce", MPI.IN_PLACE, [buf, bucket.datatype], bucket.op)  # the common case, one call
        else:
            address = buf.ctypes.data
            reduce(steps, address, address, bucket.count, bucket.datatype, bucket.op, None, cfg.max_message_bytes)
    return _results(plan, reduced, alone, comm_.Get_size(), rt)


class _Buckets(list[np.ndarray[Any, Any]]):
    """This rank's filled buckets in a steady-state call (pooled memory: nothing to give back by hand)."""

    def release(self) -> None:
        pass


def _calls(sig: Signature, ours: _Buckets | None, comm: MPI.Comm) -> list[Call]:
    """The steady state's Allreduces of ``sig``'s buckets, in place: in ``ours``, or in scratch of their sizes."""
    bufs = ours if ours is not None else [np.empty(n * dt.Get_size(), np.uint8) for n, dt, _op in sig.buckets]
    return [("Allreduce", (MPI.IN_PLACE, counted(buf, n, dt), op))
            for buf, (n, dt, op) in zip(bufs, sig.buckets, strict=True)]


def _results(plan: Plan, buffers: list[np.ndarray[Any, Any]], alone: list[np.ndarray[Any, Any]], size: int,
             rt: Runtime) -> Any:
    """The container of result Arrays over the reduced buckets and arrays (the mean divided)."""
    plan.divide(buffers, alone, size)
    return plan.container(plan.results(buffers, alone, {}, rt))


def _direct(steps: Joined, d: Direct, src: np.ndarray[Any, Any], result: np.ndarray[Any, Any],
            max_message_bytes: int) -> None:
    """Array ``d`` reduced into ``result`` (C-ordered, its shape and native dtype) from its own buffer (a copy
    only when not C-contiguous in native byte order), with a blocking Allreduce (a step of the call, bounded by its
    ``timeout=`` if it has one): docs/benchmarks.md has why not Iallreduce for all of them and one Waitall."""
    if src.dtype != d.dtype or not src.flags.c_contiguous:
        src = np.ascontiguousarray(src, d.dtype)
    count = result.size
    if count * d.dtype.itemsize <= max_message_bytes and count <= INT_MAX:
        steps("Allreduce", [src, count, d.datatype], [result, count, d.datatype], d.op)
    else:
        steps.keep = (steps.keep, src)  # (a copy of its own: kept alive past a timeout too)
        reduce(steps, src.ctypes.data, result.ctypes.data, count, d.datatype, d.op, None, max_message_bytes)


_REMEDY = ("write each step's values into the arrays bound at creation, in place (container[key][...] = new), "
           "or create a new allreduce_init for the new arrays (close this one)")


def _keys(keys: list[Any]) -> str:
    return ("key " if len(keys) == 1 else "keys ") + ", ".join(map(repr, keys))


class BucketedAllreduce(PersistentLifecycle):
    """A persistent allreduce of a list or dict of arrays, made by ``allreduce_init`` given one.

    Used as a ``PersistentCollective`` is (``start``, ``wait``, call, ``close``, context manager): each use copies
    the arrays' current contents into one bucket per dtype and runs one MPI-4 persistent Allreduce per bucket;
    a host array of ``DIRECT_BYTES`` or more has its own, bound to its buffer (no copy; a copy only when it is
    not C-contiguous in native byte order), unless some rank holds a device array. ``wait()`` returns the same
    container of Arrays at every use, over memory allocated once at creation (host results are views of the
    buckets or arrays of their own; device results are device buffers, copied into at each use): the next use
    overwrites them. ``close()`` is collective; shapes are fixed at creation (an array reshaped or reallocated
    since, an entry of the container rebound to another array, or a key added or removed, is refused with
    ``ValueError``, as is any use after ``close()``).
    """

    __slots__ = ("_alone", "_bound", "_device", "_objs", "_plan", "_recv", "_reduced_alone", "_result", "_rt",
                 "_send")

    def __init__(self, objs: Any, op: Any, comm: Any, sync: Any, timeout: Any = None) -> None:
        fn = "allreduce_init"
        self._begin_life(fn, "bucketed allreduce")
        pc, comm_, _root, rt, _cfg, due = setup(fn, comm, None, timeout)
        self._comm, self._rt = comm_, rt
        plan, device = agree(fn, pc, due, lambda: _attempt(fn, objs, op, sync, rt))
        if device and plan.direct:  # (every rank alike: which arrays go alone must not depend on where they lie)
            plan = Plan(fn, objs, op, sync, rt)
        self._plan = plan
        self._send = [np.empty(b.count, b.dtype) for b in self._plan.buckets]
        self._recv = [np.empty(b.count, b.dtype) for b in self._plan.buckets]
        for bucket, s, r in zip(self._plan.buckets, self._send, self._recv, strict=True):
            sbuf = [MPI.buffer.fromaddress(s.ctypes.data if s.size else 0, s.nbytes, readonly=True), bucket.count,
                    bucket.datatype]
            rbuf = [MPI.buffer.fromaddress(r.ctypes.data if r.size else 0, r.nbytes), bucket.count, bucket.datatype]
            self._reqs.append(prepared(comm_, "Allreduce", sbuf, rbuf, bucket.op))
        values = list(objs.values()) if isinstance(objs, Mapping) else list(objs)
        self._objs, self._bound = objs, values
        self._reduced_alone = [np.empty(d.shape, d.dtype) for d in plan.direct]
        self._alone = [self._bind(d, values[d.position], plan.sources[d.position], result)
                       for d, result in zip(plan.direct, self._reduced_alone, strict=True)]
        self._device: dict[int, Array] = {}
        self._result = self._plan.results(self._recv, self._reduced_alone, self._device, rt)
        self._device = {i: a for i, a in enumerate(self._result) if not a.is_host}
        self._open()

    def _bind(self, d: Direct, obj: Any, src: np.ndarray[Any, Any],
              result: np.ndarray[Any, Any]) -> tuple[Any, int, Any]:
        """A large host array's own persistent Allreduce, from its buffer (or a staging copy of it) into ``result``:
        ``(the array, the address bound, the staging array or None)``."""
        staging = None if src.dtype == d.dtype and src.flags.c_contiguous else np.empty(d.shape, d.dtype)
        send = src if staging is None else staging
        n = result.size
        sbuf = [MPI.buffer.fromaddress(send.ctypes.data, send.nbytes, readonly=True), n, d.datatype]
        rbuf = [MPI.buffer.fromaddress(result.ctypes.data, result.nbytes), n, d.datatype]
        self._reqs.append(prepared(self._comm, "Allreduce", sbuf, rbuf, d.op))
        return obj, src.ctypes.data, staging

    def _check_alone(self) -> None:
        """The arrays with their own Allreduce are still where and what they were bound as (staged ones copied)."""
        plan = self._plan
        for d, (obj, ptr0, staging) in zip(plan.direct, self._alone, strict=True):
            src = obj if type(obj) is np.ndarray else send_source(self._fn, obj, plan.sync, self._rt)
            shape = src.desc.shape if isinstance(src, DeviceSource) else src.shape
            if shape != d.shape or isinstance(src, DeviceSource) or (
                    staging is None and (src.ctypes.data != ptr0 or src.dtype != d.dtype)):
                raise self._changed("an array was reshaped, reallocated or retyped", d.shape, shape)
            if staging is not None:
                np.copyto(staging, src, casting="equiv")

    def _check_bound(self) -> None:
        """The container holds the arrays it held at creation (compared by identity: cheap at every use). The
        buckets read those arrays, so an entry rebound to a new array (``grads[k] = g``, as functional code does)
        would be silently left out; it is refused, like a reallocated single array, before anything starts."""
        objs, bound, keys = self._objs, self._bound, self._plan.keys
        if keys is None:
            if len(objs) != len(bound):
                raise ValueError(f"{self._fn}: the list has {len(bound)} entries at creation, {len(objs)} now: a "
                                 f"persistent allreduce reduces the arrays it was created with; {_REMEDY}")
            changed = [i for i, (a, b) in enumerate(zip(objs, bound, strict=True)) if a is not b]
        else:
            if len(objs) != len(keys) or any(k not in objs for k in keys):
                known = set(keys)
                added = [k for k in objs if k not in known]
                removed = [k for k in keys if k not in objs]
                what = "; ".join(f"{_keys(ks)} {how} since creation" for ks, how in ((added, "added"),
                                                                                     (removed, "removed")) if ks)
                raise ValueError(f"{self._fn}: {what}: a persistent allreduce reduces the arrays it was created "
                                 f"with; {_REMEDY}")
            changed = [k for k, b in zip(keys, bound, strict=True) if objs[k] is not b]
        if changed:
            entries = "the entry" if len(changed) == 1 else "the entries"
            names = ", ".join(map(repr, changed[:8])) + (f" and {len(changed) - 8} more" if len(changed) > 8 else "")
            raise ValueError(f"{self._fn}: {entries} {names} {'was' if len(changed) == 1 else 'were'} rebound to "
                             f"another array since creation, and a persistent allreduce reads the arrays bound at "
                             f"creation; {_REMEDY}")

    def _begin(self) -> list[MPI.Request]:
        """Every array's current contents copied into its bucket, then every bucket's persistent Allreduce."""
        plan, rt = self._plan, self._rt
        self._check_bound()
        if self._alone:
            self._check_alone()
        ordered: list[Any] = [None] * plan.n
        for bucket in plan.buckets:
            for obj, pos, shape0, ptr0 in zip(bucket.objs, bucket.positions, bucket.shapes, bucket.ptrs, strict=True):
                src = obj if type(obj) is np.ndarray else send_source(self._fn, obj, plan.sync, rt)
                shape = src.desc.shape if isinstance(src, DeviceSource) else src.shape
                ptr = src.desc.ptr if isinstance(src, DeviceSource) else 0
                if shape != shape0 or ptr != ptr0:
                    raise self._changed("an array was reshaped or reallocated", shape0, shape)
                ordered[pos] = src
        for bucket, buf in zip(plan.buckets, self._send, strict=True):
            plan.fill(bucket, buf, ordered, rt)
        MPI.Prequest.Startall(self._reqs)  # type: ignore[arg-type]  # (every one from Allreduce_init)
        return self._reqs

    def _done(self) -> Any:
        """The container of results (the same Arrays at every use), the mean divided and device copies made."""
        plan = self._plan
        plan.divide(self._recv, self._reduced_alone, self._comm.Get_size())
        if self._device:
            plan.results(self._recv, self._reduced_alone, self._device, self._rt)
        return plan.container(list(self._result))

    def _memory(self) -> Any:
        return (self._send, self._recv, self._alone, self._reduced_alone)

    def __repr__(self) -> str:
        return f"<cai_mpi persistent bucketed allreduce of {self._plan.n} arrays {self._state()}>"
