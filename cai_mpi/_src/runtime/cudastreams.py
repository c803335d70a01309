"""The CUDA runtime's streams and events: the contexts its calls run in, the producer's and the user's streams
(synchronized, waited on, named), and cai_mpi's own streams with the copies and events on them."""

from __future__ import annotations

import contextlib
import sys
from collections.abc import Callable, Iterator
from typing import Any

from ..errors import CudaError, StreamError
from .base import LEGACY_STREAM, Event, Stream
from .cudacontexts import ContextScope, Driver
from .cudahandles import CudaEvent, CudaStream, CudaStreamRef, Idle

__all__ = ["CudaStreams", "imported_torch", "no_cupy", "own_stream"]


class CudaStreams:
    """The stream and event calls of ``CudaRuntime`` (which sets these attributes up), in the contexts of the GPUs
    they concern."""

    ordinal: int
    driver: Driver
    idle_streams: Idle
    idle_events: Idle
    _load_cupy: Callable[[], Any]
    _load_torch: Callable[[], Any]
    _stream_sources: tuple[Callable[[int], tuple[int, Any] | None], ...]

    # -- contexts -----------------------------------------------------------
    def on_gpu(self, ordinal: int | None) -> contextlib.AbstractContextManager[None]:
        """``ordinal``'s primary context current for one call; the caller's context is back afterwards (a
        thread's current device is the caller's business: CuPy and PyTorch allocate on it)."""
        return self.driver.on(self.ordinal if ordinal is None else ordinal)

    def context_scope(self) -> ContextScope:
        """The current context asked once for the calls inside (``Driver.scope``)."""
        return self.driver.scope()

    # -- the producer's and the user's streams -----------------------------
    def sync_stream(self, handle: int, ordinal: int | None) -> None:
        if isinstance(handle, bool) or not isinstance(handle, int) or handle <= 0:
            raise StreamError(
                f"stream handle {handle!r} cannot be synchronized: CAI v3 handles are positive ints "
                "(1 legacy default, 2 per-thread default, else a cudaStream_t address)"
            )
        try:
            with self.on_gpu(ordinal):
                self.driver.check("cuStreamSynchronize", handle)
        except CudaError as exc:
            raise StreamError(_stream_failure("synchronized", handle, ordinal, exc)) from exc

    def sync_legacy(self, ordinal: int | None) -> None:
        gpu = self.ordinal if ordinal is None else ordinal
        try:
            with self.on_gpu(gpu):  # (one context query for both calls)
                self.record_event_on(LEGACY_STREAM, gpu).synchronize()
        except CudaError as exc:
            raise StreamError(
                f"the legacy default stream of GPU {gpu} cannot be synchronized: {exc}. A kernel that faulted "
                "leaves the CUDA context unusable; run the producer under compute-sanitizer to find it"
            ) from exc

    def sync_device(self, ordinal: int | None) -> None:
        try:
            with self.on_gpu(ordinal):
                self.driver.check("cuCtxSynchronize")
        except CudaError as exc:
            gpu = self.ordinal if ordinal is None else ordinal
            raise StreamError(
                f"GPU {gpu} cannot be synchronized: {exc}. A kernel that faulted leaves the CUDA context "
                "unusable; run the producer under compute-sanitizer to find it"
            ) from exc

    def stream_wait_event(self, handle: int, event: Event, ordinal: int | None) -> None:
        ev = _own_event(event)
        if isinstance(handle, bool) or not isinstance(handle, int) or handle <= 0:
            raise StreamError(f"stream handle {handle!r} cannot wait on an event: not a CAI v3 stream handle")
        try:
            with self.on_gpu(ordinal):
                self.driver.check("cuStreamWaitEvent", handle, ev.handle, 0)
        except CudaError as exc:
            message = _stream_failure("made to wait on cai_mpi's event", handle, ordinal, exc)
            raise StreamError(message) from exc

    def current_stream(self, ordinal: int) -> int:
        """The calling thread's current stream on ``ordinal`` as a CAI v3 handle: CuPy's current stream (where
        CuPy work the user launches next runs), else the legacy default stream (1)."""
        streams = self._current_streams(ordinal)
        return streams[0][0] if streams else LEGACY_STREAM

    def _current_streams(self, ordinal: int) -> list[tuple[int, Any]]:
        """The calling thread's current streams on ``ordinal`` in the libraries users compute with, each as its CAI
        handle and the object that keeps it alive (``_stream_sources``)."""
        found = []
        for source in self._stream_sources:
            stream = source(ordinal)
            if stream is not None:
                found.append(stream)
        return found

    def _cupy_stream(self, ordinal: int) -> tuple[int, Any] | None:
        """CuPy's current stream on ``ordinal`` (its null stream: the legacy one), or None without CuPy."""
        cp = self._load_cupy()
        if cp is None:
            return None
        stream = cp.cuda.get_current_stream(ordinal)
        return int(stream.ptr) or LEGACY_STREAM, stream

    def _torch_stream(self, ordinal: int) -> tuple[int, Any] | None:
        """PyTorch's current stream on ``ordinal`` (``with torch.cuda.stream(s):`` runs on side streams), or None
        where PyTorch is not imported or has not initialized CUDA (asking must not initialize it)."""
        torch = self._load_torch()
        if torch is None or not torch.cuda.is_initialized():
            return None
        stream = torch.cuda.current_stream(ordinal)
        return int(stream.cuda_stream) or LEGACY_STREAM, stream

    # -- copies on cai_mpi's own streams --------------------------------------
    def create_stream(self, ordinal: int) -> Stream:
        # A blocking stream: ordered after work on the legacy default stream, where exporters that give no
        # stream (Numba's default, CAI v0-v2) and users who never chose a stream leave their kernels. One whose
        # object died is used again (``Idle``): work queued on it before stays ahead of the new work.
        handle = self.idle_streams.take(ordinal)
        if handle is None:
            flags = self.driver.drv.CUstream_flags.CU_STREAM_DEFAULT
            with self.on_gpu(ordinal):
                (raw,) = self.driver.check("cuStreamCreate", flags)
            handle = int(raw)
        return CudaStream(self, handle, ordinal)

    def copy_async(self, dst: int, src: int, nbytes: int, stream: Stream) -> None:
        s = own_stream(stream)
        if nbytes == 0:
            return
        with self.on_gpu(s.ordinal):  # unified addressing: the driver infers the direction
            self.driver.check("cuMemcpyAsync", dst, src, nbytes, s.handle)

    def record_event(self, stream: Stream) -> Event:
        s = own_stream(stream)
        return self.record_event_on(s.handle, s.ordinal)

    def record_event_on(self, handle: int, ordinal: int) -> CudaEvent:
        """An event recorded now on CAI stream ``handle`` (1 and 2: the default streams of ``ordinal``'s context)."""
        with self.on_gpu(ordinal):
            idle = self.idle_events.take(ordinal)
            if idle is None:
                (raw,) = self.driver.check("cuEventCreate", self.driver.drv.CUevent_flags.CU_EVENT_DISABLE_TIMING)
                idle = int(raw)
            event = CudaEvent(self, idle, ordinal)
            self.driver.check("cuEventRecord", event.handle, handle)
        return event

    @contextlib.contextmanager
    def _cupy_on(self, cp: Any, ordinal: int, stream: CudaStream | None) -> Iterator[None]:
        """CuPy's current device and stream set to ``ordinal`` and cai_mpi's ``stream`` for the block (None:
        CuPy's current stream stays)."""
        with self.on_gpu(ordinal), cp.cuda.Device(ordinal):
            if stream is None:
                yield
                return
            if hasattr(cp.cuda.Stream, "from_external"):  # CuPy >= 14; ExternalStream is deprecated there
                cupy_stream = cp.cuda.Stream.from_external(CudaStreamRef(stream.handle))
            else:
                cupy_stream = cp.cuda.ExternalStream(stream.handle, ordinal)
            with cupy_stream:
                yield



