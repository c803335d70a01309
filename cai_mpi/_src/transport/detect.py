"""Decide whether the MPI library mpi4py loaded accepts CUDA device pointers (is CUDA-aware)."""

from __future__ import annotations

import ctypes
import os
from collections.abc import Iterator, Mapping
from dataclasses import dataclass

import numpy as np
from mpi4py import MPI

from ..config import cuda_aware_setting, environment

__all__ = [
    "ENV_VAR",
    "SOURCE_ALLOC_KINDS",
    "SOURCE_CRAY",
    "SOURCE_DEFAULT",
    "SOURCE_DISAGREEMENT",
    "SOURCE_ENV",
    "SOURCE_MPICH_QUERY",
    "SOURCE_MVAPICH",
    "SOURCE_OMPI_QUERY",
    "MPIX_GPU_SUPPORT_CUDA",
    "CudaAwareness",
    "MpiLibrary",
    "agree",
    "cuda_device_kind",
    "detect_local",
    "is_libmpi",
]

ENV_VAR = "CAI_MPI_CUDA_AWARE"

#: The ``source`` strings, one per detection step (see docs/gpu-and-mpi.md).
SOURCE_ENV = f"env {ENV_VAR}"
SOURCE_ALLOC_KINDS = "mpi_memory_alloc_kinds"
SOURCE_OMPI_QUERY = "MPIX_Query_cuda_support"
SOURCE_MPICH_QUERY = "MPIX_GPU_query_support"
SOURCE_CRAY = "MPICH_GPU_SUPPORT_ENABLED"
SOURCE_MVAPICH = "MV2_USE_CUDA"
SOURCE_DEFAULT = "default"
SOURCE_DISAGREEMENT = "disagreement"


#: MPICH's ``MPIX_GPU_SUPPORT_CUDA`` (mpi.h: ``#define MPIX_GPU_SUPPORT_CUDA (0)``; ZE is 1, HIP is 2).
MPIX_GPU_SUPPORT_CUDA = 0

_DOCS = "docs/gpu-and-mpi.md"
_IF_NOT_AWARE = (
    "Device buffers are staged through pinned host memory in chunks of CAI_MPI_CHUNK_BYTES. "
    f"To hand them to MPI directly, run with a CUDA-aware MPI (see {_DOCS}); "
    f"if you know this MPI is CUDA-aware, set {ENV_VAR}=1 on every rank."
)
_IF_AWARE = (
    "Device buffers are passed to MPI directly. "
    f"If MPI crashes or corrupts device buffers, set {ENV_VAR}=0 to stage them through host memory."
)


@dataclass(frozen=True)
class CudaAwareness:
    """The answer to "may device pointers go straight to MPI?", with where it came from."""

    aware: bool
    source: str
    library: str
    detail: str

    def __bool__(self) -> bool:
        return self.aware


def _answer(aware: bool, source: str, library: str, why: str) -> CudaAwareness:
    return CudaAwareness(aware, source, library, f"{why} {_IF_AWARE if aware else _IF_NOT_AWARE}")


def is_libmpi(path: str) -> bool:
    """An MPI library's own shared object: libmpi.so.40 (Open MPI), libmpi.so.12 (MPICH, Intel MPI, MVAPICH),
    libmpich.so, libmpi_cray.so, libmpi_gnu_123.so (Cray); not the GPU transport layer libmpi_gtl_*."""
    name = os.path.basename(path)
    return name.startswith("libmpi") and not name.startswith("libmpi_gtl")


def _open_loaded(path: str | None) -> ctypes.CDLL | None:
    """A handle on an already loaded object (None: the global scope); never loads anything new."""
    try:
        if path is None:
            return ctypes.CDLL(None)
        noload = getattr(os, "RTLD_NOLOAD", None)
        if noload is None:
            return None
        return ctypes.CDLL(path, mode=noload | getattr(os, "RTLD_LAZY", 0))
    except (OSError, TypeError):
        return None


