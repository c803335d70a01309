"""What each rank asks MPI to move per one-shot collective call, and which MPI calls it makes, at several world sizes.

A PMPI counter (``scripts/mpicount/mpicount.c``, built with the MPICH wheel's ``mpicc`` and loaded with
``LD_PRELOAD``, the way MPI profiling tools count) sees every MPI call of every rank; the program below makes each
collective a few times (the first call agrees on its signature: the steady state is what is measured), then
``CALLS`` times between two snapshots. Per call: the bytes each rank receives at the MPI interface (the largest
over the ranks) and the MPI calls it made.

    .venv-test-mpich/bin/python scripts/bench/collective_traffic.py --ranks 2 4 8 16 [--json out.json]

prints the table in docs/benchmarks.md ("Traffic per call"); tests/test_traffic.py runs the same at 2, 4 and 8.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from collections import defaultdict
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
SOURCE = ROOT / "scripts" / "mpicount" / "mpicount.c"
CALLS = 20
COLLECTIVES = ["allreduce_array", "reduce_array", "bcast_array", "scatter_array", "allgather_array", "gather_array",
               "allreduce_arrays", "alltoall_array", "bcast_array_1KiB", "bcast_array_8KiB", "scatter_array_8KiB",
               "alltoall_array_8KiB",
               "scatter_array_timeout", "alltoall_array_timeout", "gather_array_mixed", "allgather_array_mixed",
               "allreduce_array_after_large", "allgather_array_after_large", "allgather_array_large",
               "gather_array_large"]
PROGRAM = r"""
import ctypes, sys
import numpy as np
import cai_mpi
from mpi4py import MPI

world = MPI.COMM_WORLD
rank, size = world.Get_rank(), world.Get_size()
snapshot = ctypes.CDLL(None).mpicount_snapshot
x = np.ones(1)  # 8 bytes
many = [np.full(1, float(i)) for i in range(16)]
big = np.ones(1024)  # 8 KiB: over a description slot
kib = np.ones(128)  # 1 KiB: the most a bcast's vote carries
mixed = np.ones(8) if rank % 2 == 0 else np.ones(8, np.int64)  # 64 B on every rank, described differently
two = np.ones(2)  # 16 B: unlike every call before it
wide, tall = np.ones(1 << 14), np.ones((2, 1 << 13))  # 128 KiB, two shapes: past SPECULATE_BYTES (the vote first)
odd = np.ones((1 << 14) + 1)  # 128 KiB and 8 B: past SPECULATE_BYTES, and no multiple of 64 bytes
# Calls made before a name's own: after them, that name's calls must find their steady state again
before = {
    "allreduce_array_after_large": lambda: (cai_mpi.allreduce_array(wide), cai_mpi.allreduce_array(tall)),
    "allgather_array_after_large": lambda: (cai_mpi.allgather_array(wide), cai_mpi.allgather_array(tall)),
}
calls = {
    "allreduce_array": lambda: cai_mpi.allreduce_array(x),
    "reduce_array": lambda: cai_mpi.reduce_array(x, root=0),
    "bcast_array": lambda: cai_mpi.bcast_array(x if rank == 0 else None, root=0),
    "scatter_array": lambda: cai_mpi.scatter_array([x] * size if rank == 0 else None, root=0),
    "allgather_array": lambda: cai_mpi.allgather_array(x),
    "gather_array": lambda: cai_mpi.gather_array(x, root=0),
    "allreduce_arrays": lambda: cai_mpi.allreduce_arrays(many),
    "alltoall_array": lambda: cai_mpi.alltoall_array([x] * size),
    "bcast_array_1KiB": lambda: cai_mpi.bcast_array(kib if rank == 0 else None, root=0),
    "bcast_array_8KiB": lambda: cai_mpi.bcast_array(big if rank == 0 else None, root=0),
    "scatter_array_8KiB": lambda: cai_mpi.scatter_array([big] * size if rank == 0 else None, root=0),
    "alltoall_array_8KiB": lambda: cai_mpi.alltoall_array([big] * size),
    "scatter_array_timeout": lambda: cai_mpi.scatter_array([x] * size if rank == 0 else None, root=0, timeout=60.0),
    "alltoall_array_timeout": lambda: cai_mpi.alltoall_array([x] * size, timeout=60.0),
    "gather_array_mixed": lambda: cai_mpi.gather_array(mixed, root=0),
    "allgather_array_mixed": lambda: cai_mpi.allgather_array(mixed),
    "allreduce_array_after_large": lambda: cai_mpi.allreduce_array(two),
    "allgather_array_after_large": lambda: cai_mpi.allgather_array(two),
    "allgather_array_large": lambda: cai_mpi.allgather_array(odd),
    "gather_array_large": lambda: cai_mpi.gather_array(odd, root=0),
}
for name in sys.argv[2].split(","):
    call = calls[name]
    before.get(name, lambda: None)()
    for _ in range(3):
        call()
    snapshot(f"{name}:before".encode())
    for _ in range(int(sys.argv[1])):
        call()
    snapshot(f"{name}:after".encode())
