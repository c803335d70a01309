"""Shared pytest setup: the MPI identity in the header, the runtime reset between tests, inner skips."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from mpi4py import MPI

import cai_mpi  # noqa: F401  (initializes MPI and cai_mpi's private communicator)
from cai_mpi._src.config import reload_config
from cai_mpi._src.runtime import set_runtime
from cai_mpi._src.runtime.host import HostRuntime

_INNER_SKIPS = pytest.StashKey[list[str]]()

# tests/mpi runs under mpiexec (tests/test_under_mpiexec.py starts it); in a single process it would only skip.
collect_ignore = ["mpi"] if MPI.COMM_WORLD.Get_size() == 1 else []


def pytest_report_header(config: pytest.Config) -> list[str]:
    comm = MPI.COMM_WORLD
    return [
        f"MPI: {MPI.Get_library_version().splitlines()[0].strip().strip(chr(0))}",
        f"MPI rank {comm.Get_rank()} of {comm.Get_size()}, thread level {MPI.Query_thread()}",
    ]


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


@pytest.fixture
def inner_skips(request: pytest.FixtureRequest) -> list[str]:
    """Where a test that runs pytest under mpiexec records the inner skips, shown in the summary."""
    return request.config.stash.setdefault(_INNER_SKIPS, [])


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter, exitstatus: int, config: pytest.Config) -> None:
    skips = config.stash.get(_INNER_SKIPS, [])
    if skips:
        terminalreporter.section(f"skipped inside mpiexec runs ({len(skips)})")
        for line in skips:
            terminalreporter.write_line(line)
