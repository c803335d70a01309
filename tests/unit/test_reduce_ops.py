"""The small path of the reductions computes in numpy what MPI's predefined ops compute (issue 26): integers wrap,
logical ops give 0 or 1 in the input dtype, a single rank's values come back unchanged, mean divides in the input
dtype; and it stands in only where numpy computes the same (everything else is left to MPI)."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
from mpi4py import MPI

from cai_mpi._src.api.reduce_ops import ReduceOp, combine, parse_op


def parts(dtype: Any, *rows: Any) -> list[np.ndarray[Any, Any]]:
    return [np.array(r, dtype) for r in rows]


def test_integers_wrap_0d_included() -> None:
    got = combine(parse_op("f", "sum"), parts("i1", [100, -100], [100, -100]), 2)
    assert got.dtype == np.int8 and got.tolist() == [-56, 56]
    got = combine(parse_op("f", "sum"), [np.array(2**62, np.int64), np.array(2**62, np.int64)], 2)
    assert got.shape == () and int(got) == -(2**63)
    got = combine(parse_op("f", MPI.PROD), parts("u1", [16], [16]), 2)
    assert got.tolist() == [0]


def test_logical_ops_on_integers_give_zero_or_one_in_the_dtype() -> None:
    got = combine(parse_op("f", MPI.LAND), parts("i4", [5, 0, 3], [7, 2, 0]), 2)
    assert got.dtype == np.int32 and got.tolist() == [1, 0, 0]
    assert combine(parse_op("f", MPI.LXOR), parts("u2", [5, 0, 3], [7, 2, 0]), 2).tolist() == [0, 1, 1]
    assert combine(parse_op("f", MPI.BXOR), parts("u2", [5, 0, 3], [7, 2, 0]), 2).tolist() == [2, 2, 3]


def test_one_rank_values_come_back_unchanged() -> None:
    assert combine(parse_op("f", MPI.LAND), parts("i4", [5, 0]), 1).tolist() == [5, 0]


def test_bool_min_and_max_are_logical_and_or() -> None:
    rows = parts("?", [True, True, False], [True, False, False])
    assert combine(parse_op("f", "min").for_bool("f"), rows, 2).tolist() == [True, False, False]
    assert combine(parse_op("f", "max").for_bool("f"), rows, 2).tolist() == [True, True, False]


def test_mean_divides_in_the_input_dtype() -> None:
    got = combine(parse_op("f", "avg"), parts("f4", [1.0, 2.0], [2.0, 2.0], [1.0, 2.0]), 3)
    assert got.dtype == np.float32 and got.tobytes() == (np.array([4.0, 6.0], "f4") / np.float32(3)).tobytes()
    got = combine(parse_op("f", "mean"), parts("c8", [1 + 2j], [3 - 2j]), 2)
    assert got.dtype == np.complex64 and got.tolist() == [2 + 0j]


def test_nan_propagates_through_min_and_max() -> None:
    got = combine(parse_op("f", "min"), parts("f8", [1.0, np.nan], [np.nan, 0.5]), 2)
    assert np.isnan(got).tolist() == [True, True]


@pytest.mark.parametrize(("op", "dtype", "local"), [
    ("sum", "f8", True), ("prod", "c16", True), ("min", "i8", True), (MPI.MAX, "f4", True),
    (MPI.LAND, "i4", True), (MPI.LOR, "?", True), (MPI.BAND, "u1", True),
    (MPI.LAND, "f8", False), (MPI.BOR, "f4", False), (MPI.MINLOC, "f8", False), (MPI.REPLACE, "i4", False),
], ids=str)
def test_numpy_stands_in_only_where_it_computes_the_same(op: Any, dtype: str, local: bool) -> None:
    assert parse_op("f", op).local(np.dtype(dtype)) is local


def test_a_user_defined_op_is_never_computed_here() -> None:
    op = MPI.Op.Create(lambda a, b, t: None, commute=True)
    try:
        assert not ReduceOp(op, "mine").local(np.dtype("f8"))
    finally:
        op.Free()
