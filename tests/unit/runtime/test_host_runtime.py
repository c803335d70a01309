"""HostRuntime: a rank without a GPU, and runtime selection."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

from cai_mpi._src.config import reload_config
from cai_mpi._src.core.descriptor import CAIDescriptor
from cai_mpi._src.errors import RuntimeUnavailableError, StreamError
from cai_mpi._src.runtime import get_runtime, set_runtime
from cai_mpi._src.runtime.base import HOST, Location, MemoryKind
from cai_mpi._src.runtime.host import HostRuntime
from cai_mpi.testing import use_runtime

# =============================================================================================
# HostRuntime


def test_host_runtime_basics() -> None:
    rt = HostRuntime()
    assert (rt.name, rt.device_count(), rt.current_device()) == ("host", 0, None)
    assert rt.locate(np.zeros(3).ctypes.data) == HOST == Location(MemoryKind.HOST, None)
    rt.sync_stream(1, None)  # the default streams have nothing pending without a GPU
    rt.sync_stream(2, 0)
    rt.sync_device(None)


@pytest.mark.parametrize(
    "call",
    [
        lambda rt: rt.alloc_device(8, 0),
        lambda rt: rt.alloc_pinned(8),
        lambda rt: rt.create_stream(0),
        lambda rt: rt.pack(CAIDescriptor.for_new_buffer(0, (0,), np.dtype("f4")), 0, None),
        lambda rt: rt.unpack(0, CAIDescriptor.for_new_buffer(0, (0,), np.dtype("f4")), 0, None),
        lambda rt: rt.copy_async(0, 0, 0, None),
        lambda rt: rt.record_event(None),
        lambda rt: rt.stream_wait_event(1, None, None),
    ],
    ids=["alloc_device", "alloc_pinned", "create_stream", "pack", "unpack", "copy_async", "record_event",
         "stream_wait_event"],
)
def test_device_work_is_refused_with_the_reason(call: Any) -> None:
    with pytest.raises(RuntimeUnavailableError, match="no usable GPU on this rank"):
        call(HostRuntime())


@pytest.mark.parametrize("handle", [3, 0x7F00_1234_5600, 2**64 - 1])
def test_sync_unknown_handle_raises_naming_it(handle: int) -> None:
    with pytest.raises(StreamError, match=f"stream handle {handle:#x} cannot be synchronized") as info:
        HostRuntime().sync_stream(handle, None)
    assert "no usable GPU" in str(info.value)


def test_runtime_selection_by_name_and_environment() -> None:
    with use_runtime("host") as rt:
        assert isinstance(rt, HostRuntime) and get_runtime() is rt
        with use_runtime("simulated") as inner:  # cai_mpi.testing makes the instance: the library knows no such name
            assert type(inner).__name__ == "SimulatedRuntime" and get_runtime() is inner
        assert get_runtime() is rt
    reload_config({"CAI_MPI_RUNTIME": "host"})
    set_runtime(None)
    assert isinstance(get_runtime(), HostRuntime) and get_runtime() is not rt