def no_cupy() -> None:
    """What ``_load_cupy`` and ``_load_torch`` are where they must not be used (a driver double: the libraries
    would call the real driver)."""
    return None


def imported_torch() -> Any | None:
    """PyTorch if the program imported it (cai_mpi never imports it: that costs seconds)."""
    return sys.modules.get("torch")


def own_stream(stream: Stream) -> CudaStream:
    if not isinstance(stream, CudaStream):
        raise TypeError(f"the CUDA runtime needs a stream from create_stream(), got {type(stream).__name__}")
    return stream


def _own_event(event: Event) -> CudaEvent:
    if not isinstance(event, CudaEvent):
        raise TypeError(f"the CUDA runtime needs an event from record_event(), got {type(event).__name__}")
    return event


_INVALID_STREAM_CODES = {1, 201, 400}  # INVALID_VALUE, INVALID_CONTEXT, INVALID_HANDLE


def _stream_failure(what: str, handle: int, ordinal: int | None, exc: CudaError) -> str:
    """The StreamError text: which handle, the CUDA error, and the likely cause."""
    where = f" on GPU {ordinal}" if ordinal is not None else ""
    special = {1: " (the legacy default stream)", 2: " (the per-thread default stream)"}.get(handle, "")
    text = f"__cuda_array_interface__ stream {handle:#x}{special}{where} cannot be {what}: {exc}"
    if exc.call not in ("cuStreamSynchronize", "cuStreamWaitEvent") or exc.code is None:
        return text
    if exc.code in _INVALID_STREAM_CODES:
        text += (
            ". The handle is not a live stream of this process: the exporter destroyed the stream "
            "(it must outlive the array), or the handle came from another process"
        )
    elif 700 <= exc.code < 800:  # launch / execution errors, sticky for the context
        text += ". Work queued on the stream failed; the CUDA context is now unusable"
    return text
