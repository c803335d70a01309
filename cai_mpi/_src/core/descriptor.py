"""Parse and validate CUDA Array Interface dicts (v0-v3) into a frozen CAIDescriptor."""

from __future__ import annotations

import dataclasses
import functools
import math
import warnings
from collections.abc import Mapping
from typing import Any

import numpy as np

from ..errors import CAIError
from .typestr import descr_from_hashable, dtype_cached, dtype_from_typestr, dtype_to_cai, hashable_descr

__all__ = [
    "CAIDescriptor",
    "byte_extent",
    "describe",
    "descriptor_from_dict",
    "descriptor_from_numpy",
    "dtype_from_typestr",
    "dtype_to_cai",
    "may_self_overlap",
]

#: Highest CAI version we know; higher ones are accepted with a warning.
KNOWN_CAI_VERSION = 3
#: A version above this is garbage, not a newer specification (there have been 4 in six years).
_MAX_CAI_VERSION = 255
_REQUIRED_KEYS = ("shape", "typestr", "data", "version")
# What numpy can index: past these, numpy (or ctypes) fails naming no key, or the bytes wrap around the address space.
_MAX_NDIM = 64 if np.lib.NumpyVersion(np.__version__) >= "2.0.0" else 32
_MAX_BYTES = 2**63 - 1
_ADDRESS_SPACE = 2**64
def _c_strides(shape: tuple[int, ...], itemsize: int) -> tuple[int, ...]:
    strides = []
    step = itemsize
    for n in reversed(shape):
        strides.append(step)
        step *= max(n, 1)
    return tuple(reversed(strides))


def _f_strides(shape: tuple[int, ...], itemsize: int) -> tuple[int, ...]:
    strides = []
    step = itemsize
    for n in shape:
        strides.append(step)
        step *= max(n, 1)
    return tuple(strides)


def may_self_overlap(shape: tuple[int, ...], strides: tuple[int, ...], itemsize: int) -> bool:
    """A sufficient test for non-overlap: sorted by |stride|, each dimension steps past the span of the
    smaller ones. False means no two elements share a byte; True means they may."""
    if math.prod(shape) <= 1:
        return False
    span = itemsize
    for stride, n in sorted((abs(s), n) for n, s in zip(shape, strides) if n > 1):
        if stride < span:
            return True
        span = stride * (n - 1) + span
    return False


def byte_extent(shape: tuple[int, ...], strides: tuple[int, ...], itemsize: int) -> tuple[int, int]:
    """``(low, high)``: the byte offsets from element 0 that a layout touches, [low, high)."""
    if math.prod(shape) == 0:
        return (0, 0)
    low = high = 0
    for n, s in zip(shape, strides):
        if s < 0:
            low += s * (n - 1)
        else:
            high += s * (n - 1)
    return (low, high + itemsize)


def _is_contiguous(shape: tuple[int, ...], strides: tuple[int, ...], expect: tuple[int, ...]) -> bool:
    # Dimensions of length 1 may carry any stride; zero-size arrays are contiguous.
    if 0 in shape:
        return True
    return all(n == 1 or s == e for n, s, e in zip(shape, strides, expect))


