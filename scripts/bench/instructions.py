"""Machine instructions per call, counted by valgrind's callgrind: an A/B measure that a loaded or noisy machine
does not move, where CPU time swings by tens of percent between identical runs.

    python scripts/bench/instructions.py [--trees A,B,...] [--calls N1,N2] [--json FILE] CASE [CASE ...]

CASE is one of the steady-state calls of ``scripts/bench/python_calls.py``, on one rank: ``pair`` (the 8 B
nonblocking pair, ``irecv_array(out=)`` + ``isend_array`` + ``waitall``, sent to itself), ``blocking``
(``send_array`` + ``recv_array``; with Open MPI's wheel only, where a blocking send to oneself completes),
``bcast``, ``allreduce``, ``allgather`` (8 B) and ``arrays`` (``allreduce_arrays`` of the bench's 16 arrays). Each
tree (a checkout, put first on ``PYTHONPATH``; default: the one this script is in) runs the call N1 and N2 times
after a warm-up, each under callgrind, and the difference over N2 - N1 is the count per call, so start-up and
warm-up cancel out. ``PYTHONHASHSEED=0`` fixes the hash order; what is left of the noise is MPI's own polling and
the interpreter's memory layout, about 2% between identical trees here for the single calls and 8% for ``arrays``
(docs/benchmarks-history.md): read smaller differences as none. Name a tree twice to see it. Needs valgrind; about a
minute per tree and case.
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import re
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

HERE = Path(__file__).resolve()
CASES = ("pair", "blocking", "bcast", "allreduce", "allgather", "arrays")


def child(case: str, calls: int) -> None:
    """Run ``case`` ``calls`` times after a warm-up (under callgrind, started by ``count``)."""
    import numpy as np
    from mpi4py import MPI

    import cai_mpi
    from cai_mpi._src.cli.bench.persistent import _arrays as bench_arrays

    me = MPI.COMM_WORLD.Get_rank()
    x, out = np.arange(1, dtype=np.float64), np.empty(1)
    xs = bench_arrays(8, me)

    def pair() -> None:
        cai_mpi.waitall([cai_mpi.irecv_array(me, 0, out=out), cai_mpi.isend_array(x, me, 0)])

    def blocking() -> None:
        cai_mpi.send_array(x, me, 0)
        cai_mpi.recv_array(me, 0)

    # (chosen once: the counted loop runs the call and nothing else)
    run: Callable[[], object] = {
        "pair": pair, "blocking": blocking, "bcast": lambda: cai_mpi.bcast_array(x, 0),
        "allreduce": lambda: cai_mpi.allreduce_array(x), "allgather": lambda: cai_mpi.allgather_array(x),
        "arrays": lambda: cai_mpi.allreduce_arrays(xs),
    }[case]
    for _ in range(200):
        run()
    # The start-up's objects to the permanent generation: a full collection walks all of them, tens of millions of
    # instructions that would fall into one run's count and not the other's
    gc.freeze()
    for _ in range(calls):
        run()


def count(tree: Path, case: str, calls: int) -> int:
    """The instructions callgrind counts for a whole run of ``case`` ``calls`` times with ``tree`` first on the
    path."""
    path = os.pathsep.join(p for p in (str(tree), os.environ.get("PYTHONPATH", "")) if p)  # (no empty entry: cwd)
    env = {**os.environ, "PYTHONPATH": path, "PYTHONHASHSEED": "0"}
    run = subprocess.run(["valgrind", "--tool=callgrind", "--callgrind-out-file=/dev/null", sys.executable, str(HERE),
                          "--child", case, str(calls)], env=env, capture_output=True, text=True, check=True)
    found = re.search(r"Collected\s*:\s*(\d+)", run.stderr)
    if found is None:
        raise SystemExit(f"instructions.py: no count from callgrind for {case} in {tree}:\n{run.stderr[-2000:]}")
    return int(found.group(1))


def main() -> None:
    if len(sys.argv) == 4 and sys.argv[1] == "--child":
        child(sys.argv[2], int(sys.argv[3]))
        return
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("cases", nargs="+", choices=CASES, metavar="CASE")
    parser.add_argument("--trees", default=str(HERE.parents[2]), help="checkouts to compare, comma-separated")
    parser.add_argument("--calls", default="1000,5000", help="the two run lengths N1,N2")
    parser.add_argument("--json", help="write the counts here")
    args = parser.parse_args()
    n1, n2 = (int(n) for n in args.calls.split(","))
    if "blocking" in args.cases:
        from mpi4py import MPI

        if MPI.get_vendor()[0] != "Open MPI":
            raise SystemExit(f"instructions.py: blocking needs Open MPI's wheel (with {MPI.get_vendor()[0]} a blocking "
                             "send to this same rank waits for ever); run it with .venv-test-openmpi's python")
    trees = [Path(t).resolve() for t in args.trees.split(",")]
    table: dict[str, list[float]] = {}  # (a tree may be named twice: A against A first)
    print(f"| case | {' | '.join(str(t) for t in trees)} |")
    print(f"| --- |{' ---: |' * len(trees)}")
    for case in args.cases:
        row = table[case] = [round((count(t, case, n2) - count(t, case, n1)) / (n2 - n1), 1) for t in trees]
        print(f"| {case} | {' | '.join(f'{v:,.0f}' for v in row)} |", flush=True)
    if args.json:
        Path(args.json).write_text(json.dumps({"calls": [n1, n2], "trees": [str(t) for t in trees],
                                               "instructions_per_call": table}, indent=1) + "\n")


if __name__ == "__main__":
    main()