"""


def build(mpicc: Path, out: Path) -> Path:
    """The counter, built with ``mpicc`` (MPICH's: Open MPI 5's mpi.h has no large-count PMPI calls)."""
    subprocess.run([str(mpicc), "-shared", "-fPIC", "-O2", "-o", str(out), str(SOURCE)], check=True)
    return out


def measure(nprocs: int, library: Path, prefix: Path, collectives: list[str] = COLLECTIVES, calls: int = CALLS,
            timeout: float = 300) -> dict[str, dict[str, Any]]:
    """Per collective: ``bytes`` (the most any rank receives per call) and ``calls`` (MPI calls per call, by
    name, on the rank that makes the most)."""
    with tempfile.TemporaryDirectory() as tmp:
        env = {**os.environ, "MPICOUNT_DIR": tmp, "LD_PRELOAD": str(library), "PYTHONPATH": str(ROOT),
               "OMPI_ALLOW_RUN_AS_ROOT": "1", "OMPI_ALLOW_RUN_AS_ROOT_CONFIRM": "1"}
        cmd = [str(prefix / "bin" / "mpiexec"), "-n", str(nprocs), str(prefix / "bin" / "python"), "-c", PROGRAM,
               str(calls), ",".join(collectives)]
        subprocess.run(cmd, check=True, env=env, timeout=timeout, cwd=ROOT, capture_output=True)
        ranks = [read_counts(Path(tmp) / f"rank{r}.txt") for r in range(nprocs)]
    out: dict[str, dict[str, Any]] = {}
    for name in collectives:
        most_bytes, most_calls = 0.0, {}
        for snaps in ranks:
            before, after = snaps[f"{name}:before"], snaps[f"{name}:after"]
            diff = {fn: (after[fn][0] - before.get(fn, (0, 0))[0], after[fn][1] - before.get(fn, (0, 0))[1])
                    for fn in after}
            made = {fn: c / calls for fn, (c, _b) in diff.items() if c}
            received = sum(b for _c, b in diff.values()) / calls
            most_bytes = max(most_bytes, received)
            if sum(made.values()) > sum(most_calls.values()):
                most_calls = made
        out[name] = {"bytes": most_bytes, "calls": most_calls}
    return out


def read_counts(path: Path) -> dict[str, dict[str, tuple[int, int]]]:
    snaps: dict[str, dict[str, tuple[int, int]]] = defaultdict(dict)
    for line in path.read_text().splitlines():
        label, fn, calls, nbytes = line.split()
        snaps[label][fn] = (int(calls), int(nbytes))
    return snaps


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--ranks", type=int, nargs="+", default=[2, 4, 8, 16])
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()
    prefix = Path(sys.prefix)
    with tempfile.TemporaryDirectory() as tmp:
        library = build(prefix / "bin" / "mpicc", Path(tmp) / "libmpicount.so")
        results = {p: measure(p, library, prefix) for p in args.ranks}
    sizes = " | ".join(f"B/rank, P={p}" for p in args.ranks)
    print(f"| collective | MPI calls per call (steady state) | {sizes} |")
    print("|---|---|" + "---|" * len(args.ranks))
    for name in COLLECTIVES:
        made = results[args.ranks[-1]][name]["calls"]
        how = ", ".join(f"{fn} x{n:g}" for fn, n in sorted(made.items()))
        cells = " | ".join(f"{results[p][name]['bytes']:.0f}" for p in args.ranks)
        print(f"| `{name}` | {how} | {cells} |")
    if args.json:
        args.json.write_text(json.dumps({str(p): r for p, r in results.items()}, indent=1))


if __name__ == "__main__":
    main()
