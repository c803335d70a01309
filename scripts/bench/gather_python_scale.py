"""The Python a one-round ``allgather_array`` spends per rank of the world, in one process (no MPI call): reading
every rank's ballot words after the ``Allgather``, and making the P result Arrays (``Gathered.finish``), at world
sizes no development machine starts.

    python scripts/bench/gather_python_scale.py

Prints, per world size P (2, 64, 1,024), microseconds per call: the words read by a Python loop over the records
(the check before 2026-12-06) and by one strided numpy view (since), and ``Gathered.finish`` over P records of one
float64 each.
"""

from __future__ import annotations

import timeit

import numpy as np

from cai_mpi._src.core.header import MessageInfo
from cai_mpi._src.runtime import get_runtime
from cai_mpi._src.transport.contiguous import Gathered

WORDS = 24  # bytes of ballot words per record
RECORD = 32  # one float64, then the words
AT = RECORD - WORDS  # where the words start in a record
AGREED = bytes(WORDS)


def main() -> None:
    info = MessageInfo(np.dtype(np.float64), (1,), False, 8, 0, None, False, False, 0)
    rt = get_runtime()
    for size in (2, 64, 1024):
        block = memoryview(bytearray(RECORD * size))

        def loop(block: memoryview = block, size: int = size) -> bool:
            return all(block[w : w + WORDS] == AGREED for w in range(AT, RECORD * size, RECORD))

        def view(block: memoryview = block, size: int = size) -> bool:
            return np.ndarray((size, WORDS), np.uint8, block, AT, (RECORD, 1)).tobytes() == AGREED * size

        place = Gathered([info] * size, None, rt, direct=False, packed=True, stride=RECORD)
        n = 20000 // size + 10
        timed = {name: min(timeit.repeat(call, number=n, repeat=5)) / n * 1e6 for name, call in
                 [("words, Python loop", loop), ("words, numpy view", view),
                  ("finish (P Arrays)", lambda place=place: place.finish(rt, -1))]}
        print(f"P={size}: " + ", ".join(f"{name} {us:.1f} us" for name, us in timed.items()))


if __name__ == "__main__":
    main()
