"""A plain single-process ``pytest`` collects only what can run in it: MPI-only tests and, without a GPU, GPU tests
are left out and named once in the summary (tests/conftest.py), instead of hundreds of skips."""

from __future__ import annotations

import os
import subprocess
import sys

from launch import ROOT

from cai_mpi._src.runtime.cudadriver import probe


def pytest_here(*args: str) -> str:
    env = {k: v for k, v in os.environ.items() if k not in ("CAI_MPI_TEST_CUDA_DRIVER", "PYTEST_ADDOPTS")}
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
