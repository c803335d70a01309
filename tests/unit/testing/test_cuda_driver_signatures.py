"""The driver double cannot drift from the real API: every function it defines exists in cuda-bindings with the
same parameters, and the enums, constants and structs the runtime uses have the real values and fields.

cuda-python imports without a GPU; CI installs it (the ``test`` extra), so this runs there."""

from __future__ import annotations

import inspect
from typing import Any

import pytest

from cai_mpi.testing import CudaDriverDouble

driver: Any = pytest.importorskip("cuda.bindings.driver", reason="cuda-python is not installed")

DOUBLE_FUNCTIONS = sorted(n for n in dir(CudaDriverDouble) if n.startswith("cu") and callable(getattr(CudaDriverDouble,
                                                                                                      n)))


def parameters(fn: Any) -> list[str]:
    return [p for p in inspect.signature(fn).parameters if p != "self"]


def test_the_double_defines_what_the_runtime_calls() -> None:
    assert len(DOUBLE_FUNCTIONS) >= 38


@pytest.mark.parametrize("name", DOUBLE_FUNCTIONS)
def test_same_function_same_parameters(name: str) -> None:
    real = getattr(driver, name, None)
    assert real is not None, f"{name} is not a function of cuda.bindings.driver"
    assert parameters(getattr(CudaDriverDouble, name)) == parameters(real)


@pytest.mark.parametrize(
    "enum_name",
    ["CUresult", "CUpointer_attribute", "CUmemorytype", "CUstream_flags", "CUevent_flags", "CUdevice_attribute"],
)
def test_enum_members_have_the_real_values(enum_name: str) -> None:
    real = getattr(driver, enum_name)
    for member in getattr(CudaDriverDouble, enum_name):
        assert int(getattr(real, member.name)) == int(member), member


def test_constants_and_the_2d_copy_struct() -> None:
    for name in ("CU_MEMHOSTALLOC_PORTABLE", "CU_MEMHOSTALLOC_DEVICEMAP", "CU_MEMHOSTALLOC_WRITECOMBINED",
                 "CU_STREAM_LEGACY", "CU_STREAM_PER_THREAD"):
        assert int(getattr(driver, name)) == getattr(CudaDriverDouble, name), name
    assert int(driver.CUmemAttach_flags.CU_MEM_ATTACH_GLOBAL) == CudaDriverDouble.CU_MEM_ATTACH_GLOBAL
    real_fields = {f for f in dir(driver.CUDA_MEMCPY2D()) if not f.startswith("_")}
    ours = {f for f in dir(CudaDriverDouble.CUDA_MEMCPY2D()) if not f.startswith("_")}
    assert ours <= real_fields, ours - real_fields


@pytest.mark.parametrize("handle", ["CUdeviceptr", "CUstream", "CUevent", "CUcontext", "CUdevice"])
def test_handles_behave_alike(handle: str) -> None:
    real, ours = getattr(driver, handle), getattr(CudaDriverDouble, handle)
    assert int(ours(7)) == int(real(7)) == 7
    assert (ours(7) == ours(7)) == (real(7) == real(7))  # by value for some handles, by identity for others
    assert (ours(7) == 7) == (real(7) == 7) is False


def outcome(struct: Any, field: str, value: Any) -> Any:
    """What setting ``field`` to ``value`` does: the exception's type, or the value read back as an int, or
    ``("read", exception type)`` when the value was taken but reading it raises (a memory type that is none)."""
    try:
        setattr(struct, field, value)
    except (OverflowError, TypeError, ValueError) as exc:
        return type(exc)
    try:
        return int(getattr(struct, field))
    except ValueError as exc:
        return ("read", type(exc))


@pytest.mark.parametrize("field", ["srcXInBytes", "srcY", "srcPitch", "dstXInBytes", "dstY", "dstPitch", "WidthInBytes",
                                   "Height", "srcDevice", "dstDevice", "srcHost", "dstHost", "srcMemoryType",
                                   "dstMemoryType"])
@pytest.mark.parametrize("value", [-8, -1, 0, 2, 1 << 31, (1 << 64) - 1, 1 << 64, "8", None])
def test_2d_copy_struct_fields_take_what_the_real_ones_take(field: str, value: Any) -> None:
    """A negative pitch (a reversed axis) or an oversized one fails as it does in cuda-bindings: the double may
    refuse more than the real struct (it is strict), never less."""
    real, ours = outcome(driver.CUDA_MEMCPY2D(), field, value), outcome(CudaDriverDouble.CUDA_MEMCPY2D(), field, value)
    assert ours == real or isinstance(ours, type), (field, value, real, ours)
    if isinstance(value, int) and (value < 0 or value >= 1 << 64):
        assert ours == real, (field, value, real, ours)
