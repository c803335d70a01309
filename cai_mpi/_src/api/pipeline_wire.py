"""What a ``Pipeline``'s messages are: the tags of its two communicators, which items may travel as bare payloads,
and the failure notice a failing stage sends every other one."""

from __future__ import annotations

import json
import traceback
from typing import Any

import numpy as np

from ..arrays.array import Array
from ..errors import PipelineError

__all__ = [
    "CREDIT", "DESCRIBED", "END", "FAST", "HOST", "ITEM", "NOTICE", "NOTICE_BYTES", "SWITCH", "bare_memory",
    "encode_notice", "failure_from",
]

# Tags on the data duplicate. ITEM, END and DESCRIBED name self-describing messages (``isend_array``: their headers
# and payloads travel on cai_mpi's own duplicates of it); DESCRIBED says bare payloads of the item's shape, dtype
# and meta may follow. While the next stage holds such a description, messages travel on the data duplicate itself:
# FAST (a bare payload), SWITCH (empty: a self-describing message comes next) and END (empty).
ITEM, END, DESCRIBED, FAST, SWITCH = range(5)
CREDIT, NOTICE, HOST = 0, 1, 2  # tags on the control duplicate
NOTICE_BYTES = 64 << 10
_TEXT_CHARS = 16 << 10  # of a failing stage's message, and of the end of its traceback, that a notice carries
_BARE_KINDS = frozenset("biufc")  # dtype kinds a bare payload carries (numbers: any buffer-protocol export)


def bare_memory(obj: Any) -> np.ndarray[Any, Any] | None:
    """``obj``'s memory when it may travel as a bare payload: a numpy array (not a subclass) or a host Array, of
    numbers, in C order; else None (it always travels self-described)."""
    host: np.ndarray[Any, Any] | None
    if type(obj) is np.ndarray:
        host = obj
    elif type(obj) is Array:
        host = obj._host
    else:
        return None
    return host if host is not None and host.flags.c_contiguous and host.dtype.kind in _BARE_KINDS else None


def encode_notice(stage: int, meta: Any, error: BaseException, own: bool) -> bytes:
    """The failure notice of ``stage``: the error's type, message and (``own``: an exception this stage raised)
    traceback, and the meta of the item it worked on; at most NOTICE_BYTES (the meta dropped, then the texts cut)."""
    kind = type(error)
    name = kind.__qualname__ if kind.__module__ == "builtins" else f"{kind.__module__}.{kind.__qualname__}"
    text = "".join(traceback.format_exception(kind, error, error.__traceback__)) if own else ""
    message, text = str(error)[:_TEXT_CHARS], text[-_TEXT_CHARS:]
    while True:
        notice = {"rank": stage, "meta": meta, "type": name, "message": message, "traceback": text}
        try:
            raw = json.dumps(notice).encode()
        except (TypeError, ValueError):
            meta = None
            continue
        if len(raw) <= NOTICE_BYTES:
            return raw
        meta, message, text = None, message[: len(message) // 2], text[len(text) // 2 :]  # (escaped non-ASCII)


def failure_from(raw: bytes | bytearray) -> PipelineError:
    """The PipelineError a failure notice reports."""
    notice = json.loads(bytes(raw))
    kind, message = notice["type"], notice["message"]
    return PipelineError(f"Pipeline: stage {notice['rank']} failed: {kind}: {message}", notice["rank"],
                         notice["meta"], error_type=kind, error_message=message,
                         error_traceback=notice["traceback"])
