"""Runs the tests in tests/mpi under a real mpiexec at 2, 3 and 4 ranks with this venv's MPI wheel.

Time limits nest, innermost first, so whichever fires shows its output: one test inside mpiexec
(``HANG_SECONDS``, tests/mpi/conftest.py's watchdog: the test fails as hung, the first rank there prints the
FAILED line and its stack, and the job is aborted; pytest-timeout a minute later as a backstop), one mpiexec run
(``MPIEXEC_TIMEOUT``, then the output so far is shown), and this test itself (pytest-timeout, above both). A failed
assertion on one rank aborts MPI_COMM_WORLD at once (tests/mpi/conftest.py), so a failure ends the run within
seconds; ``run_pytest`` then starts it again after the test that ended it, so every other test of the world size
still runs and reports.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import pytest
from launch import ROOT, Finished, run_ranks

HANG_SECONDS = 50  # a test running longer under mpiexec has hung (a `timeout` marker gives a test longer)
MPIEXEC_TIMEOUT = int(os.environ.get("CAI_MPI_TEST_MPIEXEC_TIMEOUT", "600"))
RESTARTS = 5  # runs started again after an abort, at most (past that, something is broken beyond one test)


def run_pytest(nprocs: int, paths: list[str], report_dir: Path, *extra: str, timeout: float = MPIEXEC_TIMEOUT,
               test_timeout: float = HANG_SECONDS) -> tuple[Finished, list[dict[str, Any]]]:
    """pytest under mpiexec; returns the run and each rank's summary (tests/mpi/conftest.py).

    A run that a failure or a hang aborted is started again without the tests it finished, and the test that
    ended it, up to ``RESTARTS`` times: the returned run joins their outputs (each hung test's FAILED line and
    first stack where that rank printed them, the other ranks' stacks after), the summaries their counts."""
    args = ["-m", "pytest", "--with-mpi", "-q", "-p", "no:cacheprovider", "-rs",
            f"--timeout={test_timeout + 60:g}", "--timeout-method=thread", *extra, *paths]
    done: list[str] = []
    outputs: list[str] = []
    seconds, returncode = 0.0, 0
    merged: list[dict[str, Any]] = [{} for _ in range(nprocs)]
    for attempt in range(RESTARTS + 1):
        where = report_dir / f"run{attempt}"
        where.mkdir(parents=True)
        env = {"CAI_MPI_TEST_REPORT_DIR": str(where), "CAI_MPI_TEST_HANG_SECONDS": f"{test_timeout:g}"}
        if done:
            (where / "done.txt").write_text("\n".join(done) + "\n")
            env["CAI_MPI_TEST_DONE_FILE"] = str(where / "done.txt")
        run = run_ranks(nprocs, args, timeout=timeout, env=env)
        seconds += run.seconds
        returncode = returncode or run.returncode
        outputs.append(run.output + _other_stacks(where, nprocs))
        summaries = [json.loads(path.read_text()) if (path := where / f"rank{r}.json").exists() else {}
                     for r in range(nprocs)]
        for total, summary in zip(merged, summaries, strict=True):
            _add(total, summary)
        ended = sorted({nodeid for summary in summaries for nodeid in summary.get("failed", [])})
        if run.returncode == 0 or not ended:
            break  # finished, or ended with no test to blame (a crash): nothing to start again after
        if attempt < RESTARTS:
            outputs.append(f"\n==== the run ended at {', '.join(ended)}: started again after it ====\n")
        done = sorted({*done, *ended, *(n for summary in summaries for n in summary.get("done", []))})
    return Finished(returncode, "".join(outputs), "", seconds), merged


def _add(total: dict[str, Any], summary: dict[str, Any]) -> None:
    if not summary:
        return
    if not total:
        total.update(passed=0, failed=[], skipped=[], done=[], hung=[])
    total["passed"] += summary["passed"]
    for key in ("failed", "skipped", "done"):
        total[key] += summary[key]
    if summary.get("hung"):
        total["hung"].append(summary["hung"])


def _other_stacks(where: Path, nprocs: int) -> str:
    """The stacks of the ranks that did not print theirs (one rank prints its own, alone, before the abort)."""
    printed = (where / "hung").read_text() if (where / "hung").exists() else ""
    return "".join(f"\n---- rank {r}'s main thread (hung) ----\n{path.read_text()}"
                   for r in range(nprocs) if (path := where / f"rank{r}.stack").exists() and str(r) != printed)


def describe(summaries: list[dict[str, Any]]) -> str:
    """What ran on every rank: '401 passed, 2 skipped on each of 3 ranks' (or each rank's counts where they differ)."""
    counts = [", ".join([f"{s['passed']} passed", *(f"{len(s[k])} {k}" for k in ("failed", "skipped") if s[k])])
              if s else "no summary" for s in summaries]
    if len(set(counts)) == 1:
        return f"{counts[0]} on each of {len(counts)} ranks"
    return "; ".join(f"rank {rank}: {text}" for rank, text in enumerate(counts))


def tail(run: Finished, lines: int = 80) -> str:
    return "\n".join(run.output.splitlines()[-lines:])


def first_failure(run: Finished, lines: int = 80) -> str:
    """The output from the first rank's FAILED line on (its assertion or its stack first), else the tail."""
    text = run.output
    at = text.find(": FAILED ")
    if at < 0:
        return tail(run, lines)
    start = text.rfind("\n", 0, at) + 1
    return "\n".join(text[start:].splitlines()[:lines])


@pytest.mark.timeout(MPIEXEC_TIMEOUT + 60)
@pytest.mark.parametrize("nprocs", [2, 3, 4])
def test_mpi_suite(nprocs: int, tmp_path: Path, inner_skips: list[str], mpiexec_runs: list[str]) -> None:
    extra = [] if nprocs == 2 else ["-m", "not slow"]  # the >2 GiB transfer runs once per MPI library, at 2 ranks
    run, summaries = run_pytest(nprocs, [str(ROOT / "tests" / "mpi")], tmp_path, *extra)
    print(tail(run))
    mpiexec_runs.append(f"mpiexec -n {nprocs}{' -m ' + repr(extra[1]) if extra else ''}: tests/mpi: "
                        f"{describe(summaries)} (exit {run.returncode}, {run.seconds:.0f} s)")
    failed = sorted({nodeid for summary in summaries for nodeid in summary.get("failed", [])})
    assert run.returncode == 0 and not failed, (
        f"mpiexec -n {nprocs}: FAILED {', '.join(failed) or '(no test named: the run crashed)'} (exit "
        f"{run.returncode}); in all: {describe(summaries)}\n{first_failure(run)}")
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
    assert not any(summary["hung"] for summary in summaries), summaries  # rank 0 was released by the abort
    assert run.seconds < 120, f"the run took {run.seconds:.0f} s: rank 0 was not released by the abort"


PLANTED = """
import time

from mpi4py import MPI


def test_before_the_hang():
    MPI.COMM_WORLD.Barrier()
    if MPI.COMM_WORLD.Get_rank() == 0:
        time.sleep(2)  # rank 1's watchdog fires first: its abort must not end rank 0 before rank 0 records the hang


def test_that_hangs():
    if MPI.COMM_WORLD.Get_rank() == 1:
        MPI.COMM_WORLD.Recv(bytearray(8), source=0, tag=4242)  # nobody sends it
    MPI.COMM_WORLD.Barrier()  # (the other ranks wait here for rank 1, for good)


def test_after_the_hang():
    assert MPI.COMM_WORLD.allreduce(1) == MPI.COMM_WORLD.Get_size()
"""


def test_a_hang_fails_its_own_test_within_seconds_and_the_rest_still_runs(tmp_path: Path) -> None:
    """A test file planted beside a copy of tests/mpi/conftest.py, run as test_mpi_suite runs tests/mpi: the hung
    test fails as hung after its limit, its FAILED line names it, then one rank's stack alone, then the other
    ranks'; the tests after it still run and pass on every rank."""
    planted = tmp_path / "planted"
    planted.mkdir()
    (planted / "conftest.py").write_text((ROOT / "tests" / "mpi" / "conftest.py").read_text())
    (planted / "test_planted.py").write_text(PLANTED)
    run, summaries = run_pytest(2, [str(planted / "test_planted.py")], tmp_path / "reports", timeout=120,
                                test_timeout=5)
    assert run.returncode != 0
    hung = list(summaries[0]["failed"])
    assert len(hung) == 1 and hung[0].endswith("test_planted.py::test_that_hangs"), summaries
    for summary in summaries:
        assert summary["passed"] == 2 and summary["failed"] == hung, summaries  # (before and after the hang)
    text = first_failure(run)
    first = text.splitlines()[0]
    assert first.startswith("==== rank ") and f"FAILED {hung[0]} (hung: still running after 5 s)" in first, text
    rank = int(first.split()[2].rstrip(":"))
    stacks = [line for line in run.output.splitlines() if line.startswith("---- rank ")]
    assert stacks[0] == f"---- rank {rank}'s main thread ----", stacks  # one rank's stack first, alone
    assert stacks[1:] == [f"---- rank {1 - rank}'s main thread (hung) ----"], stacks  # then the other's
    first_stack = run.output.split(stacks[0])[1].split(stacks[1])[0]
    assert "in test_that_hangs" in first_stack, first_stack
    # Two mpiexec runs (the hang's, then the rest) with the 5 s hang between: well under a minute on a quiet machine;
    # the bound leaves room for a loaded one (each start of pytest under mpiexec can take 20 s there).
    assert run.seconds < 90, f"the runs took {run.seconds:.0f} s: the hang did not end its test within seconds"


def test_inner_skips_and_their_reasons_are_reported(tmp_path: Path) -> None:
    run, summaries = run_pytest(2, [str(SELFCHECK / "skipping.py")], tmp_path, timeout=120)
    assert run.returncode == 0, tail(run)
    for summary in summaries:
        assert summary["passed"] == 1
        assert summary["skipped"] == [
            ["tests/mpi/selfcheck/skipping.py::test_skips", "selfcheck: a reason the outer run reports"]
        ]
