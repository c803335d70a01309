"""Shared pytest setup: the MPI identity in the header, the runtime reset between tests, and a summary of what
ran where: in this process, under mpiexec at which world sizes (with the inner skips), and what was not collected
here and why (MPI-only tests in one process, GPU tests without a GPU), said once instead of once per test."""

from __future__ import annotations

import importlib.util
import os
import re
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from mpi4py import MPI

import cai_mpi  # noqa: F401  (initializes MPI and cai_mpi's private communicator)
from cai_mpi._src.config import reload_config
from cai_mpi._src.runtime import set_runtime
from cai_mpi._src.runtime.host import HostRuntime

_INNER_SKIPS = pytest.StashKey[list[str]]()
_MPIEXEC_RUNS = pytest.StashKey[list[str]]()
_NOT_HERE = pytest.StashKey[list[str]]()

ONE_PROCESS = MPI.COMM_WORLD.Get_size() == 1
# tests/mpi runs under mpiexec (tests/test_under_mpiexec.py starts it); in a single process it would only skip.
collect_ignore = ["mpi"] if ONE_PROCESS else []


def mpi_library() -> str:
    return MPI.Get_library_version().splitlines()[0].strip().strip(chr(0))


def pytest_report_header(config: pytest.Config) -> list[str]:
    comm = MPI.COMM_WORLD
    lines = [f"MPI: {mpi_library()}",
             f"MPI rank {comm.Get_rank()} of {comm.Get_size()}, thread level {MPI.Query_thread()}"]
    if ONE_PROCESS:
        lines.append("tests/mpi: not collected in one process; tests/test_under_mpiexec.py runs them under mpiexec")
    return lines


def _world_sizes() -> set[int] | None:
    """``CAI_MPI_TEST_WORLD_SIZES`` ("2,4"): the world sizes of the tests that start mpiexec runs; None: all."""
    text = os.environ.get("CAI_MPI_TEST_WORLD_SIZES", "").strip()
    if not text:
        return None
    try:
        return {int(n) for n in text.split(",")}
    except ValueError:
        raise pytest.UsageError(f"CAI_MPI_TEST_WORLD_SIZES={text!r}: give world sizes separated by commas, "
                                "as in 2,4") from None


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Tests that cannot run in this process are deselected and named once in the summary, not skipped one by one."""
    sizes = _world_sizes()
    if sizes is not None:  # (scripts/test.sh: 3 ranks with one wheel, 4 with the other, to keep CI short)
        _deselect(config, items, [item for item in items if _nprocs(item) not in (None, *sizes)],
                  f"at a world size not in CAI_MPI_TEST_WORLD_SIZES={','.join(map(str, sorted(sizes)))}")
    if os.environ.get("CAI_MPI_TEST_SKIP_ONE_WHEEL"):
        _deselect(config, items, [item for item in items if item.get_closest_marker("one_wheel")],
                  "marked one_wheel: they cannot depend on the MPI library and ran with the other wheel")
    if ONE_PROCESS and not config.getoption("with_mpi", False):
        # pytest-mpi would skip each with "need --with-mpi"; they belong in tests/mpi, which runs under mpiexec.
        _deselect(config, items, [item for item in items if item.get_closest_marker("mpi")],
                  "marked mpi: they run under mpiexec (tests/test_under_mpiexec.py), not in one process")
    gpu = [item for item in items if item.get_closest_marker("gpu")]
    if gpu and not re.search(r"(?<!not )\bgpu\b", config.getoption("markexpr")):
        # Unless asked for by -m gpu (scripts/test-gpu.sh, the driver double's run): then each says why it skips.
        from cai_mpi._src.runtime.cudadriver import probe

        usable, reason = probe()
        if not usable:
            _deselect(config, items, gpu, f"marked gpu: no usable CUDA GPU here ({reason}); on a GPU node run "
                                          "bash scripts/test-gpu.sh")


def _nprocs(item: pytest.Item) -> int | None:
    """The world size a test's ``nprocs`` parameter asks for, if it has one."""
    callspec = getattr(item, "callspec", None)
    nprocs = callspec.params.get("nprocs") if callspec is not None else None
    return nprocs if isinstance(nprocs, int) else None


