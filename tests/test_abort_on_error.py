"""A rank that dies of an uncaught exception ends the whole job within seconds, its rank and traceback on stderr,
instead of leaving the other ranks blocked in a receive: with cai_mpi.abort_on_error() in the program, or with the
program run by ``python -m cai_mpi run`` (a script, ``-m module`` or ``-c command``). Under this venv's mpiexec
(scripts/test.sh runs the suite with each wheel's venv), at 2 and 3 ranks.

Without the abort the other ranks wait in ``recv_array`` forever, so a run that is still going after ``LIMIT``
seconds fails as a hang, with its output."""

from __future__ import annotations

from pathlib import Path

import pytest
from launch import Finished, run_ranks

LIMIT = 60  # seconds: the job ends within a few; this only tells a hang from a slow start on a busy machine
ENDED_WITHIN = 30  # seconds: an abort that waited for some timeout (a launcher's, a rank's) would take longer

FAILING = """
import sys, threading
import cai_mpi
from mpi4py import MPI
{setup}
if MPI.COMM_WORLD.Get_rank() == 1:
    print("argv:", sys.argv[1:], file=sys.stderr, flush=True)
    {fail}
else:
    cai_mpi.recv_array(source=1)  # waits for the rank that dies
"""
RAISE = 'raise ValueError("boom on purpose")'
IN_THREAD = ('t = threading.Thread(target=lambda: 1 / 0, name="worker"); t.start(); t.join()\n'
             '    cai_mpi.recv_array(source=0)  # (rank 0 sends nothing: only the abort ends this wait)')
ABORT_ON_ERROR = "cai_mpi.abort_on_error()"
# A hook installed first keeps printing the traceback in its own way; a second call changes nothing.
EARLIER_HOOK = """
def earlier_hook(kind, error, tb):
    sys.stderr.write(f"earlier hook printed {kind.__name__}: {error}\\n")
sys.excepthook = earlier_hook
cai_mpi.abort_on_error()
cai_mpi.abort_on_error()
"""


def _write(path: Path, *, setup: str = "", fail: str = RAISE) -> str:
    path.write_text(FAILING.format(setup=setup, fail=fail))
    return str(path)


def _assert_ended_loudly(done: Finished, nprocs: int, headline: str) -> None:
    """Non-zero status within seconds (not at the hang limit), and rank 1's report: who it is, what it raised, then
    the traceback."""
    assert done.returncode != 0, done.output
    assert done.seconds < ENDED_WITHIN, f"the job took {done.seconds:.0f} s to end:\n{done.output}"
    assert f"cai_mpi: rank 1 of {nprocs} (host " in done.stderr, done.output
    assert f"{headline}, aborting MPI_COMM_WORLD" in done.stderr, done.output


def _assert_user_traceback(done: Finished, error: str) -> None:
    """Python's traceback of the program, without the runner's frames (cai_mpi's, mpi4py's, runpy's)."""
    assert "Traceback (most recent call last)" in done.stderr and error in done.stderr, done.output
    for runner_frame in ("runpy", "mpi4py/run.py", "_src/run.py"):
        assert runner_frame not in done.stderr, done.output


@pytest.mark.parametrize("nprocs", [2, 3])
def test_abort_on_error_ends_the_job(tmp_path: Path, nprocs: int) -> None:
    done = run_ranks(nprocs, [_write(tmp_path / "job.py", setup=ABORT_ON_ERROR)], timeout=LIMIT)
    _assert_ended_loudly(done, nprocs, "uncaught ValueError: boom on purpose")
    _assert_user_traceback(done, "ValueError: boom on purpose")


@pytest.mark.parametrize("nprocs", [2, 3])
def test_an_exception_in_a_thread_ends_the_job(tmp_path: Path, nprocs: int) -> None:
    done = run_ranks(nprocs, [_write(tmp_path / "job.py", setup=ABORT_ON_ERROR, fail=IN_THREAD)], timeout=LIMIT)
    _assert_ended_loudly(done, nprocs, "in thread 'worker': uncaught ZeroDivisionError: division by zero")
    # threading's own hook prints the traceback, as it would without abort_on_error
    assert "Exception in thread worker" in done.stderr and "ZeroDivisionError" in done.stderr, done.output


