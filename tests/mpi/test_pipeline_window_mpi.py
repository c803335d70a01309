"""The Pipeline's back-pressure bound with credits sent back once per half window: a stage never has more than
``depth`` items sent and not yet received by the next stage, and it gets that far once the next stage has
received what it was sent. Every rank is a stage; passes at any world size >= 2.

One edge of the chain is probed: stage ``e`` (the prober) sends ``m`` items, stage ``e + 1`` (the stopper)
receives exactly those and then stops receiving; the prober's next ``depth`` sends must complete (retried while
they time out: its Pipeline alone has a short timeout, and a send that times out sends nothing) and the one after
them must time out at every try. No clock decides the outcome: a send past the bound can never complete while the
stopper waits, however slow the machine, and a send within it always does. Then the stopper resumes and every
item must arrive at the last stage, in order and intact. ``m`` is a multiple of the half window, so every
received item has been credited: the prober must get exactly ``depth`` items ahead, no more (the bound) and no
fewer (no credit lost). Items with a meta each travel self-described; items of one shape without meta travel as
bare payloads after the first: the bound is the same either way.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import numpy as np
import pytest
from mpi4py import MPI

import cai_mpi

pytestmark = pytest.mark.mpi(min_size=2)

comm = MPI.COMM_WORLD
rank, size = comm.Get_rank(), comm.Get_size()

M = 12  # items the stopper receives before it stops: a multiple of depth // 2 for every depth below
PROBE_TIMEOUT = 0.2  # the prober's Pipeline timeout (seconds): only how long one probe waits
MISSES = 3  # probes of the send past the bound, each of which must time out (none can complete, however slow)
GIVE_UP = 30  # seconds of timeouts in a row on a send that must complete: a hang (a credit lost)


def item(i: int) -> np.ndarray[Any, Any]:
    return np.arange(i, i + 3, dtype="<i8")


def until_done(call: Any, *args: Any, **kwargs: Any) -> Any:
    """Call a send or receive of the prober until it does not time out (its timeout is short on purpose); GIVE_UP
    seconds of timeouts in a row is a hang, which fails the test (and the prober's failure reaches every stage)."""
    for _ in range(int(GIVE_UP / PROBE_TIMEOUT)):
        try:
            return call(*args, **kwargs)
        except cai_mpi.TimeoutError:
            continue
    return call(*args, **kwargs)


@pytest.mark.parametrize("bare", [False, True], ids=["described", "bare"])
@pytest.mark.parametrize("depth", [1, 2, 3, 4, 6])
@pytest.mark.parametrize("edge", ["first", "last"])
def test_a_stage_never_gets_more_than_depth_items_ahead(depth: int, edge: str, bare: bool) -> None:
    prober = 0 if edge == "first" else size - 2
    stopper = prober + 1
    n = M + depth + 4  # items in the stream: more than the prober can send while the stopper waits
    side = comm.Dup()
    ahead = -1
    kept: list[cai_mpi.Array] = []
    received = sent = 0
    try:
        with cai_mpi.Pipeline(depth=depth, timeout=PROBE_TIMEOUT if rank == prober else None) as pipe:
            if rank == prober:
                source: Iterator[Any] = (
                    ((item(i), None if bare else {"i": i}) for i in range(n)) if pipe.first
                    else ((a, a.meta) for a in iter(lambda: until_done(pipe.recv), None))
                )
                for _ in range(M):
                    x, meta = next(source)
                    until_done(pipe.send, x, meta=meta)
                assert side.recv(source=stopper) == M  # the stopper has received M items and stopped
                ahead, held = 0, None
                for _ in range(depth):  # the credits for the M items received let depth more through: no fewer...
                    x, meta = next(source)
                    until_done(pipe.send, x, meta=meta)
                    ahead += 1
                held = next(source)
                for _ in range(MISSES):  # ... and no more: the next send cannot complete, however slow the machine
                    try:
                        pipe.send(held[0], meta=held[1])
                    except cai_mpi.TimeoutError:
                        continue
                    ahead, held = ahead + 1, None
                    break
                side.send(ahead, dest=stopper)
                rest = ([held] if held is not None else []) + list(source)
                for x, meta in rest:
                    until_done(pipe.send, x, meta=meta)
                pipe.close()
            elif pipe.first:
                for i in range(n):
                    pipe.send(item(i), meta=None if bare else {"i": i})
                    sent += 1
                pipe.close()
            else:
                for a in pipe:
                    received += 1
                    if pipe.last:
                        kept.append(a)
                    else:
                        pipe.send(a)
                    if rank == stopper and received == M:
                        side.send(M, dest=prober)
                        ahead = side.recv(source=prober)
                pipe.close()
            side.Barrier()  # every stream has ended: leaving is prompt, within the prober's short deadline
    finally:
        side.Free()
    if rank == prober:
        assert ahead == depth, f"stage {rank} got {ahead} items ahead of the next stage at depth {depth}"
        assert pipe._down.bare_sent == (n - 1 if bare else 0)
    elif rank == stopper:
        assert ahead == depth and received == n
    elif rank == 0:
        assert sent == n
    else:
        assert received == n  # a forwarding stage passed on the whole stream
    if rank == size - 1:
        assert [a.meta for a in kept] == [None if bare else {"i": i} for i in range(n)]
        assert all(np.array_equal(np.asarray(a), item(i)) for i, a in enumerate(kept))
