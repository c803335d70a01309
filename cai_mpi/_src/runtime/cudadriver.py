"""The CUDA driver API through cuda-python: loading it, reading its statuses, probing for a GPU, and what a
pointer's attributes say (the contexts the calls run in: ``cudacontexts``)."""

from __future__ import annotations

import contextlib
import importlib
import importlib.metadata
import re
import threading
from typing import Any

from ..config import cuda_driver_hook, environment
from ..errors import CudaError
from .base import HOST, Location, MemoryKind

__all__ = ["FIXED_BINDINGS", "MEMTYPE_DEVICE", "MEMTYPE_UNIFIED", "NOT_READY", "OUT_OF_MEMORY", "SUCCESS",
           "bindings_version", "check", "classify_pointer", "error_text", "load_cupy", "load_driver",
           "ordinal_unreliable", "probe", "raw_call", "signed_ordinal", "visible_device_count"]

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
    replacement = cuda_driver_hook()
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
    if cuda_driver_hook():
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
            visible = environment().get("CUDA_VISIBLE_DEVICES")
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
