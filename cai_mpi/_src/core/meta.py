"""The ``meta`` dict a message carries: JSON in the header, checked to arrive equal to what was sent."""

from __future__ import annotations

import json
from typing import Any

import numpy as np

__all__ = ["MAX_META_BYTES", "encode_meta"]

MAX_META_BYTES = 16 << 10


def encode_meta(meta: Any) -> bytes:
    """Serialise ``meta`` for the header, refusing anything that would not come back equal.

    numpy scalars and 0-d arrays travel as their Python values (``.item()``), tuples as lists: they arrive as
    the int, float, bool, str or list JSON gives back.
    """
    if meta is None:
        return b""
    if not isinstance(meta, dict):
        raise TypeError(f"meta must be a dict of JSON values, got {type(meta).__name__}")
    try:
        raw = json.dumps(meta, separators=(",", ":"), allow_nan=False, default=_json_value).encode()
    except (TypeError, ValueError) as exc:
        raise TypeError(
            "meta must hold only JSON values (str keys; str, int, float, bool, None, list, tuple, dict, numpy "
            f"scalars and 0-d arrays): {exc}"
        ) from None
    except RecursionError:
        raise TypeError(_TOO_DEEP) from None
    if len(raw) > MAX_META_BYTES:
        raise ValueError(f"meta is {len(raw)} bytes as JSON; the limit is {MAX_META_BYTES} bytes")
    try:
        arrives = json.loads(raw)
        same = _arrives_equal(arrives, meta)
    except RecursionError:  # (nesting the encoder took is still too deep to decode or compare)
        raise TypeError(_TOO_DEEP) from None
    if not same:
        raise TypeError(
            "meta would not survive JSON unchanged (non-str dict keys?): "
            f"{meta!r} would arrive as {arrives!r}"
        )
    return raw


def _json_value(value: Any) -> Any:
    """json's fallback for what it cannot encode itself: numpy scalars and 0-d arrays become Python values."""
    if isinstance(value, np.ndarray) and value.ndim:
        raise TypeError(
            f"a numpy array of shape {value.shape} cannot travel in meta: send it as an array, or pass "
            "a.tolist() for a short list"
        )
    if isinstance(value, (np.generic, np.ndarray)):
        item = value.item()
        if isinstance(item, (bool, int, float, str)) or item is None:
            return item
        raise TypeError(f"numpy {value.dtype} value {value!r} is {type(item).__name__} in Python, not a JSON value")
    raise TypeError(f"Object of type {type(value).__name__} is not JSON serializable")


def _arrives_equal(arrives: Any, sent: Any) -> bool:
    """Whether what JSON gives back equals what was sent, tuples read as lists and numpy values as Python's."""
    if isinstance(sent, dict):
        return (isinstance(arrives, dict) and len(arrives) == len(sent)
                and all(isinstance(k, str) and k in arrives and _arrives_equal(arrives[k], v) for k, v in sent.items()))
    if isinstance(sent, (list, tuple)):
        return (isinstance(arrives, list) and len(arrives) == len(sent)
                and all(_arrives_equal(a, s) for a, s in zip(arrives, sent)))
    if isinstance(sent, (np.generic, np.ndarray)):
        sent = sent.item()
    return bool(arrives == sent)


# Deep nesting exhausts Python's recursion limit in json (a few KB of JSON can do it); the receiver, whose
# decoder has the same limit, could not read it either.
_TOO_DEEP = "meta is nested too deeply for JSON (past Python's recursion limit): flatten it"
