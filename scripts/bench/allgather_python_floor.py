"""The Python floor of ``allgather_array``'s one-round design (issue 42): the same single ``Allgather`` of a record
per rank (the payload, then 24 bytes of ballot words), written with as little Python as the design allows, beside
MPI's own ``Allgather``, mpi4py's pickled ``comm.allgather`` and ``allgather_array`` itself.

    python scripts/bench/allgather_python_floor.py              # CPU per call on one rank
    mpiexec -n 2 python scripts/bench/allgather_python_floor.py # wall-clock per call, the slowest rank's

The minimal form checks the argument's type and layout, finds the agreed record size in a dict, copies the payload
and the words into a fresh buffer, makes the ``Allgather`` in place, compares every rank's words with one strided
view, and returns one Array per rank over the buffer: what the steady state must do. It leaves out what the library
adds around that: the communicator's checks and its out-of-step mark, the deadline, the stream policy, the pooled
buffer and the objects of the engine (the contribution, the ballot, the gathered buffer, the joined steps and the
posting table). Prints a JSON dict of microseconds: on one rank the best of 7 rounds of 5000 calls of CPU time
(``time.process_time``); on more, the median over 9 interleaved rounds of 2000 calls of the slowest rank's wall time.
"""

from __future__ import annotations

import json
import statistics
import time
from collections.abc import Callable
from typing import Any

import numpy as np
from mpi4py import MPI

import cai_mpi
from cai_mpi import Array

WORDS = 24  # bytes of ballot words per record


def main() -> None:
    comm = MPI.COMM_WORLD.Dup()
    size, me = comm.Get_size(), comm.Get_rank()
    agreed: dict[tuple[Any, ...], tuple[int, int, bytes]] = {}
    words = bytes(range(WORDS))

    def minimal(obj: Any) -> list[Array]:
        if type(obj) is not np.ndarray or not obj.flags.c_contiguous:
            raise TypeError("a C-contiguous numpy array")
        key = (obj.dtype, obj.shape)
        known = agreed.get(key)
        if known is None:
            n = obj.nbytes
            known = agreed[key] = (n, -(-n // 8) * 8 + WORDS, words)
        n, record, mine = known
        buf = np.empty(record * size, np.uint8)
        at = me * record
        buf[at : at + n] = obj.reshape(-1).view(np.uint8)
        buf[at + record - WORDS : at + record] = np.frombuffer(mine, np.uint8)
        comm.Allgather(MPI.IN_PLACE, [buf, record, MPI.BYTE])
        if np.ndarray((size, WORDS), np.uint8, buf, record - WORDS, (record, 1)).tobytes() != mine * size:
            raise RuntimeError("the ranks' calls differ")
        return [Array.from_host(np.ndarray(obj.shape, obj.dtype, buf, r * record), source=r) for r in range(size)]

    x, gathered = np.ones(1), np.empty(size)
    calls: dict[str, Callable[[], object]] = {
        "Allgather (raw)": lambda: comm.Allgather(x, gathered),
        "comm.allgather (pickle)": lambda: comm.allgather(x),
        "the one-round design, minimal Python": lambda: minimal(x),
        "allgather_array": lambda: cai_mpi.allgather_array(x),
    }
    for call in calls.values():
        for _ in range(500):
            call()
    wall = size > 1
    clock = time.perf_counter if wall else time.process_time
    samples: dict[str, list[float]] = {name: [] for name in calls}
    for _round in range(9 if wall else 7):
        for name, call in calls.items():
            n = 2000 if wall else 5000
            comm.Barrier()
            t0 = clock()
            for _ in range(n):
                call()
            us = (clock() - t0) / n * 1e6
            samples[name].append(comm.allreduce(us, op=MPI.MAX) if wall else us)
    pick = statistics.median if wall else min
    if me == 0:
        print(json.dumps({"ranks": size, **{k: round(pick(v), 2) for k, v in samples.items()}}))

if __name__ == "__main__":
    main()