@dataclasses.dataclass(frozen=True)
class CAIDescriptor:
    """A validated CUDA Array Interface description of one array.

    ``strides`` is ``None`` for C-contiguous data (normalised), else the byte
    step per dimension. ``stream`` is ``None`` (nothing to synchronize) or a
    CAI v3 stream handle (1 legacy default, 2 per-thread default, other
    values ``cudaStream_t`` addresses). ``ptr`` addresses element 0.

    Example:
        >>> d = CAIDescriptor.for_new_buffer(0, (2, 3), np.dtype("f4"))
        >>> d.nbytes, d.is_c_contiguous
        (24, True)
    """

    ptr: int
    shape: tuple[int, ...]
    typestr: str
    readonly: bool = False
    strides: tuple[int, ...] | None = None
    descr: tuple[Any, ...] | None = None
    version: int = KNOWN_CAI_VERSION
    stream: int | None = None

    @classmethod
    def for_new_buffer(
        cls,
        ptr: int,
        shape: tuple[int, ...],
        dtype: np.dtype[Any],
        *,
        readonly: bool = False,
        fortran: bool = False,
        stream: int | None = None,
    ) -> CAIDescriptor:
        """Describe a freshly allocated contiguous buffer (C order, or F with ``fortran``) whose data is ready on
        CAI v3 ``stream`` (None: on every stream)."""
        dtype = np.dtype(dtype)
        typestr, descr = dtype_to_cai(dtype)
        shape = tuple(int(n) for n in shape)
        strides = None
        if fortran:
            f = _f_strides(shape, dtype.itemsize)
            strides = None if _is_contiguous(shape, f, _c_strides(shape, dtype.itemsize)) else f
        return cls(
            strides=strides,
            ptr=int(ptr),
            shape=shape,
            typestr=typestr,
            readonly=readonly,
            descr=hashable_descr(descr) if descr is not None else None,
            stream=stream,
        )

    @functools.cached_property
    def dtype(self) -> np.dtype[Any]:
        return dtype_cached(self.typestr, self.descr)

    @property
    def itemsize(self) -> int:
        return self.dtype.itemsize

    @functools.cached_property
    def size(self) -> int:
        return math.prod(self.shape)

    @property
    def nbytes(self) -> int:
        return self.size * self.itemsize

    @property
    def ndim(self) -> int:
        return len(self.shape)

    @functools.cached_property
    def byte_strides(self) -> tuple[int, ...]:
        """Strides in bytes, also when ``strides`` is None (C order)."""
        if self.strides is None:
            return _c_strides(self.shape, self.itemsize)
        return self.strides

    @property
    def is_c_contiguous(self) -> bool:
        return self.strides is None or _is_contiguous(
            self.shape, self.strides, _c_strides(self.shape, self.itemsize)
        )

    @property
    def is_f_contiguous(self) -> bool:
        return _is_contiguous(self.shape, self.byte_strides, _f_strides(self.shape, self.itemsize))

    @property
    def is_contiguous(self) -> bool:
        return self.is_c_contiguous or self.is_f_contiguous

    @functools.cached_property
    def byte_extent(self) -> tuple[int, int]:
        """``(low, high)`` byte offsets from ``ptr`` that the array touches: [low, high)."""
        return byte_extent(self.shape, self.byte_strides, self.itemsize)

    @property
    def may_self_overlap(self) -> bool:
        """True when two elements may share bytes (broadcast or ``as_strided`` views)."""
        return self.strides is not None and may_self_overlap(self.shape, self.strides, self.itemsize)

    def to_dict(self) -> dict[str, Any]:
        """A valid CAI v3 dict for this descriptor."""
        d: dict[str, Any] = {
            "shape": self.shape,
            "typestr": self.typestr,
            "data": (self.ptr, self.readonly),
            "version": 3,
            "strides": None if self.is_c_contiguous else self.strides,
            "stream": self.stream,
        }
        if self.descr is not None:
            d["descr"] = descr_from_hashable(self.descr)
        return d

    def transposed(self) -> CAIDescriptor:
        """The same memory with the axes reversed (an F-ordered array becomes C-ordered)."""
        strides = self.byte_strides[::-1]
        c = _c_strides(self.shape[::-1], self.itemsize)
        return dataclasses.replace(
            self, shape=self.shape[::-1], strides=None if _is_contiguous(self.shape[::-1], strides, c) else strides
        )

    def replace(self, **changes: Any) -> CAIDescriptor:
        return dataclasses.replace(self, **changes)


def descriptor_from_numpy(arr: np.ndarray[Any, Any]) -> CAIDescriptor:
    """Describe a host numpy array (element 0 at ``ptr``)."""
    typestr, descr = dtype_to_cai(arr.dtype)
    return CAIDescriptor(
        ptr=arr.ctypes.data if arr.size else 0,
        shape=arr.shape,
        typestr=typestr,
        readonly=not arr.flags.writeable,
        strides=None if arr.flags.c_contiguous else tuple(arr.strides),
        descr=hashable_descr(descr) if descr is not None else None,
    )


