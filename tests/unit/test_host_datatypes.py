"""When a strided host payload goes to MPI in place (a derived datatype) and when numpy packs it first:
CAI_MPI_HOST_DATATYPE_BYTES, else the library's default (tests/mpi/test_strided_host_mpi.py checks the bytes)."""

from __future__ import annotations

import pytest

from cai_mpi._src.config import Config
from cai_mpi._src.transport import datatypes


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
