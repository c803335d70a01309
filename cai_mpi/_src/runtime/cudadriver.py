"""The CUDA driver API through cuda-python: loading it, reading its statuses, probing for a GPU, and the
primary contexts of this process (made current for a call, the caller's restored afterwards)."""

from __future__ import annotations

import contextlib
import importlib
import importlib.metadata
import os
import re
import threading
from collections.abc import Callable, Iterator
from typing import Any

from ..errors import CudaError
from .base import HOST, Location, MemoryKind

__all__ = ["FIXED_BINDINGS", "NOT_READY", "OUT_OF_MEMORY", "SUCCESS", "Driver", "bindings_version", "check",
           "classify_pointer", "error_text", "load_cupy", "load_driver", "ordinal_unreliable", "probe", "raw_call",
           "signed_ordinal", "visible_device_count"]

SUCCESS = 0
OUT_OF_MEMORY = 2
NO_DEVICE = 100
NOT_READY = 600
MEMTYPE_HOST = 1
MEMTYPE_DEVICE = 2
MEMTYPE_ARRAY = 3
MEMTYPE_UNIFIED = 4

# -- loading the optional modules ---------------------------------------------------


_replacement_lock = threading.Lock()
_replacements: dict[str, Any] = {}
#: The test hook (config.TEST_HOOKS, docs/testing.md) naming a stand-in for the driver module, as module:factory.
#: Read here, when the driver is first loaded, so it also reaches CAI_MPI_BIND_DEVICE's binding at import time.
TEST_DRIVER_HOOK = "CAI_MPI_TEST_CUDA_DRIVER"


def load_driver() -> Any:
    """The cuda-python driver module: ``cuda.bindings.driver``, or ``cuda.cuda`` for cuda-python <= 12.6.0.

    The test hook ``CAI_MPI_TEST_CUDA_DRIVER=module:factory`` replaces it by ``factory()`` (a driver double).
    Raises ImportError when cuda-python is not installed. Importing never needs a GPU driver.
    """
    replacement = os.environ.get(TEST_DRIVER_HOOK, "").strip()
    if replacement:
        with _replacement_lock:  # one instance per process: pointers from one driver mean nothing to another
            if replacement not in _replacements:
                module, _, factory = replacement.partition(":")
                _replacements[replacement] = getattr(importlib.import_module(module), factory)()
            return _replacements[replacement]
    try:
        return importlib.import_module("cuda.bindings.driver")
    except ImportError:
        # Only cuda-python <= 12.6.0 lacks cuda.bindings; there `cuda.cuda` does not warn.
        return importlib.import_module("cuda.cuda")


_cupy_lock = threading.Lock()
_cupy_state: list[Any] = []  # [module or None] once tried


def load_cupy() -> Any | None:
    """CuPy when importable (for its memory pools and copy kernels), else None; imported once.

    None under the test hook ``CAI_MPI_TEST_CUDA_DRIVER``: CuPy calls the real driver, which knows nothing of a
    replacement's memory.
    """
    if os.environ.get(TEST_DRIVER_HOOK, "").strip():
        return None
    with _cupy_lock:
        if not _cupy_state:
            try:
                _cupy_state.append(importlib.import_module("cupy"))
            except Exception:  # a broken CuPy install must not break the driver-only path
                _cupy_state.append(None)
        return _cupy_state[0]


# -- status checking ----------------------------------------------------------------


def error_text(drv: Any, status: Any) -> tuple[str, str]:
    """``(name, description)`` of a CUresult via cuGetErrorName/cuGetErrorString, or the enum's own name."""
    name = desc = ""
    with contextlib.suppress(Exception):  # these need the driver; the enum name does not
        err, raw = drv.cuGetErrorName(status)
        if int(err) == SUCCESS and raw:
            name = raw.decode()
    with contextlib.suppress(Exception):
        err, raw = drv.cuGetErrorString(status)
        if int(err) == SUCCESS and raw:
            desc = raw.decode()
    if not name:
        name = getattr(status, "name", None) or f"CUresult {int(status)}"
    return name, desc


