"""What a Pipeline asks MPI to receive per item: a run of items with one description travels as bare payloads,
so after its first item a stage receives only the payload's bytes (a persistent receive into its ring, or a receive
of exactly the payload); an item described anew is a self-describing message, received into a header buffer.
Counted by the PMPI counter of tests/test_traffic.py, under mpiexec at 3 ranks (a first, a forwarding and a last
stage), in the steady state of each run."""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

import pytest

from cai_mpi._src.core.header import HEADER_BUFFER_BYTES

ROOT = Path(__file__).resolve().parent.parent
ITEMS = 40  # counted per run, after 3 items that start it
RANKS = 3
#: The runs of the program below: for each edge (stage 0 -> 1, and stage 1 forwarding what it received -> 2) the
#: payload bytes of an item that goes bare, 0 where it may not (a strided item arrives contiguous, so its forward
#: goes bare; an F-ordered one arrives F-ordered).
RUNS = {"same": (8, 8), "changing_meta": (0, 0), "changing_shape": (0, 0), "changing_dtype": (0, 0),
        "big_endian": (12, 12), "bool": (2, 2), "complex": (32, 32), "zero_d": (8, 8), "fortran": (0, 0),
        "strided": (0, 48), "datetime": (0, 0), "large": (8 << 18, 8 << 18), "to_a_gpu": (0, 0)}
EDGES = [(run, edge) for run in RUNS for edge in (0, 1)]
PROGRAM = r"""
import contextlib, ctypes, sys
import numpy as np
import cai_mpi
from cai_mpi.testing import SimulatedRuntime, use_runtime
from mpi4py import MPI

snapshot = ctypes.CDLL(None).mpicount_snapshot
items = int(sys.argv[1])
same = lambda i: None
runs = {  # name: (the i-th item, its meta, the runtime every rank uses)
    "same": (lambda i: np.full(1, float(i)), lambda i: {"run": 1}, None),
    "changing_meta": (lambda i: np.full(1, float(i)), lambda i: {"i": i}, None),
    "changing_shape": (lambda i: np.full(1 + i % 2, float(i)), same, None),
    "changing_dtype": (lambda i: np.full(2, i, "f8" if i % 2 else "i8"), same, None),
    "big_endian": (lambda i: np.full(3, i, ">i4"), same, None),
    "bool": (lambda i: np.array([i % 2 == 0, True]), same, None),
    "complex": (lambda i: np.full(2, i * (1 + 1j)), same, None),
    "zero_d": (lambda i: np.array(float(i)), same, None),
    "fortran": (lambda i: np.asfortranarray(np.arange(6.0).reshape(2, 3) + i), same, None),
    "strided": (lambda i: (np.arange(12.0) + i)[::2], same, None),
    "datetime": (lambda i: np.array([i, i + 1], "datetime64[s]"), same, None),
    "large": (lambda i: np.full(1 << 18, float(i)), same, None),
    "to_a_gpu": (lambda i: np.full(5, float(i)), same, SimulatedRuntime),
}
for name in sys.argv[2].split(","):
    item, meta_of, runtime = runs[name]
    with (use_runtime(runtime()) if runtime else contextlib.nullcontext()), cai_mpi.Pipeline(depth=2) as pipe:
        if pipe.first:
            for i in range(3 + items):
                pipe.send(item(i), meta=meta_of(i))
        else:
            for i, a in enumerate(pipe):
                got, want = a.numpy(), item(i)
                assert got.dtype == want.dtype and np.array_equal(got, want), (name, i, got, want)
                assert a.meta == meta_of(i), (name, i, a.meta)
                if not pipe.last:
                    pipe.send(a)
                del a, got
                if i == 2:
                    snapshot(f"{name}:before".encode())
                elif i == 2 + items:
                    snapshot(f"{name}:after".encode())
"""


@pytest.fixture(scope="module")
def received_per_item(mpicount: tuple[Any, Path]) -> dict[str, list[float]]:
    """Per run: the bytes each receiving stage (ranks 1 and 2) posted receives for, per item."""
    traffic, library = mpicount
    prefix = Path(sys.prefix)
    with tempfile.TemporaryDirectory() as tmp:
        env = {**os.environ, "MPICOUNT_DIR": tmp, "LD_PRELOAD": str(library), "PYTHONPATH": str(ROOT),
               "OMPI_ALLOW_RUN_AS_ROOT": "1", "OMPI_ALLOW_RUN_AS_ROOT_CONFIRM": "1"}
        cmd = [str(prefix / "bin" / "mpiexec"), "-n", str(RANKS), str(prefix / "bin" / "python"), "-c", PROGRAM,
               str(ITEMS), ",".join(RUNS)]
        done = subprocess.run(cmd, env=env, timeout=300, cwd=ROOT, capture_output=True, text=True)
        assert done.returncode == 0, done.stderr[-4000:]
        ranks = [traffic.read_counts(Path(tmp) / f"rank{r}.txt") for r in range(1, RANKS)]
    out: dict[str, list[float]] = {}
    for name in RUNS:
        out[name] = []
        for snaps in ranks:
            before, after = snaps[f"{name}:before"], snaps[f"{name}:after"]
            nbytes = sum(after[fn][1] - before.get(fn, (0, 0))[1] for fn in after)
            out[name].append(nbytes / ITEMS)
    return out


@pytest.mark.parametrize(("run", "edge"), [(run, edge) for run, edge in EDGES if RUNS[run][edge]])
def test_a_run_of_one_description_receives_only_payloads(received_per_item: dict[str, list[float]], run: str,
                                                         edge: int) -> None:
    """Host memory of numbers in C order, each item described as the one before it, to a stage without a GPU."""
    payload = RUNS[run][edge]
    assert received_per_item[run][edge] <= payload, (payload, received_per_item[run])
    # (a persistent receive's start counts no bytes; a receive of its own, the payload's)


@pytest.mark.parametrize(("run", "edge"), [(run, edge) for run, edge in EDGES if not RUNS[run][edge]])
def test_an_item_that_may_not_go_bare_is_received_as_a_self_describing_message(
        received_per_item: dict[str, list[float]], run: str, edge: int) -> None:
    assert received_per_item[run][edge] >= HEADER_BUFFER_BYTES * 0.9, (HEADER_BUFFER_BYTES, received_per_item[run])
