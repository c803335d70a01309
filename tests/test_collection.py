"""A plain single-process ``pytest`` collects only what can run in it: MPI-only tests and, without a GPU, GPU tests
are left out and named once in the summary (tests/conftest.py), instead of hundreds of skips."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest
from launch import ROOT

from cai_mpi._src.runtime.cudadriver import probe

pytestmark = pytest.mark.one_wheel  # (pytest's collection, whatever the MPI library)


def pytest_here(*args: str, **extra_env: str) -> str:
    env = {k: v for k, v in os.environ.items() if k not in ("CAI_MPI_TEST_CUDA_DRIVER", "PYTEST_ADDOPTS",
                                                            "CAI_MPI_TEST_WORLD_SIZES", "CAI_MPI_TEST_SKIP_ONE_WHEEL")}
    env.update(extra_env)
    proc = subprocess.run([sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-rs", *args], cwd=ROOT,
                          env=env, capture_output=True, text=True, timeout=240)
    assert proc.returncode in (0, 5), proc.stdout + proc.stderr  # 5: everything deselected
    return proc.stdout


def test_mpi_marked_tests_are_not_collected_in_one_process() -> None:
    out = pytest_here("tests/mpi/test_detect_mpi.py")
    assert "skipped" not in out and "SKIPPED" not in out, out
    assert "not collected here: 6 tests marked mpi: they run under mpiexec" in out, out
    assert "tests/mpi: not collected in one process" in out  # the header says so up front


def test_gpu_tests_without_a_gpu_say_once_why_they_are_not_run() -> None:
    usable, reason = probe()
    out = pytest_here("tests/gpu")
    if usable:
        assert "tests marked gpu" not in out and " passed" in out, out
        return
    assert "SKIPPED" not in out and " skipped" not in out, out
    notes = [line for line in out.splitlines() if "tests marked gpu" in line]
    assert len(notes) == 1 and reason in notes[0] and "scripts/test-gpu.sh" in notes[0], out


def test_asking_for_gpu_tests_by_marker_keeps_each_skip_and_its_reason() -> None:
    usable, reason = probe()
    out = pytest_here("-m", "gpu", "tests/gpu/test_cuda_runtime.py")
    if not usable:
        assert "tests marked gpu" not in out and "SKIPPED [" in out and reason in out, out


def test_world_sizes_and_one_wheel_tests_can_be_left_to_the_other_wheel() -> None:
    """scripts/test.sh shares the larger worlds out between the wheels and runs one_wheel tests with one of them."""
    everything = pytest_here("--collect-only", "-q", "tests/test_soak.py", "tests/test_collection.py")
    assert "test_soak_delivers_every_message_intact[3]" in everything and "deselected" not in everything, everything
    out = pytest_here("--collect-only", "-q", "tests/test_soak.py", "tests/test_collection.py",
                      CAI_MPI_TEST_WORLD_SIZES="1,2", CAI_MPI_TEST_SKIP_ONE_WHEEL="1")
    assert "[3]" not in out and "test_soak_delivers_every_message_intact[2]" in out, out
    assert "test_collection.py" not in out.split("not collected here")[0], out
    assert "3 tests at a world size not in CAI_MPI_TEST_WORLD_SIZES=1,2" in out, out
    assert "tests marked one_wheel" in out, out