def raw_call(drv: Any, call: str, *args: Any) -> tuple[int, Any, tuple[Any, ...]]:
    """Run ``drv.<call>(*args)``: returns ``(code, status, outputs)``; raises CudaError if it cannot run.

    cuda-python returns ``(status, out...)`` tuples (a 1-tuple is always truthy, so the
    status must be read, never the tuple) and raises a RuntimeError subclass when the
    driver library or one of its functions is missing.
    """
    fn = getattr(drv, call, None)
    if fn is None:
        raise CudaError(f"{call} is not provided by this cuda-python: upgrade cuda-python", call)
    try:
        result = fn(*args)
    except RuntimeError as exc:
        raise CudaError(
            f"{call} could not run: {exc} (is the NVIDIA driver installed, and as new as cuda-python?)", call
        ) from exc
    status = result[0]
    return int(status), status, tuple(result[1:])


def check(drv: Any, call: str, *args: Any) -> tuple[Any, ...]:
    """Run ``drv.<call>(*args)`` and return its outputs; any status but CUDASUCCESS raises CudaError."""
    code, status, outputs = raw_call(drv, call, *args)
    if code != SUCCESS:
        name, desc = error_text(drv, status)
        detail = f": {desc}" if desc else ""
        raise CudaError(f"{call} failed with {name} ({code}){detail}", call, code, name)
    return outputs


# -- probe --------------------------------------------------------------------------


def probe() -> tuple[bool, str]:
    """Whether CUDA is usable here: cuda-python importable, driver loads, cuInit succeeds, >= 1 GPU.

    Returns ``(usable, reason)``. Never raises and never creates a CUDA context
    (cuInit and device counting do not), so it is safe before device selection.
    """
    try:
        try:
            drv = load_driver()
        except ImportError as exc:
            return False, f"cuda-python is not installed ({exc}); pip install 'cai_mpi[cuda12]'"
        try:
            code, status, _ = raw_call(drv, "cuInit", 0)
        except CudaError as exc:  # (no local names the cause: its traceback holds the caller's frames, locals too)
            return False, f"the NVIDIA driver library (libcuda) cannot be loaded: {exc.__cause__ or exc}"
        if code == NO_DEVICE:
            visible = os.environ.get("CUDA_VISIBLE_DEVICES")
            where = f" (CUDA_VISIBLE_DEVICES={visible!r})" if visible is not None else ""
            return False, f"the NVIDIA driver sees no CUDA device{where}"
        if code != SUCCESS:
            name, desc = error_text(drv, status)
            return False, f"cuInit failed with {name} ({code}){': ' + desc if desc else ''}"
        (count,) = check(drv, "cuDeviceGetCount")
        if int(count) < 1:
            return False, "the NVIDIA driver reports 0 CUDA devices"
        version = ""
        with contextlib.suppress(Exception):
            (v,) = check(drv, "cuDriverGetVersion")
            version = f", driver CUDA {int(v) // 1000}.{int(v) % 1000 // 10}"
        return True, f"{int(count)} CUDA device(s){version}"
    except Exception as exc:  # the promise is "never raises": report anything unforeseen as the reason
        return False, f"CUDA probe failed: {type(exc).__name__}: {exc}"


def visible_device_count() -> int:
    """GPUs the driver shows this process (after CUDA_VISIBLE_DEVICES), 0 if CUDA is unusable.

    Like probe(), it creates no context, so device selection (``choose_device(visible_count=...)``)
    can use it before anything binds a GPU.
    """
    try:
        drv = load_driver()
        check(drv, "cuInit", 0)
        (count,) = check(drv, "cuDeviceGetCount")
        return int(count)
    except Exception:
        return 0


# -- pointer classification -----------------------------------------------------------


def classify_pointer(
    memory_type: int, is_managed: bool, device_ordinal: int, fallback_ordinal: int
) -> Location:
    """Turn cuPointerGetAttributes' (MEMORY_TYPE, IS_MANAGED, DEVICE_ORDINAL) into a Location.

    Memory type 0 means CUDA does not know the pointer (pageable host memory); managed
    memory reports DEVICE, so IS_MANAGED is checked first. ``fallback_ordinal`` is used
    when the driver gives no valid ordinal for managed memory.
    """
    memory_type = int(memory_type)
    if memory_type == 0:
        return HOST
    ordinal = int(device_ordinal)
    if bool(is_managed) or memory_type == MEMTYPE_UNIFIED:
        return Location(MemoryKind.MANAGED, ordinal if ordinal >= 0 else fallback_ordinal)
    if memory_type == MEMTYPE_HOST:  # pinned or registered: a kernel on its GPU may write it
        return Location(MemoryKind.HOST, ordinal if ordinal >= 0 else None)
    if memory_type == MEMTYPE_DEVICE:
        return Location(MemoryKind.DEVICE, ordinal)
    if memory_type == MEMTYPE_ARRAY:
        raise CudaError(
            "the pointer is a CUDA array (texture memory), not linear memory a CAI exporter may describe",
            "cuPointerGetAttributes",
        )
    raise CudaError(
        f"cuPointerGetAttributes returned unknown memory type {memory_type}", "cuPointerGetAttributes"
    )


