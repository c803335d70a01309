"""scripts/test-gpu.sh, scripts/gpu-wheels.sh and scripts/test-real-bindings.sh where there is no GPU: they parse, pass
shellcheck, and test-gpu.sh stops with a message that says why when nvidia-smi is missing or fails (a FAKE nvidia-smi
here)."""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
SCRIPTS = [ROOT / "scripts" / name for name in ("test-gpu.sh", "gpu-wheels.sh", "test-real-bindings.sh")]


@pytest.mark.parametrize("script", SCRIPTS, ids=lambda p: p.name)
def test_the_scripts_parse(script: Path) -> None:
    done = subprocess.run(["bash", "-n", str(script)], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr


def test_the_scripts_pass_shellcheck() -> None:
    shellcheck = shutil.which("shellcheck")
    if shellcheck is None:
        pytest.skip("shellcheck is not installed (scripts/test.sh installs it with apt-get)")
    done = subprocess.run([shellcheck, "--shell=bash", "--severity=style", *map(str, SCRIPTS)],
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stdout + done.stderr


def run_test_gpu(tmp_path: Path, nvidia_smi: str | None, *args: str,
                 env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    """test-gpu.sh with PATH holding only a fake nvidia-smi (if any) and the basic tools (and ``env`` added)."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    if nvidia_smi is not None:
        (bin_dir / "nvidia-smi").write_text("#!/bin/sh\n" + nvidia_smi)
        (bin_dir / "nvidia-smi").chmod(0o755)
    environ = {k: v for k, v in os.environ.items() if k not in ("CUDA_MAJOR", "GPU_ENV", "GPU_WHEELS")}
    environ.update(env or {}, PATH=f"{bin_dir}:/usr/bin:/bin")
    return subprocess.run(["bash", str(SCRIPTS[0]), *args], capture_output=True, text=True, timeout=60, env=environ,
                          cwd=tmp_path)


def test_a_failing_nvidia_smi_stops_the_run_with_its_message(tmp_path: Path) -> None:
    done = run_test_gpu(tmp_path, "echo 'NVIDIA-SMI has failed because it could not communicate with the driver'\n"
                                  "exit 9\n", "--no-install")
    assert done.returncode == 2
    assert "nvidia-smi is installed but failed (exit 9)" in done.stderr
    assert "nvidia-smi: NVIDIA-SMI has failed because it could not communicate with the driver" in done.stderr


def test_no_nvidia_smi_stops_the_run(tmp_path: Path) -> None:
    done = run_test_gpu(tmp_path, None)
    assert done.returncode == 2 and "nvidia-smi not found" in done.stderr


def test_an_unknown_mode_is_refused(tmp_path: Path) -> None:
    done = subprocess.run(["bash", str(SCRIPTS[0])], capture_output=True, text=True, timeout=60,
                          env={**os.environ, "GPU_ENV": "conda"}, cwd=tmp_path)
    assert done.returncode == 2 and "GPU_ENV=conda: use GPU_ENV=venv" in done.stderr


def test_carried_wheels_choose_the_offline_mode(tmp_path: Path) -> None:
    # A lent machine: no network, wheels carried in GPU_WHEELS. The venv mode would reach for the network; with
    # GPU_WHEELS given the script takes the machine's own Python (here one that is missing, to stop it there).
    (tmp_path / "wheels").mkdir()
    smi = 'case "$1" in --query-gpu=*) echo "Fixture GPU, 000.00";; *) echo "CUDA Version: 13.0";; esac\n'
    env = {"GPU_WHEELS": str(tmp_path / "wheels"), "PYTHON": str(tmp_path / "no-python")}
    done = run_test_gpu(tmp_path, smi, env=env)
    assert done.returncode == 2 and f"GPU_ENV=system: no '{tmp_path / 'no-python'}' on PATH" in done.stderr, (
        done.stdout + done.stderr)
