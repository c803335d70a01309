"""The timing rule of the floor scripts (``collective_floor.py``, ``halo_floor.py``): after a warm-up, every mode is
timed in turn, round after round, each round after a barrier, so a disturbance of the machine falls on all modes
alike; a mode's figure is the median of its rounds."""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable, Mapping

from mpi4py import MPI


def median_us(comm: MPI.Intracomm, modes: Mapping[str, Callable[[], object]], rounds: int, calls: int,
              warm_up: int = 20) -> dict[str, float]:
    """Each mode's median time per call, in microseconds, over ``rounds`` interleaved rounds of ``calls`` calls."""
    for run in modes.values():
        for _ in range(warm_up):
            run()  # pools, caches and MPI's connections made before anything is timed
    times: dict[str, list[float]] = {name: [] for name in modes}
    for _ in range(rounds):
        for name, run in modes.items():
            comm.Barrier()
            start = time.perf_counter()
            for _ in range(calls):
                run()
            times[name].append((time.perf_counter() - start) / calls * 1e6)
    return {name: statistics.median(t) for name, t in times.items()}
