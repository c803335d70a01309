"""When a strided host payload goes to MPI in place (a derived datatype) and when numpy packs it first:
CAI_MPI_HOST_DATATYPE_BYTES, else the library's default (tests/mpi/test_strided_host_mpi.py checks the bytes)."""

from __future__ import annotations

import importlib
from typing import Any

import numpy as np
import pytest
from mpi4py import MPI

import cai_mpi
from cai_mpi._src.config import Config, reload_config
from cai_mpi._src.transport import datatypes

receive = importlib.import_module("cai_mpi._src.transport.receive")  # (the package's ``receive`` is a function)
ME = MPI.COMM_WORLD.Get_rank()


def test_the_setting_is_read_as_a_number_of_bytes() -> None:
    assert Config.from_env({"CAI_MPI_HOST_DATATYPE_BYTES": "0x4000"}).host_datatype_bytes == 16384
    assert Config.from_env({"CAI_MPI_HOST_DATATYPE_BYTES": "0"}).host_datatype_bytes == 0
    assert Config.from_env({}).host_datatype_bytes is None
    assert Config.from_env({"CAI_MPI_HOST_DATATYPE_BYTES": " "}).host_datatype_bytes is None


@pytest.mark.parametrize("bad", ["-1", "lots", "1.5"])
def test_a_bad_value_names_the_variable(bad: str) -> None:
    with pytest.raises(ValueError, match="CAI_MPI_HOST_DATATYPE_BYTES"):
        Config.from_env({"CAI_MPI_HOST_DATATYPE_BYTES": bad})


def test_the_setting_wins_over_the_library_default() -> None:
    assert datatypes.host_datatype_bytes(Config.from_env({"CAI_MPI_HOST_DATATYPE_BYTES": "123"})) == 123


@pytest.mark.parametrize(("version", "limit"), [
    ("MPICH Version:      4.3.2\nMPICH Release date: ...", 4096),
    ("Open MPI v5.0.8, package: Open MPI ...", 2**63),
])
def test_the_default_follows_the_library(monkeypatch: pytest.MonkeyPatch, version: str, limit: int) -> None:
    monkeypatch.setattr(datatypes.MPI, "Get_library_version", lambda: version)
    datatypes.library_is_mpich.cache_clear()
    try:
        assert datatypes.host_datatype_bytes(Config.from_env({})) == limit
    finally:
        datatypes.library_is_mpich.cache_clear()


@pytest.mark.parametrize(("limit", "in_place"), [("64", True), ("63", False)])
def test_a_receive_lands_in_place_up_to_the_setting(
    monkeypatch: pytest.MonkeyPatch, limit: str, in_place: bool
) -> None:
    """A 64-byte payload into a strided ``out=`` is received through a derived datatype when it is within
    CAI_MPI_HOST_DATATYPE_BYTES, else into a contiguous buffer that numpy copies from: the bytes are the same either
    way (tests/mpi/test_strided_host_mpi.py), so the route is read from the derived datatypes the receive builds."""
    built: list[tuple[int, ...]] = []

    def spy(shape: tuple[int, ...], strides: tuple[int, ...], itemsize: int) -> Any:
        built.append(shape)
        return datatypes.strided_type(shape, strides, itemsize)

    monkeypatch.setattr(receive, "strided_type", spy)
    reload_config({"CAI_MPI_HOST_DATATYPE_BYTES": limit, "CAI_MPI_INLINE_BYTES": "0"})
    try:
        sent = np.arange(8.0)  # 64 bytes, contiguous: the sender builds no datatype
        field = np.full(16, -1.0)
        req = cai_mpi.isend_array(sent, ME, 11)
        got = cai_mpi.recv_array(ME, 11, out=field[::2])
        req.wait()
    finally:
        reload_config()
    assert field[::2].tolist() == sent.tolist() and field[1::2].tolist() == [-1.0] * 8
    assert np.asarray(got).tolist() == sent.tolist()
    assert built == ([(8,)] if in_place else [])
