"""Every collective and a point-to-point ring, called as a program would over a seeded random sequence, against
mpi4py's pickle-based forms of the same exchange: the same dtype, shape and values on every rank, exactly.

The sequence draws the dtype (byte orders, bool, half, complex), the shape (0-d and empty included), the layout (C,
F, transposed, strided), whether ranks' shapes differ, the root, and how many times the call repeats: a repeated
call takes the steady state (a signature agreed before, one collective), and on a repeat one rank changes its
contribution while keeping its byte count (the reversed shape, or another dtype of the same size), which the steady
state must notice. Repeats of bcast, the reductions and scatter land in ``out=`` (C or F order), which must then hold
the result too. The same seed draws the same sequence on every rank. Passes at any world size >= 2."""

from __future__ import annotations

from typing import Any, NamedTuple

import numpy as np
import pytest
from mpi4py import MPI

import cai_mpi

pytestmark = pytest.mark.mpi(min_size=2)

comm = MPI.COMM_WORLD
me, P = comm.Get_rank(), comm.Get_size()
DTYPES = ["f8", "f4", "i8", "i4", "u1", "i2", "?", "c16", ">f8", ">i4", "f2", "u8"]
# A rank's change in the steady state that keeps its byte count
SAME_SIZE = {"f8": "i8", "i8": "f8", "f4": "i4", "i4": "f4", ">f8": "<f8", "u1": "?", "?": "i1", "c16": "f8"}
REDUCE = {"sum": np.add, "max": np.maximum, "min": np.minimum, "prod": np.multiply}


def make(shape: tuple[int, ...], dtype: str, layout: str, salt: int) -> np.ndarray[Any, Any]:
    """Small integer values (sums stay exact in every dtype) in ``layout``: C, F, T (a transposed view) or S (every
    other element along the last axis)."""
    n = int(np.prod(shape, dtype=np.int64))
    values = (np.arange(2 * n + 2, dtype=np.int64) % 5 + salt) % 7
    dt = np.dtype(dtype)
    typed = (values % 2).astype(bool) if dt.kind == "b" else values.astype(dt)
    if layout == "C" or not shape:
        return typed[:n].reshape(shape).copy()
    if layout == "F":
        return np.asfortranarray(typed[:n].reshape(shape))
    if layout == "T":
        return typed[:n].reshape(shape[::-1]).T
    wide = (*shape[:-1], shape[-1] * 2)
    return np.resize(typed, wide)[..., ::2]


def check(got: Any, expected: np.ndarray[Any, Any], what: str) -> None:
    data = got.numpy()
    assert (data.dtype, data.shape) == (expected.dtype, expected.shape), f"{what}: got {data.dtype} {data.shape}"
    assert np.array_equal(data, expected), f"{what}: got {data.ravel()[:8]}, expected {expected.ravel()[:8]}"


class Draw(NamedTuple):
    """One case's arguments, drawn alike on every rank."""

    dtype: str
    layout: str
    shape: tuple[int, ...]
    differ: bool  # gathers, scatter and alltoall: rank r's shape is shape + r
    root: int
    op: str
    arrays: list[tuple[tuple[int, ...], str, str]]  # allreduce_arrays: shape, dtype, layout of each


