"""CUDA-awareness detection: each step, its order, and the real answer of the MPI wheel installed here.

Another MPI library is a ``Library``: an ``MpiLibrary`` whose answers the test gives (``detect_local(mpi=...)``); a
question given ``NOT_ASKED`` fails the test if detection asks it, which pins the order of the steps."""

from __future__ import annotations

import ctypes
import ctypes.util
import dataclasses
import os
import re
import sys
from collections.abc import Iterator
from typing import Any

import pytest
from mpi4py import MPI

from cai_mpi._src.transport.detect import (
    MPIX_GPU_SUPPORT_CUDA,
    CudaAwareness,
    MpiLibrary,
    agree,
    detect_local,
    is_libmpi,
)

VENDOR_VARS = ("CAI_MPI_CUDA_AWARE", "MPICH_GPU_SUPPORT_ENABLED", "MV2_USE_CUDA")
NOT_ASKED: Any = object()


@pytest.fixture(autouse=True)
def clean_env(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in VENDOR_VARS:
        monkeypatch.delenv(name, raising=False)


class Library(MpiLibrary):
    """An MPI library that answers what the test says (by default: nothing, as a library without memory kinds or
    query functions)."""

    def __init__(self, *, version: str = "Test MPI 1.0", usable: bool = True, kinds: str | None = None,
                 mpich: int | None = None, ompi: int | None = None, mapped: list[str] | None = None) -> None:
        self.answers = {"version": version, "usable": usable, "alloc_kinds": kinds, "query_mpich": mpich,
                        "query_ompi": ompi, "mapped_libraries": [] if mapped is None else mapped}

    def answer(self, question: str) -> Any:
        value = self.answers[question]
        if value is NOT_ASKED:
            raise AssertionError(f"detection asked {question} although an earlier step had answered")
        return value

    def version(self) -> str:
        return str(self.answer("version"))

    def usable(self) -> bool:
        return bool(self.answer("usable"))

    def alloc_kinds(self) -> str | None:
        return self.answer("alloc_kinds")  # type: ignore[no-any-return]

    def query_mpich(self) -> int | None:
        return self.answer("query_mpich")  # type: ignore[no-any-return]

    def query_ompi(self) -> int | None:
        return self.answer("query_ompi")  # type: ignore[no-any-return]

    def mapped_libraries(self) -> list[str] | None:
        return self.answer("mapped_libraries")  # type: ignore[no-any-return]


# -- step 1: CAI_MPI_CUDA_AWARE -----------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("raw", "expected"),
    [
        ("1", True),
        ("0", False),
        ("true", True),
        ("no", False),
        ("YES", True),
        ("False", False),
        ("on", True),
        ("off", False),
        (" 1 ", True),
    ],
)
def test_env_override(monkeypatch: pytest.MonkeyPatch, raw: str, expected: bool) -> None:
    monkeypatch.setenv("CAI_MPI_CUDA_AWARE", raw)
    # The override answers first: no later step may even run.
    result = detect_local(mpi=Library(kinds=NOT_ASKED, mpich=NOT_ASKED, ompi=NOT_ASKED))
    assert result.aware is expected
    assert bool(result) is expected
    assert result.source == "env CAI_MPI_CUDA_AWARE"
    assert f"CAI_MPI_CUDA_AWARE={raw.strip()}" in result.detail


def test_env_override_beats_alloc_kinds() -> None:
    result = detect_local(env={"CAI_MPI_CUDA_AWARE": "0"}, mpi=Library(kinds="mpi,system,cuda"))
    assert (result.aware, result.source) == (False, "env CAI_MPI_CUDA_AWARE")


@pytest.mark.parametrize("raw", ["maybe", "2", "cuda", "y"])
def test_env_override_invalid(monkeypatch: pytest.MonkeyPatch, raw: str) -> None:
    monkeypatch.setenv("CAI_MPI_CUDA_AWARE", raw)
    with pytest.raises(ValueError, match=r"CAI_MPI_CUDA_AWARE=.*not understood.*use 1, true, yes") as info:
        detect_local(mpi=Library())
    assert repr(raw) in str(info.value)
    assert "0, false, no" in str(info.value)


def test_env_override_empty_means_detect() -> None:
    result = detect_local(env={"CAI_MPI_CUDA_AWARE": "  "}, mpi=Library())
    assert result.source == "default"


# -- step 2: mpi_memory_alloc_kinds -------------------------------------------------------------------------


@pytest.mark.parametrize(
    "kinds",
    ["mpi,system,cuda", "mpi, system, CUDA", "mpi,system,cuda:device", "system,cuda:host:device"],
)
def test_alloc_kinds_naming_cuda_device_memory(kinds: str) -> None:
    result = detect_local(mpi=Library(kinds=kinds, mpich=NOT_ASKED, ompi=NOT_ASKED))
    assert (result.aware, result.source) == (True, "mpi_memory_alloc_kinds")
    assert repr(kinds) in result.detail


