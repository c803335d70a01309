"""The library reads a host array's address through mpi4py's buffer where it can (cheaper than numpy's ctypes
attribute, on every collective's landing and piece): it must be the address numpy gives, for any layout and dtype,
including those the buffer protocol refuses."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

from cai_mpi._src.transport.pieces import host_address

_GRID = np.arange(24.0).reshape(4, 6)
ADDRESSED: list[tuple[str, np.ndarray[Any, Any]]] = [
    ("C order", _GRID), ("Fortran order", np.asfortranarray(_GRID)), ("reversed rows", _GRID[::-1]),
    ("every other column", _GRID[:, ::2]), ("broadcast", np.broadcast_to(np.arange(3.0), (4, 3))),
    ("empty", np.empty(0)), ("0-d", np.array(3.0)), ("read-only", np.frombuffer(bytes(16))),
    ("a slice's tail", np.arange(10)[7:]), ("datetime64", np.zeros(3, "M8[s]")),
    ("structured", np.zeros(3, [("a", "<i4"), ("b", "<f8")])), ("big-endian", np.zeros(3, ">f8")),
    ("unicode", np.zeros(2, "U3")), ("void", np.zeros(3, "V5")), ("float16", np.zeros(4, np.float16)),
]


@pytest.mark.parametrize("arr", [case[1] for case in ADDRESSED], ids=[case[0] for case in ADDRESSED])
def test_host_address_is_the_address_of_element_0(arr: np.ndarray[Any, Any]) -> None:
    assert host_address(arr) == arr.__array_interface__["data"][0]