class Calls:
    """The random calls of one seed, drawn alike on every rank."""

    def __init__(self, seed: int) -> None:
        self.rng = np.random.default_rng(seed)

    def pick(self, options: list[str]) -> str:
        return str(options[int(self.rng.integers(0, len(options)))])

    def shape(self) -> tuple[int, ...]:
        return tuple(int(self.rng.integers(0, 5)) for _ in range(int(self.rng.integers(0, 4))))

    def case(self, i: int) -> None:
        kind = self.pick(["allgather", "gather", "bcast", "allreduce", "reduce", "scatter", "alltoall", "arrays",
                          "ring"])
        dtype, layout, shape = self.pick(DTYPES), self.pick(["C", "F", "T", "S"]), self.shape()
        differ, root = bool(self.rng.integers(0, 2)), int(self.rng.integers(0, P))
        repeats = int(self.rng.integers(1, 4))
        op = self.pick(["sum", "max", "min"])
        arrays = [(self.shape(), self.pick(["f8", "f4", "i8", "i4", "c16", "u1"]), self.pick(["C", "F", "T"]))
                  for _ in range(int(self.rng.integers(1, 6)))]
        d = Draw(dtype, layout, shape, differ, root, op, arrays)
        for rep in range(repeats):
            what = f"case {i} ({kind}, {dtype}, {layout}, {shape}, differ={differ}, root={root}), call {rep}"
            if kind in ("allgather", "gather"):
                self.gathers(d, None if kind == "allgather" else root, rep, what)
            elif kind in ("allreduce", "reduce"):
                self.reductions(d, None if kind == "allreduce" else root, rep, what)
            else:
                getattr(self, kind)(d, rep, what)

    def gathers(self, d: Draw, root: int | None, rep: int, what: str) -> None:
        """allgather_array (``root`` None) or gather_array."""
        mine, dtype = tuple(s + me for s in d.shape) if d.differ else d.shape, d.dtype
        if rep and me == rep % P:  # this rank changes, keeping its byte count
            mine, dtype = (mine[::-1], dtype) if rep % 2 else (mine, SAME_SIZE.get(dtype, dtype))
        x = make(mine, dtype, d.layout, rep + me)
        expected = comm.allgather(x.copy())
        got = cai_mpi.allgather_array(x) if root is None else cai_mpi.gather_array(x, root)
        if root is not None and me != root:
            assert got is None, what
            return
        assert got is not None and len(got) == P, what
        for r in range(P):
            check(got[r], expected[r], f"{what}, rank {r}'s piece")

    def bcast(self, d: Draw, rep: int, what: str) -> None:
        x = make(d.shape, d.dtype, d.layout, 3 * rep)
        expected = comm.bcast(x.copy() if me == d.root else None, d.root)
        if rep % 2 and me != d.root:  # into out= (in either order)
            out = np.empty(expected.shape, expected.dtype, order=d.layout if d.layout in "CF" else "C")
            check(cai_mpi.bcast_array(None, d.root, out=out), expected, f"{what}, out=")
            assert np.array_equal(out, expected), f"{what}: out= holds {out.ravel()[:8]}"
            return
        check(cai_mpi.bcast_array(x if me == d.root else None, d.root), expected, what)

    def reductions(self, d: Draw, root: int | None, rep: int, what: str) -> None:
        """allreduce_array (``root`` None) or reduce_array, repeats into ``out=``."""
        dt = np.dtype(d.dtype).newbyteorder("=")  # (cai_mpi reduces in native byte order)
        dt = np.dtype("f4") if dt.kind == "f" and dt.itemsize == 2 else np.dtype("i4") if dt.kind == "b" else dt
        op = "sum" if dt.kind == "c" else d.op
        x = make(d.shape, dt.str, d.layout, rep + me)
        pieces = comm.allgather(x.copy())
        expected = pieces[0]
        for piece in pieces[1:]:
            expected = REDUCE[op](expected, piece)
        expected = expected.astype(x.dtype)
        out = np.empty(x.shape, x.dtype, order="F" if rep % 2 else "C") if rep else None  # (the first call without)
        if root is None:
            got = cai_mpi.allreduce_array(x, op, out=out)
        else:
            got = cai_mpi.reduce_array(x, op, root, out=out if me == root else None)
        if root is not None and me != root:
            assert got is None, what
            return
        check(got, expected, f"{what}, {op}")
        if out is not None:
            assert np.array_equal(out, expected), f"{what}: out= holds {out.ravel()[:8]}"

    def scatter(self, d: Draw, rep: int, what: str) -> None:
        objs = [make(tuple(s + r for s in d.shape) if d.differ else d.shape, d.dtype, d.layout, rep + r)
                for r in range(P)]
        expected = comm.scatter([o.copy() for o in objs] if me == d.root else None, d.root)
        out = np.empty(expected.shape, expected.dtype, order="F") if rep == 1 else None
        check(cai_mpi.scatter_array(objs if me == d.root else None, d.root, out=out), expected, what)
        if out is not None:
            assert np.array_equal(out, expected), f"{what}: out= holds {out.ravel()[:8]}"

    def alltoall(self, d: Draw, rep: int, what: str) -> None:
        objs = [make(tuple(s + r for s in d.shape) if d.differ else d.shape, d.dtype, d.layout, rep + me + r)
                for r in range(P)]
        expected = comm.alltoall([o.copy() for o in objs])
        got = cai_mpi.alltoall_array(objs)
        for r in range(P):
            check(got[r], expected[r], f"{what}, from rank {r}")

    def arrays(self, d: Draw, rep: int, what: str) -> None:
        xs = [make(shape, dtype, layout, rep + me) for shape, dtype, layout in d.arrays]
        everyone = comm.allgather([x.copy() for x in xs])
        got = cai_mpi.allreduce_arrays(xs)
        for j, x in enumerate(xs):
            expected = everyone[0][j]
            for theirs in everyone[1:]:
                expected = expected + theirs[j]
            check(got[j], expected.astype(x.dtype), f"{what}, array {j} of {d.arrays}")

    def ring(self, d: Draw, rep: int, what: str) -> None:
        """sendrecv_array, irecv_array(out=) + isend_array + waitall, or irecv_array + send_array, one drawn."""
        x = make(d.shape, d.dtype, d.layout, rep + me)
        right, left = (me + 1) % P, (me - 1) % P
        expected = comm.sendrecv(x.copy(), right, source=left)
        form = int(self.rng.integers(0, 3))
        if form == 0:
            got = cai_mpi.sendrecv_array(x, right, 0, left)
        elif form == 1:
            out = np.empty(expected.shape, expected.dtype, order="F" if rep % 2 else "C")
            got, _ = cai_mpi.waitall([cai_mpi.irecv_array(left, 5, out=out), cai_mpi.isend_array(x, right, 5)])
            assert np.array_equal(out, expected), f"{what}: out="
        else:
            request = cai_mpi.irecv_array(left, 6)
            cai_mpi.send_array(x, right, 6)
            got = request.wait()
        check(got, expected, f"{what}, form {form}")


@pytest.mark.parametrize("seed", [42, 43, 44])
def test_calls_match_mpi4py(seed: int) -> None:
    calls = Calls(seed)
    for i in range(60):
        calls.case(i)
