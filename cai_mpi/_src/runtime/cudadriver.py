"""The CUDA driver API through cuda-python: loading it, reading its statuses, probing for a GPU, and the
primary contexts of this process (made current for a call, the caller's restored afterwards)."""

from __future__ import annotations

import contextlib
import importlib
import os
import threading
from collections.abc import Iterator
from typing import Any

from ..errors import CudaError
from .base import HOST, Location, MemoryKind

__all__ = ["NOT_READY", "SUCCESS", "Driver", "check", "classify_pointer", "error_text", "load_cupy", "load_driver",
           "probe", "raw_call", "visible_device_count"]

SUCCESS = 0
NO_DEVICE = 100
NOT_READY = 600
MEMTYPE_HOST = 1
MEMTYPE_DEVICE = 2
MEMTYPE_ARRAY = 3
MEMTYPE_UNIFIED = 4



# -- loading the optional modules ---------------------------------------------------


_replacement_lock = threading.Lock()
_replacements: dict[str, Any] = {}


def load_driver() -> Any:
    """The cuda-python driver module: ``cuda.bindings.driver``, or ``cuda.cuda`` for cuda-python <= 12.6.0.

    ``CAI_MPI_CUDA_DRIVER=module:factory`` replaces it by ``factory()`` (the driver double in tests).
    Raises ImportError when cuda-python is not installed. Importing never needs a GPU driver.
    """
    replacement = os.environ.get("CAI_MPI_CUDA_DRIVER", "").strip()
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

    None under ``CAI_MPI_CUDA_DRIVER``: CuPy calls the real driver, which knows nothing of a replacement's memory.
    """
    if os.environ.get("CAI_MPI_CUDA_DRIVER", "").strip():
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
        except CudaError as exc:
            cause = exc.__cause__ or exc
            return False, f"the NVIDIA driver library (libcuda) cannot be loaded: {cause}"
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


# -- contexts -------------------------------------------------------------------------


class Driver:
    """The driver module plus this process's retained primary contexts (one per device)."""

    def __init__(self, drv: Any) -> None:
        self.drv = drv
        self._lock = threading.Lock()
        self._initialized = False
        self._contexts: dict[int, Any] = {}

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
    def on(self, ordinal: int) -> Iterator[None]:
        """Make ``ordinal``'s primary context current for the block, restoring the caller's afterwards."""
        target = self.primary(ordinal)
        (current,) = self.check("cuCtxGetCurrent")
        if int(current) == int(target):
            yield
            return
        self.check("cuCtxPushCurrent", target)  # the caller's stack is left exactly as it was
        try:
            yield
        finally:
            self.check("cuCtxPopCurrent")

    def release(self, ordinal: int, call: str, *args: Any) -> None:
        """Free a resource from a finalizer: in its own context, from any thread, never raising."""
        # At interpreter exit the driver may be gone already: leaking then is harmless.
        with contextlib.suppress(Exception), self.on(ordinal):
            self.check(call, *args)


