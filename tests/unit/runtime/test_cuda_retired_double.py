"""Retired device blocks of the CUDA runtime on the CUDA driver double: a received Array's block goes back to its
pool only once the user work that may read it has passed, without hanging when the garbage collector re-enters,
and without one GPU's failure reaching another."""

from __future__ import annotations

import gc
import threading
from collections.abc import Callable
from typing import Any

import pytest

from cai_mpi._src.runtime.cuda import CudaRuntime
from cai_mpi.testing import CudaDriverDouble

HANG = 30.0  # seconds after which a call that should return at once is declared hung (only a failure waits this)
LAZY = 600.0  # queued device work runs only when something waits for it (no test lives this long)


@pytest.fixture
def d(make_double: Callable[..., CudaDriverDouble]) -> CudaDriverDouble:
    return make_double(2, lazy=LAZY)


def finishes(fn: Callable[[], Any], within: float = HANG) -> bool:
    """Whether ``fn()`` returns (or raises) within ``within`` seconds; run in a thread, so a deadlock fails the test
    instead of hanging the run."""
    worker = threading.Thread(target=fn, daemon=True)
    worker.start()
    worker.join(within)
    return not worker.is_alive()


def pending_kernel(rt: CudaRuntime, d: CudaDriverDouble, ordinal: int) -> None:
    """A user kernel still queued on ``ordinal``'s legacy default stream (the lazy double runs it only on demand)."""
    with rt.driver.on(ordinal):
        d.launch(1, lambda: None)


# -- defect 1: the retired list's lock and the garbage collector -----------------------------------------------------


def test_an_array_collected_while_reap_queries_does_not_hang(
    rt: CudaRuntime, d: CudaDriverDouble, monkeypatch: pytest.MonkeyPatch
) -> None:
    # reap() queries events, which runs Python that allocates; the collector may then finalize a dead received
    # Array in a reference cycle, whose finalizer retires its block (hold) on the same thread.
    gc.disable()
    try:
        second = rt.alloc_device(256, 0, handed_out=True)
        cycle: list[Any] = [second]
        cycle.append(cycle)  # only the collector frees it
        del second, cycle
        first = rt.alloc_device(256, 0, handed_out=True)
        first.free()  # retired
        rt.sync_device(0)  # its events have passed: the next reap queries them
        query = d.cuEventQuery

        def collecting_query(event: Any) -> Any:
            gc.collect()
            return query(event)

        monkeypatch.setattr(d, "cuEventQuery", collecting_query)
        got: list[Any] = []
        assert finishes(lambda: got.append(rt.alloc_device(256, 0)))
        assert got and got[0].ptr
    finally:
        gc.enable()


class CollectingLock:
    """The retired list's lock, running the collector once right after it is first taken: the moment its holder
    allocates (a new deque, a tuple, a list), where the collector may run any finalizer."""

    def __init__(self, lock: Any) -> None:
        self.lock = lock
        self.armed = True

    def acquire(self, blocking: bool = True, timeout: float = -1) -> bool:
        got: bool = self.lock.acquire(blocking, timeout)
        if got and self.armed:
            self.armed = False
            gc.collect()
        return got

    def release(self) -> None:
        self.lock.release()

    def __enter__(self) -> bool:
        return self.acquire()

    def __exit__(self, *exc: object) -> None:
        self.release()


def dead_in_a_cycle(rt: CudaRuntime, ordinal: int, data: bytes, d: CudaDriverDouble) -> int:
    """A received Array's block on ``ordinal``, holding ``data``, left in a reference cycle: only the collector
    retires it (the caller disables it until then). Its address."""
    buf = rt.alloc_device(len(data), ordinal, handed_out=True)
    d.write_device(buf.ptr, data)
    cycle: list[Any] = [buf]
    cycle.append(cycle)
    return buf.ptr


