"""The primary contexts of this process through the CUDA driver: made current for a call (the caller's restored
afterwards), asked once per message inside a ``scope``, and the GPU a pointer's context belongs to."""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Callable, Iterator
from typing import Any

from ..errors import CudaError
from .cudadriver import (
    FIXED_BINDINGS,
    MEMTYPE_DEVICE,
    MEMTYPE_UNIFIED,
    SUCCESS,
    bindings_version,
    check,
    ordinal_unreliable,
    raw_call,
    signed_ordinal,
)

__all__ = ["ContextScope", "Driver", "Isolated"]


class ContextScope:
    """``Driver.scope``'s block: the thread's known current context (``known``) exists only inside it. A class, not
    a generator, since every device message enters a few."""

    __slots__ = ("_outer", "_tls")

    def __init__(self, tls: threading.local) -> None:
        self._tls = tls
        self._outer = False

    def __enter__(self) -> None:
        self._outer = getattr(self._tls, "known", None) is not None  # (inside another scope: that one holds it)
        if not self._outer:
            self._tls.known = []  # the current context, once asked: its last entry

    def __exit__(self, *exc: object) -> None:
        if not self._outer:  # (an exception inside leaves nothing behind for a later call to trust)
            self._tls.known = None


class Isolated:
    """``Driver.isolated``'s block: the thread's ``within`` and ``known`` set aside, fresh ones inside, and put back
    at its end, with the switch it interrupted still under way."""

    __slots__ = ("_saved", "_tls")

    def __init__(self, tls: threading.local) -> None:
        self._tls = tls
        self._saved: tuple[Any, Any] = (None, None)

    def __enter__(self) -> None:
        tls = self._tls
        self._saved = (getattr(tls, "within", None), getattr(tls, "known", None))
        tls.within = []
        tls.known = None
        tls.switching = False

    def __exit__(self, *exc: object) -> None:
        tls = self._tls
        tls.switching = True  # (only a switch is interrupted by an Isolated block; set first, so none trusts it)
        tls.within, tls.known = self._saved


_SETTLED = contextlib.nullcontext()


