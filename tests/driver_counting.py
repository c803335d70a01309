"""What the tests that count CUDA driver calls per message share (tests/unit/runtime/test_driver_call_budget.py for
one rank, tests/mpi/test_driver_budget_mpi.py between two): cai_mpi's CUDA runtime on a fresh driver double, the
user's context current, as CuPy or PyTorch leave it, and the library's settings as a user has them.

The double runs in ``eager`` mode (device work has run when its call returns), so every query finds its work done
at the first ask and the counts do not depend on timing: they are what a message costs when the GPU keeps up.
"""

from __future__ import annotations

import contextlib
import gc
from collections.abc import Iterator
from typing import Any

from cai_mpi.testing import CudaDriverDouble, double_runtime, use_runtime


@contextlib.contextmanager
def user_context_on_double(*, cuda_aware: bool = False) -> Iterator[tuple[Any, CudaDriverDouble]]:
    """``(runtime, driver double)``: the runtime in use, over a new eager double whose calls (``d.calls``) the test
    counts; the double is closed on leaving, after the finalizers that free device memory ran while it was open."""
    rt = double_runtime(cuda_aware=cuda_aware, eager=True)
    d: CudaDriverDouble = rt.driver_double  # type: ignore[attr-defined]
    try:
        with use_runtime(rt):
            assert d.cuInit(0)[0] == 0
            _err, ctx = d.cuDevicePrimaryCtxRetain(0)
            assert d.cuCtxSetCurrent(ctx)[0] == 0  # the user's context current
            yield rt, d
            gc.collect()
    finally:
        gc.collect()
        d.close()
