"""Under mpiexec: a failure on any rank ends the whole run at once, and every rank reports what it ran.

A failed assertion on one rank used to leave the other ranks waiting in a collective until the outer
time limit, with no output. Now the failing rank prints its report to stderr and aborts
MPI_COMM_WORLD, so mpiexec ends within seconds and the assertion text is in the output.

Every rank also writes a summary (passed, failed, skipped with reasons) to
``$CAI_MPI_TEST_REPORT_DIR/rank<N>.json`` when that variable is set, which ``tests/test_under_mpiexec.py``
reads: the outer run then knows exactly what ran on each rank and shows the inner skips.
"""

from __future__ import annotations

import json
import os
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from mpi4py import MPI

_summary: dict[str, Any] = {"passed": 0, "failed": [], "skipped": []}


def _under_mpiexec() -> bool:
    return MPI.COMM_WORLD.Get_size() > 1


def _write_summary() -> None:
    where = os.environ.get("CAI_MPI_TEST_REPORT_DIR")
    if where:
        path = Path(where) / f"rank{MPI.COMM_WORLD.Get_rank()}.json"
        # Whole or not at all: a rank may be killed mid-write (another rank's abort), and a half-written
        # summary would fail the outer run's reading of it.
        partial = path.with_suffix(".partial")
        partial.write_text(json.dumps(_summary))
        os.replace(partial, path)


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]) -> Iterator[None]:
    outcome = yield
    report: pytest.TestReport = outcome.get_result()  # type: ignore[attr-defined]
    if report.failed and _under_mpiexec():
        rank = MPI.COMM_WORLD.Get_rank()
        _summary["failed"].append(item.nodeid)
        _write_summary()
        sys.stdout.flush()
        sys.stderr.write(
            f"\n==== rank {rank}: FAILED {item.nodeid} (in {report.when}); aborting MPI_COMM_WORLD ====\n"
            f"{report.longreprtext}\n"
        )
        sys.stderr.flush()
        MPI.COMM_WORLD.Abort(1)  # the other ranks may be waiting for this one: end them all now


def pytest_runtest_logreport(report: pytest.TestReport) -> None:
    if report.passed and report.when == "call":
        _summary["passed"] += 1
    elif report.skipped:
        longrepr = report.longrepr
        reason = longrepr[2] if isinstance(longrepr, tuple) else str(longrepr)
        _summary["skipped"].append([report.nodeid, reason.removeprefix("Skipped: ")])


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    _write_summary()
