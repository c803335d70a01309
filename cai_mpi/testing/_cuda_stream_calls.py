"""Streams and events of the CUDA driver double: CUDA's handle conventions and legacy-default-stream order."""

from __future__ import annotations

import threading
from typing import Any

from ._cuda_streams import DONE, Fence, Stream
from ._cuda_types import CUcontext as _CUcontext
from ._cuda_types import CUevent as _CUevent
from ._cuda_types import CUresult as _CUresult
from ._cuda_types import CUstream as _CUstream
from ._cuda_types import CUstream_flags as _CUstream_flags
from ._cuda_types import value as _value

__all__ = ["StreamCalls"]


class StreamCalls:
    """The stream and event calls of the double (mixed into ``CudaDriverDouble``)."""

    _lock: threading.RLock
    _tls: threading.local
    _streams: dict[int, Stream]
    _legacy: dict[int, Stream]
    _events: dict[int, Fence]
    _event_contexts: dict[int, int]  # event -> the context it was created in
    _destroyed_streams: list[int]  # handles of destroyed streams and events, handed out again first
    _destroyed_events: list[int]
    lazy: float
    eager: bool

    def _enter(self, name: str, *, needs_init: bool = True, needs_context: bool = False) -> _CUresult | None:
        raise NotImplementedError

    def _current(self) -> int:
        raise NotImplementedError

    def _handle(self) -> int:
        raise NotImplementedError

    def _poisoned_after_wait(self, context: int | None = None) -> _CUresult | None:
        raise NotImplementedError


    def _all_streams(self) -> list[Stream]:
        with self._lock:
            return [*self._streams.values(), *self._legacy.values()]

    def _legacy_of(self, ctx: int) -> Stream:
        with self._lock:
            stream = self._legacy.get(ctx)
            if stream is None:
                stream = self._legacy[ctx] = Stream(1, ctx, True, f"legacy-default-{ctx:#x}", self.lazy, self.eager)
            return stream

    def _stream(self, handle: Any) -> Stream | None:
        """The stream a handle names for the calling thread (0/1: legacy, 2: per-thread default)."""
        value = _value(handle)
        ctx = self._current()
        if value in (0, 1):
            return self._legacy_of(ctx) if ctx else None
        if value == 2:
            if not ctx:
                return None
            per_thread: dict[int, Stream] | None = getattr(self._tls, "per_thread", None)
            if per_thread is None:
                per_thread = self._tls.per_thread = {}
            stream = per_thread.get(ctx)
            if stream is None:
                name = f"per-thread-default-{threading.get_ident()}"
                stream = per_thread[ctx] = Stream(2, ctx, True, name, self.lazy, self.eager)
                with self._lock:
                    self._streams[id(stream)] = stream
            return stream
        return self._streams.get(value)

    def _implicit(self, stream: Stream) -> list[Fence]:
        """What ``stream`` must wait for besides its own order: CUDA's legacy default stream semantics."""
        if not stream.blocking:
            return []
        if stream.handle == 1:  # legacy: after every blocking stream of its context
            return [s.tail for s in self._all_streams()
                    if s.blocking and s.context == stream.context and s is not stream]
        return [self._legacy_of(stream.context).tail]

    def _reused(self, destroyed: list[int]) -> int:
        """A handle for a new stream or event: the one destroyed last, as CUDA may hand it out again (using a
        destroyed handle is undefined there; here it names the next stream or event made), else a fresh one."""
        with self._lock:
            if destroyed:
                return destroyed.pop()
        return self._handle()

    def cuStreamCreate(self, Flags: int) -> tuple[_CUresult, _CUstream | None]:
        failure = self._enter("cuStreamCreate", needs_context=True)
        if failure:
            return failure, None
        handle = self._reused(self._destroyed_streams)
        blocking = not int(Flags) & _CUstream_flags.CU_STREAM_NON_BLOCKING
        with self._lock:
            self._streams[handle] = Stream(handle, self._current(), blocking, f"stream-{handle:#x}", self.lazy,
                                          self.eager)
        return _CUresult.CUDA_SUCCESS, _CUstream(handle)

    def cuStreamDestroy(self, hStream: Any) -> tuple[_CUresult]:
        failure = self._enter("cuStreamDestroy")
        with self._lock:
            stream = self._streams.pop(_value(hStream), None) if _value(hStream) > 2 else None
        if failure is None and stream is None:
            failure = _CUresult.CUDA_ERROR_INVALID_HANDLE
        if failure is None:
            assert stream is not None
            stream.close()
            with self._lock:
                self._destroyed_streams.append(stream.handle)
        return (failure or _CUresult.CUDA_SUCCESS,)

    def _on_stream(self, name: str, hStream: Any) -> tuple[_CUresult | None, Stream | None]:
        failure = self._enter(name, needs_context=_value(hStream) in (0, 1, 2))
        stream = None if failure else self._stream(hStream)
        if failure is None and stream is None:
            failure = _CUresult.CUDA_ERROR_INVALID_HANDLE
        return failure, stream

    def cuStreamSynchronize(self, hStream: Any) -> tuple[_CUresult]:
        """Waits for the operations in the stream only (CUDA's words): the legacy default stream's implicit order
        is taken when an action is queued on a stream, and a synchronize queues none, so work queued on another
        stream after the last such action is not waited for (the legacy stream's included)."""
        failure, stream = self._on_stream("cuStreamSynchronize", hStream)
        if stream is not None:
            stream.tail.wait()
            failure = self._poisoned_after_wait(stream.context)
        return (failure or _CUresult.CUDA_SUCCESS,)

    def cuStreamQuery(self, hStream: Any) -> tuple[_CUresult]:
        failure, stream = self._on_stream("cuStreamQuery", hStream)
        if stream is not None and not stream.tail.is_set():
            failure = _CUresult.CUDA_ERROR_NOT_READY
        return (failure or _CUresult.CUDA_SUCCESS,)

    def cuStreamGetFlags(self, hStream: Any) -> tuple[_CUresult, int | None]:
        failure, stream = self._on_stream("cuStreamGetFlags", hStream)
        if failure or stream is None:
            return failure or _CUresult.CUDA_ERROR_INVALID_HANDLE, None
        return _CUresult.CUDA_SUCCESS, 0 if stream.blocking else int(_CUstream_flags.CU_STREAM_NON_BLOCKING)

    def cuStreamGetCtx(self, hStream: Any) -> tuple[_CUresult, _CUcontext | None]:
        failure, stream = self._on_stream("cuStreamGetCtx", hStream)
        if failure or stream is None:
            return failure or _CUresult.CUDA_ERROR_INVALID_HANDLE, None
        return _CUresult.CUDA_SUCCESS, _CUcontext(stream.context)

    def cuStreamWaitEvent(self, hStream: Any, hEvent: Any, Flags: int) -> tuple[_CUresult]:
        failure, stream = self._on_stream("cuStreamWaitEvent", hStream)
        fence = self._events.get(_value(hEvent))
        if failure is None and fence is None:
            failure = _CUresult.CUDA_ERROR_INVALID_HANDLE
        if failure is None:
            assert stream is not None and fence is not None
            stream.enqueue(lambda: None, [fence, *self._implicit(stream)])
        return (failure or _CUresult.CUDA_SUCCESS,)

    def cuEventCreate(self, Flags: int) -> tuple[_CUresult, _CUevent | None]:
        failure = self._enter("cuEventCreate", needs_context=True)
        if failure:
            return failure, None
        handle = self._reused(self._destroyed_events)
        self._events[handle] = DONE  # an event never recorded is complete
        self._event_contexts[handle] = self._current()
        return _CUresult.CUDA_SUCCESS, _CUevent(handle)

    def cuEventRecord(self, hEvent: Any, hStream: Any) -> tuple[_CUresult]:
        failure, stream = self._on_stream("cuEventRecord", hStream)
        if failure is None and _value(hEvent) not in self._events:
            failure = _CUresult.CUDA_ERROR_INVALID_HANDLE
        if failure is None and stream is not None and self._event_contexts.get(_value(hEvent)) != stream.context:
            failure = _CUresult.CUDA_ERROR_INVALID_HANDLE  # an event is recorded only on a stream of its own context
        if failure is None:
            assert stream is not None
            self._events[_value(hEvent)] = stream.enqueue(lambda: None, self._implicit(stream))
        return (failure or _CUresult.CUDA_SUCCESS,)

    def cuEventSynchronize(self, hEvent: Any) -> tuple[_CUresult]:
        failure = self._enter("cuEventSynchronize")
        fence = self._events.get(_value(hEvent))
        if failure is None and fence is None:
            failure = _CUresult.CUDA_ERROR_INVALID_HANDLE
        if failure is None:
            assert fence is not None
            fence.wait()
            failure = self._poisoned_after_wait()
        return (failure or _CUresult.CUDA_SUCCESS,)

    def cuEventQuery(self, hEvent: Any) -> tuple[_CUresult]:
        failure = self._enter("cuEventQuery")
        fence = self._events.get(_value(hEvent))
        if failure is None and fence is None:
            failure = _CUresult.CUDA_ERROR_INVALID_HANDLE
        if failure is None and not fence.is_set():  # type: ignore[union-attr]
            failure = _CUresult.CUDA_ERROR_NOT_READY
        return (failure or _CUresult.CUDA_SUCCESS,)

    def cuEventDestroy(self, hEvent: Any) -> tuple[_CUresult]:
        failure = self._enter("cuEventDestroy")
        if failure is None and _value(hEvent) not in self._events:
            failure = _CUresult.CUDA_ERROR_INVALID_HANDLE
        if failure is None:
            with self._lock:
                self._event_contexts.pop(_value(hEvent), None)
                self._events.pop(_value(hEvent), None)
                self._destroyed_events.append(_value(hEvent))
        return (failure or _CUresult.CUDA_SUCCESS,)
