"""Set-up shared by the CUDA runtime tests on the driver double: doubles made for a test, installed where
cuda-python's driver module is loaded, and closed after it; the runtime of GPU 0 over the test's double ``d``."""

from __future__ import annotations

import gc
from collections.abc import Callable, Iterator
from typing import Any

import pytest

from cai_mpi._src.runtime import cudadriver
from cai_mpi._src.runtime.cuda import CudaRuntime
from cai_mpi.testing import CudaDriverDouble


@pytest.fixture
def make_double(monkeypatch: pytest.MonkeyPatch) -> Iterator[Callable[..., CudaDriverDouble]]:
    """``make_double(*args, install=True, **kwargs)``: a ``CudaDriverDouble(*args, **kwargs)``; installed, it is
    what the runtime loads as the driver (and CuPy is not used: it would call the real driver)."""
    made: list[CudaDriverDouble] = []

    def make(*args: Any, install: bool = True, **kwargs: Any) -> CudaDriverDouble:
        double = CudaDriverDouble(*args, **kwargs)
        made.append(double)
        if install:
            monkeypatch.setattr(cudadriver, "load_driver", lambda: double)
            monkeypatch.setattr(cudadriver, "load_cupy", lambda: None)
        return double

    yield make
    gc.collect()  # finalizers (stream, event, memory) run while the double is alive
    for double in made:
        double.close()


@pytest.fixture
def rt(d: CudaDriverDouble) -> CudaRuntime:
    return CudaRuntime(0, driver=d)
