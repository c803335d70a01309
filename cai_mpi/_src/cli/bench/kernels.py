"""Timing loops (ping-pong, windowed and bidirectional bandwidth, N-rank pipeline, halo exchange) and the sample
driver."""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable
from typing import Any

import numpy as np

from .modes import MODES, Context, Mode, ModeSpec, SharedBuffers
from .multirank import COLLECTIVE_MODES, COLLECTIVE_TESTS, PIPELINE_MODES, collective_loop
from .progress import Progress

__all__ = ["TESTS", "Plan", "SizeResult", "mode_table", "ops_per_iteration", "run_plan"]

ACK_TAG = 8
_perf = time.perf_counter

TESTS = {
    "latency": "ping-pong between rank pairs (0,1), (2,3)...; one-way latency = round trip / 2",
    "bw": "windowed unidirectional bandwidth (like osu_bw): rank 0 sends a window, rank 1 acks",
    "bibw": "windowed bidirectional bandwidth (like osu_bibw): both ranks send a window at once",
    "pipeline": "items through a chain 0 -> 1 -> ... -> N-1; time per item at steady state",
    "halo": "face exchange along a chain 0 - 1 - ... - N-1 (not periodic): each rank posts a receive from each "
            "neighbour, sends to each and waits for all (irecv + isend + waitall); time per exchange",
    **COLLECTIVE_TESTS,
}


def mode_table(test: str) -> dict[str, ModeSpec]:
    """The modes ``test`` can compare: point-to-point ones (and the Pipeline's), or the collectives' own."""
    return COLLECTIVE_MODES if test in COLLECTIVE_TESTS else {**MODES, **PIPELINE_MODES}