def _deselect(config: pytest.Config, items: list[pytest.Item], chosen: list[pytest.Item], why: str) -> None:
    if not chosen:
        return
    gone = set(chosen)
    items[:] = [item for item in items if item not in gone]
    config.hook.pytest_deselected(items=chosen)
    config.stash.setdefault(_NOT_HERE, []).append(f"{len(chosen)} tests {why}")


@pytest.fixture(autouse=True)
def _fresh_runtime_and_config(request: pytest.FixtureRequest) -> Iterator[None]:
    """Each test starts from the environment's configuration, on the host runtime: placement is pinned to host
    memory, as the tests mean it, also where cuda-python sees a GPU (received arrays would land on it).
    ``gpu``-marked tests get the automatically chosen runtime; tests of device paths install their own."""
    previous = set_runtime(None if request.node.get_closest_marker("gpu") else HostRuntime())
    reload_config()
    yield
    set_runtime(previous)
    reload_config()


@pytest.fixture(scope="session")
def mpicount(tmp_path_factory: pytest.TempPathFactory) -> tuple[Any, Path]:
    """``(scripts/bench/collective_traffic.py as a module, the PMPI counter it built)``: what counts the MPI calls
    of a program under mpiexec (tests/test_traffic.py, tests/test_pipeline_traffic.py)."""
    mpicc = Path(sys.prefix) / "bin" / "mpicc"
    if "MPICH" not in MPI.Get_library_version() or not mpicc.exists():
        pytest.skip("the PMPI counter is built with the MPICH wheel's mpicc (Open MPI 5's mpi.h lacks the "
                    "large-count PMPI calls mpi4py makes); the MPICH run of the suite counts")
    root = Path(__file__).resolve().parent.parent
    spec = importlib.util.spec_from_file_location("collective_traffic", root / "scripts/bench/collective_traffic.py")
    assert spec is not None and spec.loader is not None
    traffic = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(traffic)
    return traffic, traffic.build(mpicc, tmp_path_factory.mktemp("mpicount") / "libmpicount.so")


@pytest.fixture
def inner_skips(request: pytest.FixtureRequest) -> list[str]:
    """Where a test that runs pytest under mpiexec records the inner skips, shown in the summary."""
    return request.config.stash.setdefault(_INNER_SKIPS, [])


@pytest.fixture
def mpiexec_runs(request: pytest.FixtureRequest) -> list[str]:
    """Where a test that runs pytest under mpiexec says what ran there (world size, counts), shown in the summary."""
    return request.config.stash.setdefault(_MPIEXEC_RUNS, [])


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter, exitstatus: int, config: pytest.Config) -> None:
    runs, not_here = config.stash.get(_MPIEXEC_RUNS, []), config.stash.get(_NOT_HERE, [])
    if ONE_PROCESS and (runs or not_here):
        terminalreporter.section("what ran where")
        terminalreporter.write_line(f"MPI: {mpi_library()}")
        terminalreporter.write_line(f"in this process (1 rank): {_counts(terminalreporter)}")
        for line in runs:
            terminalreporter.write_line(line)
        for line in not_here:
            terminalreporter.write_line(f"not collected here: {line}")
    skips = config.stash.get(_INNER_SKIPS, [])
    if skips:
        terminalreporter.section(f"skipped inside mpiexec runs ({len(skips)})")
        for line in skips:
            terminalreporter.write_line(line)


def _counts(terminalreporter: pytest.TerminalReporter) -> str:
    counts = {word: len(terminalreporter.stats.get(word, [])) for word in ("passed", "failed", "error", "skipped")}
    return ", ".join(f"{n} {word}" for word, n in counts.items() if n) or "no tests"