class Driver:
    """The driver module plus this process's retained primary contexts (one per device)."""

    def __init__(self, drv: Any) -> None:
        self.drv = drv
        self._lock = threading.Lock()
        self._initialized = False
        self._contexts: dict[int, Any] = {}
        self._foreign: dict[int, tuple[int, int]] = {}  # context handle -> (its unique id, its GPU)
        self._ordinals: dict[int, int] = {}  # CUdevice handle -> ordinal (CUDA does not promise they are equal)
        self._pitches: dict[int, int] = {}  # ordinal -> CU_DEVICE_ATTRIBUTE_MAX_PITCH
        self._tls = threading.local()

    def check(self, call: str, *args: Any) -> tuple[Any, ...]:
        return check(self.drv, call, *args)

    def init(self) -> None:
        """cuInit(0) once per process: every other driver call fails with NOT_INITIALIZED before it."""
        if not self._initialized:
            with self._lock:
                if not self._initialized:
                    self.check("cuInit", 0)
                    self._initialized = True

    def primary(self, ordinal: int) -> Any:
        """The primary context of ``ordinal``, retained once for the life of the process.

        The primary context is the one the CUDA runtime, CuPy, PyTorch and Numba use, so
        memory and streams are shared with them. It is never released: libraries that
        share it may still hold memory in it at interpreter exit.
        """
        ctx = self._contexts.get(ordinal)
        if ctx is not None:
            return ctx
        self.init()
        with self._lock:
            ctx = self._contexts.get(ordinal)
            if ctx is None:
                try:
                    (dev,) = self.check("cuDeviceGet", ordinal)
                except CudaError as exc:
                    raise CudaError(
                        f"GPU {ordinal} is not usable by this process: {exc} "
                        "(check CAI_MPI_DEVICE and CUDA_VISIBLE_DEVICES)",
                        exc.call,
                        exc.code,
                        exc.name,
                    ) from exc
                (ctx,) = self.check("cuDevicePrimaryCtxRetain", dev)
                self._contexts[ordinal] = ctx
        return ctx

    def scope(self) -> ContextScope:
        """One message's driver calls in this thread: inside, the caller's current context is asked once, at the
        first call that needs it (``current``), and ``on`` keeps the answer up to date as it pushes and pops.

        What it relies on: while it is open nothing in this thread switches the context without restoring it
        (cai_mpi's ``on`` restores; CuPy, PyTorch and MPI libraries do too). It is never held beyond one cai_mpi
        call, since the user may switch contexts between two (a request's steps open one per part between two
        waits); nested scopes are one scope.
        """
        return ContextScope(self._tls)

    def current(self) -> Any:
        """The calling thread's current context (0: none): asked of the driver, or known inside a ``scope``."""
        known: list[Any] | None = getattr(self._tls, "known", None)
        if known:
            return known[-1]
        (context,) = self.check("cuCtxGetCurrent")
        if known is not None:
            known.append(context)
        return context

    @contextlib.contextmanager
    def on(self, ordinal: int) -> Iterator[None]:
        """Make ``ordinal``'s primary context current for the block, restoring the caller's afterwards. Inside such
        a block for the same GPU (in this thread) nothing is asked or switched again: cai_mpi's own code between
        them changes no context.

        Between a push or pop and the notes of it (``within``, a scope's ``known``) the thread is ``switching``:
        a finalizer run there by the collector trusts none of them (``isolated``)."""
        within = self._within()
        if within and within[-1] == ordinal:
            yield
            return
        target = self.primary(ordinal)
        current = self.current()
        if int(current) == int(target):
            within.append(ordinal)
            try:
                yield
            finally:
                within.pop()
            return
        tls = self._tls
        known: list[Any] | None = getattr(tls, "known", None)
        tls.switching = True
        try:
            self.check("cuCtxPushCurrent", target)  # the caller's stack is left exactly as it was
            if known is not None:
                known.append(target)
            within.append(ordinal)  # (entered only once its context is current)
        finally:
            tls.switching = False
        try:
            yield
        finally:
            tls.switching = True
            try:
                within.pop()
                popped = False
                try:
                    self.check("cuCtxPopCurrent")
                    popped = True
                finally:
                    if popped and known:  # the caller's context is current again
                        known.pop()
                    elif known is not None:  # the pop failed: which context is current, the driver says next
                        known.clear()
            finally:
                tls.switching = False

    def isolated(self) -> contextlib.AbstractContextManager[None]:
        """Where a finalizer makes driver calls: it may run at any allocation of the code it interrupts in this
        thread. Most of the time what this thread knows of its contexts is what the driver would say, and the
        finalizer's calls use it; inside ``on``'s switch, between a push or pop and its note, it is set aside and the
        driver is asked (``Isolated``)."""
        return Isolated(self._tls) if getattr(self._tls, "switching", False) else _SETTLED

    def _within(self) -> list[int]:
        """The GPUs whose ``on`` blocks this thread is in, innermost last."""
        within: list[int] | None = getattr(self._tls, "within", None)
        if within is None:
            within = self._tls.within = []
        return within

    def max_pitch(self, ordinal: int) -> int:
        """CU_DEVICE_ATTRIBUTE_MAX_PITCH of GPU ``ordinal``, read once per device."""
        pitch = self._pitches.get(ordinal)
        if pitch is None:
            (device,) = self.check("cuDeviceGet", ordinal)
            attribute = self.drv.CUdevice_attribute.CU_DEVICE_ATTRIBUTE_MAX_PITCH
            (raw,) = self.check("cuDeviceGetAttribute", attribute, device)
            pitch = self._pitches[ordinal] = int(raw)
        return pitch

    def release(self, ordinal: int, call: str, *args: Any) -> None:
        """Free a resource from a finalizer: in its own context, from any thread, never raising."""
        # At interpreter exit the driver may be gone already: leaking then is harmless.
        with contextlib.suppress(Exception), self.isolated(), self.on(ordinal):
            self.check(call, *args)

    # -- which GPU holds a pointer --------------------------------------------------------------

    def pointer_attributes(self, ptr: int, ordinal: int) -> tuple[int, bool, int, int, Any]:
        """``(MEMORY_TYPE, IS_MANAGED, DEVICE_ORDINAL, HOST_POINTER, CONTEXT)`` of ``ptr``.

        Asked in the caller's current context when it has one (under unified addressing any context may ask where
        memory lives, and the caller's needs no switch), else in ``ordinal``'s: a query with no context current
        can fail (cupy/cupy#3991). If the caller's context cannot answer (a context poisoned by a failed kernel),
        ``ordinal``'s is asked before giving up.
        """
        a = self.drv.CUpointer_attribute
        attrs = [a.CU_POINTER_ATTRIBUTE_MEMORY_TYPE, a.CU_POINTER_ATTRIBUTE_IS_MANAGED,
                 a.CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL, a.CU_POINTER_ATTRIBUTE_HOST_POINTER,
                 a.CU_POINTER_ATTRIBUTE_CONTEXT]
        self.init()
        current = self.current()
        try:
            with contextlib.nullcontext() if int(current) else self.on(ordinal):
                (values,) = self.check("cuPointerGetAttributes", len(attrs), attrs, ptr)
        except CudaError as exc:
            failure = exc
            values = None
            if int(current) and int(current) != int(self.primary(ordinal)):
                with contextlib.suppress(CudaError), self.on(ordinal):
                    (values,) = self.check("cuPointerGetAttributes", len(attrs), attrs, ptr)
            if values is None:
                raise CudaError(f"cannot classify pointer {ptr:#x}: {failure}", failure.call, failure.code,
                                failure.name) from failure
        memory_type, is_managed, reported, host_pointer, context = values
        return int(memory_type), bool(is_managed), signed_ordinal(reported), int(host_pointer or 0), context

    def pointer_ordinal(self, ptr: int, memory_type: int, is_managed: bool, context: Any, reported: int,
                        device_count: Callable[[], int]) -> int:
        """The GPU of device or managed memory at ``ptr``: its context's device, else the DEVICE_ORDINAL reported
        (host memory: the reported ordinal, unused).

        The context is asked first because some cuda-bindings releases report DEVICE_ORDINAL 0 for every pointer.
        Memory with no context (stream-ordered pools, virtual memory management) has only the reported ordinal;
        under those releases, with more than one GPU, it cannot be placed, and that is an error, not a guess.
        """
        if memory_type not in (MEMTYPE_DEVICE, MEMTYPE_UNIFIED) and not is_managed:
            return reported
        if int(context or 0):
            return self.context_ordinal(context)
        version = bindings_version(self.drv)
        if reported == 0 and ordinal_unreliable(version) and device_count() > 1:
            raise CudaError(
                f"cannot tell which GPU holds pointer {ptr:#x}: it belongs to no CUDA context (a stream-ordered "
                f"pool or virtual memory) and cuda-bindings {version} reports GPU 0 for every pointer; "
                f"install {FIXED_BINDINGS}",
                "cuPointerGetAttributes",
            )
        return reported

    def context_ordinal(self, context: Any) -> int:
        """The GPU of ``context``: a primary context retained here maps directly; another is made current once to
        ask (cuCtxGetDevice), and remembered with its unique id, since a handle may return for a later context."""
        handle = int(context)
        for ordinal, own in list(self._contexts.items()):
            if int(own) == handle:
                return ordinal
        ident = self._context_id(context)
        known = self._foreign.get(handle)
        if known is not None and ident is not None and known[0] == ident:
            return known[1]
        was = getattr(self._tls, "switching", False)
        self._tls.switching = True  # (another context is current for the next three calls, unknown to any note)
        try:
            self.check("cuCtxPushCurrent", context)
            try:
                (device,) = self.check("cuCtxGetDevice")
            finally:
                self.check("cuCtxPopCurrent")
        finally:
            self._tls.switching = was
        ordinal = self._device_ordinal(device)
        if ident is not None:
            self._foreign[handle] = (ident, ordinal)
        return ordinal

    def _context_id(self, context: Any) -> int | None:
        """cuCtxGetId (CUDA 12.0+), or None where the driver or bindings lack it."""
        with contextlib.suppress(CudaError):
            code, _status, outputs = raw_call(self.drv, "cuCtxGetId", context)
            if code == SUCCESS:
                return int(outputs[0])
        return None

    def _device_ordinal(self, device: Any) -> int:
        """The ordinal of a CUdevice handle (cuDeviceGet's inverse)."""
        handle = int(device)
        if handle not in self._ordinals:
            (count,) = self.check("cuDeviceGetCount")
            for ordinal in range(int(count)):
                (dev,) = self.check("cuDeviceGet", ordinal)
                self._ordinals[int(dev)] = ordinal
        if handle not in self._ordinals:
            raise CudaError(f"cuCtxGetDevice returned device {handle}, which cuDeviceGet never gives", "cuCtxGetDevice")
        return self._ordinals[handle]