def test_the_hook_installed_before_prints_the_traceback(tmp_path: Path) -> None:
    done = run_ranks(2, [_write(tmp_path / "job.py", setup=EARLIER_HOOK)], timeout=LIMIT)
    _assert_ended_loudly(done, 2, "uncaught ValueError: boom on purpose")
    assert done.stderr.count("earlier hook printed ValueError: boom on purpose") == 1, done.output


@pytest.mark.parametrize("nprocs", [2, 3])
def test_run_a_script_ends_the_job_and_passes_its_arguments(tmp_path: Path, nprocs: int) -> None:
    done = run_ranks(nprocs, ["-m", "cai_mpi", "run", _write(tmp_path / "job.py"), "--epochs", "3"], timeout=LIMIT)
    _assert_ended_loudly(done, nprocs, "uncaught ValueError: boom on purpose")
    _assert_user_traceback(done, "ValueError: boom on purpose")
    assert "argv: ['--epochs', '3']" in done.stderr, done.output


@pytest.mark.parametrize("nprocs", [2, 3])
def test_run_a_module_ends_the_job_and_passes_its_arguments(tmp_path: Path, nprocs: int) -> None:
    _write(tmp_path / "failing_module.py")
    done = run_ranks(nprocs, ["-m", "cai_mpi", "run", "-m", "failing_module", "-v", "x"], timeout=LIMIT,
                     env={"PYTHONPATH": str(tmp_path)})
    _assert_ended_loudly(done, nprocs, "uncaught ValueError: boom on purpose")
    _assert_user_traceback(done, "ValueError: boom on purpose")
    assert "argv: ['-v', 'x']" in done.stderr, done.output


@pytest.mark.parametrize("nprocs", [2, 3])
def test_run_a_command_ends_the_job_on_sys_exit(nprocs: int) -> None:
    # sys.exit never reaches sys.excepthook: only the runner sees it (as in python -m mpi4py)
    command = FAILING.format(setup="", fail="sys.exit(7)")
    done = run_ranks(nprocs, ["-m", "cai_mpi", "run", "-c", command, "a"], timeout=LIMIT)
    _assert_ended_loudly(done, nprocs, "uncaught SystemExit: 7")
    assert "(exit status 7)" in done.stderr and "argv: ['a']" in done.stderr, done.output


def test_run_a_program_that_succeeds(tmp_path: Path) -> None:
    path = tmp_path / "fine.py"
    path.write_text("import sys\nfrom mpi4py import MPI\n"
                    # one write per line: print's pieces from two ranks interleave under PYTHONUNBUFFERED
                    "sys.stdout.write(f'rank {MPI.COMM_WORLD.Get_rank()} {__name__} {sys.argv}\\n')\n"
                    "sys.exit(0)  # a normal exit, not a failure\n")
    done = run_ranks(2, ["-m", "cai_mpi", "run", str(path), "a", "--b"], timeout=LIMIT)
    assert done.returncode == 0, done.output
    for rank in (0, 1):
        assert f"rank {rank} __main__ [{str(path)!r}, 'a', '--b']" in done.stdout, done.output
    assert "aborting" not in done.stderr, done.output


def test_run_help_has_an_example() -> None:
    done = run_ranks(1, ["-m", "cai_mpi", "run", "--help"], timeout=LIMIT)
    assert done.returncode == 0, done.output
    assert "mpiexec -n 4 python -m cai_mpi run train.py --epochs 3" in done.stdout, done.output


@pytest.mark.parametrize(("args", "error"), [
    ([], "give a script, -m module or -c command"),
    (["--epochs", "3"], "unrecognized option --epochs"),
    (["-m"], "argument -m: expected one argument"),
    (["-"], "cannot read the program from stdin"),
])
def test_run_without_a_program_is_a_usage_error(args: list[str], error: str) -> None:
    done = run_ranks(1, ["-m", "cai_mpi", "run", *args], timeout=LIMIT)
    assert done.returncode == 2 and error in done.stderr and "usage: python -m cai_mpi run" in done.stderr, done.output
