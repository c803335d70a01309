"""A collective that some rank never joins ends in cai_mpi.TimeoutError instead of a hang. MPI cannot withdraw a
collective, so the communicator is out of step afterwards: the program here does what the error advises (abort),
under mpiexec, and the job ends at once with the message.

The programs report through ``say``, which also appends to a file of each rank's own: MPI_Abort may end the job
before mpiexec has forwarded what a rank printed (on a loaded machine stdout came back empty), and the file does
not depend on that."""

from __future__ import annotations

from pathlib import Path

import pytest
from launch import Finished, run_ranks

# Prepended to every program: say(...) prints and appends the line to $REPORT.<rank>, flushed to disk.
SAY = r"""
import os as _os
from mpi4py import MPI as _MPI
def say(*words):
    line = " ".join(str(w) for w in words)
    print(line, flush=True)
    with open(f"{_os.environ['REPORT']}.{_MPI.COMM_WORLD.Get_rank()}", "a") as f:
        f.write(line + "\n")
        f.flush()
        _os.fsync(f.fileno())
"""


def run_reporting(program: str, tmp_path: Path, env: dict[str, str] | None = None) -> tuple[Finished, str]:
    """Run ``program`` on 2 ranks; what its ranks said, rank 0's lines first."""
    report = tmp_path / "report"
    done = run_ranks(2, ["-c", SAY + program], timeout=100, env={**(env or {}), "REPORT": str(report)})
    said = "".join(p.read_text() for p in sorted(tmp_path.glob("report.*")))
    return done, said


PROGRAM = r"""
import sys, time
import numpy as np
import cai_mpi
from mpi4py import MPI

world = MPI.COMM_WORLD
calls = {
    "bcast_array": lambda c: cai_mpi.bcast_array(None, root=1, comm=c, timeout=0.5),
    "gather_array": lambda c: cai_mpi.gather_array(np.arange(3), root=0, comm=c, timeout=0.5),
    "allgather_array": lambda c: cai_mpi.allgather_array(np.arange(3), comm=c, timeout=0.5),
    "scatter_array": lambda c: cai_mpi.scatter_array(None, root=1, comm=c, timeout=0.5),
    "alltoall_array": lambda c: cai_mpi.alltoall_array([np.arange(2)] * c.Get_size(), comm=c, timeout=0.5),
    "reduce_array": lambda c: cai_mpi.reduce_array(np.arange(3), root=0, comm=c, timeout=0.5),
    "allreduce_array": lambda c: cai_mpi.allreduce_array(np.arange(3), comm=c, timeout=0.5),
    "allreduce_arrays": lambda c: cai_mpi.allreduce_arrays([np.arange(3), np.ones(2, np.float32)], comm=c,
                                                           timeout=0.5),
    # the persistent forms' creation agrees on what every rank creates: bounded by its timeout= too
    "allreduce_init": lambda c: cai_mpi.allreduce_init(np.arange(3.0), comm=c, timeout=0.5),
    "bcast_init": lambda c: cai_mpi.bcast_init(np.arange(3.0), root=1, comm=c, timeout=0.5),
    "allgather_init": lambda c: cai_mpi.allgather_init(np.arange(3.0), comm=c, timeout=0.5),
    "reduce_init": lambda c: cai_mpi.reduce_init(np.arange(3.0), root=0, comm=c, timeout=0.5),
    "bucketed allreduce_init": lambda c: cai_mpi.allreduce_init({"w": np.ones(2)}, comm=c, timeout=0.5),
}
comms = {name: world.Dup() for name in calls}  # one per collective: a timed-out one leaves its own out of step
for c in comms.values():
    cai_mpi.cuda_aware(c)  # (cai_mpi's first use of a communicator is collective: done while everyone is here)
if world.Get_rank() == 1:
    time.sleep(120)  # never joins
else:
    for name, call in calls.items():
        start = time.monotonic()
        try:
            call(comms[name])
            say(f"{name}: returned")
        except cai_mpi.TimeoutError as exc:
            say(f"{name}: TimeoutError after {time.monotonic() - start:.1f} s: {exc}")
        except Exception as exc:  # (said, so that the test fails by its assertion, naming it)
            say(f"{name}: {type(exc).__name__}: {exc}")
    world.Abort(3)
"""


