"""A job that fails loudly: an uncaught exception on one rank prints the rank and the traceback, then aborts
MPI_COMM_WORLD, so the other ranks do not wait for it forever (MPI has no way to tell them otherwise)."""

from __future__ import annotations

import signal
import socket
import sys
import threading
import traceback
from types import TracebackType

from mpi4py import MPI

__all__ = ["abort_on_error", "abort_with_report"]

_installed = False


def _status(error: BaseException) -> int:
    """The exit status of the job: SystemExit's code, 128 + SIGINT for Ctrl-C, else 1 (as ``python -m mpi4py``)."""
    if isinstance(error, SystemExit):
        code = error.code
        return code if isinstance(code, int) else (0 if code is None else 1)
    if isinstance(error, KeyboardInterrupt):
        return 128 + signal.SIGINT
    return 1


def abort_with_report(error: BaseException, where: str = "") -> None:
    """Print this rank's identity and ``error``'s traceback to stderr, then abort MPI_COMM_WORLD (no return).

    A SystemExit with status 0 is a normal exit, not a failure: nothing happens.
    """
    status = _status(error)
    if status == 0:
        return
    world = MPI.COMM_WORLD
    rank, size = (world.Get_rank(), world.Get_size()) if MPI.Is_initialized() and not MPI.Is_finalized() else (0, 1)
    text = "".join(traceback.format_exception(type(error), error, error.__traceback__))
    sys.stdout.flush()
    sys.stderr.write(
        f"cai_mpi: rank {rank} of {size} (host {socket.gethostname()}){where}: uncaught "
        f"{type(error).__name__}: {error}; aborting MPI_COMM_WORLD with status {status}\n{text}"
    )
    sys.stderr.flush()
    if MPI.Is_initialized() and not MPI.Is_finalized():
        world.Abort(status)
    sys.exit(status)  # (MPI is gone already: an ordinary exit)


def abort_on_error() -> None:
    """Make an uncaught exception on this rank end the whole MPI job at once, with its rank and traceback on stderr.

    Call it once near the top of a program, on every rank (calling it again does nothing). It installs
    ``sys.excepthook`` and ``threading.excepthook``: without it, a rank that dies of an exception leaves the
    others blocked in their next receive or collective until the job's time limit. ``python -m cai_mpi run
    script.py`` does the same for a script you do not want to edit.

    Example:
        >>> import cai_mpi
        >>> cai_mpi.abort_on_error()  # doctest: +SKIP
    """
    global _installed
    if _installed:
        return
    _installed = True

    def excepthook(kind: type[BaseException], error: BaseException, tb: TracebackType | None) -> None:
        abort_with_report(error.with_traceback(tb))

    def thread_excepthook(args: threading.ExceptHookArgs) -> None:
        if args.exc_value is not None and not isinstance(args.exc_value, SystemExit):
            thread = f" in thread {args.thread.name!r}" if args.thread is not None else ""
            abort_with_report(args.exc_value.with_traceback(args.exc_traceback), thread)

    sys.excepthook = excepthook
    threading.excepthook = thread_excepthook
