"""The exception hierarchy: every error cai_mpi raises on purpose derives from CaiMpiError."""

from __future__ import annotations

import builtins
from typing import Any

__all__ = [
    "CaiMpiError",
    "CAIError",
    "CollectiveMismatchError",
    "CudaError",
    "PipelineError",
    "ProtocolError",
    "RecvMismatchError",
    "RuntimeUnavailableError",
    "SenderFailedError",
    "StreamError",
    "TimeoutError",
]

CAI_PREFIX = "__cuda_array_interface__: "


class CaiMpiError(Exception):
    """Base class of every error raised by cai_mpi."""

    def __reduce__(self) -> tuple[Any, ...]:
        # Rebuilt without calling __init__ (whose extra arguments args lacks), then its attributes restored: every
        # error pickles, e.g. to travel between processes.
        return _rebuild, (type(self), self.args, self.__dict__)


def _rebuild(cls: type[CaiMpiError], args: tuple[Any, ...], state: dict[str, Any]) -> CaiMpiError:
    error = cls.__new__(cls, *args)
    error.args = args  # (OSError's __new__, TimeoutError's, leaves args empty when a subclass has its own __init__)
    error.__dict__.update(state)
    return error


class CAIError(CaiMpiError, BufferError):
    """A ``__cuda_array_interface__`` dict (or host buffer) that cai_mpi cannot use.

    The message starts with ``__cuda_array_interface__:`` and names the key,
    what was expected and what came.
    """

    def __init__(self, message: str) -> None:
        if not message.startswith(CAI_PREFIX):
            message = CAI_PREFIX + message
        super().__init__(message)


class ProtocolError(CaiMpiError):
    """A cai_mpi header that cannot be decoded (wrong magic, version, truncated, absurd sizes)."""


class RecvMismatchError(CaiMpiError, ValueError):
    """The incoming message does not fit the ``out=`` buffer; the payload was discarded."""


class SenderFailedError(CaiMpiError):
    """The sender of a message failed after its header went out (a CUDA error it could only see then, such as a
    sticky error while staging): the rest of the payload never came. ``source`` and ``tag`` name the message,
    ``reason`` is the sender's error as it reported it (the sender raised it too). Every message of the payload
    was received and dropped, so the communicator stays usable; an ``out=`` buffer may hold part of it.

    Attributes:
        source: the rank that sent the message.
        tag: the message's tag.
        reason: the sender's error, as it reported it.
    """

    def __init__(self, message: str, source: int, tag: int, reason: str) -> None:
        super().__init__(message)
        self.source = source
        self.tag = tag
        self.reason = reason


class StreamError(CaiMpiError):
    """A CAI stream handle that cannot be synchronized on this rank."""


class RuntimeUnavailableError(CaiMpiError):
    """The requested device runtime (CUDA, simulated) cannot be used here."""


class CudaError(CaiMpiError, RuntimeError):
    """A failed CUDA driver call: ``call`` names it, ``code`` is its CUresult (None if it never ran).

    Attributes:
        call: the driver function that failed.
        code: its CUresult, or None if it never ran.
        name: the CUresult's name (``CUDA_ERROR_...``), or None.
    """

    def __init__(self, message: str, call: str, code: int | None = None, name: str | None = None) -> None:
        super().__init__(message)
        self.call = call
        self.code = code
        self.name = name


class CollectiveMismatchError(CaiMpiError, ValueError):
    """The ranks of a collective disagree (shapes or dtypes of a reduction), or some rank could not take
    part; raised on every rank, naming the ranks and what each had. The communicator stays usable. A
    ``ValueError`` too, as a receive's ``RecvMismatchError`` is."""


class PipelineError(CaiMpiError, RuntimeError):
    """A stage of a ``Pipeline`` failed: ``rank`` is the failing stage, ``meta`` the meta of the item it was
    working on when known (else None). Raised on every other stage; the failing stage sees its own error. A
    ``RuntimeError`` too, so ``except RuntimeError`` catches a failed stage as it catches a ``CudaError``.

    Attributes:
        rank: the stage that failed.
        meta: the ``meta`` of the item it was working on, or None.
        error_type: the name of the failing stage's exception type (``"ValueError"``, ``"mypkg.MyError"``).
        error_message: its message (``str()`` of it; the first 16 Ki characters of a longer one).
        error_traceback: its traceback as that stage would print it (the frames where it failed; of a longer one,
            the last 16 Ki characters), or ``""`` when the stage failed without an exception of its own.
    """

    def __init__(
        self, message: str, rank: int, meta: dict[str, object] | None = None, *, error_type: str = "",
        error_message: str = "", error_traceback: str = "",
    ) -> None:
        super().__init__(message)
        self.rank = rank
        self.meta = meta
        self.error_type = error_type
        self.error_message = error_message
        self.error_traceback = error_traceback


class TimeoutError(CaiMpiError, builtins.TimeoutError):  # the name users expect; builtin handlers catch it too
    """A wait passed its ``timeout=`` (or ``CAI_MPI_TIMEOUT``). The message says what was awaited: the peer, tag,
    communicator and how long. ``seconds`` is the timeout; ``cancelled`` is True when the operation was withdrawn
    (an unmatched receive: nothing was consumed), False when it could not be and completes in the background.

    Attributes:
        seconds: the timeout that passed.
        cancelled: whether the operation was withdrawn.
    """

    def __init__(self, message: str, seconds: float, cancelled: bool) -> None:
        super().__init__(message)
        self.seconds = seconds
        self.cancelled = cancelled
