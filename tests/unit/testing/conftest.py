"""Fixtures shared by the tests of cai_mpi.testing."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from cai_mpi._src.errors import StreamError
from cai_mpi.testing import SimulatedStream


@pytest.fixture
def stream() -> Iterator[SimulatedStream]:
    """A simulated stream, closed afterwards (a second close if the first reports a pending failure)."""
    s = SimulatedStream("test-stream")
    yield s
    try:
        s.close()
    except StreamError:
        s.close()
