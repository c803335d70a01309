"""The rules of tests/gpu/conftest.py, checked where there is no GPU: which warnings fail a GPU test, and that a
failing rank ends a 2-rank run with its JUnit report written (what scripts/test-gpu.sh and scripts/gpu_results.py
rely on). Not marked gpu: these run with the rest of the suite."""

from __future__ import annotations

import os
import subprocess
import sys
import warnings
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest
from launch import ROOT, run_ranks

from cai_mpi._src.core.descriptor import descriptor_from_dict

SELFCHECK = ROOT / "tests" / "gpu" / "selfcheck"


def warn_from(module: str, message: str) -> None:
    """``warnings.warn`` as called by code in ``module`` (the module a warning filter sees)."""
    code = compile(f"import warnings\nwarnings.warn({message!r}, DeprecationWarning)", f"<{module}>", "exec")
    exec(code, {"__name__": module})


def test_warnings_of_gpu_libraries_are_shown_not_raised() -> None:
    with warnings.catch_warnings(record=True) as shown:  # records what the filters let through, as pytest does
        for module in ("cupy._core.core", "torch.cuda", "numba.cuda.dispatcher", "cuda.bindings.driver"):
            warn_from(module, f"{module}: an old API")
    assert [str(w.message) for w in shown] == [
        f"{m}: an old API" for m in ("cupy._core.core", "torch.cuda", "numba.cuda.dispatcher", "cuda.bindings.driver")
    ]


def test_warnings_of_cai_mpi_are_errors() -> None:
    with pytest.raises(DeprecationWarning, match="cai_mpi's own"):
        warn_from("cai_mpi._src.transport", "cai_mpi's own")
    # A CAI warning points at the caller (stacklevel), here this test: recognised by its prefix.
    with pytest.raises(UserWarning, match="__cuda_array_interface__: 'stream' key ignored"):
        descriptor_from_dict({"version": 2, "shape": (4,), "typestr": "<f4", "data": (4096, False), "stream": 7})


NOISY_DRIVER = """
import warnings

warnings.warn("noisy_driver: this import path is deprecated", DeprecationWarning, stacklevel=1)

from cai_mpi.testing.cuda_driver import CudaDriverDouble
"""


def test_a_gpu_library_that_warns_when_imported_does_not_hide_the_gpu(tmp_path: Path) -> None:
    # The probe imports the driver bindings while pytest collects (warnings are errors there): a deprecation
    # notice in them made every GPU test skip as "no usable CUDA GPU". Here a driver double that warns so.
    (tmp_path / "noisy_driver.py").write_text(NOISY_DRIVER)
    env = {**os.environ, "CAI_MPI_TEST_CUDA_DRIVER": "noisy_driver:CudaDriverDouble",
           "PYTHONPATH": os.pathsep.join([str(ROOT), str(tmp_path), os.environ.get("PYTHONPATH", "")])}
    done = subprocess.run([sys.executable, "-m", "pytest", "-m", "gpu", "-p", "no:cacheprovider", "-rs",
                           "tests/gpu/test_gpu_p2p.py::test_runtime_is_cuda"], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=240)
    assert done.returncode == 0 and "1 passed" in done.stdout, done.stdout + done.stderr


def test_a_failing_rank_aborts_the_run_and_leaves_its_junit_report(tmp_path: Path) -> None:
    junit = str(tmp_path / "run-rank${CAI_MPI_TEST_RANK}.xml")  # expanded by pytest in each rank
    run = run_ranks(2, ["-m", "pytest", "-q", "-p", "no:cacheprovider", "--timeout=120", "--timeout-method=thread",
                        f"--junitxml={junit}", str(SELFCHECK / "broken_on_rank_one.py")], timeout=240)
    assert run.returncode != 0
    assert "Timeout" not in run.output, "rank 0 was released by the per-test time limit, not by the abort"
    assert outcomes(tmp_path / "run-rank1.xml") == {"test_every_rank_passes_first": [],
                                                    "test_rank_one_fails_while_rank_zero_waits": ["failure"]}
    # The failing rank says why on stderr, and its report keeps it: the launcher forwards output asynchronously, and
    # an abort may end the job before it has (MPICH's hydra did once in CI, on a loaded machine), never the report.
    said = run.output + failures(tmp_path / "run-rank1.xml")
    assert "deliberate failure on rank 1" in said, run.output[-3000:]
    assert "rank 1: FAILED" in run.output or not run.output.strip(".\n "), run.output[-3000:]
    # Rank 0 was killed in the second test; its report holds the test it finished.
    assert outcomes(tmp_path / "run-rank0.xml") == {"test_every_rank_passes_first": []}


def failures(junit: Path) -> str:
    """The text of every failure a JUnit report holds."""
    return "\n".join(f"{child.get('message')}\n{child.text}" for case in ET.parse(junit).getroot().iter("testcase")
                     for child in case if child.tag == "failure")


def outcomes(junit: Path) -> dict[str | None, list[str]]:
    """Each test case of a JUnit report, with the tags of its outcome (none: passed)."""
    return {case.get("name"): [child.tag for child in case] for case in ET.parse(junit).getroot().iter("testcase")}