@dataclasses.dataclass(frozen=True)
class Plan:
    """What to run. ``iters``/``warmup`` apply up to ``ref_bytes`` and shrink in proportion above it."""

    test: str
    sizes: list[int]
    modes: list[str]
    samples: int
    iters: int
    warmup: int
    window: int
    window_bytes: int = 256 << 20  # cap on the bytes one window puts in flight (memory on 2-core CI)
    ref_bytes: int = 16 << 10
    min_iters: int = 4

    def _scale(self, n: int, size: int, floor: int) -> int:
        per_op = size * (self.window_at(size) if self.test in ("bw", "bibw") else 1)
        ref = self.ref_bytes * (self.window if self.test in ("bw", "bibw") else 1)
        if per_op <= ref:
            return n
        return max(floor, round(n * ref / per_op))

    def iters_at(self, size: int) -> int:
        return self._scale(self.iters, size, min(self.min_iters, self.iters))

    def warmup_at(self, size: int) -> int:
        return self._scale(self.warmup, size, min(1, self.warmup))

    def window_at(self, size: int) -> int:
        return max(1, min(self.window, self.window_bytes // max(size, 1)))


def ops_per_iteration(test: str, window: int) -> int:
    """How many one-way messages one iteration times (the unit of ``median_us``)."""
    return {"latency": 2, "bw": window, "bibw": 2 * window}.get(test, 1)  # pipeline: items; halo: exchanges; calls


@dataclasses.dataclass
class SizeResult:
    samples_us: list[float]  # time per one-way message (per item for the pipeline), one entry per sample
    iterations: int
    window: int


_ACK = np.zeros(1, np.int32)


def _latency(m: Mode, ctx: Context, iters: int, window: int) -> float:
    rank = ctx.comm.Get_rank()
    peer = rank ^ 1
    send, recv = m.send, m.recv
    if rank % 2 == 0:
        x = m.src
        t0 = _perf()
        for _ in range(iters):
            send(x, peer)
            recv(peer)  # dropped at once: steady state for modes that allocate
        return _perf() - t0
    for _ in range(iters):
        send(recv(peer), peer)
    return 0.0


def _bw(m: Mode, ctx: Context, iters: int, window: int) -> float:
    comm = ctx.comm
    rank = comm.Get_rank()
    peer = rank ^ 1
    if rank % 2 == 0:
        x = m.src
        t0 = _perf()
        for _ in range(iters):
            m.waitall([m.isend(x, peer) for _ in range(window)])
            comm.Recv(_ACK, peer, ACK_TAG)
        return _perf() - t0
    for _ in range(iters):
        m.waitall([m.irecv(peer) for _ in range(window)])  # received arrays are dropped here
        comm.Send(_ACK, peer, ACK_TAG)
    return 0.0


def _bibw(m: Mode, ctx: Context, iters: int, window: int) -> float:
    peer = ctx.comm.Get_rank() ^ 1
    x = m.src
    t0 = _perf()
    for _ in range(iters):
        recvs = [m.irecv(peer) for _ in range(window)]
        m.waitall(recvs + [m.isend(x, peer) for _ in range(window)])
    return _perf() - t0


def _pipeline(m: Mode, ctx: Context, iters: int, window: int) -> float:
    comm = ctx.comm
    rank, size = comm.Get_rank(), comm.Get_size()
    last = size - 1
    if rank == 0:
        x = m.src
        t0 = _perf()
        prev: Any = None
        for _ in range(iters):
            h = m.isend(x, 1)
            if prev is not None:
                m.waitall([prev])
            prev = h
        m.waitall([prev])
        comm.Recv(_ACK, last, ACK_TAG)
        return _perf() - t0
    if rank == last:
        for k in range(iters):
            m.recv(rank - 1, k & 1)
        comm.Send(_ACK, 0, ACK_TAG)
        return 0.0
    prev = None
    for k in range(iters):
        y = m.recv(rank - 1, k & 1)
        if prev is not None:
            m.waitall([prev])
        prev = m.isend(y, rank + 1)
        del y
    m.waitall([prev])
    return 0.0


def _halo(m: Mode, ctx: Context, iters: int, window: int) -> float:
    comm = ctx.comm
    rank, size = comm.Get_rank(), comm.Get_size()
    neighbours = [p for p in (rank - 1, rank + 1) if 0 <= p < size]
    slots = list(enumerate(neighbours))  # one receive buffer per neighbour
    x = m.src
    t0 = _perf()
    for _ in range(iters):
        recvs = [m.irecv(p, slot) for slot, p in slots]
        m.waitall(recvs + [m.isend(x, p) for p in neighbours])
    return _perf() - t0


_LOOPS: dict[str, Callable[[Mode, Context, int, int], float]] = {
    "latency": _latency,
    "bw": _bw,
    "bibw": _bibw,
    "pipeline": _pipeline,
    "halo": _halo,
    **dict.fromkeys(COLLECTIVE_TESTS, collective_loop),
}


def run_plan(plan: Plan, ctx: Context, progress: Progress) -> dict[str, dict[int, SizeResult]]:
    """Run every size and mode; samples of the modes interleave so drift hits all modes alike.

    Every rank runs this; only rank 0's timings are meaningful (and returned filled in).
    """
    comm = ctx.comm
    loop = _LOOPS[plan.test]
    results: dict[str, dict[int, SizeResult]] = {name: {} for name in plan.modes}
    progress.start(sum(_cost(plan, size) for size in plan.sizes) * plan.samples * len(plan.modes))
    for size in plan.sizes:
        iters, warm, window = plan.iters_at(size), plan.warmup_at(size), plan.window_at(size)
        ops = iters * ops_per_iteration(plan.test, window)
        progress.status(f"{plan.test} {size_label(size)}")
        in_flight = window if plan.test in ("bw", "bibw") else 1
        mctx = dataclasses.replace(ctx, window=in_flight, buffers=SharedBuffers(ctx.kind, size))
        table = mode_table(plan.test)
        modes = {name: table[name].make(mctx, size) for name in plan.modes}
        comm.Barrier()
        for name, m in modes.items():
            results[name][size] = SizeResult([], iters, window)
            if warm:
                m.enter()
                comm.Barrier()
                loop(m, mctx, warm, window)
                m.leave()
        for s in range(plan.samples):
            for name, m in modes.items():
                m.enter()
                comm.Barrier()
                elapsed = loop(m, mctx, iters, window)
                m.leave()
                results[name][size].samples_us.append(elapsed / ops * 1e6)
                label = f"{plan.test} {size_label(size)} {name} sample {s + 1}/{plan.samples}"
                progress.advance(_cost(plan, size), label)
        for m in modes.values():
            m.close()
        del modes
        comm.Barrier()
    return results


def _cost(plan: Plan, size: int) -> float:
    """A rough relative cost of one sample of one mode, for the progress bar's estimate."""
    window = plan.window_at(size)
    return plan.iters_at(size) * ops_per_iteration(plan.test, window) * (size + 32768.0)


def size_label(n: int) -> str:
    """``1 MiB``, ``4 KiB``, ``3 B``: sizes as people read them (progress, Markdown tables)."""
    for unit, shift in (("GiB", 30), ("MiB", 20), ("KiB", 10)):
        if n >= 1 << shift and n % (1 << shift) == 0:
            return f"{n >> shift} {unit}"
    return f"{n} B"
