"""The ops of the reductions: what a user's ``op`` means (``mean`` is MPI's sum divided by the number of ranks,
in the input's dtype), the MPI datatype that reduces a dtype with it, and the division of a mean. MPI computes
every reduction itself, so cai_mpi's answer is the user's MPI's.
"""

from __future__ import annotations

import ctypes
from typing import Any

import numpy as np
from mpi4py import MPI

__all__ = ["ReduceOp", "divide", "native_dtype", "op_name", "parse_op", "reduce_datatype"]

_OPS = {"sum": MPI.SUM, "prod": MPI.PROD, "min": MPI.MIN, "max": MPI.MAX}
_MEAN = ("mean", "avg")
_ORDERED = (MPI.MIN, MPI.MAX)
# every predefined op, by the name users write (mpi4py's Op has no name of its own)
_NAMES = [(getattr(MPI, name), f"MPI.{name}") for name in
          ("SUM", "PROD", "MIN", "MAX", "LAND", "LOR", "LXOR", "BAND", "BOR", "BXOR", "MINLOC", "MAXLOC",
           "REPLACE", "NO_OP") if hasattr(MPI, name)]
# bool arrays reduce with the logical ops; min and max of bools are logical and/or
_LOGICAL = (MPI.LAND, MPI.LOR, MPI.LXOR)
_BOOL_OPS = "MPI.LAND, MPI.LOR, MPI.LXOR, 'min' or MPI.MIN (logical and), 'max' or MPI.MAX (logical or)"
_OP_CHOICES = "'sum', 'prod', 'min', 'max', 'mean' (alias 'avg'), or an mpi4py MPI.Op such as MPI.SUM or MPI.LOR"

class ReduceOp:
    """The op a reduction was asked for: MPI's op, whether the result is then divided by the size (mean), and
    the name to put in errors."""

    __slots__ = ("mean", "mpi", "name")

    def __init__(self, mpi: MPI.Op, name: str, mean: bool = False) -> None:
        self.mpi, self.name, self.mean = mpi, name, mean

    def for_bool(self, fn: str) -> ReduceOp:
        """The op that reduces bool arrays for this one: min and max are logical and/or (MPI defines MIN and
        MAX for integer and floating types only), the logical ops themselves; anything else is refused."""
        if self.mean:
            raise TypeError(f"{fn}: op={self.name} (the sum divided by the number of ranks) applies to floating or "
                            f"complex arrays, not to bool: convert to a floating dtype first")
        if self.mpi == MPI.MIN:
            return ReduceOp(MPI.LAND, self.name)
        if self.mpi == MPI.MAX:
            return ReduceOp(MPI.LOR, self.name)
        if any(self.mpi == logical for logical in _LOGICAL):
            return self
        raise TypeError(f"{fn}: {self.name} does not apply to a bool array: use {_BOOL_OPS}; "
                        "or convert to an integer dtype to count")


def op_name(op: MPI.Op) -> str:
    """``MPI.SUM`` for MPI.SUM, not ``<mpi4py.MPI.Op object at ...>``."""
    for known, name in _NAMES:
        if op == known:
            return name
    return "a user-defined MPI.Op"


def parse_op(fn: str, op: Any) -> ReduceOp:
    """The reduction ``op`` names, or ValueError."""
    if isinstance(op, MPI.Op):
        return ReduceOp(op, op_name(op))
    if isinstance(op, str) and op.lower() in _OPS:
        return ReduceOp(_OPS[op.lower()], repr(op))
    if isinstance(op, str) and op.lower() in _MEAN:
        return ReduceOp(MPI.SUM, repr(op), mean=True)
    raise ValueError(f"{fn}: op must be {_OP_CHOICES}; got {op!r}")


def native_dtype(fn: str, dtype: np.dtype[Any], device: bool) -> np.dtype[Any]:
    """The dtype a reduction of ``dtype`` elements computes in: MPI's arithmetic reads native values, and would
    compute nonsense on swapped bytes. Host data is converted to it (a copy, by the caller); a device array's is
    refused, since converting it is the device library's job. Structured dtypes pass (``reduce_datatype`` refuses
    them, whatever their byte order)."""
    if dtype.isnative or dtype.names is not None or dtype.subdtype is not None:
        return dtype
    if device:
        raise TypeError(f"{fn}: a device array of dtype {dtype.str} is not in native byte order, and MPI reduces "
                        f"native values: convert it on the device first (to {dtype.newbyteorder('=').str})")
    return dtype.newbyteorder("=")


def reduce_datatype(fn: str, dtype: np.dtype[Any], op: ReduceOp) -> MPI.Datatype:
    """The MPI datatype that reduces ``dtype`` elements, or a clear refusal."""
    if dtype.names is not None or dtype.subdtype is not None:
        raise TypeError(f"{fn}: cannot reduce a structured dtype ({dtype}): reduce its fields separately")
    if dtype.kind == "b":
        return MPI.C_BOOL
    if op.mean and dtype.kind not in "fc":
        raise TypeError(f"{fn}: op={op.name} (the sum divided by the number of ranks) applies to floating or "
                        f"complex arrays, not to {dtype}: convert to a floating dtype first, or reduce with "
                        "'sum' and divide")
    if not dtype.isnative:  # (host input is converted first; this guards every other way in)
        raise TypeError(f"{fn}: dtype {dtype.str} is not in native byte order, and MPI reduces native values: "
                        "convert with x.astype(x.dtype.newbyteorder('='))")
    if dtype.kind == "c" and any(op.mpi == ordered for ordered in _ORDERED):
        raise TypeError(f"{fn}: complex values have no order: {op.name} does not apply to {dtype}; "
                        "use 'sum', 'prod' or 'mean'")
    try:
        datatype = MPI.Datatype.fromcode(dtype.char)  # predefined (reductions take no derived datatype)
    except (ValueError, KeyError, TypeError):
        datatype = None
    if datatype is None or datatype == MPI.DATATYPE_NULL or datatype.Get_size() != dtype.itemsize:
        raise TypeError(f"{fn}: MPI has no reduction datatype for {dtype} ({dtype.str})")
    return datatype


def divide(address: int, count: int, dtype: np.dtype[Any], size: int) -> None:
    """op="mean": the sum at ``address`` (host memory) divided by the number of ranks, in place, in ``dtype``."""
    if count == 0:
        return
    total = np.frombuffer(memoryview((ctypes.c_char * (count * dtype.itemsize)).from_address(address)).cast("B"), dtype)
    np.true_divide(total, dtype.type(size), out=total)
