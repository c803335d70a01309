"""The streams a received device Array's users compute on, on the CUDA driver double: the stream an Array names
lives as long as the Array, and its block is reused only once the work on every stream that may read it has
passed (the caller's current streams at receive time, and each stream a DLPack consumer named)."""

from __future__ import annotations

import gc
import weakref
from collections.abc import Callable
from typing import Any

import numpy as np
import pytest

from cai_mpi._src.arrays.array import Array
from cai_mpi._src.runtime.cuda import CudaRuntime
from cai_mpi.testing import CudaDriverDouble, use_runtime

CUresult = CudaDriverDouble.CUresult
LAZY = 600.0  # queued device work runs only when something waits for it (no test lives this long)


@pytest.fixture
def d(make_double: Callable[..., CudaDriverDouble]) -> CudaDriverDouble:
    return make_double(2, lazy=LAZY)


class UsersStream:
    """What ``cupy.cuda.Stream()`` or ``torch.cuda.Stream()`` is: a stream the user owns, destroyed when the object
    is collected (``ptr``: its handle)."""

    def __init__(self, rt: CudaRuntime, *, blocking: bool = True) -> None:
        flags = 0 if blocking else 1  # CU_STREAM_DEFAULT or CU_STREAM_NON_BLOCKING
        with rt.driver.on(0):
            (handle,) = rt.driver.check("cuStreamCreate", flags)
        self.ptr = int(handle)
        weakref.finalize(self, rt.driver.release, 0, "cuStreamDestroy", self.ptr)


def current_is(rt: CudaRuntime, streams: list[UsersStream]) -> None:
    """The caller's current stream (CuPy's, as ``with stream:`` sets it) is ``streams[0]`` while the list holds it."""
    rt._stream_sources = (lambda ordinal: (streams[0].ptr, streams[0]) if streams else None,)


def alive(rt: CudaRuntime, d: CudaDriverDouble, handle: int) -> bool:
    with rt.driver.on(0):
        return d.cuStreamQuery(handle)[0] in (CUresult.CUDA_SUCCESS, CUresult.CUDA_ERROR_NOT_READY)


# -- defect 5: the stream an Array names lives as long as the Array --------------------------------------------------


def test_a_received_array_keeps_the_stream_it_names_alive(rt: CudaRuntime, d: CudaDriverDouble) -> None:
    current = [UsersStream(rt)]
    handle = current[0].ptr
    current_is(rt, current)
    a = Array.from_device(rt.alloc_device(256, 0, handed_out=True), (32,), np.dtype("f8"))
    assert a.__cuda_array_interface__["stream"] == handle
    current.clear()  # the user's ``with stream:`` block ends and the stream object is dropped
    gc.collect()
    assert alive(rt, d, handle)  # to_host, forwarding and consumers of ``a`` still name it
    with use_runtime(rt):
        assert a.to_host().nbytes == 256
    del a
    gc.collect()
    assert not alive(rt, d, handle)  # and it goes with the Array


# -- defect 6: every stream known to read a received block holds it back -------------------------------------------


def pending_read(rt: CudaRuntime, d: CudaDriverDouble, stream: int, ptr: int, nbytes: int) -> bytearray:
    """A user kernel on ``stream`` that copies ``nbytes`` at ``ptr`` (the lazy double runs it only on demand)."""
    seen = bytearray()
    with rt.driver.on(0):
        d.launch(stream, lambda: seen.extend(d.read_device(ptr, nbytes)))
    return seen


def reuse_after_death(rt: CudaRuntime, d: CudaDriverDouble, old: bytes) -> None:
    """Once the legacy default stream's work has run, the next allocation is written at once (as a receive lands)."""
    rt.sync_legacy(0)  # every blocking stream's work, and the events on the legacy default stream, have passed
    again = rt.alloc_device(len(old), 0)
    d.write_device(again.ptr, b"\xff" * len(old))
    rt.sync_device(0)


