"""``Driver.scope``: one message's device calls ask which context is current once, and no answer outlives its scope
(an exception inside, a context switched between two steps, another thread), on the strict driver double."""

from __future__ import annotations

import gc
import threading
from collections.abc import Iterator
from typing import Any

import pytest

from cai_mpi._src.runtime import cudadriver
from cai_mpi._src.runtime.base import LEGACY_STREAM
from cai_mpi._src.runtime.cuda import CudaRuntime
from cai_mpi._src.transport.pieces import in_context_scope
from cai_mpi.testing import CudaDriverDouble


@pytest.fixture
def d(monkeypatch: pytest.MonkeyPatch) -> Iterator[CudaDriverDouble]:
    double = CudaDriverDouble(2, eager=True)
    monkeypatch.setattr(cudadriver, "load_driver", lambda: double)
    monkeypatch.setattr(cudadriver, "load_cupy", lambda: None)
    yield double
    gc.collect()
    double.close()


@pytest.fixture
def rt(d: CudaDriverDouble) -> CudaRuntime:
    return CudaRuntime(0, driver=d)


def make_current(d: CudaDriverDouble, ordinal: int | None) -> Any:
    """The user's choice: GPU ``ordinal``'s primary context current in this thread (None: no context)."""
    assert d.cuInit(0)[0] == 0
    ctx = 0 if ordinal is None else d.cuDevicePrimaryCtxRetain(ordinal)[1]
    assert d.cuCtxSetCurrent(ctx)[0] == 0
    return ctx


def current(d: CudaDriverDouble) -> int:
    return int(d.cuCtxGetCurrent()[1] or 0)


def synchronize_legacy(rt: CudaRuntime, ordinal: int) -> None:
    """A call that needs ``ordinal``'s context current (the legacy stream is the current context's)."""
    rt.sync_stream(LEGACY_STREAM, ordinal)


def test_a_scope_asks_once_and_each_call_runs_in_its_gpus_context(rt: CudaRuntime, d: CudaDriverDouble) -> None:
    ctx0 = make_current(d, 0)
    ctx1 = d.cuDevicePrimaryCtxRetain(1)[1]
    rt.device_count()
    d.calls.clear()
    with rt.context_scope():
        synchronize_legacy(rt, 0)
        synchronize_legacy(rt, 1)  # another GPU: pushed and popped, and the scope knows it
        synchronize_legacy(rt, 0)
        assert rt.current_device() == 0
    where = [(call, ctx) for call, ctx in d.calls if call == "cuStreamSynchronize"]
    assert where == [("cuStreamSynchronize", int(ctx0)), ("cuStreamSynchronize", int(ctx1)),
                     ("cuStreamSynchronize", int(ctx0))]
    assert [call for call, _ in d.calls].count("cuCtxGetCurrent") == 1
    assert current(d) == int(ctx0)


def test_with_no_context_current_each_call_in_a_scope_pushes_and_pops(rt: CudaRuntime, d: CudaDriverDouble) -> None:
    make_current(d, None)
    with rt.context_scope():
        synchronize_legacy(rt, 0)
        synchronize_legacy(rt, 0)
        assert current(d) == 0  # never left bound to a device
    assert [call for call, _ in d.calls].count("cuCtxPushCurrent") == 2


def test_an_exception_inside_a_scope_leaves_no_answer_for_a_later_call(rt: CudaRuntime, d: CudaDriverDouble) -> None:
    make_current(d, 0)
    with pytest.raises(RuntimeError), rt.context_scope():
        synchronize_legacy(rt, 0)
        with rt.driver.on(1):
            raise RuntimeError("inside a pushed context")
    assert current(d) == int(d.cuDevicePrimaryCtxRetain(0)[1])  # the push was undone
    make_current(d, 1)  # the user switches
    assert rt.current_device() == 1
    with rt.context_scope():
        assert rt.current_device() == 1


def test_a_failed_pop_makes_the_scope_ask_again(rt: CudaRuntime, d: CudaDriverDouble) -> None:
    make_current(d, 0)
    with rt.context_scope():
        rt.current_device()
        d.fail_next("cuCtxPopCurrent", d.CUresult.CUDA_ERROR_INVALID_CONTEXT)
        with pytest.raises(Exception, match="cuCtxPopCurrent"), rt.driver.on(1):
            pass
        d.calls.clear()
        rt.current_device()
        assert [call for call, _ in d.calls] == ["cuCtxGetCurrent"]


def test_steps_ask_again_after_each_wait(rt: CudaRuntime, d: CudaDriverDouble) -> None:
    """The user may switch contexts between two resumptions of a request's steps: no scope spans a yield."""
    make_current(d, 0)
    seen = []

    def steps() -> Iterator[Any]:
        seen.append(rt.current_device())
        yield None
        seen.append(rt.current_device())

    wrapped = in_context_scope(rt, steps())  # type: ignore[arg-type]
    next(wrapped)
    make_current(d, 1)
    with pytest.raises(StopIteration):
        next(wrapped)
    assert seen == [0, 1]


def test_a_scope_in_one_thread_answers_nothing_in_another(rt: CudaRuntime, d: CudaDriverDouble) -> None:
    make_current(d, 0)
    found: list[int] = []

    def other() -> None:
        make_current(d, 1)
        found.append(rt.current_device())

    with rt.context_scope():
        assert rt.current_device() == 0
        thread = threading.Thread(target=other)
        thread.start()
        thread.join()
    assert found == [1]
