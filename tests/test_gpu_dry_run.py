"""A dry run of scripts/test-gpu.sh on the CUDA driver double, in its offline mode (the machine's own packages, as on
a lent GPU machine without network): a fake nvidia-smi, ``CAI_MPI_TEST_CUDA_DRIVER`` for the GPU, this venv's
Python and mpiexec. The script runs both its runs (1 rank, 2 ranks under mpiexec), writes the reports and the page,
and its limits fit one 10-minute command; the page says it is no GPU result."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from launch import LAUNCH_ENV, ROOT

#: What one command on a lent machine may take, in seconds.
ONE_COMMAND = 600
#: What the script needs besides its two runs (checks, the offline install, cai_mpi info, the summary), at most.
SETUP = 90

FAKE_NVIDIA_SMI = """#!/bin/sh
case "$1" in
  --query-gpu=*) echo "Fixture GPU (dry run), 000.00" ;;
  *) echo "| NVIDIA-SMI 000.00   Driver Version: 000.00   CUDA Version: 13.0 |" ;;
esac
"""


def test_a_dry_run_on_the_double_fits_one_command_of_a_lent_machine(tmp_path: Path) -> None:
    bin_dir, results = tmp_path / "bin", tmp_path / "results"
    bin_dir.mkdir()
    (bin_dir / "nvidia-smi").write_text(FAKE_NVIDIA_SMI)
    (bin_dir / "nvidia-smi").chmod(0o755)
    drop = ("GPU_ENV", "GPU_WHEELS", "GPU_TEST_TIMEOUT", "GPU_RUN_TIMEOUT", "XLA_PYTHON_CLIENT_PREALLOCATE",
            "CUDA_MAJOR", "CAI_MPI_CUDA_AWARE")
    env = {k: v for k, v in os.environ.items() if k not in drop}
    env.update(LAUNCH_ENV, GPU_ENV="system", PYTHON=sys.executable, GPU_RESULTS=str(results),
               CAI_MPI_TEST_CUDA_DRIVER="cai_mpi.testing.cuda_driver:CudaDriverDouble",
               PATH=f"{bin_dir}:{Path(sys.executable).parent}:/usr/bin:/bin")
    done = subprocess.run(["bash", str(ROOT / "scripts" / "test-gpu.sh"), "-k", "runtime_is_cuda or probe_and_device"],
                          capture_output=True, text=True, timeout=300, env=env, cwd=tmp_path)
    assert done.returncode == 0, done.stdout[-4000:] + done.stderr[-4000:]
    summary = json.loads((results / "summary.json").read_text())
    assert summary["mode"] == "system" and [run["exit"] for run in summary["runs"]] == [0, 0], summary
    harness = summary.get("harness", {})
    assert harness.get("XLA_PYTHON_CLIENT_PREALLOCATE") == "false", summary  # two ranks on one GPU can start JAX
    per_test, per_run = int(harness.get("GPU_TEST_TIMEOUT", 0)), int(harness.get("GPU_RUN_TIMEOUT", 0))
    assert 0 < per_test <= per_run and 2 * per_run + SETUP <= ONE_COMMAND, harness
    page = (results / "gpu-results.md").read_text()
    assert "**Not a GPU run:**" in page and "| test-gpu.sh settings |" in page
    for report in ("1rank-rank0.xml", "2ranks-rank0.xml", "2ranks-rank1.xml"):
        assert 'name="test_runtime_is_cuda"' in (results / report).read_text(), report
