"""A failing stage's notice carries the ``meta`` of the item it worked on; when that meta can no longer be written as
JSON (the stage made the received dict refer to itself, or put a non-JSON value in it), the notice goes without it
and every other stage still gets ``PipelineError`` naming the failing stage. A survivor of the mutation run (the
fallback for a meta JSON refuses with ValueError was never exercised, docs/testing.md). Passes at any world size
>= 2."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
from mpi4py import MPI

import cai_mpi

pytestmark = pytest.mark.mpi(min_size=2)

comm = MPI.COMM_WORLD
rank, size = comm.Get_rank(), comm.Get_size()
LIMIT = 10.0  # s, every wait of a stage: a notice that never comes fails the test by TimeoutError, not the watchdog


@pytest.mark.parametrize("spoil", ["circular", "not-json"])
def test_a_failure_whose_meta_cannot_be_written_still_reaches_every_stage(spoil: str) -> None:
    failing = size - 1
    outcome: Any = None
    try:
        with cai_mpi.Pipeline(depth=2, timeout=LIMIT) as pipe:
            if pipe.first:
                for i in range(5):
                    pipe.send(np.full(4, i), meta={"i": i})
            else:
                for a in pipe:
                    if rank == failing and a.meta == {"i": 2}:
                        if spoil == "circular":
                            a.meta["self"] = a.meta  # json.dumps: ValueError
                        else:
                            a.meta["when"] = object()  # json.dumps: TypeError
                        raise KeyError(f"stage {rank} broke")
                    if not pipe.last:
                        pipe.send(a)
    except cai_mpi.PipelineError as exc:
        outcome = exc
    except KeyError as exc:
        outcome = exc
    if rank == failing:
        assert isinstance(outcome, KeyError), outcome
    else:
        assert isinstance(outcome, cai_mpi.PipelineError), outcome
        assert outcome.rank == failing and f"stage {failing} failed" in str(outcome)
        assert outcome.meta is None
    comm.Barrier()