def describe(obj: Any) -> CAIDescriptor:
    """Read ``obj.__cuda_array_interface__`` once and validate it.

    Args:
        obj: any object exporting the CUDA Array Interface (versions 0 to 3).

    Returns:
        The frozen CAIDescriptor: pointer, shape, dtype, strides (None for C order), stream, version.

    Raises:
        TypeError: ``obj`` does not export the CUDA Array Interface.
        CAIError: the dict breaks the specification (the message names the key), or reading it raised
            (the exporter's exception is chained as the cause).
    """
    try:
        cai = obj.__cuda_array_interface__
    except AttributeError:
        raise TypeError(
            f"{type(obj).__name__} object does not export __cuda_array_interface__"
        ) from None
    except Exception as exc:
        raise CAIError(f"describe: reading it from a {type(obj).__name__} object raised {type(exc).__name__}: "
                       f"{exc} (the exporter's error is this one's cause)") from exc
    return descriptor_from_dict(cai)


def _is_int(x: Any) -> bool:
    return isinstance(x, (int, np.integer)) and not isinstance(x, (bool, np.bool_))


def _show_data(data: Any) -> str:
    """``data`` for an error message, its pointer shown as a word: an address would make each message unique."""
    if isinstance(data, (tuple, list)):
        items = ", ".join("pointer" if i == 0 and _is_int(x) else repr(x) for i, x in enumerate(data))
        return f"({items}{',' if len(data) == 1 else ''})" if isinstance(data, tuple) else f"[{items}]"
    return "an int" if _is_int(data) else f"a {type(data).__name__}"


def _check_extent(ptr: int, shape: tuple[int, ...], strides: tuple[int, ...] | None, nbytes: int,
                  itemsize: int) -> None:
    """The bytes the array touches lie in the address space (else numpy fails, or the bytes wrap around)."""
    low, high = 0, nbytes
    if strides is not None:
        if any(not -_MAX_BYTES <= s <= _MAX_BYTES for s in strides):
            raise CAIError(f"'strides' {strides} must each lie within +-(2**63-1) bytes")
        low = sum(s * (n - 1) for n, s in zip(shape, strides) if s < 0)
        high = sum(s * (n - 1) for n, s in zip(shape, strides) if s > 0) + itemsize
    if ptr + low < 0 or ptr + high > _ADDRESS_SPACE or high - low > _MAX_BYTES:
        where = f"'strides' {strides} of shape {shape} reach" if strides is not None else f"shape {shape} reaches"
        raise CAIError(f"{where} outside the 64-bit address space from the array's pointer "
                       f"(bytes {low:+d} to {high:+d})")