@pytest.mark.parametrize(
    "kinds", ["mpi,system", "mpi,system,cuda:host", "mpi,system,cuda:managed", "mpi,rocm,level_zero:device", ""]
)
@pytest.mark.parametrize(("query", "flag"), [("ompi", 1), ("mpich", 1), ("ompi", 0)])
def test_alloc_kinds_without_cuda_device_memory_ask_the_queries(kinds: str, query: str, flag: int) -> None:
    # Open MPI 6 lists only the kinds a program asked for: a CUDA-aware build can answer "mpi,system".
    # A negative answer there proves nothing, so the vendor queries decide.
    result = detect_local(mpi=Library(kinds=kinds, **{query: flag}))
    source = "MPIX_GPU_query_support" if query == "mpich" else "MPIX_Query_cuda_support"
    assert (result.aware, result.source) == (bool(flag), source)


def test_alloc_kinds_without_cuda_and_no_query() -> None:
    result = detect_local(mpi=Library(kinds="mpi,system"))
    assert (result.aware, result.source) == (False, "default")
    assert "'mpi,system'" in result.detail


# -- step 3: the vendor queries -----------------------------------------------------------------------------


@pytest.mark.parametrize(("flag", "expected"), [(1, True), (0, False)])
def test_mpich_query(flag: int, expected: bool) -> None:
    result = detect_local(mpi=Library(mpich=flag, ompi=NOT_ASKED))
    assert (result.aware, result.source) == (expected, "MPIX_GPU_query_support")


@pytest.mark.parametrize(("flag", "expected"), [(1, True), (0, False)])
def test_ompi_query(flag: int, expected: bool) -> None:
    result = detect_local(mpi=Library(ompi=flag))
    assert (result.aware, result.source) == (expected, "MPIX_Query_cuda_support")
    assert f"returned {flag}" in result.detail


class OnlyIn(MpiLibrary):
    """The real ctypes queries, looking only in ``handles`` (no memory kinds)."""

    def __init__(self, *handles: ctypes.CDLL) -> None:
        self.found = handles

    def handles(self) -> Iterator[ctypes.CDLL]:
        yield from self.found

    def alloc_kinds(self) -> str | None:
        return None


def test_missing_symbols_fall_through() -> None:
    # Only libc to look in: the real ctypes lookups find no MPIX_* symbol and must say so with None.
    only_libc = OnlyIn(ctypes.CDLL(ctypes.util.find_library("c")))
    assert only_libc.query_ompi() is None
    assert only_libc.query_mpich() is None
    result = detect_local(mpi=only_libc)
    assert (result.aware, result.source) == (False, "default")
    assert "no CUDA query" in result.detail
    assert "CAI_MPI_CUDA_AWARE=1" in result.detail


def test_nothing_to_look_in() -> None:
    assert OnlyIn().query_ompi() is None
    assert OnlyIn().query_mpich() is None


def test_uninitialized_mpi_skips_library_steps() -> None:
    result = detect_local(mpi=Library(usable=False, kinds=NOT_ASKED, mpich=NOT_ASKED, ompi=NOT_ASKED))
    assert (result.aware, result.source) == (False, "default")
    assert "not initialized" in result.detail


# -- step 4: vendor hints -----------------------------------------------------------------------------------

CRAY = "MPI VERSION    : CRAY MPICH version 8.1.28.2 (ANL base 3.4a2)"
LIBS_GTL_CUDA = ["/opt/cray/pe/lib64/libmpi_gnu_123.so.12", "/opt/cray/pe/lib64/libmpi_gtl_cuda.so.0"]
LIBS_NO_GTL = ["/opt/cray/pe/lib64/libmpi_gnu_123.so.12", "/usr/lib64/libc.so.6"]


def test_cray_hint() -> None:
    result = detect_local(env={"MPICH_GPU_SUPPORT_ENABLED": "1"}, mpi=Library(version=CRAY, mapped=LIBS_GTL_CUDA))
    assert (result.aware, result.source, result.library) == (True, "MPICH_GPU_SUPPORT_ENABLED", CRAY)
    assert "libmpi_gtl_cuda" in result.detail


def test_cray_hint_without_cuda_gtl() -> None:
    result = detect_local(env={"MPICH_GPU_SUPPORT_ENABLED": "1"}, mpi=Library(version=CRAY, mapped=LIBS_NO_GTL))
    assert (result.aware, result.source) == (False, "MPICH_GPU_SUPPORT_ENABLED")
    assert "libmpi_gtl_cuda.so is not loaded" in result.detail


class UnreadableMaps(Library):
    def mapped_libraries(self) -> list[str] | None:
        return None


def test_cray_hint_maps_unreadable() -> None:
    result = detect_local(env={"MPICH_GPU_SUPPORT_ENABLED": "1"}, mpi=UnreadableMaps(version=CRAY))
    assert (result.aware, result.source) == (True, "MPICH_GPU_SUPPORT_ENABLED")


