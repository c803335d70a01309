"""The floor of a one-shot collective's design, side by side with the call itself (issue 42): is the vote better
posted with the payload collective, or before it?

    mpiexec -n 2 python scripts/bench/collective_floor.py bcast|allreduce [NBYTES] [ROUNDS] [CALLS]

Interleaves, round after round, in mpi4py alone: MPI's collective on ``COMM_WORLD`` (raw), the same on a duplicate
communicator, the vote's ``Allreduce(MAX)`` of six int64 and then the collective (in sequence: what cai_mpi does
past ``SPECULATE_BYTES``, and on a call unlike the last), and the vote's ``Iallreduce`` posted with the collective's
nonblocking form and completed by one ``Waitall`` (together: the steady state up to ``SPECULATE_BYTES``); then the
cai_mpi call itself (``bcast_array`` without ``out=``, ``allreduce_array``), and the same into ``out=`` (what the
landing of a new result costs is the difference). Prints on rank 0 each mode's median time per call (us) and its
ratio to raw, as JSON. Defaults: 1 MiB, 7 rounds of 200 calls.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Callable

import numpy as np
from interleaved import median_us  # (scripts/bench, this script's folder)
from mpi4py import MPI

import cai_mpi


def main() -> None:
    kind = sys.argv[1] if len(sys.argv) > 1 else "bcast"
    if kind not in ("bcast", "allreduce"):
        raise SystemExit(f"collective_floor.py: bcast or allreduce, not {kind!r}")
    given = [int(a) for a in sys.argv[2:5]]
    nbytes, rounds, calls = given + [1 << 20, 7, 200][len(given) :]
    comm = MPI.COMM_WORLD
    rank = comm.Get_rank()
    dup = comm.Dup()
    src = np.arange(max(nbytes // 8, 1), dtype=np.float64)
    buf = np.empty_like(src)
    votes = np.zeros(6, np.int64)

    def blocking(c: MPI.Intracomm) -> None:
        if kind == "bcast":
            c.Bcast(src if rank == 0 else buf, root=0)
        else:
            c.Allreduce(src, buf, MPI.SUM)

    def nonblocking(c: MPI.Intracomm) -> MPI.Request:
        if kind == "bcast":
            return c.Ibcast(src if rank == 0 else buf, root=0)
        return c.Iallreduce(src, buf, MPI.SUM)

    def in_sequence() -> None:
        dup.Allreduce(MPI.IN_PLACE, votes, MPI.MAX)
        blocking(dup)

    def together() -> None:
        MPI.Request.Waitall([nonblocking(dup), dup.Iallreduce(MPI.IN_PLACE, votes, MPI.MAX)])

    def call() -> object:
        if kind == "bcast":
            return cai_mpi.bcast_array(src if rank == 0 else None, root=0)
        return cai_mpi.allreduce_array(src)

    def call_into_out() -> object:  # (no landing to make: what the default one costs is the difference)
        if kind == "bcast":
            return cai_mpi.bcast_array(src if rank == 0 else None, root=0, out=None if rank == 0 else buf)
        return cai_mpi.allreduce_array(src, out=buf)

    modes: dict[str, Callable[[], object]] = {
        "raw": lambda: blocking(comm),
        "raw on a duplicate": lambda: blocking(dup),
        "vote, then the collective": in_sequence,
        "vote with the collective": together,
        f"{kind}_array": call,
        f"{kind}_array(out=)": call_into_out,
    }
    median = median_us(comm, modes, rounds, calls)
    if rank == 0:
        print(json.dumps({"kind": kind, "nbytes": src.nbytes, "rounds": rounds, "calls": calls, "us": median,
                          "x raw": {name: m / median["raw"] for name, m in median.items()}}, indent=1))
    dup.Free()


if __name__ == "__main__":
    main()
