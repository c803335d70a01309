"""The public persistent collectives: ``allreduce_init`` (one array, or a list or dict: bucketed),
``bcast_init``, ``allgather_init``, ``reduce_init``. The machinery is in ``persistent`` and ``bucketed``."""

from __future__ import annotations

from typing import Any

from mpi4py import MPI

from .bucketed import BucketedAllreduce, is_container
from .persistent import PersistentCollective, single_allreduce_init

__all__ = ["allgather_init", "allreduce_init", "bcast_init", "reduce_init"]


def allreduce_init(
    obj: Any, op: Any = "sum", comm: MPI.Comm | None = None, *, out: Any = None, sync: bool | None = None,
    timeout: float | None = None,
) -> PersistentCollective | BucketedAllreduce:
    """A persistent allreduce: create once (collective), then reduce the input's current contents at each use.

    ``red = allreduce_init(x)``, then ``y = red()`` (or ``red.start()`` ... ``y = red.wait()``) as often as
    needed, and ``red.close()`` (collective) at the end, or use it as a context manager. Shapes, dtypes and the
    op are agreed once, here; each use is MPI's own persistent collective (``Allreduce_init``: ``Start`` and
    ``Wait``) on the same buffers. Where a rank holds device memory the ranks use ``Iallreduce`` per use instead
    (device memory sent directly on a CUDA-aware MPI, staged through pinned host memory otherwise, as
    ``allreduce_array`` does), and also where MPI lacks MPI-4's persistent collectives.

    Args:
        obj: this rank's array (anything ``send_array`` takes; same shape and dtype on every rank), or a list or
            a dict of arrays: the bucketed form, one persistent Allreduce per dtype (see ``allreduce_arrays``),
            which reads at each use the arrays the container held at creation (write new values into them in
            place: ``grads[k][...] = new``).
        op: "sum", "prod", "min", "max", "mean" (alias "avg": the sum divided by the communicator size, in
            the input's dtype; floating and complex arrays only), or an mpi4py ``MPI.Op``. Bool arrays reduce with
            ``MPI.LAND``, ``MPI.LOR``, ``MPI.LXOR``, and "min"/"max" (logical and/or).
        comm: None for COMM_WORLD; any intracommunicator.
        out: where every result lands (same shape and dtype, native byte order; one array only; ``out=obj``
            reduces in place); without it, a buffer allocated once here.
        sync: None follows ``CAI_MPI_SYNC`` (default on): the producer stream of a device input is
            synchronized before every ``start()``; False skips it.
        timeout: seconds the creation waits at most for every rank to join it (None: ``CAI_MPI_TIMEOUT``, off by
            default); each use takes its own (``wait(timeout=)``).

    Returns:
        A ``PersistentCollective`` (a ``BucketedAllreduce`` for a list or dict) whose ``wait()`` returns an
        Array over ``out=`` or the buffer allocated here (the same container of Arrays for a list or dict): the
        same memory at every use, overwritten by the next use.

    Raises:
        CollectiveMismatchError: on every rank, when shapes, dtypes or ops differ (naming every rank's), or a
            rank could not take part (that rank raises its own error).
        TimeoutError: some rank did not join within ``timeout`` (the collectives of ``comm`` are then out of
            step: later ones on it raise ``CollectiveMismatchError``).
        ValueError: at a use, when the input was reshaped or reallocated since creation (for a list or dict: an
            entry rebound to another array, ``grads[k] = new``, or a key added or removed; the error names them),
            or after ``close()``. Nothing is started on the rank that raises.
    """
    if is_container(obj):
        if out is not None:
            raise TypeError("allreduce_init: out= is for one array; a list or dict gets its results in buffers "
                            "allocated once at creation")
        return BucketedAllreduce(obj, op, comm, sync, timeout)
    return single_allreduce_init(obj, op, comm, out, sync, timeout)


