"""Which GPU holds a pointer, on real GPUs: what the driver double models (a context per allocation, none for
stream-ordered memory, queries from any context) checked against the driver, and cai_mpi's answer per GPU."""

from __future__ import annotations

from typing import Any

import pytest

from cai_mpi._src.errors import CudaError
from cai_mpi._src.runtime import cudadriver
from cai_mpi._src.runtime.base import Location, MemoryKind
from cai_mpi._src.runtime.cuda import CudaRuntime, device_attribution
from cai_mpi._src.runtime.cudadriver import bindings_version, check, ordinal_unreliable, probe

USABLE, REASON = probe()

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not USABLE, reason=f"no usable CUDA GPU: {REASON}"),
]


def attributes(drv: Any, ptr: int) -> tuple[int, int, int]:
    """(MEMORY_TYPE, CONTEXT, DEVICE_ORDINAL) of ``ptr``, asked in the current context."""
    a = drv.CUpointer_attribute
    asked = [a.CU_POINTER_ATTRIBUTE_MEMORY_TYPE, a.CU_POINTER_ATTRIBUTE_CONTEXT, a.CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL]
    (values,) = check(drv, "cuPointerGetAttributes", len(asked), asked, ptr)
    return int(values[0]), int(values[1]), cudadriver.signed_ordinal(values[2])


def test_each_gpu_holds_its_own_arrays(rt: CudaRuntime, cp: Any) -> None:
    arrays = []
    for gpu in range(rt.device_count()):
        with cp.cuda.Device(gpu):
            arrays.append(cp.arange(16, dtype=cp.float32))
    assert [rt.locate(a.data.ptr + 4).ordinal for a in arrays] == list(range(rt.device_count()))


def test_device_attribution_is_right_on_every_gpu(rt: CudaRuntime) -> None:
    report = device_attribution(rt)
    assert all("error" not in g and g["located"] == g["gpu"] for g in report), report
    if not ordinal_unreliable(bindings_version(rt.driver.drv)):
        assert all(g["reported"] == g["gpu"] for g in report), report


def test_queries_from_another_gpus_context_see_the_owner(rt: CudaRuntime, cp: Any) -> None:
    """The double answers MEMORY_TYPE, CONTEXT and DEVICE_ORDINAL from any context (unified addressing)."""
    if rt.device_count() < 2:
        pytest.skip("needs two GPUs")
    drv = rt.driver.drv
    with cp.cuda.Device(1):
        b = cp.zeros(4)
    with rt.driver.on(0):
        memory_type, context, _ordinal = attributes(drv, b.data.ptr)
    assert memory_type == int(drv.CUmemorytype.CU_MEMORYTYPE_DEVICE)
    assert rt.driver.context_ordinal(context) == 1


def test_stream_ordered_memory_belongs_to_no_context(rt: CudaRuntime, cp: Any) -> None:
    """The double reports CONTEXT NULL for cuMemAllocAsync memory, as CUDA documents; cai_mpi then uses
    DEVICE_ORDINAL (or refuses, under bindings that report 0 for every pointer with several GPUs)."""
    last = rt.device_count() - 1
    with cp.cuda.Device(last):
        pool = cp.cuda.MemoryAsyncPool()
        mem = pool.malloc(256)
        with rt.driver.on(last):
            _type, context, _ordinal = attributes(rt.driver.drv, int(mem.ptr))
        assert context == 0
        if last > 0 and ordinal_unreliable(bindings_version(rt.driver.drv)):
            with pytest.raises(CudaError, match="cannot tell which GPU holds pointer"):
                rt.locate(int(mem.ptr))
        else:
            assert rt.locate(int(mem.ptr)) == Location(MemoryKind.DEVICE, last)
        del mem
        cp.cuda.Device(last).synchronize()
