"""Benchmarks over every rank: cai_mpi's shape-free collectives against mpi4py's with known shapes, and
cai_mpi's ``Pipeline`` as a mode of the pipeline test."""

from __future__ import annotations

import time
from typing import Any

import numpy as np
from mpi4py import MPI

from .modes import Context, Mode, ModeSpec

__all__ = [
    "COLLECTIVE_DEFAULTS", "COLLECTIVE_MODES", "COLLECTIVE_TESTS", "DEFAULT_COLLECTIVE_MODES", "PIPELINE_MODES",
    "PipelineMode", "collective_loop",
]

COLLECTIVE_TESTS = {
    "bcast": "rank 0's array to every rank: bcast_array vs mpi4py Bcast into a buffer of known shape",
    "allreduce": "element-wise sum over the ranks: allreduce_array vs mpi4py Allreduce (float64; bytes below 8)",
    "allgather": "every rank's array to every rank: allgather_array vs mpi4py Allgather into a known-size buffer",
}


def _typed(buf: Any, nbytes: int) -> Any:
    """The buffer as float64 elements when the size allows it (what reductions usually sum), else bytes."""
    return buf.view(np.float64) if nbytes and nbytes % 8 == 0 else buf


class CollectiveMode(Mode):
    """One collective operation per ``run()``; every rank calls it. ``test`` names the collective."""

    def __init__(self, ctx: Context, nbytes: int) -> None:
        super().__init__(ctx, nbytes)
        self.test = ctx.test
        self.rank = ctx.comm.Get_rank()
        self.x = _typed(self.src, nbytes)
        self.out = _typed(self.buffers.dst[0], nbytes)

    def run(self) -> None:
        raise NotImplementedError


class RawCollective(CollectiveMode):
    """mpi4py's buffer collectives on buffers whose shapes every rank knows in advance (the floor)."""

    def __init__(self, ctx: Context, nbytes: int) -> None:
        super().__init__(ctx, nbytes)
        self.gathered = _typed(self.kind.alloc(nbytes * ctx.comm.Get_size()), nbytes)

    def run(self) -> None:
        comm = self.comm
        if self.test == "bcast":
            comm.Bcast(self.x if self.rank == 0 else self.out, root=0)
        elif self.test == "allreduce":
            comm.Allreduce(self.x, self.out, op=MPI.SUM)
        else:
            comm.Allgather(self.x, self.gathered)


class CaiCollective(CollectiveMode):
    """cai_mpi's collectives: nothing known in advance but the root; ``out``: bcast and allreduce into buffers."""

    def __init__(self, ctx: Context, nbytes: int, *, out: bool = False) -> None:
        super().__init__(ctx, nbytes)
        import cai_mpi

        self.cai = cai_mpi
        self.use_out = out

    def run(self) -> None:
        cai, comm = self.cai, self.comm
        out = self.out if self.use_out else None
        if self.test == "bcast":
            if self.rank == 0:
                cai.bcast_array(self.x, 0, comm)
            else:
                cai.bcast_array(None, 0, comm, out=out)
        elif self.test == "allreduce":
            cai.allreduce_array(self.x, "sum", comm, out=out)
        else:
            cai.allgather_array(self.x, comm)


class PickleCollective(CollectiveMode):
    """mpi4py's lowercase collectives (``comm.bcast``, ``comm.allreduce``, ``comm.allgather``): the array pickled,
    nothing known in advance, as a newcomer to mpi4py would write it."""

    def run(self) -> None:
        comm = self.comm
        if self.test == "bcast":
            comm.bcast(self.x if self.rank == 0 else None, root=0)
        elif self.test == "allreduce":
            comm.allreduce(self.x, op=MPI.SUM)
        else:
            comm.allgather(self.x)


def _host_only(ctx: Context) -> str | None:
    return "mpi4py pickles host arrays only" if ctx.kind.device else None


def _no_out_for_allgather(ctx: Context) -> str | None:
    return "allgather_array has no out=" if ctx.test == "allgather" else None


def _raw_collective_unavailable(ctx: Context) -> str | None:
    if ctx.kind.device and not ctx.aware:
        return "mpi4py's collectives read device memory in place: they need a CUDA-aware MPI"
    return None


COLLECTIVE_MODES: dict[str, ModeSpec] = {
    s.name: s
    for s in (
        ModeSpec("raw", "mpi4py Bcast / Allreduce / Allgather with shapes known in advance (the floor)",
                 RawCollective, _raw_collective_unavailable),
        ModeSpec("cai", "cai_mpi bcast_array / allreduce_array / allgather_array (no shapes given)", CaiCollective),
        ModeSpec("cai-out", "cai, receiving into preallocated out= (bcast, allreduce)",
                 lambda c, n: CaiCollective(c, n, out=True), _no_out_for_allgather),
        ModeSpec("pickle", "mpi4py's lowercase bcast / allreduce / allgather (the array pickled, shapes unknown)",
                 PickleCollective, _host_only),
    )
}

DEFAULT_COLLECTIVE_MODES = ("raw", "cai", "cai-out")
# A test's default modes are modes it runs: none listed only to be skipped (allgather_array has no out=).
COLLECTIVE_DEFAULTS: dict[str, tuple[str, ...]] = {"allgather": ("raw", "cai")}


def collective_loop(m: Mode, ctx: Context, iters: int, window: int) -> float:
    """``iters`` operations on every rank, then a barrier, so rank 0's time covers every rank's part."""
    assert isinstance(m, CollectiveMode)
    run = m.run
    t0 = time.perf_counter()
    for _ in range(iters):
        run()
    ctx.comm.Barrier()
    return time.perf_counter() - t0


class PipelineMode(Mode):
    """``cai_mpi.Pipeline`` on the bench communicator: ``isend`` is ``pipe.send`` (back-pressure at ``depth``
    items in flight), ``recv`` is ``pipe.recv``. Opened before and closed after each timed block (both collective,
    neither timed)."""

    def __init__(self, ctx: Context, nbytes: int, *, depth: int = 2) -> None:
        super().__init__(ctx, nbytes)
        import cai_mpi

        self.cai = cai_mpi
        self.depth = depth
        self.pipe: Any = None

    def enter(self) -> None:
        self.pipe = self.cai.Pipeline(self.comm, depth=self.depth)

    def leave(self) -> None:
        pipe, self.pipe = self.pipe, None
        if not pipe.first:
            while pipe.recv() is not None:  # the end of the stream, after the timed items
                pass
        pipe.__exit__(None, None, None)

    def send(self, obj: Any, dest: int) -> None:
        self.pipe.send(obj)

    def isend(self, obj: Any, dest: int) -> Any:
        self.pipe.send(obj)
        return None

    def recv(self, source: int, slot: int = 0) -> Any:
        return self.pipe.recv()

    def wait_sends(self, handles: list[Any]) -> None:
        pass  # the Pipeline completes its own sends (at most depth in flight)


def _pipeline_only(ctx: Context) -> str | None:
    return None if ctx.test == "pipeline" else "only a mode of the pipeline test"


#: Modes of the pipeline test beside the point-to-point ones.
PIPELINE_MODES: dict[str, ModeSpec] = {
    "cai-pipeline": ModeSpec("cai-pipeline", "cai_mpi.Pipeline(depth=2): send with back-pressure, recv the next item",
                             PipelineMode, _pipeline_only),
    "cai-pipeline-8": ModeSpec("cai-pipeline-8", "cai-pipeline with depth=8 (credits go back once per 4 items)",
                               lambda c, n: PipelineMode(c, n, depth=8), _pipeline_only),
}