# -- the cuda-bindings releases that misreport DEVICE_ORDINAL ------------------------------------

# [first broken, first fixed): these write DEVICE_ORDINAL to a signed field and read it from an unsigned one never
# written, so cuPointerGetAttribute(s) report 0 for every pointer (NVIDIA/cuda-python#2928).
_ORDINAL_BUG = (((12, 9, 6), (12, 9, 9)), ((13, 1, 2), (13, 4, 3)))
FIXED_BINDINGS = "cuda-bindings>=12.9.9,<13 (CUDA 12) or cuda-bindings>=13.4.3 (CUDA 13)"


def bindings_version(drv: Any) -> str | None:
    """The cuda-bindings release behind the driver module ``drv`` (a stand-in declares ``bindings_version``)."""
    declared = getattr(drv, "bindings_version", None)
    if declared is not None:
        return str(declared)
    if not str(getattr(drv, "__name__", "")).startswith("cuda."):
        return None
    for dist in ("cuda-bindings", "cuda-python"):  # cuda-python <= 12.6.0 carried the bindings itself
        with contextlib.suppress(importlib.metadata.PackageNotFoundError):
            return importlib.metadata.version(dist)
    return None


def ordinal_unreliable(version: str | None) -> bool:
    """Whether cuda-bindings ``version`` reports DEVICE_ORDINAL 0 for every pointer (12.9.6-12.9.8, 13.1.2-13.4.2)."""
    found = re.match(r"(\d+)\.(\d+)\.(\d+)", version or "")
    if found is None:
        return False
    release = tuple(int(part) for part in found.groups())
    return any(first <= release < fixed for first, fixed in _ORDINAL_BUG)


def signed_ordinal(reported: Any) -> int:
    """DEVICE_ORDINAL as the signed int CUDA writes: releases before 12.9.6 / 13.1.2 read it as unsigned, so -2
    (no device) came back as 2**32 - 2."""
    ordinal = int(reported)
    return ordinal - 2**32 if ordinal >= 2**31 else ordinal


# -- contexts -------------------------------------------------------------------------


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

    @contextlib.contextmanager
    def scope(self) -> Iterator[None]:
        """One message's driver calls in this thread: inside, the caller's current context is asked once, at the
        first call that needs it (``current``), and ``on`` keeps the answer up to date as it pushes and pops.

        What it relies on: between the calls of one message nothing in this thread switches the context without
        restoring it (cai_mpi's ``on`` restores; CuPy, PyTorch and MPI libraries do too). A scope is never held
        across a step's yield (the user may switch contexts between cai_mpi calls); nested scopes are one scope.
        """
        if getattr(self._tls, "known", None) is not None:
            yield
            return
        self._tls.known = []  # the current context, once asked: its last entry
        try:
            yield
        finally:  # (an exception inside leaves nothing behind for a later call to trust)
            self._tls.known = None

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
        them changes no context."""
        within = self._within()
        if within and within[-1] == ordinal:
            yield
            return
        target = self.primary(ordinal)
        current = self.current()
        within.append(ordinal)
        try:
            if int(current) == int(target):
                yield
                return
            self.check("cuCtxPushCurrent", target)  # the caller's stack is left exactly as it was
            known: list[Any] | None = getattr(self._tls, "known", None)
            if known is not None:
                known.append(target)
            try:
                yield
            finally:
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
            within.pop()

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
        with contextlib.suppress(Exception), self.on(ordinal):
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
        self.check("cuCtxPushCurrent", context)
        try:
            (device,) = self.check("cuCtxGetDevice")
        finally:
            self.check("cuCtxPopCurrent")
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
