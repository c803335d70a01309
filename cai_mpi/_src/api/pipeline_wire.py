"""A ``Pipeline``'s failure notice: what a failing stage sends every other one, on the control communicator (its
edges' own messages, items and credits, are ``transport.stream``'s)."""

from __future__ import annotations

import json
import traceback
from typing import Any

from ..errors import PipelineError

__all__ = ["NOTICE", "NOTICE_BYTES", "encode_notice", "failure_from"]

NOTICE = 1  # its tag on the control communicator (the stream's credits and bare-payload handshake use 0 and 2, the
# chain's abandon message 3)
NOTICE_BYTES = 64 << 10
_TEXT_CHARS = 16 << 10  # of a failing stage's message, and of the end of its traceback, that a notice carries


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
