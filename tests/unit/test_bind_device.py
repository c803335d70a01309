"""CAI_MPI_BIND_DEVICE=1 makes the rank's GPU current before MPI is initialized (transports such as smcuda and
PSM2 create CUDA resources inside MPI_Init, on whatever device is current then). Run in fresh interpreters on the
CUDA driver double, which records what was bound and whether MPI had been initialized at that moment."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

RECORDING_DRIVER = '''
import atexit, json, os, sys
from cai_mpi.testing.cuda_driver import CudaDriverDouble

class RecordingDouble(CudaDriverDouble):
    def cuCtxSetCurrent(self, ctx):
        binds.append({"ordinal": self.ordinal_of(int(ctx)), "mpi_initialized": "mpi4py.MPI" in sys.modules})
        return super().cuCtxSetCurrent(ctx)

binds = []
atexit.register(lambda: open(os.environ["BIND_RECORD"], "w").write(json.dumps(binds)))

def make():
    return RecordingDouble(4)
'''

CHECK = '''
import cai_mpi, json
from mpi4py import MPI
from cai_mpi._src.runtime.cudadriver import load_driver
d = load_driver()
d.cuInit(0)
_err, ctx = d.cuCtxGetCurrent()
print(json.dumps({"current": None if int(ctx) == 0 else d.ordinal_of(int(ctx)), "mpi": MPI.Is_initialized()}))
'''


def run(tmp_path: Path, **env: str) -> tuple[dict[str, object], list[dict[str, object]]]:
    (tmp_path / "recording_driver.py").write_text(RECORDING_DRIVER)
    record = tmp_path / "binds.json"
    full = {k: v for k, v in os.environ.items() if not k.startswith(("CAI_MPI_", "OMPI_COMM_WORLD", "SLURM_"))}
    full.update(PYTHONPATH=f"{tmp_path}{os.pathsep}{os.environ.get('PYTHONPATH', '')}", BIND_RECORD=str(record),
                CAI_MPI_TEST_CUDA_DRIVER="recording_driver:make", **env)
    full.pop("CUDA_VISIBLE_DEVICES", None)
    done = subprocess.run([sys.executable, "-c", CHECK], env=full, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout.strip().splitlines()[-1]), json.loads(record.read_text())


def test_the_ranks_gpu_is_current_before_mpi_is_initialized(tmp_path: Path) -> None:
    after, binds = run(tmp_path, CAI_MPI_BIND_DEVICE="1", CAI_MPI_LOCAL_RANK="6")
    assert binds and binds[0] == {"ordinal": 2, "mpi_initialized": False}  # local rank 6 of 4 GPUs: GPU 2
    assert after == {"current": 2, "mpi": True}


def test_cai_mpi_device_chooses_the_gpu(tmp_path: Path) -> None:
    after, binds = run(tmp_path, CAI_MPI_BIND_DEVICE="1", CAI_MPI_DEVICE="3")
    assert binds[0] == {"ordinal": 3, "mpi_initialized": False} and after["current"] == 3


def test_off_by_default_nothing_is_bound(tmp_path: Path) -> None:
    after, binds = run(tmp_path, CAI_MPI_LOCAL_RANK="1")
    assert binds == [] and after == {"current": None, "mpi": True}


def test_asked_for_without_a_usable_gpu_is_an_error() -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith("CAI_MPI_")}
    env.update(CAI_MPI_BIND_DEVICE="1", CUDA_VISIBLE_DEVICES="")
    done = subprocess.run([sys.executable, "-c", "import cai_mpi"], env=env, capture_output=True, text=True,
                          timeout=120)
    assert done.returncode != 0
    assert "RuntimeUnavailableError: CAI_MPI_BIND_DEVICE=1, but CUDA is not usable here" in done.stderr


@pytest.mark.parametrize("raw", ["2", "maybe"])
def test_a_malformed_switch_is_refused(raw: str) -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith("CAI_MPI_")}
    env["CAI_MPI_BIND_DEVICE"] = raw
    done = subprocess.run([sys.executable, "-c", "import cai_mpi"], env=env, capture_output=True, text=True,
                          timeout=120)
    assert done.returncode != 0 and f"CAI_MPI_BIND_DEVICE='{raw}'" in done.stderr
