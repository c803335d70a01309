"""Where a reduction runs (docs/collectives.md, "Reductions"): device arrays are reduced on the device by a
CUDA-aware MPI, with no copy, when the result goes to device memory too; a result that goes to host memory
(``out=`` a host array) gets the input staged to the host first. The real CUDA runtime on the driver double, one
rank (a survivor of the mutation run: a reduction that staged everything, or nothing, gave the same numbers and
passed every test, docs/testing.md)."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import numpy as np
import pytest
from mpi4py import MPI

import cai_mpi
from cai_mpi._src.config import reload_config
from cai_mpi._src.runtime.cuda import CudaRuntime
from cai_mpi.testing import DoubleDeviceArray, double_runtime, use_runtime

DATA = np.arange(4096, dtype="<f8")


@pytest.fixture
def aware(monkeypatch: pytest.MonkeyPatch) -> Iterator[CudaRuntime]:
    """A CUDA-aware MPI: device memory MPI may read directly."""
    monkeypatch.setenv("CAI_MPI_CUDA_AWARE", "1")
    reload_config({"CAI_MPI_INLINE_BYTES": "0"})
    rt = double_runtime(cuda_aware=True)
    comm = MPI.COMM_SELF.Dup()  # CUDA-awareness is detected once per communicator: a fresh one sees the setting
    rt.comm = comm  # type: ignore[attr-defined]
    with use_runtime(rt):
        yield rt  # type: ignore[misc]
    comm.Free()
    reload_config()
    rt.driver_double.close()  # type: ignore[attr-defined]


def copies_during(rt: CudaRuntime, call: Any) -> tuple[Any, list[str]]:
    calls = rt.driver_double.calls  # type: ignore[attr-defined]
    before = len(calls)
    result = call()
    return result, [name for name, _ in calls[before:] if name.startswith("cuMemcpy")]


def test_device_arrays_are_reduced_on_the_device_without_a_copy(aware: CudaRuntime) -> None:
    x = DoubleDeviceArray(aware, DATA)
    got, copies = copies_during(aware, lambda: cai_mpi.allreduce_array(x, comm=aware.comm))
    assert copies == [], f"a CUDA-aware reduction of device arrays staged its data: {copies}"
    assert isinstance(got, cai_mpi.Array) and got.device != "cpu"
    aware.sync_device(0)
    assert aware.driver_double.read_device(got.descriptor.ptr, got.nbytes) == DATA.tobytes()  # type: ignore[attr-defined]


def test_a_result_in_host_memory_is_reduced_on_the_host(aware: CudaRuntime) -> None:
    x = DoubleDeviceArray(aware, DATA)
    out = np.zeros_like(DATA)
    _, copies = copies_during(aware, lambda: cai_mpi.allreduce_array(x, comm=aware.comm, out=out))
    assert copies, "a device input reduced into host memory was handed to MPI without staging"
    assert out.tobytes() == DATA.tobytes()


@pytest.mark.parametrize("call", ["allreduce_array", "reduce_array", "allreduce_init", "allreduce_arrays",
                                  "allreduce_init(list)"])
def test_a_device_array_in_swapped_byte_order_is_refused_by_every_reduction(call: str) -> None:
    """MPI reduces native values; host data is converted, device data must be converted by its own library: every
    form of reduction says so, with the dtype to convert to (one rule, ``reduce_ops.native_dtype``)."""
    from cai_mpi.testing import FakeCudaArray, SimulatedRuntime

    with use_runtime(SimulatedRuntime()):
        x = FakeCudaArray(np.arange(4, dtype=">f8"), device=True)
        run = {
            "allreduce_array": lambda: cai_mpi.allreduce_array(x, comm=MPI.COMM_SELF),
            "reduce_array": lambda: cai_mpi.reduce_array(x, root=0, comm=MPI.COMM_SELF),
            "allreduce_init": lambda: cai_mpi.allreduce_init(x, comm=MPI.COMM_SELF),
            "allreduce_arrays": lambda: cai_mpi.allreduce_arrays([x], comm=MPI.COMM_SELF),
            "allreduce_init(list)": lambda: cai_mpi.allreduce_init([np.ones(2), x], comm=MPI.COMM_SELF),
        }[call]
        with pytest.raises(TypeError, match=r"device array of dtype >f8 is not in native byte order.*convert it on "
                                            r"the device first \(to <f8\)"):
            run()
        # and the same values in native order reduce as usual
        assert np.array_equal(cai_mpi.allreduce_array(FakeCudaArray(np.arange(4, dtype="<f8"), device=True),
                                                      comm=MPI.COMM_SELF).numpy(), np.arange(4.0))
