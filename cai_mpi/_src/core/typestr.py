"""CAI type strings and ``descr`` lists to numpy dtypes and back, strictly (a ``CAIError`` names what is wrong)."""

from __future__ import annotations

import functools
import re
from typing import Any

import numpy as np

from ..errors import CAIError

__all__ = ["descr_from_hashable", "dtype_cached", "dtype_from_typestr", "dtype_to_cai", "hashable_descr"]

# An array-interface type string: byte order, kind, size (datetimes may carry a unit). numpy's dtype() also takes
# names ('float32'), comma lists ('f4,i4') and subarrays ('(2,)<f4', which would change the shape): not typestrs.
_TYPESTR = re.compile(r"[<>|=]?(?:[biufcOSUV]\d*|[mM]8(?:\[\w+\])?)")


@functools.lru_cache(maxsize=512)
def dtype_cached(typestr: str, descr: Any) -> np.dtype[Any]:
    """The dtype of a typestr, or of a ``hashable_descr`` (cached: a stream of messages repeats a few)."""
    dt: np.dtype[Any] = np.dtype(descr_from_hashable(descr)) if descr is not None else np.dtype(typestr)
    return dt


def hashable_descr(descr: Any) -> Any:
    """A ``descr`` as nested tuples, so it can key a cache and live in a frozen descriptor."""
    if isinstance(descr, (list, tuple)):
        return tuple(hashable_descr(d) for d in descr)
    return descr


def descr_from_hashable(descr: Any) -> Any:
    """``hashable_descr`` undone: the list of field tuples numpy and the CAI expect."""
    if isinstance(descr, tuple):
        # numpy wants a list of fields, each field a tuple; nested descrs are lists too.
        return [
            tuple(descr_from_hashable(x) if isinstance(x, tuple) and _is_field_list(x) else x for x in field)
            for field in descr
        ]
    return descr


def _is_field_list(x: tuple[Any, ...]) -> bool:
    return len(x) > 0 and all(isinstance(f, tuple) and len(f) >= 2 and isinstance(f[0], str) for f in x)


def _is_plain_descr(descr: Any) -> bool:
    """``[('', typestr)]`` is the default descr: it restates typestr, no structure."""
    return (
        isinstance(descr, (list, tuple))
        and len(descr) == 1
        and isinstance(descr[0], (list, tuple))
        and len(descr[0]) == 2
        and descr[0][0] == ""
    )


def dtype_from_typestr(typestr: str, descr: Any = None) -> np.dtype[Any]:
    """Return the numpy dtype for a CAI ``typestr`` (with ``descr`` for structured types)."""
    if _TYPESTR.fullmatch(typestr) is None:
        raise CAIError(f"'typestr' {typestr!r} is not a numpy array-interface type (expected a byte order, a kind "
                       "and a size in bytes, e.g. '<f4' or '|V12')")
    key = None if descr is None or _is_plain_descr(descr) else hashable_descr(descr)
    what = f"'descr' {descr!r}" if key is not None else f"'typestr' {typestr!r}"
    try:
        dtype = dtype_cached(typestr, key)
    except (TypeError, ValueError) as exc:
        raise CAIError(f"{what} is not a numpy array-interface type ({exc})") from None
    if dtype.hasobject:
        raise CAIError(f"{what} holds Python objects, which cannot live in GPU memory")
    if dtype.itemsize == 0:
        raise CAIError(f"'typestr' {typestr!r} has itemsize 0")
    return dtype


def dtype_to_cai(dtype: np.dtype[Any]) -> tuple[str, list[Any] | None]:
    """Return ``(typestr, descr)`` for a dtype; ``descr`` is None unless the dtype is structured."""
    if dtype.names is not None:
        return dtype.str, dtype.descr
    return dtype.str, None