class MpiLibrary:
    """What detection asks of the MPI library mpi4py loaded, one method a question.

    ``detect_local(library=...)`` takes one, so the answers of another library (Cray MPICH, MVAPICH, a CUDA-aware
    Open MPI) are an object of this class with methods replaced, and the order of the steps shows in which methods
    are called. Every method answers "cannot say" (None) rather than raising when the library has no answer."""

    def version(self) -> str:
        """First line of MPI_Get_library_version, stripped ("" if the library will not say)."""
        try:
            text = MPI.Get_library_version()
        except MPI.Exception:
            return ""
        lines = text.replace("\x00", "").strip().splitlines()  # Open MPI 5 counts its terminating NUL
        return lines[0].strip() if lines else ""

    def usable(self) -> bool:
        """MPI is initialized and not finalized, so the library can be asked."""
        return bool(MPI.Is_initialized()) and not bool(MPI.Is_finalized())

    def alloc_kinds(self) -> str | None:
        """Step 2: the ``mpi_memory_alloc_kinds`` info value of COMM_WORLD (else MPI_INFO_ENV), None if absent."""
        try:
            info = MPI.COMM_WORLD.Get_info()
        except MPI.Exception:
            info = None
        if info is not None:
            try:
                value = info.Get(SOURCE_ALLOC_KINDS)
            except MPI.Exception:
                value = None
            finally:
                info.Free()
            if value is not None:
                return str(value)
        try:
            value = MPI.INFO_ENV.Get(SOURCE_ALLOC_KINDS)
        except MPI.Exception:
            return None
        return None if value is None else str(value)

    def mapped_libraries(self) -> list[str] | None:
        """Paths of the shared objects mapped into this process (Linux /proc/self/maps); None if unreadable."""
        try:
            with open("/proc/self/maps", encoding="utf-8", errors="replace") as maps:
                lines = maps.read().splitlines()
        except OSError:
            return None
        paths: list[str] = []
        for line in lines:
            fields = line.split(maxsplit=5)
            if len(fields) == 6 and fields[5].startswith("/") and ".so" in fields[5] and fields[5] not in paths:
                paths.append(fields[5])
        return paths

    def handles(self) -> Iterator[ctypes.CDLL]:
        """Where to look up MPIX_* symbols, best first.

        1. mpi4py's MPI extension module: dlsym on its handle searches the libmpi it was linked against.
        2. Every libmpi*.so mapped into the process (mpi4py may have dlopen'ed it RTLD_LOCAL itself).
        3. The global symbol scope (libmpi preloaded, or loaded RTLD_GLOBAL).
        """
        extension = getattr(MPI, "__file__", None)
        if isinstance(extension, str):
            handle = _open_loaded(extension)
            if handle is not None:
                yield handle
        for path in self.mapped_libraries() or []:
            if is_libmpi(path):
                handle = _open_loaded(path)
                if handle is not None:
                    yield handle
        handle = _open_loaded(None)
        if handle is not None:
            yield handle

    def query_ompi(self) -> int | None:
        """Step 3: ``MPIX_Query_cuda_support()`` (Open MPI, MVAPICH2 >= 2.3.4, MPICH >= 4), None if no library
        has it."""
        proto = ctypes.CFUNCTYPE(ctypes.c_int)
        for handle in self.handles():
            try:
                func = proto((SOURCE_OMPI_QUERY, handle))
            except AttributeError:
                continue
            return int(func())
        return None

    def query_mpich(self) -> int | None:
        """Step 3: ``MPIX_GPU_query_support(MPIX_GPU_SUPPORT_CUDA, &flag)`` (MPICH >= 4), None if missing or
        failing."""
        proto = ctypes.CFUNCTYPE(ctypes.c_int, ctypes.c_int, ctypes.POINTER(ctypes.c_int))
        for handle in self.handles():
            try:
                func = proto((SOURCE_MPICH_QUERY, handle))
            except AttributeError:
                continue
            flag = ctypes.c_int(0)
            if int(func(MPIX_GPU_SUPPORT_CUDA, ctypes.byref(flag))) != 0:  # not MPI_SUCCESS
                return None
            return int(flag.value)
        return None


def cuda_device_kind(kinds: str) -> bool:
    """True if a kinds list ("mpi,system,cuda:device") admits device memory: ``cuda`` or ``cuda:device``."""
    for item in kinds.split(","):
        kind, *restrictors = (part.strip().lower() for part in item.split(":"))
        if kind == "cuda" and (not restrictors or "device" in restrictors):
            return True
    return False


# -- step 4: vendor switches for libraries without a query ---------------------------------------------------


def _cray_hint(env: Mapping[str, str], library: str, mpi: MpiLibrary) -> tuple[bool, str] | None:
    """Cray MPICH: MPICH_GPU_SUPPORT_ENABLED=1 plus the CUDA GTL library loaded."""
    if env.get(SOURCE_CRAY, "").strip() != "1":
        return None
    mapped = mpi.mapped_libraries()
    gtl_cuda = mapped is not None and any(os.path.basename(p).startswith("libmpi_gtl_cuda") for p in mapped)
    if not gtl_cuda and "CRAY" not in library.upper():
        return None  # a stray variable from a Cray module, and a library that is not Cray MPICH
    if mapped is not None and not gtl_cuda:
        return False, (
            f"{SOURCE_CRAY}=1 but libmpi_gtl_cuda.so is not loaded in this process, so Cray MPICH "
            "cannot reach CUDA memory: load craype-accel-nvidia80 (or similar) before building mpi4py, "
            "or link/preload libmpi_gtl_cuda.so."
        )
    return True, f"{SOURCE_CRAY}=1 and the CUDA GTL library (libmpi_gtl_cuda) is in use by Cray MPICH."


