"""A rank that dies of an uncaught exception ends the whole job within seconds, its rank and traceback on stderr,
instead of leaving the other ranks blocked in a receive: with cai_mpi.abort_on_error() in the program, or with the
program run by ``python -m cai_mpi run``. Under this venv's mpiexec, at 2 and 3 ranks."""

from __future__ import annotations

from pathlib import Path

import pytest
from launch import run_ranks

FAILING = """
import sys, threading
import numpy as np
import cai_mpi
from mpi4py import MPI
{setup}
rank = MPI.COMM_WORLD.Get_rank()
if rank == 1:
    print("argv:", sys.argv[1:], file=sys.stderr, flush=True)  # (the failing rank's stderr reaches mpiexec)
    {fail}
else:
    cai_mpi.recv_array(source=1)  # would wait forever for the rank that died
"""
RAISE = 'raise ValueError("boom on purpose")'
IN_THREAD = ('t = threading.Thread(target=lambda: 1 / 0, name="worker"); t.start(); t.join()\n'
             '    cai_mpi.recv_array(source=0)')
LIMIT = 60  # seconds: a hang would last until the test's own timeout


def _script(tmp_path: Path, *, setup: str = "", fail: str = RAISE) -> str:
    path = tmp_path / "job.py"
    path.write_text(FAILING.format(setup=setup, fail=fail))
    return str(path)


def _assert_ended_loudly(done, nprocs: int, error: str) -> None:
    assert done.returncode != 0, done.output
    assert done.seconds < LIMIT, done.output
    assert f"cai_mpi: rank 1 of {nprocs} (host " in done.stderr, done.output
    assert error in done.stderr and "Traceback" in done.stderr, done.output


@pytest.mark.parametrize("nprocs", [2, 3])
def test_abort_on_error_ends_the_job(tmp_path: Path, nprocs: int) -> None:
    done = run_ranks(nprocs, [_script(tmp_path, setup="cai_mpi.abort_on_error()")], timeout=120)
    _assert_ended_loudly(done, nprocs, "ValueError: boom on purpose")


@pytest.mark.parametrize("nprocs", [2, 3])
def test_an_exception_in_a_thread_ends_the_job(tmp_path: Path, nprocs: int) -> None:
    done = run_ranks(nprocs, [_script(tmp_path, setup="cai_mpi.abort_on_error()", fail=IN_THREAD)], timeout=120)
    _assert_ended_loudly(done, nprocs, "ZeroDivisionError")
    assert "in thread 'worker'" in done.stderr


@pytest.mark.parametrize("nprocs", [2, 3])
def test_run_a_script_ends_the_job_and_passes_its_arguments(tmp_path: Path, nprocs: int) -> None:
    done = run_ranks(nprocs, ["-m", "cai_mpi", "run", _script(tmp_path), "--epochs", "3"], timeout=120)
    _assert_ended_loudly(done, nprocs, "ValueError: boom on purpose")
    assert "argv: ['--epochs', '3']" in done.stderr


def test_run_a_command_and_a_module(tmp_path: Path) -> None:
    command = "import cai_mpi, sys; from mpi4py import MPI\nif MPI.COMM_WORLD.Get_rank() == 1: sys.exit(7)\n" \
              "cai_mpi.recv_array(source=1)"
    done = run_ranks(2, ["-m", "cai_mpi", "run", "-c", command], timeout=120)
    assert done.returncode != 0, done.output
    assert done.seconds < LIMIT and "SystemExit: 7" in done.stderr, done.output
    (tmp_path / "failing_module.py").write_text(FAILING.format(setup="", fail=RAISE))
    done = run_ranks(2, ["-m", "cai_mpi", "run", "-m", "failing_module"], timeout=120,
                     env={"PYTHONPATH": str(tmp_path)})
    _assert_ended_loudly(done, 2, "ValueError: boom on purpose")


def test_run_a_program_that_succeeds(tmp_path: Path) -> None:
    path = tmp_path / "fine.py"
    path.write_text("import sys, cai_mpi\nfrom mpi4py import MPI\n"
                    "print('rank', MPI.COMM_WORLD.Get_rank(), 'args', sys.argv[1:])\n")
    done = run_ranks(2, ["-m", "cai_mpi", "run", str(path), "a", "b"], timeout=120)
    assert done.returncode == 0, done.output
    assert done.stdout.count("args ['a', 'b']") == 2 and "aborting" not in done.stderr


def test_run_help_has_an_example() -> None:
    done = run_ranks(1, ["-m", "cai_mpi", "run", "--help"], timeout=120)
    assert done.returncode == 0 and "mpiexec -n 4 python -m cai_mpi run train.py" in done.stdout