def test_collectives_that_a_rank_never_joins_time_out(tmp_path: Path) -> None:
    done, out = run_reporting(PROGRAM, tmp_path)
    assert done.returncode != 0 and done.seconds < 60, done.output
    lines = [line for line in out.splitlines() if ": " in line]
    for name in ("bcast_array", "gather_array", "allgather_array", "scatter_array", "alltoall_array", "reduce_array",
                 "allreduce_array", "allreduce_arrays", "allreduce_init", "bcast_init", "allgather_init", "reduce_init",
                 "bucketed allreduce_init"):
        said = next((line for line in lines if line.startswith(name + ":")), None)
        assert said is not None and "TimeoutError after " in said, said or done.output
        waited = float(said.split("TimeoutError after ")[1].split(" s")[0])
        assert 0.45 <= waited < 10, said
        fn = name.split()[-1]  # (the bucketed form's errors name allreduce_init)
        assert f"{fn}: not every rank of" in said and "joined within 0.5 s" in said and "abort" in said, said


@pytest.mark.parametrize("seconds", ["0.5"])
def test_the_environment_timeout_reaches_the_collectives(seconds: str, tmp_path: Path) -> None:
    program = ("import time, numpy as np, cai_mpi\nfrom mpi4py import MPI\nw = MPI.COMM_WORLD\n"
               "if w.Get_rank() == 1: time.sleep(120)\n"
               "try: cai_mpi.allreduce_array(np.ones(2))\n"
               "except cai_mpi.TimeoutError as e: say('timed out:', e); w.Abort(3)\n")
    done, out = run_reporting(program, tmp_path, {"CAI_MPI_TIMEOUT": seconds})
    assert done.returncode != 0 and done.seconds < 60, done.output
    assert f"timed out: allreduce_array: not every rank of MPI_COMM_WORLD joined within {seconds} s" in out, done.output


OUT_OF_STEP = r"""
import time
import numpy as np
import cai_mpi
from mpi4py import MPI

world = MPI.COMM_WORLD
comm = world.Dup()
cai_mpi.cuda_aware(comm)  # (cai_mpi's first use of a communicator is collective: done while everyone is here)
if world.Get_rank() == 0:
    try:
        cai_mpi.allreduce_array(np.ones(2), comm=comm, timeout=0.5)
    except cai_mpi.TimeoutError:
        say("timed out")
    for call in (lambda: cai_mpi.allreduce_array(np.ones(2), comm=comm),
                 lambda: cai_mpi.bcast_array(np.ones(2), comm=comm, timeout=5)):
        try:
            call()
            say("a collective went through")
        except cai_mpi.CollectiveMismatchError as exc:
            say("refused:", exc)
    cai_mpi.send_array(np.arange(3), 1, tag=4, comm=comm)
    say("sent")
else:
    time.sleep(2)  # late: rank 0's allreduce timed out
    got = cai_mpi.recv_array(0, tag=4, comm=comm, timeout=30)
    say("received", np.asarray(got).tolist())
world.Barrier()
world.Abort(3)  # (rank 0's timed-out collective is still posted: the job ends as the error advises)
"""


def test_a_collective_that_timed_out_leaves_its_communicator_refusing_collectives(tmp_path: Path) -> None:
    """After a timeout, every collective on that communicator raises at once, naming the call that timed out
    (a later call could otherwise match the stale one on another rank); point-to-point on it still works."""
    done, out = run_reporting(OUT_OF_STEP, tmp_path)
    assert "timed out" in out and "a collective went through" not in out, done.output
    refusals = [line for line in out.splitlines() if line.startswith("refused:")]
    assert len(refusals) == 2, done.output
    for line in refusals:
        assert "out of step since allreduce_array timed out after 0.5 s" in line, line
        assert "point-to-point on this one still works" in line, line
    assert "sent" in out and "received [0, 1, 2]" in out, done.output
