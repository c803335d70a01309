"""The collectives' agreement at 8 and 16 ranks, oversubscribed (issue 38): tests/mpi/test_agreement_mpi.py (every
one-shot collective: mismatched roots and ops, signatures that change from call to call, failures, a bad out=)
and the collectives' own file, under one mpiexec each. The MPI library cannot change what is checked here, only
how it is carried out, so it runs with the Open MPI wheel only (marked one_wheel, as CI's time allows)."""

from __future__ import annotations

from pathlib import Path

import pytest
from launch import ROOT
from test_under_mpiexec import describe, run_pytest, tail

FILES = ["tests/mpi/test_agreement_mpi.py", "tests/mpi/test_collectives_mpi.py"]


@pytest.mark.one_wheel
@pytest.mark.timeout(900)
@pytest.mark.parametrize("nprocs", [8, 16])
def test_collectives_agree_at_scale(nprocs: int, tmp_path: Path, mpiexec_runs: list[str]) -> None:
    run, summaries = run_pytest(nprocs, [str(ROOT / f) for f in FILES], tmp_path, "-m", "not slow", timeout=800,
                                test_timeout=300)
    mpiexec_runs.append(f"mpiexec -n {nprocs}: {', '.join(FILES)}: {describe(summaries)} "
                        f"(exit {run.returncode}, {run.seconds:.0f} s)")
    assert run.returncode == 0, f"mpiexec -n {nprocs} failed (exit {run.returncode}):\n{tail(run)}"
    for rank, summary in enumerate(summaries):
        assert summary and summary["passed"] and not summary["failed"], (rank, summary, tail(run))