def bcast_init(obj: Any, root: int = 0, comm: MPI.Comm | None = None, *, sync: bool | None = None,
               timeout: float | None = None) -> PersistentCollective:
    """A persistent broadcast of the root's ``obj`` into every other rank's ``obj``. Collective.

    Every rank passes its own buffer, as with MPI's ``Bcast``: the root's is sent (its current contents at each
    ``start()``), every other rank's is received into. Shapes and dtypes are checked against the root's once,
    here. Built on MPI's ``Bcast_init`` (host memory on every rank), or ``Ibcast`` per start where a rank holds
    device memory (staged as ``bcast_array`` does) or MPI lacks MPI-4's persistent collectives.

    Args:
        obj: this rank's buffer (anything ``send_array`` takes; writable on the non-roots); same shape and dtype
            on every rank.
        root: the broadcasting rank.
        comm: None for COMM_WORLD; any intracommunicator.
        sync: None follows ``CAI_MPI_SYNC`` (default on): the producer stream of a device input is
            synchronized before every ``start()``; False skips it.
        timeout: seconds the creation waits at most for every rank to join it (None: ``CAI_MPI_TIMEOUT``, off by
            default); each use takes its own (``wait(timeout=)``).

    Returns:
        A ``PersistentCollective`` whose ``wait()`` returns an Array over this rank's own buffer (the same
        memory at every use: the next use overwrites it).

    Raises:
        CollectiveMismatchError: on every rank, when shapes, dtypes or roots differ (naming every rank's), or a
            rank could not take part (that rank raises its own error).
        TimeoutError: some rank did not join within ``timeout`` (the collectives of ``comm`` are then out of
            step: later ones on it raise ``CollectiveMismatchError``).
    """
    return PersistentCollective("bcast_init", "bcast", obj, None, root, comm, None, sync, timeout)


def allgather_init(obj: Any, comm: MPI.Comm | None = None, *, sync: bool | None = None,
                   timeout: float | None = None) -> PersistentCollective:
    """A persistent allgather: every rank's ``obj``, on every rank. Collective.

    Built on MPI's ``Allgather_init`` (host memory on every rank), or ``Iallgather`` per start where a rank holds
    device memory (staged as ``allgather_array`` does) or MPI lacks MPI-4's persistent collectives.

    Args:
        obj: this rank's contribution (anything ``send_array`` takes); same shape and dtype on every rank.
        comm: None for COMM_WORLD; any intracommunicator.
        sync: None follows ``CAI_MPI_SYNC`` (default on): the producer stream of a device input is
            synchronized before every ``start()``; False skips it.
        timeout: seconds the creation waits at most for every rank to join it (None: ``CAI_MPI_TIMEOUT``, off by
            default); each use takes its own (``wait(timeout=)``).

    Returns:
        A ``PersistentCollective`` whose ``wait()`` returns a list of one Array per rank (``source`` is the rank),
        views of one buffer allocated here, on this rank's GPU when ``obj`` is device memory: the same memory at
        every use (the next use overwrites it).

    Raises:
        CollectiveMismatchError, TimeoutError: as in ``bcast_init``.
    """
    return PersistentCollective("allgather_init", "allgather", obj, None, None, comm, None, sync, timeout)


def reduce_init(obj: Any, op: Any = "sum", root: int = 0, comm: MPI.Comm | None = None, *, out: Any = None,
                sync: bool | None = None, timeout: float | None = None) -> PersistentCollective:
    """A persistent reduction of every rank's ``obj`` onto ``root``. Collective.

    Built on MPI's ``Reduce_init`` (host memory on every rank), or ``Ireduce`` per start where a rank holds
    device memory (staged as ``reduce_array`` does) or MPI lacks MPI-4's persistent collectives.

    Args:
        obj: this rank's array; same shape and dtype on every rank. Its current contents are read at each
            ``start()``.
        op: "sum", "prod", "min", "max", "mean" (alias "avg": the sum divided by the communicator size, in
            the input's dtype; floating and complex arrays only), or an mpi4py ``MPI.Op``. Bool arrays reduce with
            ``MPI.LAND``, ``MPI.LOR``, ``MPI.LXOR``, and "min"/"max" (logical and/or).
        root: the rank that gets the result.
        comm: None for COMM_WORLD; any intracommunicator.
        out: on the root, where every result lands (same shape and dtype, native byte order); without it, a
            buffer allocated once here.
        sync: None follows ``CAI_MPI_SYNC`` (default on): the producer stream of a device input is
            synchronized before every ``start()``; False skips it.
        timeout: seconds the creation waits at most for every rank to join it (None: ``CAI_MPI_TIMEOUT``, off by
            default); each use takes its own (``wait(timeout=)``).

    Returns:
        A ``PersistentCollective`` whose ``wait()`` returns, on the root, an Array over ``out=`` or the buffer
        allocated here (the same memory at every use: the next use overwrites it); None elsewhere.

    Raises:
        CollectiveMismatchError, TimeoutError: as in ``bcast_init``; a mismatched ``op`` too.
    """
    return PersistentCollective("reduce_init", "reduce", obj, op, root, comm, out, sync, timeout)