@pytest.mark.parametrize(
    ("version", "value"),
    [("MPICH Version:      3.3.2", "1"), (CRAY, "0"), (CRAY, "")],
)
def test_cray_hint_ignored(version: str, value: str) -> None:
    # A stray variable with a library that is not Cray MPICH (and no GTL), or GPU support switched off.
    result = detect_local(env={"MPICH_GPU_SUPPORT_ENABLED": value}, mpi=Library(version=version, mapped=LIBS_NO_GTL))
    assert (result.aware, result.source) == (False, "default")


def test_cray_query_beats_hint() -> None:
    cray = Library(version=CRAY, mapped=LIBS_GTL_CUDA, mpich=0, ompi=NOT_ASKED)
    result = detect_local(env={"MPICH_GPU_SUPPORT_ENABLED": "1"}, mpi=cray)
    assert (result.aware, result.source) == (False, "MPIX_GPU_query_support")


def test_mvapich_hint() -> None:
    mvapich = Library(version="MVAPICH2 Version      :\t2.3.7")
    result = detect_local(env={"MV2_USE_CUDA": "1"}, mpi=mvapich)
    assert (result.aware, result.source) == (True, "MV2_USE_CUDA")
    result = detect_local(env={"MV2_USE_CUDA": "0"}, mpi=mvapich)
    assert (result.aware, result.source) == (False, "default")


def test_mvapich_hint_needs_mvapich() -> None:
    result = detect_local(env={"MV2_USE_CUDA": "1"}, mpi=Library(version="Open MPI v4.1.6"))
    assert (result.aware, result.source) == (False, "default")


# -- the result type and agree() on one rank ----------------------------------------------------------------


def test_cuda_awareness_is_frozen_and_truthy() -> None:
    yes = CudaAwareness(True, "test", "lib", "detail")
    no = CudaAwareness(False, "test", "lib", "detail")
    assert bool(yes) and not bool(no)
    with pytest.raises(dataclasses.FrozenInstanceError):
        yes.aware = False  # type: ignore[misc]


@pytest.mark.parametrize("aware", [True, False])
def test_agree_single_rank_returns_local(aware: bool) -> None:
    local = CudaAwareness(aware, "test", "lib", "detail")
    assert agree(MPI.COMM_SELF, local) is local


# -- the wheel installed here, asked for real ---------------------------------------------------------------


def test_real_answer_of_this_library() -> None:
    mpi = MpiLibrary()
    library = mpi.version()
    assert library == library.strip() and "\n" not in library and "\x00" not in library
    result = detect_local()
    assert result.library == library
    if library.startswith("Open MPI"):
        # The Open MPI wheel (and any Open MPI 5 built --without-cuda): the real ctypes call answers 0.
        assert mpi.alloc_kinds() is None
        assert mpi.query_ompi() == 0
        assert (result.aware, result.source) == (False, "MPIX_Query_cuda_support")
        assert result.detail.startswith("MPIX_Query_cuda_support() returned 0.")
    elif library.startswith("MPICH Version"):
        # The MPICH wheel: MPI-4.1 memory kinds without CUDA prove nothing; its GPU query says no.
        assert mpi.alloc_kinds() == "mpi,system"
        assert mpi.query_mpich() == 0
        assert mpi.query_ompi() == 0
        assert (result.aware, result.source) == (False, "MPIX_GPU_query_support")
    else:
        pytest.skip(f"no recorded answer for {library!r}")
    assert "CAI_MPI_CHUNK_BYTES" in result.detail
    assert "CAI_MPI_CUDA_AWARE=1" in result.detail


def test_libmpi_found_in_process() -> None:
    mapped = MpiLibrary().mapped_libraries()
    if mapped is None:
        pytest.skip("no /proc/self/maps on this system")
    assert any(is_libmpi(p) for p in mapped), mapped
    assert not is_libmpi("/opt/cray/pe/lib64/libmpi_gtl_cuda.so.0")
    assert next(MpiLibrary().handles(), None) is not None


def test_mpich_cuda_enum_matches_installed_header() -> None:
    # The MPICH wheel ships <prefix>/include/mpi.h; so do most MPICH installs next to their lib/.
    headers = [os.path.join(sys.prefix, "include", "mpi.h")]
    headers += [os.path.join(os.path.dirname(p), os.pardir, "include", "mpi.h") for p in _libmpi_paths()]
    for header in headers:
        if os.path.isfile(header):
            with open(header, encoding="utf-8", errors="replace") as f:
                match = re.search(r"#define\s+MPIX_GPU_SUPPORT_CUDA\s+\(?\s*(\d+)", f.read())
            if match:
                assert int(match.group(1)) == MPIX_GPU_SUPPORT_CUDA
                return
    pytest.skip("no MPICH mpi.h defining MPIX_GPU_SUPPORT_CUDA next to this MPI")


def _libmpi_paths() -> list[str]:
    return [p for p in MpiLibrary().mapped_libraries() or [] if is_libmpi(p)]