def _mvapich_hint(env: Mapping[str, str], library: str) -> tuple[bool, str] | None:
    """MVAPICH2(-GDR) without MPIX_Query_cuda_support: MV2_USE_CUDA=1."""
    if env.get(SOURCE_MVAPICH, "").strip() != "1" or "MVAPICH" not in library.upper():
        return None
    return True, f"{SOURCE_MVAPICH}=1 with an MVAPICH library that has no CUDA query."


# -- the steps in order --------------------------------------------------------------------------------------


def detect_local(*, env: Mapping[str, str] | None = None, mpi: MpiLibrary | None = None) -> CudaAwareness:
    """This rank's answer, without communication: env override, alloc kinds, vendor query, vendor hint, no.

    ``env`` defaults to the process environment (``config.environment()``), ``mpi`` to the library mpi4py loaded.
    Raises ValueError for an unreadable CAI_MPI_CUDA_AWARE; never raises for a missing symbol or a library that
    cannot answer (it falls through to the next step).
    """
    env = environment() if env is None else env
    mpi = MpiLibrary() if mpi is None else mpi
    library = mpi.version()

    override = cuda_aware_setting(env)  # step 1: the user's override
    if override is not None:
        return _answer(override, SOURCE_ENV, library, f"Set by {ENV_VAR}={env[ENV_VAR].strip()}.")

    if mpi.usable():
        kinds = mpi.alloc_kinds()
        # Only a yes is conclusive: Open MPI 6 lists just the kinds a program asked for, so a CUDA-aware
        # build can answer "mpi,system". Without CUDA device memory listed, the vendor queries decide.
        if kinds is not None and cuda_device_kind(kinds):
            return _answer(
                True,
                SOURCE_ALLOC_KINDS,
                library,
                f"The MPI library's {SOURCE_ALLOC_KINDS}={kinds!r} includes CUDA device memory.",
            )
        unlisted = "" if kinds is None else f"{SOURCE_ALLOC_KINDS}={kinds!r} lists no CUDA device memory. "

        flag = mpi.query_mpich()
        if flag is not None:
            return _answer(
                bool(flag),
                SOURCE_MPICH_QUERY,
                library,
                f"{unlisted}{SOURCE_MPICH_QUERY}(MPIX_GPU_SUPPORT_CUDA) set its flag to {flag}.",
            )
        flag = mpi.query_ompi()
        if flag is not None:
            return _answer(flag == 1, SOURCE_OMPI_QUERY, library, f"{unlisted}{SOURCE_OMPI_QUERY}() returned {flag}.")
        why_default = f"{unlisted}The MPI library offers no CUDA query (no MPIX_* function)"
    else:
        why_default = "MPI is not initialized (or already finalized), so the library could not be asked"

    for hint, source in (
        (_cray_hint(env, library, mpi), SOURCE_CRAY),
        (_mvapich_hint(env, library), SOURCE_MVAPICH),
    ):
        if hint is not None:
            return _answer(hint[0], source, library, hint[1])

    return _answer(
        False, SOURCE_DEFAULT, library, f"{why_default} and no vendor switch says it is CUDA-aware."
    )


def agree(comm: MPI.Comm, local: CudaAwareness) -> CudaAwareness:
    """Collective over ``comm``: CUDA-aware only if every rank is; otherwise not-aware on all ranks.

    If the ranks disagree the result has source "disagreement" and says how many ranks were aware.
    """
    votes = np.array([1 if local.aware else 0], dtype=np.int32)
    comm.Allreduce(MPI.IN_PLACE, votes, op=MPI.SUM)
    yes, size = int(votes[0]), int(comm.Get_size())
    if yes in (0, size):
        return local
    this = f"this rank said {'yes' if local.aware else 'no'} via {local.source}"
    why = (
        f"Ranks disagree: {yes} of {size} ranks found a CUDA-aware MPI ({this}), so no rank sends device "
        f"pointers to MPI on this communicator. Give every rank the same MPI library and settings, "
        f"or set {ENV_VAR} the same way on every rank."
    )
    return _answer(False, SOURCE_DISAGREEMENT, local.library, why)