def descriptor_from_dict(cai: Mapping[str, Any]) -> CAIDescriptor:
    """Validate a CAI dict (v0-v3) and return its descriptor."""
    if not isinstance(cai, Mapping):
        raise CAIError(f"expected a dict, got {type(cai).__name__}")
    missing = [k for k in _REQUIRED_KEYS if k not in cai]
    if missing:
        raise CAIError(f"missing required key(s) {missing}; got keys {sorted(cai)}")

    version = cai["version"]
    if not _is_int(version) or version < 0:
        raise CAIError(f"'version' must be a non-negative int, got {version!r}")
    version = int(version)
    if version > _MAX_CAI_VERSION:
        raise CAIError(f"'version' {version} is not a CAI version (the specification is at {KNOWN_CAI_VERSION}; a "
                       f"later one up to {_MAX_CAI_VERSION} would be read as {KNOWN_CAI_VERSION} with a warning)")
    if version > KNOWN_CAI_VERSION:
        warnings.warn(f"__cuda_array_interface__: version {version} is newer than {KNOWN_CAI_VERSION}; "
                      "reading it as version 3", stacklevel=3)

    shape_in = cai["shape"]
    if not isinstance(shape_in, (tuple, list)) or not all(_is_int(n) and n >= 0 for n in shape_in):
        raise CAIError(f"'shape' must be a tuple of non-negative ints, got {shape_in!r}")
    shape = tuple(int(n) for n in shape_in)
    if len(shape) > _MAX_NDIM:
        raise CAIError(f"'shape' has {len(shape)} dimensions; numpy holds at most {_MAX_NDIM}")

    typestr = cai["typestr"]
    if not isinstance(typestr, str):
        raise CAIError(f"'typestr' must be a str, got {typestr!r}")
    descr_in = cai.get("descr")
    dtype = dtype_from_typestr(typestr, descr_in)
    descr = hashable_descr(dtype.descr) if dtype.names is not None else None
    if dtype.names is not None and typestr != dtype.str:
        # typestr of a structured type is |V<n>; keep numpy's spelling for to_dict().
        try:
            matches = typestr[1:2] == "V" and np.dtype(typestr).itemsize == dtype.itemsize
        except (TypeError, ValueError):
            matches = False
        if not matches:
            raise CAIError(f"'typestr' {typestr!r} does not match 'descr' itemsize {dtype.itemsize}")
        typestr = dtype.str

    data = cai["data"]
    if (not isinstance(data, (tuple, list)) or len(data) != 2 or not _is_int(data[0])
            or not isinstance(data[1], (bool, np.bool_))):
        raise CAIError(f"'data' must be a (pointer: int, readonly: bool) tuple, got {_show_data(data)}")
    ptr, readonly = int(data[0]), bool(data[1])
    if ptr < 0:
        raise CAIError(f"'data' pointer must be non-negative, got {ptr}")
    if ptr >= _ADDRESS_SPACE:
        raise CAIError(f"'data' pointer {ptr} is not a 64-bit address")
    size = math.prod(shape)
    itemsize = dtype.itemsize
    # (numpy also refuses a zero-size shape whose other dimensions would not fit)
    if (size or math.prod(n for n in shape if n)) * itemsize > _MAX_BYTES:
        raise CAIError(f"'shape' {shape} of {itemsize}-byte items does not fit a 64-bit address space")
    if ptr == 0 and size != 0:
        raise CAIError(f"'data' pointer is 0 (NULL) but shape {shape} has {size} elements")

    strides_in = cai.get("strides")
    strides: tuple[int, ...] | None
    if strides_in is None:
        strides = None
    else:
        if not isinstance(strides_in, (tuple, list)) or not all(_is_int(s) for s in strides_in):
            raise CAIError(f"'strides' must be None or a tuple of ints, got {strides_in!r}")
        if len(strides_in) != len(shape):
            raise CAIError(f"'strides' {tuple(strides_in)} must have one entry per dimension of shape {shape}")
        strides = tuple(int(s) for s in strides_in)
        if _is_contiguous(shape, strides, _c_strides(shape, itemsize)):
            strides = None
    if size:
        _check_extent(ptr, shape, strides, size * itemsize, itemsize)

    mask = cai.get("mask")
    if mask is not None:
        raise CAIError(
            f"'mask' must be None: cai_mpi does not transfer masked arrays (got a {type(mask).__name__}); "
            "fill or compress the array first"
        )

    stream: int | None = None
    if "stream" in cai:
        stream_in = cai["stream"]
        if version < 3:
            if stream_in is not None:
                warnings.warn(
                    f"__cuda_array_interface__: 'stream' key ignored in a version {version} dict "
                    "(streams were added in version 3)",
                    stacklevel=3,
                )
        elif stream_in is not None:
            if not _is_int(stream_in):
                raise CAIError(f"'stream' must be None or an int handle, got {stream_in!r}")
            if stream_in == 0:
                raise CAIError(
                    "'stream' 0 is forbidden by CAI v3 (ambiguous): use 1 for the legacy default "
                    "stream, 2 for the per-thread default stream"
                )
            if stream_in < 0:
                raise CAIError(f"'stream' must be a positive handle, got {stream_in}")
            if stream_in >= _ADDRESS_SPACE:
                raise CAIError(f"'stream' {stream_in} is not a handle: handles are below 2**64")
            stream = int(stream_in)

    return CAIDescriptor(ptr=ptr, shape=shape, typestr=typestr, readonly=readonly, strides=strides, descr=descr,
                         version=version, stream=stream)
