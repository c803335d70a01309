"""Runs the tests in tests/mpi under a real mpiexec at 2, 3 and 4 ranks with this venv's MPI wheel.

Time limits nest, innermost first, so whichever fires shows its output: one test inside mpiexec
(``INNER_TEST_TIMEOUT``, thread method: it interrupts a rank blocked in MPI, prints every thread's
stack and exits that rank), one mpiexec run (``MPIEXEC_TIMEOUT``, then the output so far is shown),
and this test itself (pytest-timeout, above both). A failed assertion on one rank aborts
MPI_COMM_WORLD at once (tests/mpi/conftest.py), so a failure ends the run within seconds.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import pytest
from launch import ROOT, Finished, run_ranks

INNER_TEST_TIMEOUT = 120
MPIEXEC_TIMEOUT = int(os.environ.get("CAI_MPI_TEST_MPIEXEC_TIMEOUT", "600"))


def run_pytest(nprocs: int, paths: list[str], report_dir: Path, *extra: str, timeout: float = MPIEXEC_TIMEOUT,
               test_timeout: int = INNER_TEST_TIMEOUT) -> tuple[Finished, list[dict[str, Any]]]:
    """pytest under mpiexec; returns the run and each rank's summary (tests/mpi/conftest.py)."""
    args = ["-m", "pytest", "--with-mpi", "-q", "-p", "no:cacheprovider", "-rs",
            f"--timeout={test_timeout}", "--timeout-method=thread", *extra, *paths]
    run = run_ranks(nprocs, args, timeout=timeout, env={"CAI_MPI_TEST_REPORT_DIR": str(report_dir)})
    summaries = []
    for rank in range(nprocs):
        path = report_dir / f"rank{rank}.json"
        summaries.append(json.loads(path.read_text()) if path.exists() else {})
    return run, summaries


def describe(summaries: list[dict[str, Any]]) -> str:
    """What ran on every rank: '401 passed, 2 skipped on each of 3 ranks' (or each rank's counts where they differ)."""
    counts = [", ".join([f"{s['passed']} passed", *(f"{len(s[k])} {k}" for k in ("failed", "skipped") if s[k])])
              if s else "no summary" for s in summaries]
    if len(set(counts)) == 1:
        return f"{counts[0]} on each of {len(counts)} ranks"
    return "; ".join(f"rank {rank}: {text}" for rank, text in enumerate(counts))


def tail(run: Finished, lines: int = 80) -> str:
    return "\n".join(run.output.splitlines()[-lines:])


@pytest.mark.timeout(MPIEXEC_TIMEOUT + 60)
@pytest.mark.parametrize("nprocs", [2, 3, 4])
def test_mpi_suite(nprocs: int, tmp_path: Path, inner_skips: list[str], mpiexec_runs: list[str]) -> None:
    extra = [] if nprocs == 2 else ["-m", "not slow"]  # the >2 GiB transfer runs once per MPI library, at 2 ranks
    run, summaries = run_pytest(nprocs, [str(ROOT / "tests" / "mpi")], tmp_path, *extra)
    print(tail(run))
    mpiexec_runs.append(f"mpiexec -n {nprocs}{' -m ' + repr(extra[1]) if extra else ''}: tests/mpi: "
                        f"{describe(summaries)} (exit {run.returncode}, {run.seconds:.0f} s)")
    assert run.returncode == 0, f"mpiexec -n {nprocs} failed (exit {run.returncode}):\n{tail(run)}"
    for rank, summary in enumerate(summaries):
        assert summary, f"rank {rank} wrote no summary: did it run pytest at all?\n{tail(run)}"
        assert summary["passed"] > 0 and not summary["failed"], f"rank {rank}: {summary}\n{tail(run)}"
    skipped = {(nodeid, reason) for summary in summaries for nodeid, reason in summary["skipped"]}
    inner_skips.extend(f"mpiexec -n {nprocs}: {nodeid}: {reason}" for nodeid, reason in sorted(skipped))


# -- the plumbing itself, on deliberately broken tests ---------------------------------------------------------

SELFCHECK = ROOT / "tests" / "mpi" / "selfcheck"


def test_a_failing_rank_ends_the_run_within_seconds_with_its_assertion(tmp_path: Path) -> None:
    run, summaries = run_pytest(2, [str(SELFCHECK / "broken_assert.py")], tmp_path, timeout=120)
    assert run.returncode != 0
    assert "deliberate failure on rank 1" in run.output and "rank 1: FAILED" in run.output, tail(run)
    assert summaries[1]["failed"] == ["tests/mpi/selfcheck/broken_assert.py::test_rank_one_fails_while_the_others_wait"]
    assert run.seconds < 60, f"the run took {run.seconds:.0f} s: rank 0 was not released by the abort"


def test_a_rank_blocked_in_mpi_is_interrupted_with_its_stack(tmp_path: Path) -> None:
    run, _ = run_pytest(2, [str(SELFCHECK / "broken_hang.py")], tmp_path, timeout=120, test_timeout=5)
    assert run.returncode != 0
    assert "Timeout" in run.output and "test_every_rank_blocks_in_a_receive_nobody_sends" in run.output, tail(run)
    assert run.seconds < 60, f"the run took {run.seconds:.0f} s: the per-test limit did not interrupt MPI"


def test_inner_skips_and_their_reasons_are_reported(tmp_path: Path) -> None:
    run, summaries = run_pytest(2, [str(SELFCHECK / "skipping.py")], tmp_path, timeout=120)
    assert run.returncode == 0, tail(run)
    for summary in summaries:
        assert summary["passed"] == 1
        assert summary["skipped"] == [
            ["tests/mpi/selfcheck/skipping.py::test_skips", "selfcheck: a reason the outer run reports"]
        ]
