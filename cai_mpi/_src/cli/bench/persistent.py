"""Bench modes of the persistent and bucketed collectives (issue 26), registered into the collective tests.

``raw-init``: mpi4py's MPI-4 persistent collective (``Bcast_init``/``Allreduce_init``/``Allgather_init``,
``Start`` + ``Wait``) on buffers of known shape; ``cai-init``: cai_mpi's ``bcast_init``/``allreduce_init``/
``allgather_init`` called once per operation. The ``allreduce-arrays`` test reduces 16 arrays of the message
size each (8 float64 and 8 float32 arrays, shapes (n,), (1, n) and (n, 1)): ``raw`` is 16 mpi4py ``Allreduce``
calls with known shapes, ``raw-init`` 16 persistent ones, ``cai`` one ``allreduce_arrays`` call, ``cai-init`` the
bucketed ``allreduce_init`` of the list.
"""

from __future__ import annotations

from typing import Any

import numpy as np
from mpi4py import MPI

from .modes import Context, ModeSpec
from .multirank import (
    COLLECTIVE_DEFAULTS,
    COLLECTIVE_MODES,
    COLLECTIVE_TESTS,
    CaiCollective,
    CollectiveMode,
    RawCollective,
)

__all__ = ["ARRAYS_TEST", "register"]

ARRAYS_TEST = "allreduce-arrays"
_N_ARRAYS = 16


def _arrays(nbytes: int, rank: int) -> list[np.ndarray[Any, Any]]:
    """16 arrays of ``nbytes`` each (at least one element): 8 float64, 8 float32, in three shapes."""
    out = []
    for i in range(_N_ARRAYS):
        dtype = np.dtype(np.float64 if i % 2 == 0 else np.float32)
        n = max(1, nbytes // dtype.itemsize)
        shape = [(n,), (1, n), (n, 1)][i % 3]
        out.append(np.full(shape, rank + i, dtype))
    return out


class RawInit(CollectiveMode):
    """mpi4py's persistent collectives, bound once to buffers of known shape; each run is ``Start`` + ``Wait``."""

    def __init__(self, ctx: Context, nbytes: int) -> None:
        super().__init__(ctx, nbytes)
        comm = self.comm
        self.reqs: list[MPI.Prequest] = []
        if self.test == ARRAYS_TEST:
            self.xs = _arrays(nbytes, self.rank)
            self.outs = [np.empty_like(x) for x in self.xs]
            self.reqs = [comm.Allreduce_init(x, o, MPI.SUM) for x, o in zip(self.xs, self.outs, strict=True)]
        elif self.test == "bcast":
            self.reqs = [comm.Bcast_init(self.x if self.rank == 0 else self.out, root=0)]
        elif self.test == "allreduce":
            self.reqs = [comm.Allreduce_init(self.x, self.out, MPI.SUM)]
        else:
            self.gathered = np.empty(self.x.nbytes * comm.Get_size(), np.uint8).view(self.x.dtype)
            self.reqs = [comm.Allgather_init(self.x, self.gathered)]

    def run(self) -> None:
        for req in self.reqs:  # (16 arrays: one after the other, as 16 blocking calls would)
            req.Start()
            req.Wait()

    def close(self) -> None:
        for req in self.reqs:
            req.Free()
        self.reqs = []


class CaiInit(CollectiveMode):
    """cai_mpi's persistent collectives, created once; each run is one call of the object (start + wait)."""

    def __init__(self, ctx: Context, nbytes: int) -> None:
        super().__init__(ctx, nbytes)
        import cai_mpi

        comm = self.comm
        if self.test == ARRAYS_TEST:
            self.p = cai_mpi.allreduce_init(_arrays(nbytes, self.rank), comm=comm)
        elif self.test == "bcast":
            self.p = cai_mpi.bcast_init(self.x if self.rank == 0 else self.out, 0, comm)
        elif self.test == "allreduce":
            self.p = cai_mpi.allreduce_init(self.x, comm=comm, out=self.out)
        else:
            self.p = cai_mpi.allgather_init(self.x, comm)
        self.run = self.p  # type: ignore[method-assign]

    def close(self) -> None:
        self.p.close()


class RawArrays(CollectiveMode):
    """16 mpi4py ``Allreduce`` calls on arrays of known shapes (the floor of the bucketed allreduce)."""

    def __init__(self, ctx: Context, nbytes: int) -> None:
        super().__init__(ctx, nbytes)
        self.xs = _arrays(nbytes, self.rank)
        self.outs = [np.empty_like(x) for x in self.xs]

    def run(self) -> None:
        allreduce = self.comm.Allreduce
        for x, o in zip(self.xs, self.outs, strict=True):
            allreduce(x, o, MPI.SUM)


class CaiArrays(CollectiveMode):
    """One ``allreduce_arrays`` call over the 16 arrays."""

    def __init__(self, ctx: Context, nbytes: int) -> None:
        super().__init__(ctx, nbytes)
        import cai_mpi

        self.fn = cai_mpi.allreduce_arrays
        self.xs = _arrays(nbytes, self.rank)

    def run(self) -> None:
        self.fn(self.xs, "sum", self.comm)


def _host_or_aware(ctx: Context) -> str | None:
    if ctx.kind.device:
        return "the persistent and bucketed modes are measured on host memory"
    return None


def _not_arrays(ctx: Context) -> str | None:
    return f"not a mode of the {ARRAYS_TEST} test" if ctx.test == ARRAYS_TEST else None


def register() -> None:
    """Add the modes and the ``allreduce-arrays`` test to the collective tests (called once, by the package)."""
    COLLECTIVE_TESTS[ARRAYS_TEST] = (f"{_N_ARRAYS} arrays of the message size each (float64 and float32, mixed "
                                     "shapes): allreduce_arrays vs 16 mpi4py Allreduce calls with known shapes")
    COLLECTIVE_DEFAULTS[ARRAYS_TEST] = ("raw", "raw-init", "cai", "cai-init")  # (it has no cai-out: see below)
    raw, cai, cai_out = COLLECTIVE_MODES["raw"], COLLECTIVE_MODES["cai"], COLLECTIVE_MODES["cai-out"]
    COLLECTIVE_MODES["raw"] = ModeSpec(
        raw.name, raw.description + f"; {ARRAYS_TEST}: 16 Allreduce calls",
        lambda c, n: RawArrays(c, n) if c.test == ARRAYS_TEST else RawCollective(c, n),
        lambda c: _host_or_aware(c) if c.test == ARRAYS_TEST else raw.unavailable(c))
    COLLECTIVE_MODES["cai"] = ModeSpec(
        cai.name, cai.description + f"; {ARRAYS_TEST}: one allreduce_arrays call",
        lambda c, n: CaiArrays(c, n) if c.test == ARRAYS_TEST else CaiCollective(c, n), cai.unavailable)
    COLLECTIVE_MODES["cai-out"] = ModeSpec(cai_out.name, cai_out.description, cai_out.make,
                                           lambda c: _not_arrays(c) or cai_out.unavailable(c))
    COLLECTIVE_MODES["raw-init"] = ModeSpec(
        "raw-init", "mpi4py persistent Bcast_init / Allreduce_init / Allgather_init: Start + Wait (MPI-4)", RawInit,
        _host_or_aware)
    COLLECTIVE_MODES["cai-init"] = ModeSpec(
        "cai-init", "cai_mpi bcast_init / allreduce_init / allgather_init (bucketed for allreduce-arrays), called",
        CaiInit, _host_or_aware)
