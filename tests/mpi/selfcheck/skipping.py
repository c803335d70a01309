"""Run only by tests/test_under_mpiexec.py: one test passes, one skips with a reason the outer run must show."""

import pytest


def test_passes() -> None:
    assert 1 + 1 == 2


def test_skips() -> None:
    pytest.skip("selfcheck: a reason the outer run reports")