def test_an_array_collected_while_the_retired_list_is_locked_does_not_hang(
    rt: CudaRuntime, d: CudaDriverDouble, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Issue 44: the code holding the lock allocates; the collector may finalize a dead received Array right there,
    # on this thread, and its finalizer retires the block into the same list.
    gc.disable()
    try:
        dead_in_a_cycle(rt, 0, bytes(256), d)
        lock = CollectingLock(rt._retired._lock)
        monkeypatch.setattr(rt._retired, "_lock", lock)
        got: list[Any] = []
        done = finishes(lambda: got.append(rt.alloc_device(256, 0)))
        if not done:  # (let the hung thread go, so that the assertion is the test's only outcome)
            lock.lock.release()
        assert done
        assert got and got[0].ptr
        assert len(rt._retired) == 1  # the dead Array's block is retired (its events are pending), not lost
    finally:
        gc.enable()


# -- issue 44: a collection while ``Driver.on`` switches contexts ----------------------------------------------------


@pytest.mark.parametrize("window", ["before the push", "after the push"])
def test_an_array_collected_while_a_context_is_switched_retires_in_its_own_gpus_context(
    rt: CudaRuntime, d: CudaDriverDouble, monkeypatch: pytest.MonkeyPatch, window: str
) -> None:
    # The user's context is GPU 0's; a call on GPU 1 pushes GPU 1's. A collection inside that switch finalizes a dead
    # Array of GPU 1 (before the push: GPU 1 already marked entered) or of GPU 0 (after it: GPU 0 still noted as
    # current by the scope): its events must be recorded in its own GPU's context.
    assert d.cuInit(0)[0] == 0
    contexts = [d.cuDevicePrimaryCtxRetain(g)[1] for g in (0, 1)]
    assert d.cuCtxSetCurrent(contexts[0])[0] == 0
    dying = 1 if window == "before the push" else 0
    old = bytes(range(256))
    gc.disable()
    try:
        ptr = dead_in_a_cycle(rt, dying, old, d)
        seen = bytearray()
        with rt.driver.on(dying):  # a user kernel still reads the block on its GPU's legacy default stream
            d.launch(1, lambda: seen.extend(d.read_device(ptr, len(old))))
        push, armed = d.cuCtxPushCurrent, [True]

        def collecting_push(ctx: Any) -> Any:
            pushed = None if window == "before the push" else push(ctx)
            if armed:
                armed.clear()
                gc.collect()
            return push(ctx) if pushed is None else pushed

        monkeypatch.setattr(d, "cuCtxPushCurrent", collecting_push)
        d.calls.clear()
        with rt.context_scope():
            rt.sync_stream(1, 1)  # GPU 1's legacy default stream, from GPU 0's context
        recorded = {ctx for name, ctx in d.calls if name == "cuEventRecord"}
    finally:
        gc.enable()
    assert recorded == {int(contexts[dying])}, (recorded, contexts)
    again = rt.alloc_device(len(old), dying)
    d.write_device(again.ptr, b"\xff" * len(old))  # (a receive landing there)
    rt.sync_device(dying)
    assert bytes(seen) == old  # the kernel read the block before anything else was written there
    rt.sync_legacy(dying)  # and GPU ``dying``'s idle events are its own


def test_an_array_collected_while_a_pointers_context_is_asked_its_gpu_retires_in_its_own_gpus_context(
    rt: CudaRuntime, d: CudaDriverDouble, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Placing a pointer whose context this runtime never retained pushes that context to ask its device
    # (Driver.context_ordinal); a collection there finalizes a dead Array of GPU 0 while the scope still notes GPU 0's
    # context as current.
    assert d.cuInit(0)[0] == 0
    contexts = [d.cuDevicePrimaryCtxRetain(g)[1] for g in (0, 1)]
    assert d.cuCtxSetCurrent(contexts[1])[0] == 0
    (ptr,) = d.cuMemAlloc(64)[1:]  # the user's memory on GPU 1, made in its primary context
    assert d.cuCtxSetCurrent(contexts[0])[0] == 0  # and GPU 0's current where cai_mpi is called
    gc.disable()
    try:
        dead_in_a_cycle(rt, 0, bytes(256), d)
        push, armed = d.cuCtxPushCurrent, [True]

        def collecting_push(ctx: Any) -> Any:
            pushed = push(ctx)
            if armed:
                armed.clear()
                gc.collect()
            return pushed

        monkeypatch.setattr(d, "cuCtxPushCurrent", collecting_push)
        d.calls.clear()
        with rt.context_scope():
            assert rt.locate(int(ptr)).ordinal == 1
        recorded = {ctx for name, ctx in d.calls if name == "cuEventRecord"}
    finally:
        gc.enable()
    assert recorded == {int(contexts[0])}, (recorded, contexts)


# -- defect 3: a sticky error on one GPU, and one retirement queue per GPU ------------------------------------------


def test_a_sticky_error_on_one_gpu_leaves_allocation_on_another_working(rt: CudaRuntime, d: CudaDriverDouble) -> None:
    lost = rt.alloc_device(256, 0, handed_out=True)
    lost_ptr = lost.ptr
    lost.free()  # retired, its events recorded on GPU 0
    d.fault(0)  # a kernel on GPU 0 faulted: every call in its context fails from now on
    other = rt.alloc_device(256, 1)  # GPU 1 is fine
    assert other.ptr and other.ordinal == 1
    d.clear_fault(0)  # (a reset) a block whose events could not be asked about is never reused
    again = rt.alloc_device(256, 0)
    assert again.ptr != lost_ptr


def test_a_gpu_with_pending_work_does_not_hold_back_another_gpus_blocks(rt: CudaRuntime, d: CudaDriverDouble) -> None:
    pending_kernel(rt, d, 0)
    busy = rt.alloc_device(256, 0, handed_out=True)
    busy.free()  # retired behind the pending kernel on GPU 0
    idle = rt.alloc_device(256, 1, handed_out=True)
    idle_ptr = idle.ptr
    idle.free()
    rt.sync_device(1)  # every event on GPU 1 has passed
    again = rt.alloc_device(256, 1)
    assert again.ptr == idle_ptr  # reused: GPU 0's pending block is no reason to hold it back


# -- defect 7: retired blocks go back when an Array dies and when memory runs out ----------------------------------


def frees(d: CudaDriverDouble) -> int:
    """How many blocks went back to the driver's stream-ordered pool."""
    return sum(1 for name, _ctx in d.calls if name == "cuMemFreeAsync")


def test_a_dead_arrays_block_goes_back_when_the_next_array_dies(rt: CudaRuntime, d: CudaDriverDouble) -> None:
    first = rt.alloc_device(256, 0, handed_out=True)
    second = rt.alloc_device(256, 0, handed_out=True)
    first.free()
    rt.sync_device(0)  # first's readers are done: nothing needs its block held back any more
    assert frees(d) == 0
    second.free()  # no allocation follows: the first block must not wait for one
    assert frees(d) == 1
    assert len(rt._retired) == 1  # second's events are still pending (the lazy double runs nothing unasked)


def test_an_allocation_that_does_not_fit_waits_for_retired_blocks(rt: CudaRuntime, d: CudaDriverDouble) -> None:
    d.device_memory_bytes = 8192
    first = rt.alloc_device(8192, 0, handed_out=True)
    old = bytes(range(256)) * 32
    d.write_device(first.ptr, old)
    seen = bytearray()
    ptr = first.ptr
    with rt.driver.on(0):  # a user kernel still reads the block on the legacy default stream
        d.launch(1, lambda: seen.extend(d.read_device(ptr, 8192)))
    first.free()  # retired behind that kernel
    second = rt.alloc_device(8192, 0)  # the device has no room but the retired block's
    assert second.ptr
    d.write_device(second.ptr, b"\xff" * 8192)
    assert bytes(seen) == old  # the kernel finished reading before the block was handed out again
