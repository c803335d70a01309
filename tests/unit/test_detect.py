"""CUDA-awareness detection: each step, its order, and the real answer of the MPI wheel installed here."""

from __future__ import annotations

import ctypes
import ctypes.util
import dataclasses
import os
import re
import sys
from collections.abc import Iterator

import pytest
from mpi4py import MPI

from cai_mpi._src.transport import detect
from cai_mpi._src.transport.detect import CudaAwareness, agree, detect_local

VENDOR_VARS = ("CAI_MPI_CUDA_AWARE", "MPICH_GPU_SUPPORT_ENABLED", "MV2_USE_CUDA")


@pytest.fixture(autouse=True)
def clean_env(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in VENDOR_VARS:
        monkeypatch.delenv(name, raising=False)


def _must_not_run() -> int | None:
    raise AssertionError("a later detection step ran although an earlier one had answered")


@pytest.fixture
def no_library_answer(monkeypatch: pytest.MonkeyPatch) -> None:
    """The library has neither memory kinds nor a query function: only vendor hints are left."""
    monkeypatch.setattr(detect, "_alloc_kinds", lambda: None)
    monkeypatch.setattr(detect, "_query_mpich", lambda: None)
    monkeypatch.setattr(detect, "_query_ompi", lambda: None)


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
    monkeypatch.setattr(detect, "_alloc_kinds", _must_not_run)
    monkeypatch.setattr(detect, "_query_mpich", _must_not_run)
    monkeypatch.setattr(detect, "_query_ompi", _must_not_run)
    result = detect_local()
    assert result.aware is expected
    assert bool(result) is expected
    assert result.source == "env CAI_MPI_CUDA_AWARE"
    assert f"CAI_MPI_CUDA_AWARE={raw.strip()}" in result.detail


def test_env_override_beats_alloc_kinds(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(detect, "_alloc_kinds", lambda: "mpi,system,cuda")
    result = detect_local(env={"CAI_MPI_CUDA_AWARE": "0"})
    assert (result.aware, result.source) == (False, "env CAI_MPI_CUDA_AWARE")


@pytest.mark.parametrize("raw", ["maybe", "2", "cuda", "y"])
def test_env_override_invalid(monkeypatch: pytest.MonkeyPatch, raw: str) -> None:
    monkeypatch.setenv("CAI_MPI_CUDA_AWARE", raw)
    with pytest.raises(ValueError, match=r"CAI_MPI_CUDA_AWARE=.*not understood.*use 1, true, yes") as info:
        detect_local()
    assert repr(raw) in str(info.value)
    assert "0, false, no" in str(info.value)


def test_env_override_empty_means_detect(monkeypatch: pytest.MonkeyPatch, no_library_answer: None) -> None:
    result = detect_local(env={"CAI_MPI_CUDA_AWARE": "  "})
    assert result.source == "default"


# -- step 2: mpi_memory_alloc_kinds -------------------------------------------------------------------------


@pytest.mark.parametrize(
    "kinds",
    ["mpi,system,cuda", "mpi, system, CUDA", "mpi,system,cuda:device", "system,cuda:host:device"],
)
def test_alloc_kinds_naming_cuda_device_memory(monkeypatch: pytest.MonkeyPatch, kinds: str) -> None:
    monkeypatch.setattr(detect, "_alloc_kinds", lambda: kinds)
    monkeypatch.setattr(detect, "_query_mpich", _must_not_run)
    monkeypatch.setattr(detect, "_query_ompi", _must_not_run)
    result = detect_local()
    assert (result.aware, result.source) == (True, "mpi_memory_alloc_kinds")
    assert repr(kinds) in result.detail


@pytest.mark.parametrize(
    "kinds", ["mpi,system", "mpi,system,cuda:host", "mpi,system,cuda:managed", "mpi,rocm,level_zero:device", ""]
)
@pytest.mark.parametrize(("query", "flag"), [("_query_ompi", 1), ("_query_mpich", 1), ("_query_ompi", 0)])
def test_alloc_kinds_without_cuda_device_memory_ask_the_queries(
    monkeypatch: pytest.MonkeyPatch, kinds: str, query: str, flag: int
) -> None:
    # Open MPI 6 lists only the kinds a program asked for: a CUDA-aware build can answer "mpi,system".
    # A negative answer there proves nothing, so the vendor queries decide.
    monkeypatch.setattr(detect, "_alloc_kinds", lambda: kinds)
    monkeypatch.setattr(detect, "_query_mpich", lambda: flag if query == "_query_mpich" else None)
    monkeypatch.setattr(detect, "_query_ompi", lambda: flag if query == "_query_ompi" else None)
    result = detect_local()
    source = "MPIX_GPU_query_support" if query == "_query_mpich" else "MPIX_Query_cuda_support"
    assert (result.aware, result.source) == (bool(flag), source)


def test_alloc_kinds_without_cuda_and_no_query(monkeypatch: pytest.MonkeyPatch, no_library_answer: None) -> None:
    monkeypatch.setattr(detect, "_alloc_kinds", lambda: "mpi,system")
    result = detect_local()
    assert (result.aware, result.source) == (False, "default")
    assert "'mpi,system'" in result.detail


# -- step 3: the vendor queries -----------------------------------------------------------------------------


@pytest.mark.parametrize(("flag", "expected"), [(1, True), (0, False)])
def test_mpich_query(monkeypatch: pytest.MonkeyPatch, flag: int, expected: bool) -> None:
    monkeypatch.setattr(detect, "_alloc_kinds", lambda: None)
    monkeypatch.setattr(detect, "_query_mpich", lambda: flag)
    monkeypatch.setattr(detect, "_query_ompi", _must_not_run)
    result = detect_local()
    assert (result.aware, result.source) == (expected, "MPIX_GPU_query_support")


@pytest.mark.parametrize(("flag", "expected"), [(1, True), (0, False)])
def test_ompi_query(monkeypatch: pytest.MonkeyPatch, flag: int, expected: bool) -> None:
    monkeypatch.setattr(detect, "_alloc_kinds", lambda: None)
    monkeypatch.setattr(detect, "_query_mpich", lambda: None)
    monkeypatch.setattr(detect, "_query_ompi", lambda: flag)
    result = detect_local()
    assert (result.aware, result.source) == (expected, "MPIX_Query_cuda_support")
    assert f"returned {flag}" in result.detail


def test_missing_symbols_fall_through(monkeypatch: pytest.MonkeyPatch) -> None:
    # Only libc to look in: the real ctypes lookups find no MPIX_* symbol and must say so with None.
    libc = ctypes.CDLL(ctypes.util.find_library("c"))

    def only_libc() -> Iterator[ctypes.CDLL]:
        yield libc

    monkeypatch.setattr(detect, "_libmpi_handles", only_libc)
    assert detect._query_ompi() is None
    assert detect._query_mpich() is None
    monkeypatch.setattr(detect, "_alloc_kinds", lambda: None)
    result = detect_local()
    assert (result.aware, result.source) == (False, "default")
    assert "no CUDA query" in result.detail
    assert "CAI_MPI_CUDA_AWARE=1" in result.detail


def test_nothing_to_look_in(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(detect, "_libmpi_handles", lambda: iter(()))
    assert detect._query_ompi() is None
    assert detect._query_mpich() is None


def test_uninitialized_mpi_skips_library_steps(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(detect, "_mpi_usable", lambda: False)
    monkeypatch.setattr(detect, "_alloc_kinds", _must_not_run)
    monkeypatch.setattr(detect, "_query_mpich", _must_not_run)
    monkeypatch.setattr(detect, "_query_ompi", _must_not_run)
    result = detect_local()
    assert (result.aware, result.source) == (False, "default")
    assert "not initialized" in result.detail


# -- step 4: vendor hints -----------------------------------------------------------------------------------

CRAY = "MPI VERSION    : CRAY MPICH version 8.1.28.2 (ANL base 3.4a2)"
LIBS_GTL_CUDA = ["/opt/cray/pe/lib64/libmpi_gnu_123.so.12", "/opt/cray/pe/lib64/libmpi_gtl_cuda.so.0"]
LIBS_NO_GTL = ["/opt/cray/pe/lib64/libmpi_gnu_123.so.12", "/usr/lib64/libc.so.6"]


def _fake_library(monkeypatch: pytest.MonkeyPatch, version: str, mapped: list[str] | None) -> None:
    monkeypatch.setattr(detect, "_library_version", lambda: version)
    monkeypatch.setattr(detect, "_mapped_libraries", lambda: mapped)


def test_cray_hint(monkeypatch: pytest.MonkeyPatch, no_library_answer: None) -> None:
    _fake_library(monkeypatch, CRAY, LIBS_GTL_CUDA)
    result = detect_local(env={"MPICH_GPU_SUPPORT_ENABLED": "1"})
    assert (result.aware, result.source, result.library) == (True, "MPICH_GPU_SUPPORT_ENABLED", CRAY)
    assert "libmpi_gtl_cuda" in result.detail


def test_cray_hint_without_cuda_gtl(monkeypatch: pytest.MonkeyPatch, no_library_answer: None) -> None:
    _fake_library(monkeypatch, CRAY, LIBS_NO_GTL)
    result = detect_local(env={"MPICH_GPU_SUPPORT_ENABLED": "1"})
    assert (result.aware, result.source) == (False, "MPICH_GPU_SUPPORT_ENABLED")
    assert "libmpi_gtl_cuda.so is not loaded" in result.detail


def test_cray_hint_maps_unreadable(monkeypatch: pytest.MonkeyPatch, no_library_answer: None) -> None:
    _fake_library(monkeypatch, CRAY, None)
    result = detect_local(env={"MPICH_GPU_SUPPORT_ENABLED": "1"})
    assert (result.aware, result.source) == (True, "MPICH_GPU_SUPPORT_ENABLED")


@pytest.mark.parametrize(
    ("version", "value"),
    [("MPICH Version:      3.3.2", "1"), (CRAY, "0"), (CRAY, "")],
)
def test_cray_hint_ignored(
    monkeypatch: pytest.MonkeyPatch, no_library_answer: None, version: str, value: str
) -> None:
    # A stray variable with a library that is not Cray MPICH (and no GTL), or GPU support switched off.
    _fake_library(monkeypatch, version, LIBS_NO_GTL)
    result = detect_local(env={"MPICH_GPU_SUPPORT_ENABLED": value})
    assert (result.aware, result.source) == (False, "default")


def test_cray_query_beats_hint(monkeypatch: pytest.MonkeyPatch) -> None:
    _fake_library(monkeypatch, CRAY, LIBS_GTL_CUDA)
    monkeypatch.setattr(detect, "_alloc_kinds", lambda: None)
    monkeypatch.setattr(detect, "_query_mpich", lambda: 0)
    result = detect_local(env={"MPICH_GPU_SUPPORT_ENABLED": "1"})
    assert (result.aware, result.source) == (False, "MPIX_GPU_query_support")


def test_mvapich_hint(monkeypatch: pytest.MonkeyPatch, no_library_answer: None) -> None:
    _fake_library(monkeypatch, "MVAPICH2 Version      :\t2.3.7", [])
    result = detect_local(env={"MV2_USE_CUDA": "1"})
    assert (result.aware, result.source) == (True, "MV2_USE_CUDA")
    result = detect_local(env={"MV2_USE_CUDA": "0"})
    assert (result.aware, result.source) == (False, "default")


def test_mvapich_hint_needs_mvapich(monkeypatch: pytest.MonkeyPatch, no_library_answer: None) -> None:
    _fake_library(monkeypatch, "Open MPI v4.1.6", [])
    result = detect_local(env={"MV2_USE_CUDA": "1"})
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
    library = detect._library_version()
    assert library == library.strip() and "\n" not in library and "\x00" not in library
    result = detect_local()
    assert result.library == library
    if library.startswith("Open MPI"):
        # The Open MPI wheel (and any Open MPI 5 built --without-cuda): the real ctypes call answers 0.
        assert detect._alloc_kinds() is None
        assert detect._query_ompi() == 0
        assert (result.aware, result.source) == (False, "MPIX_Query_cuda_support")
        assert result.detail.startswith("MPIX_Query_cuda_support() returned 0.")
    elif library.startswith("MPICH Version"):
        # The MPICH wheel: MPI-4.1 memory kinds without CUDA prove nothing; its GPU query says no.
        assert detect._alloc_kinds() == "mpi,system"
        assert detect._query_mpich() == 0
        assert detect._query_ompi() == 0
        assert (result.aware, result.source) == (False, "MPIX_GPU_query_support")
    else:
        pytest.skip(f"no recorded answer for {library!r}")
    assert "CAI_MPI_CHUNK_BYTES" in result.detail
    assert "CAI_MPI_CUDA_AWARE=1" in result.detail


def test_libmpi_found_in_process() -> None:
    mapped = detect._mapped_libraries()
    if mapped is None:
        pytest.skip("no /proc/self/maps on this system")
    assert any(detect._is_libmpi(p) for p in mapped), mapped
    assert not detect._is_libmpi("/opt/cray/pe/lib64/libmpi_gtl_cuda.so.0")
    assert next(detect._libmpi_handles(), None) is not None


def test_mpich_cuda_enum_matches_installed_header() -> None:
    # The MPICH wheel ships <prefix>/include/mpi.h; so do most MPICH installs next to their lib/.
    headers = [os.path.join(sys.prefix, "include", "mpi.h")]
    headers += [os.path.join(os.path.dirname(p), os.pardir, "include", "mpi.h") for p in _libmpi_paths()]
    for header in headers:
        if os.path.isfile(header):
            with open(header, encoding="utf-8", errors="replace") as f:
                match = re.search(r"#define\s+MPIX_GPU_SUPPORT_CUDA\s+\(?\s*(\d+)", f.read())
            if match:
                assert int(match.group(1)) == detect._MPIX_GPU_SUPPORT_CUDA
                return
    pytest.skip("no MPICH mpi.h defining MPIX_GPU_SUPPORT_CUDA next to this MPI")


def _libmpi_paths() -> list[str]:
    return [p for p in detect._mapped_libraries() or [] if detect._is_libmpi(p)]
