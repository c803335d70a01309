"""slurm/cai_mpi.sbatch's defaults where there is no Slurm (issue 46): run by bash with Slurm's variables set and a
FAKE srun and mpirun (in the venv's bin/, which the template puts first on PATH) that start the one rank they are
given. A user coming from the README submits from the clone with its .venv and sets nothing: the template finds
the venv and picks the launcher from the MPI mpi4py uses and the PMI plugins srun lists. What a set variable does
is unchanged (tests/slurm submits the template to a real Slurm with each of them)."""

from __future__ import annotations

import os
import stat
import subprocess
import sys
from pathlib import Path

import pytest
from mpi4py import MPI

ROOT = Path(__file__).resolve().parents[2]
TEMPLATE = ROOT / "slurm" / "cai_mpi.sbatch"
# Prints its options, then starts the program after them: one rank, as srun -n 1 would.
FAKE_SRUN = """#!/bin/sh
if [ "$1" = "--mpi=list" ]; then
    printf 'MPI plugin types are...\\n\\tnone\\n'; for p in $FAKE_PLUGINS; do printf '\\t%s\\n' "$p"; done; exit 0
fi
echo "FAKE srun $*"
while [ $# -gt 0 ]; do case "$1" in -*) shift ;; *) break ;; esac; done
exec "$@"
"""
FAKE_MPIRUN = """#!/bin/sh
echo "FAKE mpirun $*"
shift 2
exec "$@"
"""
OPEN_MPI = "Open MPI" in MPI.Get_library_version()


def _executable(path: Path, text: str) -> None:
    path.write_text(text)
    path.chmod(path.stat().st_mode | stat.S_IXUSR)


def _venv(where: Path) -> Path:
    """A venv-shaped directory whose python is this interpreter (with its packages), and the fake launchers."""
    bin_ = where / "bin"
    bin_.mkdir(parents=True)
    _executable(bin_ / "python", f'#!/bin/sh\nexec "{sys.executable}" "$@"\n')
    _executable(bin_ / "srun", FAKE_SRUN)
    _executable(bin_ / "mpirun", FAKE_MPIRUN)
    return where


def _submit(submit_dir: Path, plugins: str, gpus: str = "2", **env: str) -> subprocess.CompletedProcess[str]:
    program = submit_dir / "program.py"
    program.write_text("print('PROGRAM RAN')\n")
    full = {k: v for k, v in os.environ.items() if not k.startswith(("CAI_MPI_", "SLURM_"))}
    full.update(SLURM_SUBMIT_DIR=str(submit_dir), SLURM_JOB_ID="7", SLURM_JOB_NODELIST="n1", SLURM_NTASKS="1",
                SLURM_GPUS_ON_NODE=gpus, HOME=str(submit_dir / "home"), FAKE_PLUGINS=plugins,
                PYTHONPATH=os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]),
                OMPI_ALLOW_RUN_AS_ROOT="1", OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1", **env)
    return subprocess.run(["bash", str(TEMPLATE), str(program)], cwd=submit_dir, env=full, capture_output=True,
                          text=True, timeout=120)


@pytest.mark.timeout(150)
def test_from_the_readme_s_clone_nothing_needs_setting(tmp_path: Path) -> None:
    venv = _venv(tmp_path / ".venv")
    done = _submit(tmp_path, "pmi2 pmix", CAI_MPI_PREFLIGHT="0")
    assert done.returncode == 0, done.stdout + done.stderr
    want = "srun-pmix" if OPEN_MPI else "srun-pmi2"
    library = " ".join(MPI.Get_library_version().replace("\0", "").split(",")[0].split())  # as the template says
    assert f"launcher={want} gpu-bind=per-task nodes=n1 tasks=1 venv={venv}\n" in done.stdout
    assert f"== launcher {want}: detected: {library}\n" in done.stdout
    assert f"FAKE srun --mpi={want[5:]} --gpus-per-task=1 python -m cai_mpi run" in done.stdout
    assert "PROGRAM RAN" in done.stdout


@pytest.mark.timeout(150)
def test_without_the_mpi_s_pmi_plugin_the_mpi_s_mpirun_starts_the_ranks(tmp_path: Path) -> None:
    _venv(tmp_path / ".venv")
    done = _submit(tmp_path, "pmi1")  # (the preflight steps run too)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "launcher=mpirun gpu-bind=all " in done.stdout and "== launcher mpirun: detected: " in done.stdout
    assert "FAKE mpirun -n 1 python -m cai_mpi run" in done.stdout and "PROGRAM RAN" in done.stdout
    assert "world size 1 == SLURM_NTASKS: ok" in done.stdout


@pytest.mark.timeout(150)
def test_set_variables_win_over_the_defaults(tmp_path: Path) -> None:
    _venv(tmp_path / ".venv")
    other = _venv(tmp_path / "elsewhere")
    done = _submit(tmp_path, "pmi2 pmix", gpus="0", CAI_MPI_VENV=str(other), CAI_MPI_LAUNCHER="srun-pmi2",
                   CAI_MPI_PREFLIGHT="0")
    assert done.returncode == 0, done.stdout + done.stderr
    assert "launcher=srun-pmi2 gpu-bind=none " in done.stdout
    assert "== launcher srun-pmi2: set in CAI_MPI_LAUNCHER\n" in done.stdout
    assert f"venv={other}" in done.stdout and "FAKE srun --mpi=pmi2 python -m cai_mpi run" in done.stdout


def test_without_a_venv_the_message_names_both_places(tmp_path: Path) -> None:
    done = _submit(tmp_path, "pmix")
    assert done.returncode == 1
    assert f"CAI_MPI_VENV={tmp_path}/home/venvs/cai_mpi has no bin/python" in done.stderr
    assert f"unset, {tmp_path}/.venv is used if it exists" in done.stderr
