"""The GPU tests' own rules, for the runs of scripts/test-gpu.sh at 1 rank and under mpiexec.

- Warnings: the project turns every warning into an error (pyproject's ``filterwarnings = ["error"]``). Here only
  cai_mpi's own warnings are: CuPy, PyTorch, Numba and cuda-bindings warn about their own affairs (deprecations,
  kernel launch sizes, versions), and a new release of one of them must not fail cai_mpi's tests. Their warnings
  are shown in pytest's warnings summary instead. The test modules probe for a GPU while pytest collects them,
  when every warning is an error: the probe runs here first, where the driver bindings' import-time warnings are
  shown, so a deprecation notice in them cannot make every GPU test skip as "no usable CUDA GPU".
- A failure on one rank aborts MPI_COMM_WORLD at once, as in tests/mpi/conftest.py, so the other rank, perhaps
  waiting in a receive from this one, does not hang until the time limit. The failing rank writes its JUnit
  report first, so the run's summary (scripts/gpu_results.py) names the test that failed.
- The JUnit report (when one is asked for) is rewritten after every test, so a rank ended by another's abort or
  by the per-test time limit still leaves the outcomes of the tests it finished.
- Fixtures the GPU test modules share: ``cp`` (CuPy, or the test skips), ``rt`` (cai_mpi's CUDA runtime on GPU 0)
  and ``route`` (a communicator sending device payloads direct or staged, in chunks of the module's
  ``CHUNK_BYTES``).
- ``CAI_MPI_TEST_RANK`` is set to this process's rank in COMM_WORLD before pytest opens its JUnit report, whose
  path pytest expands with ``os.path.expandvars``: ``--junitxml='DIR/rank${CAI_MPI_TEST_RANK}.xml'`` gives each
  rank its own file under any launcher.
"""

from __future__ import annotations

import os
import sys
import time
import warnings
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from mpi4py import MPI

import cai_mpi
from cai_mpi._src.config import reload_config
from cai_mpi._src.runtime.cuda import CudaRuntime
from cai_mpi._src.runtime.cudadriver import probe

HERE = Path(__file__).resolve().parent

#: Later filters win: every warning is shown once per place, then those of cai_mpi are errors again. A cai_mpi
#: warning is recognised by the module it is attributed to, or, for the CAI warnings that point at the caller
#: (``stacklevel``), by the prefix every CAI problem carries.
CAI_MPI_WARNINGS_ONLY = pytest.mark.filterwarnings(
    "default",
    r"error::Warning:cai_mpi",
    "error:__cuda_array_interface__",
)

os.environ["CAI_MPI_TEST_RANK"] = str(MPI.COMM_WORLD.Get_rank())

with warnings.catch_warnings():
    warnings.simplefilter("default")
    probe()  # imports the driver bindings (or CAI_MPI_TEST_CUDA_DRIVER's stand-in) once, for the test modules' probes

_config: pytest.Config | None = None


@pytest.fixture
def cp() -> Any:
    """CuPy (the test skips where it does not import), its import-time warnings kept out of filterwarnings=error."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return pytest.importorskip("cupy")


@pytest.fixture
def rt() -> CudaRuntime:
    """cai_mpi's CUDA runtime on GPU 0."""
    return CudaRuntime(0)


@pytest.fixture(params=["direct", "staged"])
def route(request: pytest.FixtureRequest) -> Iterator[MPI.Comm]:
    """A duplicate of COMM_WORLD whose device payloads go straight to MPI (only where the MPI is CUDA-aware: else
    the test skips) or are staged, in chunks of the test module's ``CHUNK_BYTES`` (several per large message). The
    override must be set when detection runs: at the communicator's first use, done here."""
    world = MPI.COMM_WORLD
    direct = request.param == "direct"
    if direct and not cai_mpi.cuda_aware(world):
        pytest.skip(f"this MPI is not CUDA-aware ({cai_mpi.cuda_aware(world).detail.split('.')[0]})")
    before = os.environ.get("CAI_MPI_CUDA_AWARE")
    os.environ["CAI_MPI_CUDA_AWARE"] = "1" if direct else "0"
    try:
        comm = world.Dup()
        assert cai_mpi.cuda_aware(comm).aware is direct
    finally:
        if before is None:
            del os.environ["CAI_MPI_CUDA_AWARE"]
        else:
            os.environ["CAI_MPI_CUDA_AWARE"] = before
    reload_config({"CAI_MPI_CHUNK_BYTES": str(request.module.CHUNK_BYTES)})
    try:
        yield comm
    finally:
        reload_config()
        comm.Free()


def pytest_configure(config: pytest.Config) -> None:
    global _config
    _config = config


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    # This hook sees the whole session's items (also where the GPU tests run with the rest): mark only ours.
    for item in items:
        if HERE in item.path.parents:
            item.add_marker(CAI_MPI_WARNINGS_ONLY)


@pytest.hookimpl(trylast=True)  # after pytest's JUnit writer has taken the report in
def pytest_runtest_logreport(report: pytest.TestReport) -> None:
    if report.when == "teardown" and _config is not None:
        xml = _junit(_config)
        if xml is not None:
            _write_whole(xml)


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]) -> Iterator[None]:
    outcome = yield
    report: pytest.TestReport = outcome.get_result()  # type: ignore[attr-defined]
    if report.failed and MPI.COMM_WORLD.Get_size() > 1:
        _write_junit_now(item.config, report)
        rank = MPI.COMM_WORLD.Get_rank()
        sys.stdout.flush()
        sys.stderr.write(
            f"\n==== rank {rank}: FAILED {item.nodeid} (in {report.when}); aborting MPI_COMM_WORLD ====\n"
            f"{report.longreprtext}\n"
        )
        sys.stderr.flush()
        time.sleep(0.2)  # (the launcher forwards output asynchronously: give it a moment before the abort ends all)
        MPI.COMM_WORLD.Abort(1)  # the other ranks may be waiting for this one: end them all now
        # MPICH's Abort can return while its launcher ends the job; pytest would then log the failure again.
        os._exit(1)


def _write_junit_now(config: pytest.Config, report: pytest.TestReport) -> None:
    """Write the JUnit report with this failure in it: the abort ends the process before pytest would."""
    xml = _junit(config)
    if xml is not None:
        xml.pytest_runtest_logreport(report)
        _write_whole(xml)


def _write_whole(xml: Any) -> None:
    """Write the JUnit report whole or not at all: another rank's abort may kill this one mid-write."""
    final = xml.logfile
    xml.logfile = f"{final}.partial"
    try:
        xml.pytest_sessionfinish()
    finally:
        xml.logfile = final
    os.replace(f"{final}.partial", final)


def _junit(config: pytest.Config) -> Any:
    """pytest's JUnit writer, where --junitxml asked for one. pytest keeps it under a private key; without it the
    reports are written at the end only, and the run's log still has every failure."""
    try:
        from _pytest.junitxml import xml_key
    except ImportError:
        return None
    return config.stash.get(xml_key, None)
