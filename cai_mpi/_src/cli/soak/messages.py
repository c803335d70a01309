"""What the soak sends: each message's dtype, shape, layout, exporter and contents derive from its id, so a
receiver knows exactly what should have arrived and checks it by content hash."""

from __future__ import annotations

import dataclasses
import hashlib
import math
from typing import Any

import numpy as np

from ...arrays.array import Array

__all__ = ["Ident", "Spec", "content", "digest", "make", "problem", "receive_buffer", "spec_for"]

#: A message's id: (round, thread, source rank, destination rank (-1: a collective's contribution), slot).
Ident = tuple[int, int, int, int, int]

DTYPES = [np.dtype(t) for t in ("|u1", "<i2", "<i4", "<i8", "<f2", "<f4", "<f8", "<c8", "<c16", "|b1", ">i4", ">f8")]
DTYPES.append(np.dtype([("id", "<i4"), ("xyz", "<f8", (3,))]))  # structured (packed: no padding bytes)
LAYOUTS = ("C", "F", "strided", "reversed")
HOST = -1  # Spec.export of a numpy array; 0-3 are CAI objects of that version


@dataclasses.dataclass(frozen=True)
class Spec:
    ident: Ident
    dtype: np.dtype[Any]
    shape: tuple[int, ...]
    layout: str
    export: int

    @property
    def nbytes(self) -> int:
        return math.prod(self.shape) * self.dtype.itemsize


def _rng(ident: Ident, seed: int, purpose: int) -> np.random.Generator:
    return np.random.default_rng([seed, purpose, *(i + 1 for i in ident)])  # (entropy words must be >= 0)


def spec_for(ident: Ident, seed: int, max_bytes: int, *, dtype: Any = None, layouts: tuple[str, ...] = LAYOUTS,
             exports: tuple[int, ...] = (HOST, 0, 1, 2, 3)) -> Spec:
    """The message ``ident``: mostly small (header-inline), some up to a MiB, a few up to ``max_bytes``, some
    empty, some a single item; zero to four dimensions; any of ``layouts``; a numpy array or a CAI object of
    any version."""
    rng = _rng(ident, seed, 0)
    dt = DTYPES[int(rng.integers(len(DTYPES)))] if dtype is None else np.dtype(dtype)
    u = rng.random()
    bounds = (1, 8 << 10) if u < 0.58 else (8 << 10, 1 << 20) if u < 0.95 else (1 << 20, max(max_bytes, 1 << 20))
    nbytes = 0 if u < 0.03 else int(math.exp(rng.uniform(math.log(bounds[0]), math.log(bounds[1]))))
    count = 1 if 0.03 <= u < 0.05 else min(nbytes, max_bytes) // dt.itemsize  # some single items (also 0-d)
    ndim = int(rng.integers(0 if count == 1 else 1, 5))
    shape: list[int] = []
    left = count
    for axis in range(ndim - 1):  # dimensions whose product is about ``count`` (exactly 0 when it is 0)
        n = int(rng.integers(1, max(2, round(left ** (1 / (ndim - axis))) * 2)))
        shape.append(n)
        left = left // n if count else left
    if ndim:
        shape.append(left if count else int(rng.integers(0, 3)))
        if not count:
            shape[int(rng.integers(ndim))] = 0
    layout = layouts[int(rng.integers(len(layouts)))] if ndim else "C"
    return Spec(ident, dt, tuple(shape), layout, exports[int(rng.integers(len(exports)))])


def content(spec: Spec, seed: int) -> np.ndarray[Any, Any]:
    """The message's contents, C-ordered: random bytes (bool: 0 or 1)."""
    data = bytearray(_rng(spec.ident, seed, 1).bytes(spec.nbytes))
    arr = np.frombuffer(data, spec.dtype).reshape(spec.shape) if data else np.empty(spec.shape, spec.dtype)
    if spec.dtype == np.bool_:
        arr.view(np.uint8)[...] &= 1
    return arr


def digest(arr: np.ndarray[Any, Any]) -> bytes:
    return hashlib.blake2b(arr.tobytes(order="C"), digest_size=16).digest()


def _strides(spec: Spec) -> tuple[tuple[int, ...], int, int]:
    """(byte strides, byte offset of element 0, items of memory) of ``spec``'s layout."""
    shape, item = spec.shape, spec.dtype.itemsize
    full = list(shape)
    if spec.layout == "strided":
        full[-1] *= 2
    order = reversed(range(len(full))) if spec.layout != "F" else range(len(full))
    strides = [0] * len(full)
    step = item
    for axis in order:
        strides[axis] = step
        step *= max(full[axis], 1)
    if spec.layout == "strided":
        strides[-1] *= 2
    offset = 0
    if spec.layout == "reversed" and shape[0] > 1:
        offset, strides[0] = (shape[0] - 1) * strides[0], -strides[0]
    return tuple(strides), offset, math.prod(full)


def _laid_out(spec: Spec, values: np.ndarray[Any, Any] | None) -> tuple[np.ndarray[Any, Any], np.ndarray[Any, Any],
                                                                          tuple[int, ...], int]:
    strides, offset, items = _strides(spec)
    memory = np.zeros(items, spec.dtype)
    view = np.ndarray(spec.shape, spec.dtype, memory, offset, strides) if items else np.empty(spec.shape, spec.dtype)
    if values is not None:
        view[...] = values
    return memory, view, strides, offset


def make(spec: Spec, values: np.ndarray[Any, Any] | None, runtime: str) -> tuple[Any, np.ndarray[Any, Any] | None]:
    """An object to send (or receive into) in ``spec``'s layout and exporter, holding ``values`` (zeros for
    None), and a host view to read it back (None for a CUDA device object)."""
    memory, view, strides, offset = _laid_out(spec, values)
    if spec.export == HOST:
        return view, view
    if runtime == "cuda":
        import cupy

        dev = cupy.asarray(memory)
        obj = cupy.ndarray(spec.shape, spec.dtype, dev.data + offset, strides) if memory.size else dev.reshape(
            spec.shape)
        return _Versioned(obj, spec.export), None
    from ....testing import FakeCudaArray

    fake = FakeCudaArray(memory, version=spec.export, shape=spec.shape, strides=strides, offset=offset,
                         device=runtime == "simulated")
    return fake, fake.host


def receive_buffer(spec: Spec, runtime: str) -> tuple[Any, np.ndarray[Any, Any] | None]:
    """An ``out=`` for ``spec`` (zeros, its layout and exporter)."""
    return make(spec, None, runtime)


class _Versioned:
    """A CuPy array exported under another CAI version (the stream key exists from version 3 on)."""

    def __init__(self, obj: Any, version: int) -> None:
        self.obj, self.version = obj, version

    @property
    def __cuda_array_interface__(self) -> dict[str, Any]:
        cai = dict(self.obj.__cuda_array_interface__, version=self.version)
        if self.version < 3:
            cai.pop("stream", None)
        return cai


def problem(got: Array, spec: Spec, expected: bytes, meta: Any = None) -> str | None:
    """What is wrong with ``got`` as the message ``spec`` whose content hash is ``expected``, or None."""
    if got.shape != spec.shape or got.dtype != spec.dtype:
        return f"{spec.ident}: got shape {got.shape} dtype {got.dtype}, sent {spec.shape} {spec.dtype}"
    if meta is not None and got.meta != meta:
        return f"{spec.ident}: got meta {got.meta}, sent {meta}"
    if digest(got.numpy()) != expected:
        return f"{spec.ident}: the contents differ ({spec.nbytes} bytes, {spec.layout}, export {spec.export})"
    return None