def test_a_block_a_dlpack_consumer_reads_on_its_stream_is_not_reused_under_it(
    rt: CudaRuntime, d: CudaDriverDouble
) -> None:
    # torch.from_dlpack(a) on a side stream S passes stream=S: the consumer's kernels on S read the block after the
    # Array (and the tensor) are gone.
    side = UsersStream(rt, blocking=False)
    old = bytes(range(256)) * 32
    buf = rt.alloc_device(len(old), 0, handed_out=True)
    d.write_device(buf.ptr, old)
    a = Array.from_device(buf, (len(old) // 8,), np.dtype("f8"))
    with use_runtime(rt):
        capsule = a.__dlpack__(stream=side.ptr)
    seen = pending_read(rt, d, side.ptr, buf.ptr, len(old))
    del a, buf, capsule  # the consumer is done with the Array; its kernel on S is not
    gc.collect()
    reuse_after_death(rt, d, old)
    assert bytes(seen) == old


def test_a_block_read_on_pytorchs_current_stream_is_not_reused_under_it(
    rt: CudaRuntime, d: CudaDriverDouble, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Inside ``with torch.cuda.stream(s):`` a received Array is read on s (PyTorch's side streams are non-blocking).
    side = UsersStream(rt, blocking=False)

    class Cuda:
        @staticmethod
        def is_initialized() -> bool:
            return True

        @staticmethod
        def current_stream(device: int) -> Any:
            return type("TorchStream", (), {"cuda_stream": side.ptr, "device_index": device})()

    torch = type("torch", (), {"cuda": Cuda})
    monkeypatch.setattr(rt, "_load_torch", lambda: torch, raising=False)
    old = bytes(range(256)) * 32
    buf = rt.alloc_device(len(old), 0, handed_out=True)
    d.write_device(buf.ptr, old)
    seen = pending_read(rt, d, side.ptr, buf.ptr, len(old))
    del buf
    gc.collect()
    reuse_after_death(rt, d, old)
    assert bytes(seen) == old


# -- issue 44: a DLPack consumer's stream destroyed before the Array dies --------------------------------------------


@pytest.mark.parametrize("handle_reused", [False, True])
def test_a_dlpack_consumers_stream_destroyed_before_the_array_dies_is_not_used_then(
    rt: CudaRuntime, d: CudaDriverDouble, monkeypatch: pytest.MonkeyPatch, handle_reused: bool
) -> None:
    # cupy.from_dlpack(a) inside ``with s:`` on a stream the program drops (and CUDA destroys) before a dies. Using
    # its handle then is undefined in CUDA: it may name nothing, or a stream made since. Nor may a finalizer wait
    # for the whole device.
    side = UsersStream(rt, blocking=False)
    handle = side.ptr
    buf = rt.alloc_device(256, 0, handed_out=True)
    a = Array.from_device(buf, (32,), np.dtype("f8"))
    with use_runtime(rt):
        capsule = a.__dlpack__(stream=handle)
    del capsule, buf
    pending_read(rt, d, handle, a.descriptor.ptr, 256)
    del side
    gc.collect()  # the stream is destroyed (the double runs its pending work at once, as CUDA lets it finish)
    later = UsersStream(rt) if handle_reused else None
    assert later is None or later.ptr == handle  # (the double hands the handle out again, as CUDA may)
    used: list[int] = []
    record = d.cuEventRecord

    def recording(event: Any, stream: Any) -> Any:
        used.append(int(stream))
        return record(event, stream)

    monkeypatch.setattr(d, "cuEventRecord", recording)
    d.calls.clear()
    del a
    gc.collect()
    assert handle not in used, used
    assert "cuCtxSynchronize" not in {name for name, _ctx in d.calls}, d.calls


def test_a_dlpack_consumers_current_stream_lives_as_long_as_the_array(rt: CudaRuntime, d: CudaDriverDouble) -> None:
    # cupy.from_dlpack(a) inside ``with s:`` names s, CuPy's current stream: the Array keeps s alive, so the event
    # at its death is recorded on s itself, whatever the program did with s meanwhile.
    current_is(rt, [])
    old = bytes(range(256)) * 32
    buf = rt.alloc_device(len(old), 0, handed_out=True)
    d.write_device(buf.ptr, old)
    a = Array.from_device(buf, (len(old) // 8,), np.dtype("f8"))
    current = [UsersStream(rt, blocking=False)]
    handle = current[0].ptr
    current_is(rt, current)
    with use_runtime(rt):
        capsule = a.__dlpack__(stream=handle)
    seen = pending_read(rt, d, handle, buf.ptr, len(old))
    current.clear()  # the ``with s:`` block ends and the program drops s
    del capsule, buf
    gc.collect()
    assert alive(rt, d, handle)  # the Array still holds it
    del a
    gc.collect()
    reuse_after_death(rt, d, old)
    assert bytes(seen) == old
